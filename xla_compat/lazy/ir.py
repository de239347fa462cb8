"""IR: nodes of the lazy graph. A LazyTensor points at one output (a ``Value``) of one node.

Leaves are ``DeviceData`` (a jax array, a parameter of the compiled graph) and ``ScalarParam``
(a Python number that changes between steps, passed as a weakly typed parameter so a new value
does not force a recompile). Every other node applies one lowering rule to its inputs.
"""
from __future__ import annotations

import itertools
import os
import sys
from typing import Any, NamedTuple

_ids = itertools.count()
# ``on_create(node)`` is called for every new node while set (dual run records which nodes a
# shadow run's thread creates: ``dualrun/detached.py``); None, and one check, otherwise.
on_create = None
try:
    from jax.sharding import SingleDeviceSharding as _SINGLE
except ImportError:  # pragma: no cover - older jax
    _SINGLE = None


class Aval(NamedTuple):
    """Shape and jax dtype of one node output."""

    shape: tuple[int, ...]
    dtype: Any


class Slot:
    """Marks where the k-th input array goes in a node's argument template.

    Interned (one object per ``k``), so equality and hashing are identity, in C: graph keys
    hash templates full of them."""

    __slots__ = ("k",)
    _interned: dict = {}

    def __new__(cls, k: int):
        s = cls._interned.get(k)
        if s is None:
            s = object.__new__(cls)
            s.k = k
            s = cls._interned.setdefault(k, s)
        return s

    def __reduce__(self):
        return (Slot, (self.k,))

    def __repr__(self):
        return f"${self.k}"


NO_SOURCE = "(source line not recorded; set XLA_IR_DEBUG=1)"


class Node:
    """One op application: ``rule(*template filled with inputs)`` producing ``avals``."""

    __slots__ = ("id", "op", "rule", "args", "kwargs", "inputs", "avals", "source", "sig",
                 "note", "__weakref__")

    def __init__(self, op: str, rule, args: tuple, kwargs: tuple, inputs: tuple, avals: tuple,
                 source=None, sig=None):
        self.id = next(_ids)
        self.op = op              # "aten.add.Tensor", "device_data", "scalar", ...
        self.rule = rule          # callable on jax values, or None for leaves
        self.args = args          # positional template (Slots where inputs go)
        self.kwargs = kwargs      # keyword template as a sorted tuple of (name, value)
        self.inputs = inputs      # tuple[Value]
        self.avals = avals        # tuple[Aval]
        self.source = source      # (filename, lineno, function) that created it, if recorded
        self.sig = sig            # sig_id(self.signature()), filled in on first use
        self.note = None          # what a path knows about this node (not part of the key)
        if on_create is not None:
            on_create(self)

    @property
    def is_leaf(self) -> bool:
        return self.rule is None

    def signature(self) -> tuple:
        """What identifies this node's computation, apart from its inputs."""
        return (self.op, self.rule, self.args, self.kwargs, self.avals)

    def sig_id(self) -> int:
        """``sig_id(self.signature())``, computed once per node (graph keys are made of these)."""
        s = self.sig
        if s is None:
            s = self.sig = sig_id(self.signature())
        return s

    def where(self) -> str:
        if not self.source:
            return NO_SOURCE
        f, line, fn = self.source
        return f"{f}:{line} in {fn}"

    def __repr__(self):
        return f"Node#{self.id}({self.op})"


class DeviceData(Node):
    """A materialised device buffer: a jax array, passed to graphs as a parameter."""

    __slots__ = ("array", "placement")

    def __init__(self, array):
        super().__init__("device_data", None, (), (), (), (Aval(tuple(array.shape), array.dtype),))
        self.set_array(array)

    def set_array(self, array) -> None:
        """Hold ``array`` (the same values, perhaps laid out on other devices)."""
        self.array = array
        self.placement = placement(array)
        self.sig = None           # the placement is part of the signature

    def signature(self) -> tuple:
        # A buffer spread over a device mesh compiles differently: its sharding is in the key.
        return ("device_data", self.avals, self.placement)


def placement(array):
    """None for an array on one device; a hashable description of its layout when spread over
    several (equal for equivalent layouts: P() and P(None,) lay a vector out alike)."""
    s = getattr(array, "sharding", None)
    if s is None or type(s) is _SINGLE or s.num_devices <= 1:
        return None
    spec = getattr(s, "spec", None)
    if spec is None:
        return s
    parts = tuple(p[0] if isinstance(p, tuple) and len(p) == 1 else (p or None) for p in spec)
    return ("named", s.mesh, parts + (None,) * (len(array.shape) - len(parts)), s.memory_kind)


class ScalarParam(Node):
    """A Python number fed to the graph at run time (its type, not its value, is in the key)."""

    __slots__ = ("value",)

    def __init__(self, value):
        kind = type(value)
        avals = _SCALAR_AVALS.get(kind)
        if avals is None:
            avals = _SCALAR_AVALS[kind] = (Aval((), kind),)
        Node.__init__(self, "scalar", None, (), (), (), avals, None, _scalar_sig(kind))
        self.value = value

    def signature(self) -> tuple:
        return ("scalar", self.avals[0].dtype)


_SCALAR_AVALS: dict = {}
_SCALAR_SIGS: dict = {}


def _scalar_sig(kind) -> int:
    s = _SCALAR_SIGS.get(kind)
    if s is None:
        s = _SCALAR_SIGS[kind] = sig_id(("scalar", kind))
    return s


class Poisoned(Node):
    """Stands for a value whose computation failed; reading it re-raises a clear error."""

    __slots__ = ("error",)

    def __init__(self, avals, error: BaseException):
        super().__init__("poisoned", None, (), (), (), avals)
        self.error = error


# Graph keys are tuples of small ints: each node's signature is interned here once. An id is
# never given to another signature, so clearing the table (at its size limit) costs later
# lookups a recompile at worst, never a wrong cache hit.
_sig_ids: dict = {}
_next_sig = itertools.count()
_SIG_LIMIT = 1 << 20


def sig_id(signature: tuple) -> int:
    """A small int standing for one hashable node signature for the life of the process.
    Numbers in it count by type and bits (``typed``), not by ``==``."""
    signature = typed(signature)
    s = _sig_ids.get(signature)
    if s is None:
        if len(_sig_ids) >= _SIG_LIMIT:
            _sig_ids.clear()
        s = _sig_ids[signature] = next(_next_sig)
    return s


def typed(x):
    """``x`` with every number (in plain tuples and lists, recursively) as its type and exact
    value: Python finds ``0 == 0.0 == 0j == False`` and ``-0.0 == 0.0``, and ``nan`` unequal to
    itself, but ``pow(x, 0)`` and ``pow(x, 0j)`` lower differently, and ``nan_to_num(nan=-0.0)``
    must not run the executable compiled for ``nan=0.0``."""
    t = type(x)
    if t is float:
        return (float, x.hex())
    if t is int or t is bool:
        return (t, x)
    if t is complex:
        return (complex, x.real.hex(), x.imag.hex())
    if t is tuple or t is list:
        return (t, tuple(map(typed, x)))
    return x


def reaches(values) -> set:
    """Every node the Values ``values`` are computed from (their own nodes included)."""
    seen: set = set()
    stack = [v.node for v in values]
    while stack:
        node = stack.pop()
        if node not in seen:
            seen.add(node)
            stack.extend(v.node for v in node.inputs)
    return seen


class Value(NamedTuple):
    """Output ``index`` of ``node``."""

    node: Node
    index: int

    @property
    def aval(self) -> Aval:
        return self.node.avals[self.index]


def leaf(array) -> Value:
    return Value(DeviceData(array), 0)


def output_leaf(array, aval: Aval) -> Value:
    """``leaf(array)`` for an output of a one-device executable whose value had ``aval``: what
    ``DeviceData`` would read off the array (shape, dtype, placement: three jax properties) is
    known (the lowering casts every node's output to its aval: ``executor._check_outputs``), and
    so is its interned signature. A sync makes one per output."""
    node = _new_node(DeviceData)
    node.id = next(_ids)
    node.op = "device_data"
    node.rule = None
    node.args = node.kwargs = node.inputs = ()
    node.avals = avals = (aval,)
    node.source = node.note = None
    s = _DATA_SIGS.get(avals)
    if s is None:
        s = _DATA_SIGS[avals] = sig_id(("device_data", avals, None))
    node.sig = s
    node.array = array
    node.placement = None
    if on_create is not None:
        on_create(node)
    return _new_value(Value, (node, 0))


_new_node = object.__new__
_new_value = tuple.__new__
_DATA_SIGS: dict = {}


# Source lines: skip frames inside torch and xla_compat to find the user's line.
_SKIP = (
    os.path.dirname(__import__("torch").__file__) + os.sep,
    os.path.dirname(os.path.dirname(__file__)) + os.sep,
)


def skip_frames_in(directory: str) -> None:
    """Treat frames under ``directory`` as library code when looking for the user's line."""
    global _SKIP
    _SKIP = _SKIP + (os.path.abspath(directory) + os.sep,)
    _LIBRARY_FILE.clear()


# filename -> is it library code (a frame to skip)? Filenames hash once (str caches its hash).
_LIBRARY_FILE: dict = {}


class Source(tuple):
    """Where a node was created: reads as ``(filename, line, function)``.

    Stored as the frame's code object and instruction offset; the line number is worked out
    only when asked for (errors, dumps, dual-run reports), not on every traced op."""

    __slots__ = ()

    def _resolve(self) -> tuple:
        code, lasti = tuple.__getitem__(self, 0), tuple.__getitem__(self, 1)
        line = None
        for start, end, n in code.co_lines():
            if start <= lasti < end:
                line = n
                break
        return (code.co_filename, line, code.co_name)

    def __getitem__(self, i):
        return self._resolve()[i]

    def __iter__(self):
        return iter(self._resolve())

    def __len__(self) -> int:
        return 3

    def __eq__(self, other):
        return tuple(self) == tuple(other) if isinstance(other, tuple) else NotImplemented

    def __hash__(self):
        return hash(tuple(self))

    def __repr__(self):
        return repr(self._resolve())


_new_source = tuple.__new__


def user_frame(depth: int = 2):
    """The user's frame that is tracing (the first outside torch and the library), as a
    ``Source``. The search starts ``depth`` frames up from this function (2: its caller's
    caller); a caller that knows the frames above it are library code skips them."""
    try:
        f = sys._getframe(depth)
    except ValueError:            # a shorter stack than the caller said
        return None
    library = _LIBRARY_FILE
    while f is not None:
        code = f.f_code
        name = code.co_filename
        skip = library.get(name)
        if skip is None:
            skip = library[name] = name.startswith(_SKIP) or name.startswith("<")
        if not skip:
            return _new_source(Source, (code, f.f_lasti))
        f = f.f_back
    return None
