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

import jax
import numpy as np
from jax._src.lax.lax import _convert_element_type

# Python number type -> (host vector dtype, weakly typed inside the program?). Python bools
# are not weakly typed in jax.
_KINDS = {float: (np.float64, True), int: (np.int64, True), bool: (np.bool_, False),
          complex: (np.complex128, True)}
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
    arrays, groups = plan
    ins = [params[i] for i in arrays]
    for positions, dtype, _ in groups:
        ins.append(np.array([params[i] for i in positions], dtype))
    return ins


class Packed:
    """An executable compiled for packed numbers, called with one parameter per graph leaf.

    The same number objects as the last call (a captured step replays its recorded numbers,
    held as device scalars) reuse that call's vectors: no conversion, no transfer."""

    __slots__ = ("executable", "plan", "xla_compat_compile_ns", "_numbers", "_vectors")

    def __init__(self, executable, plan):
        self.executable, self.plan = executable, plan
        self.xla_compat_compile_ns = None
        self._numbers = self._vectors = None

    def __call__(self, *params):
        arrays, groups = self.plan
        numbers = [params[i] for positions, _, _ in groups for i in positions]
        last = self._numbers
        if last is None or len(last) != len(numbers) or any(
                a is not b for a, b in zip(last, numbers)):
            vectors = host_params(params, self.plan)[len(arrays):]
            if not all(type(n) in _KINDS for n in numbers):   # device scalars: keep them there
                vectors = [jax.device_put(v) for v in vectors]
                self._numbers, self._vectors = numbers, vectors
        else:
            vectors = self._vectors
        return self.executable(*[params[i] for i in arrays], *vectors)

    def __getattr__(self, name):          # as_text, memory_analysis, cost_analysis, ...
        return getattr(self.executable, name)
