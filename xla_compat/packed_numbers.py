"""A graph's Python numbers passed to its executable as one host vector per kind.

A sync passes every lifted Python number (``ir.ScalarParam``: ``x * 0.5``'s 0.5) as its own
executable parameter, and jax converts and transfers each one on every run: ~3 us a number, the
largest per-run cost of a short graph after the execution itself (W1 passes 17). Packed, the
executable takes its arrays, then one float64 vector of the float numbers, one int64 vector of the
ints, and so on; inside, each element is unpacked into a weakly typed scalar, which is what jax
makes of a Python number, so every rule sees what it saw before and the program computes the same.

``pack(fn, params, donate)`` gives the function to compile, its parameters and donated positions;
``Packed`` wraps the executable so that callers still pass one parameter per graph leaf.
"""
from __future__ import annotations

import operator

import numpy as np
from jax._src.lax.lax import _convert_element_type

# Python number type -> (host vector dtype, weakly typed inside the program?). Python bools
# are not weakly typed in jax.
_KINDS = {float: (np.float64, True), int: (np.int64, True), bool: (np.bool_, False),
          complex: (np.complex128, True)}
_NUMBER_TYPES = frozenset(_KINDS)
MIN_NUMBERS = 2          # one number gains nothing from a vector


def layout(params: list):
    """(positions of the arrays, ((positions, vector dtype, weak), ...) per number kind), or
    None when the graph has fewer than MIN_NUMBERS numbers or a number too large for its kind."""
    arrays, groups = [], {}
    for i, p in enumerate(params):
        kind = _KINDS.get(type(p))
        if kind is None:
            arrays.append(i)
        else:
            groups.setdefault(type(p), []).append(i)
    if sum(len(g) for g in groups.values()) < MIN_NUMBERS:
        return None
    if int in groups and any(not -2 ** 63 <= params[i] < 2 ** 63 for i in groups[int]):
        return None
    return tuple(arrays), tuple((tuple(pos), *_KINDS[k]) for k, pos in groups.items())


def pack(fn, n: int, plan, donate: tuple):
    """``fn`` (of ``n`` parameters) taking them as ``plan`` packs them, and its donated
    positions (only arrays are donated)."""
    arrays, groups = plan

    def packed(*ins):
        full = [None] * n
        for k, i in enumerate(arrays):
            full[i] = ins[k]
        for g, (positions, _, weak) in enumerate(groups):
            vector = ins[len(arrays) + g]
            for j, i in enumerate(positions):
                x = vector[j]
                full[i] = _convert_element_type(x, x.dtype, weak_type=True) if weak else x
        return fn(*full)

    position = {i: k for k, i in enumerate(arrays)}
    return packed, tuple(position[d] for d in donate)


def host_params(params: list, plan) -> list:
    """The parameters as the packed executable takes them."""
    return [params[i] for i in plan[0]] + number_vectors(params, plan)


def number_vectors(params: list, plan) -> list:
    """The host vector of each kind of number, as the packed executable takes them."""
    return [np.array([params[i] for i in positions], dtype) for positions, dtype, _ in plan[1]]


class Packed:
    """An executable compiled for packed numbers, called with one parameter per graph leaf.

    The same numbers as the last call reuse that call's host vectors: no conversion. A traced
    loop passes the same values each step (its code's literals, a learning rate), a captured step
    the same objects (its recorded numbers, held as device scalars). Same means the same objects,
    or equal Python numbers that also have the same ``repr`` where equality hides a difference
    (``0.0 == -0.0``, yet ``1 / -0.0`` is ``-inf``). Device scalars are never compared by value:
    that would read them back to the host.

    The vectors go to the executable as numpy arrays, which jax's C++ call path transfers for
    ~2 us each; ``jax.device_put`` of the same vector costs ~30 us in Python, which a step whose
    numbers change every call (AdamW's bias corrections) paid per kind, every step."""

    __slots__ = ("executable", "plan", "xla_compat_compile_ns", "xla_compat_maps",
                 "xla_compat_module", "_last", "_arrays", "_numbers", "_complex")

    def __init__(self, executable, plan):
        self.executable, self.plan = executable, plan
        self.xla_compat_compile_ns = None
        self.xla_compat_maps = 1
        self.xla_compat_module = None
        self._last = None         # (numbers, their host vectors): one attribute, one store
        arrays, groups = plan
        self._arrays = _picker(arrays)
        self._numbers = _picker(tuple(i for positions, _, _ in groups for i in positions))
        self._complex = any(dtype == np.complex128 for _, dtype, _ in groups)

    def __call__(self, *params):
        numbers = self._numbers(params)
        last = self._last
        if last is not None and self._same(last[0], numbers):
            vectors = last[1]
        else:
            vectors = number_vectors(params, self.plan)
            self._last = (numbers, vectors)
        return self.executable(*self._arrays(params), *vectors)

    def _same(self, old: tuple, new: tuple) -> bool:
        if all(map(operator.is_, old, new)):
            return True
        if not _NUMBER_TYPES.issuperset(map(type, new)) or old != new:
            return False          # device scalars only by identity; numbers by value
        return not (self._complex or 0.0 in new) or _exactly(old, new)

    def __getattr__(self, name):          # as_text, memory_analysis, cost_analysis, ...
        return getattr(self.executable, name)


def _picker(positions: tuple):
    """``params -> tuple(params[i] for i in positions)``, in C."""
    if not positions:
        return lambda params: ()
    get = operator.itemgetter(*positions)
    if len(positions) == 1:
        return lambda params: (get(params),)
    return get


def _exactly(a: tuple, b: tuple) -> bool:
    """Equal numbers that are also the same bits where equality hides it (signed zeros)."""
    return all(x is y or repr(x) == repr(y) for x, y in zip(a, b))
