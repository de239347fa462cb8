"""The tracer: turns one aten call on LazyTensors into IR nodes (or a decomposition, or CPU fallback).

Order for an op: a special handler (transfers, scalars, aliasing no-ops) > a lowering rule
(recorded as a node, output metadata from the meta kernel) > PyTorch's decompositions > CPU
fallback (counted as ``aten::<name>``; an error under XLA_CPU_FALLBACK=error). Mutating ops are
traced through their functional variant and rebind the mutated tensors' values.
"""
from __future__ import annotations

import functools
import math
import re
import sys
import warnings
from typing import NamedTuple

import torch
from torch._decomp import core_aten_decompositions

from .. import _jax, metrics, settings
from ..errors import UnsupportedDtypeError, UnsupportedOpError  # noqa: F401 (re-exported)
from ..lowering import registry
from . import ir
from .ir import Aval, DeviceData, Node, ScalarParam, Slot, Value
from . import tensor as _tensor
from .tensor import DEVICE, LazyTensor, lock

aten = torch.ops.aten


class LoweringError(RuntimeError):
    """A lowering rule failed while a graph was built; names the op and the Python line."""


# ----------------------------------------------------------------------------------------------
# Schema facts, computed once per overload.

def _is_scalar_type(t) -> bool:
    # A Python number in a Tensor slot is a wrapped number: lifted like a Scalar.
    if isinstance(t, (torch.NumberType, torch.TensorType)):
        return True
    if isinstance(t, torch.OptionalType):
        return _is_scalar_type(t.getElementType())
    if isinstance(t, torch.ListType):
        return _is_scalar_type(t.getElementType())
    return False


def _is_float_type(t) -> bool:
    if isinstance(t, torch.OptionalType):
        t = t.getElementType()
    return isinstance(t, torch.FloatType)


@functools.lru_cache(maxsize=None)
def scalar_args(func) -> tuple[frozenset, frozenset]:
    """Positions and keyword names of Scalar-typed arguments (lifted to run-time parameters)."""
    pos, kw = set(), set()
    rule = registry.lookup(func)
    floats = rule is not None and rule.lift_floats
    for i, a in enumerate(func._schema.arguments):
        if _is_scalar_type(a.type) or (floats and _is_float_type(a.type)):
            (kw if a.kwarg_only else pos).add(i)
            kw.add(a.name)
    return frozenset(pos), frozenset(kw)


@functools.lru_cache(maxsize=None)
def mutation_info(func):
    """(mutated argument names in schema order, number of fresh returns, functional op or None)."""
    schema = func._schema
    mutated = [a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write]
    fresh = sum(1 for r in schema.returns if r.alias_info is None)
    return tuple(mutated), fresh, _functional_variant(func, set(mutated))


def _arg_sig(args) -> tuple:
    return tuple((a.name, str(a.type)) for a in args)


def _functional_variant(func, mutated: set):
    name = func._schema.name.split("::", 1)[1]
    own = _arg_sig(func._schema.arguments)
    non_out = _arg_sig(a for a in func._schema.arguments
                       if not (a.name in mutated and a.kwarg_only))
    candidates = []
    if name.startswith("__i") and name.endswith("__"):
        candidates.append("__" + name[3:])
    elif name.endswith("_") and not name.endswith("__"):
        candidates.append(name[:-1])
    candidates += [name, name + "_functional"]
    for base in candidates:
        packet = getattr(aten, base, None)
        if packet is None:
            continue
        for ov_name in packet.overloads():
            ov = getattr(packet, ov_name)
            if ov is func or ov._schema.is_mutable:
                continue
            sig = _arg_sig(ov._schema.arguments)
            if sig == own or sig == non_out:
                return ov
    return None


# ----------------------------------------------------------------------------------------------
# Converting arguments.

def _meta_of(t: torch.Tensor) -> torch.Tensor:
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")


def to_meta(x, memo=None):
    """Meta twins of the tensors in ``x``; ``memo`` maps id(tensor) -> its twin."""
    if isinstance(x, torch.Tensor):
        m = _meta_of(x)
        if memo is not None:
            memo[id(x)] = m
        return m
    if isinstance(x, (list, tuple)):
        return type(x)(to_meta(e, memo) for e in x)
    if isinstance(x, torch.device):
        return torch.device("meta")
    return x


def _input_value(t: torch.Tensor, func) -> Value:
    if isinstance(t, LazyTensor):
        v = t._value
        if type(v.node) is ir.Poisoned:
            raise v.node.error
        return v
    if t.device.type == "cpu" and t.dim() == 0:
        metrics.inc("TransferToDevice")
        return ir.leaf(_jax.from_torch(t))
    if t.device.type == "meta":
        raise RuntimeError(f"xla_compat: {func} got a meta tensor; meta tensors carry no data")
    raise RuntimeError(
        f"Expected all tensors to be on the same device, but found at least two devices, "
        f"{DEVICE} and {t.device}! (when checking arguments for {func}). "
        f"Move the {t.device} tensor with .to('hlo') first.")


class _Template:
    """Builds an argument template: tensors and lifted scalars become Slots, the rest is static."""

    def __init__(self, func, lift: bool):
        self.func = func
        self.inputs: list[Value] = []
        self.lift_pos, self.lift_kw = scalar_args(func) if lift else (frozenset(), frozenset())

    def convert(self, x, lift: bool):
        if isinstance(x, torch.Tensor):
            self.inputs.append(_input_value(x, self.func))
            return Slot(len(self.inputs) - 1)
        if lift and (type(x) is float or type(x) is int):
            self.inputs.append(Value(ScalarParam(x), 0))
            return Slot(len(self.inputs) - 1)
        if isinstance(x, (list, tuple)):
            return tuple(self.convert(e, lift) for e in x)
        if isinstance(x, torch.SymInt):
            return int(x)
        return x

    def build(self, args, kwargs):
        a = tuple(self.convert(x, i in self.lift_pos) for i, x in enumerate(args))
        # (by name: inputs come in ``call_values``' order, as a plan replays them)
        k = tuple((n, self.convert(kwargs[n], n in self.lift_kw)) for n in sorted(kwargs))
        return a, k


def fill(template, values):
    """Put input values where the Slots of a template are."""
    if type(template) is Slot:
        return values[template.k]
    if type(template) is tuple:
        return tuple(fill(e, values) for e in template)
    return template


# ----------------------------------------------------------------------------------------------
# Recording nodes.

def _flat_tensors(out) -> list:
    if isinstance(out, (torch.Tensor, TMeta)):
        return [out]
    if isinstance(out, (list, tuple)):
        return [t for e in out for t in _flat_tensors(e)]
    return []


def _avals(metas) -> tuple:
    return tuple(Aval(tuple(m.shape), _jax.to_jax_dtype(m.dtype)) for m in metas)


@functools.lru_cache(maxsize=None)
def op_name(func) -> str:
    """"aten.add.Tensor" (OpOverload.__str__ formats it anew on every call)."""
    return str(func)


@functools.lru_cache(maxsize=None)
def overload_named(name: str):
    """The aten OpOverload an IR node's op name ("aten.mul.Tensor") names, or None."""
    parts = name.split(".")
    if len(parts) != 3 or parts[0] != "aten":
        return None
    packet = getattr(aten, parts[1], None)
    return getattr(packet, parts[2], None) if packet is not None else None


def make_node(func, rule: registry.Rule, args, kwargs, out_metas) -> Node:
    """A node applying ``rule`` to ``args``; its outputs are described by ``out_metas``."""
    tb = _Template(func, lift=not rule.static)
    targs, tkwargs = tb.build(args, kwargs)
    try:
        avals = _avals(out_metas)
    except UnsupportedDtypeError as e:
        raise UnsupportedDtypeError(f"{e} (in {func}, inputs {describe(args)})") from None
    inputs = tb.inputs
    if rule.random:
        from . import rng
        targs = targs + (Slot(len(inputs)),)
        inputs = inputs + [rng.state()]
        avals = avals + (rng.STATE_AVAL,)
    source = ir.user_frame() if settings.get().ir_debug else None
    node = Node(op_name(func), rule, targs, tkwargs, tuple(inputs), avals, source)
    if rule.random:
        from . import rng
        rng.advance(Value(node, len(avals) - 1))
    metrics.inc("IrNodes")
    return node


def map_nested(x, fn, leaves=()):
    """``x`` with ``fn`` applied to everything in it that is not a list or tuple (or is one of
    the ``leaves`` types), lists and tuples rebuilt as their type.

    The one walk of nested arguments: a nested function that calls itself is a reference
    cycle (function -> closure cell -> function), and whatever its closure holds (a node, the
    call's device tensors) then lives until the cyclic collector runs; a dead intermediate kept
    so becomes an extra output of the next sync, and another graph."""
    if isinstance(x, (list, tuple)) and not isinstance(x, leaves):
        return type(x)(map_nested(e, fn, leaves) for e in x)
    return fn(x)


def wrap_outputs(cls, meta_out, node: Node, start: int = 0):
    """Replace each meta tensor in ``meta_out`` by a LazyTensor on the node's next output."""
    counter = [start]

    def conv(m):
        if isinstance(m, TMeta):
            i = counter[0]
            counter[0] += 1
            return cls(Value(node, i), m.shape, m.dtype, m.stride, m.offset)
        if isinstance(m, torch.Tensor):
            i = counter[0]
            counter[0] += 1
            return cls(Value(node, i), m.shape, m.dtype, m.stride(), m.storage_offset())
        return m

    return map_nested(meta_out, conv, TMeta)


class TMeta(NamedTuple):
    """What the meta kernel said about one output tensor."""

    shape: tuple
    dtype: torch.dtype
    stride: tuple
    offset: int


def _desc(x):
    if isinstance(x, torch.Tensor):
        return TMeta(tuple(x.shape), x.dtype, tuple(x.stride()), x.storage_offset())
    if isinstance(x, (list, tuple)):
        return type(x)(_desc(e) for e in x)
    return x


_NUMBER = (int, float, bool, complex)


def key_parts(x, out: list, tensor, number) -> bool:
    """Append a hashable description of ``x`` (an argument, or a list or tuple of them) to
    ``out``: ``tensor(t)`` for a tensor, ``number(n)`` for a Python number, the length and each
    element for a sequence, anything hashable as it is. False where something is unhashable."""
    if isinstance(x, torch.Tensor):
        out.append(tensor(x))
    elif type(x) in _NUMBER:
        out.append(number(x))
    elif isinstance(x, (list, tuple)):
        out.append(len(x))
        for e in x:
            if not key_parts(e, out, tensor, number):
                return False
    else:
        try:
            hash(x)
        except TypeError:
            return False
        out.append(x)
    return True


def _layout_of(t) -> tuple:
    return (t.shape, t.stride(), t.dtype, t.storage_offset())


def _number_of(n) -> tuple:
    return (type(n), n)        # 1, 1.0 and True promote differently


def _key_of(x, out: list) -> bool:
    """Append a hashable description of ``x`` to ``out`` (tensors by layout and dtype, numbers
    by type and value); False if it has none."""
    return key_parts(x, out, _layout_of, _number_of)


def call_key(head: list, args, kwargs):
    """``head`` followed by ``_key_of``'s description of ``args`` and of the sorted ``kwargs``,
    as a tuple (a memo key for the call); None where an argument has no description."""
    if _key_of(args, head) and (not kwargs or _key_of(tuple(sorted(kwargs.items())), head)):
        return tuple(head)
    return None


def op_table(table: dict):
    """A decorator factory: ``@deco(op1, op2)`` enters the function in ``table`` for each op
    (the one registration pattern of the tracer's and the paths' per-op tables). An op has one
    function per table: a second is refused (two modules registering for one op, the later
    silently winning, hid a check), unless ``wraps=True`` says it calls the one it replaces."""
    def deco(*ops, wraps: bool = False):
        def register(fn):
            for op in ops:
                held = table.get(op)
                if held is not None and held is not fn and not wraps:
                    raise RuntimeError(f"xla_compat: {op} already has {held.__qualname__} in "
                                       f"this table; {fn.__qualname__} would replace it")
                table[op] = fn
            return fn
        return register
    return deco


# Checks eager makes that PyTorch's meta kernels skip (``mm`` of two dtypes computes on meta):
# ``fn(func, bound_args)`` raises eager's error. Run with the meta kernel, so once per signature.
_EAGER_CHECKS: dict = {}
eager_check = op_table(_EAGER_CHECKS)   # fn(func, bound) for ops; see ``meta``
# The same, for checks eager makes before its meta function's own (pow's negative integer
# exponent comes before an in-place op's cast error).
_EAGER_FIRST_CHECKS: dict = {}
eager_check_first = op_table(_EAGER_FIRST_CHECKS)


# Output shapes eager gives and PyTorch's meta kernels do not (eval-mode batch norm returns empty
# save_mean/save_invstd on the CPU, its meta kernel [C]): ``fn(func, bound, out)`` returns the
# meta output to use instead. Run with the meta kernel, so once per signature.
_EAGER_OUTPUTS: dict = {}
eager_output = op_table(_EAGER_OUTPUTS)  # fn(func, bound, out) -> out for ops; see ``meta``
# Arguments eager takes and an op's meta kernel refuses (torch's meta decomposition of
# _batch_norm_with_update passes weight=None on to a binding that refuses it): ``fn(func, args,
# kwargs)`` returns the (args, kwargs) to run the meta kernel on instead.
_META_ARGUMENTS: dict = {}
meta_arguments = op_table(_META_ARGUMENTS)


def meta_args(func, args, kwargs) -> tuple:
    """(args, kwargs) to run ``func``'s meta kernel on: ``meta_arguments``' where it has some."""
    fix = _META_ARGUMENTS.get(func)
    return (args, kwargs) if fix is None else fix(func, args, kwargs)
# Checks of every op, run with its meta kernel (so once per signature): ``fn(func, args,
# kwargs)`` raises eager's error for a call eager refuses (eager_checks.cpu_kernel_dtypes).
_EVERY_OP_CHECKS: list = []


def register_every_op_check(fn):
    _EVERY_OP_CHECKS.append(fn)
    return fn


def every_op_checks(func, args, kwargs) -> None:
    """Run the checks every op gets (``eager_checks.cpu_kernel_dtypes``: eager's CPU kernel asked
    about the call's dtypes)."""
    for check in _EVERY_OP_CHECKS:
        check(func, args, kwargs)


def _flat_key(func, args, kwargs=None):
    """The meta-cache key of a call whose arguments are tensors, numbers, None, dtypes or lists
    of free floats (the common case, built without recursion); None otherwise. A free float
    (``arg_key``) is keyed by its type: it decides no output metadata and no check.
    ``id(func)``: overloads live for the process, and OpOverload.__hash__ is Python code."""
    parts = [id(func)]
    for x in call_values(args, kwargs):
        tx = type(x)
        if tx is float or tx is list or tx is tuple:
            k = arg_key(func, x)
            if k is NO_KEY:
                return None
            parts.append(k)
        elif tx in _NUMBER:
            parts.append((tx, x))
        elif isinstance(x, torch.Tensor):
            parts.append((x.shape, x.stride(), x.dtype, x.storage_offset()))
        elif x is None or tx is torch.dtype:
            parts.append(x)
        else:
            return None
    if kwargs:
        parts.append(tuple(sorted(kwargs)))
    return tuple(parts)


def meta_key(func, args, kwargs):
    """The key of what a meta kernel says of a call (the meta cache's, the functional path's
    memo of passed meta references): ``_flat_key``'s where it applies, else ``call_key``'s; None
    where an argument has no description."""
    key = _flat_key(func, args, kwargs)
    return key if key is not None else call_key([id(func)], args, kwargs)


_META_CACHE: dict = {}
_META_CACHE_LIMIT = 65536


def meta(func, args, kwargs):
    """(output description, {flat tensor-argument position: its description after the op}).

    Cached on the op and its arguments' shapes, strides, dtypes and static values, so a traced
    loop runs each distinct op's meta kernel once. Errors are never cached.
    """
    key = meta_key(func, args, kwargs)
    if key is not None:
        hit = _META_CACHE.get(key)
        if hit is not None:
            metrics.inc("MetaCacheHit")
            return hit
    memo: dict = {}
    check = _EAGER_FIRST_CHECKS.get(func)
    if check is not None:
        check(func, bind(func, args, kwargs))
    out = run_meta(func, *meta_args(func, args, kwargs), memo)
    check = _EAGER_CHECKS.get(func)
    if check is not None:
        check(func, bind(func, args, kwargs))
    every_op_checks(func, args, kwargs)
    fix = _EAGER_OUTPUTS.get(func)
    if fix is not None:
        out = fix(func, bind(func, args, kwargs), out)
    out = _wrapped_number_strides(func, args, kwargs, out)
    flat = _flat_tensors((args, list(kwargs.values())))
    after = {i: _desc(memo[id(t)]) for i, t in enumerate(flat) if id(t) in memo}
    result = (_desc(out), after)
    if key is not None:
        keep(_META_CACHE, key, result, _META_CACHE_LIMIT)
    return result


@functools.lru_cache(maxsize=None)
def _tensor_slots(func) -> tuple:
    """(position, name) of the plain ``Tensor`` arguments of a pointwise op, else ()."""
    if torch.Tag.pointwise not in func.tags:
        return ()
    return tuple((i, a.name) for i, a in enumerate(func._schema.arguments)
                 if isinstance(a.type, torch.TensorType))


def _wrapped_number_strides(func, args, kwargs, out):
    """Eager's output strides where a Python number sits in a Tensor slot (``x + 2``).

    Eager wraps the number in a 0-dim tensor, and TensorIterator then lays the output out like
    the dimensioned input (``x.t() + 2`` keeps ``x.t()``'s strides even across size-1 dims); the
    meta kernel sees a Python scalar and answers contiguous. Re-running it with a 0-dim tensor of
    the output's dtype (only the strides are taken) gives eager's layout."""
    slots = _tensor_slots(func)
    if not slots or not isinstance(out, torch.Tensor) or out.dim() < 2:
        return out
    args = list(args)
    kwargs = dict(kwargs)
    changed = False
    for i, name in slots:
        where, key = (args, i) if i < len(args) else (kwargs, name)
        v = where[key] if (i < len(args) or name in kwargs) else None
        if type(v) in _NUMBER:
            where[key] = torch.scalar_tensor(v, dtype=out.dtype, device="meta")
            changed = True
    if not changed:
        return out
    try:
        again = func(*to_meta(args), **{k: to_meta(v) for k, v in kwargs.items()})
    except Exception:
        return out
    if not isinstance(again, torch.Tensor) or again.shape != out.shape or \
            again.stride() == out.stride():
        return out
    return torch.empty_strided(out.shape, again.stride(), dtype=out.dtype, device="meta")


def run_meta(func, args, kwargs, memo=None):
    try:
        return func(*to_meta(args, memo), **{k: to_meta(v, memo) for k, v in kwargs.items()})
    except NotImplementedError:
        raise
    except Exception as e:  # the same error type eager raises, with the op named
        every_op_checks(func, args, kwargs)    # eager's own refusal first, where it has one
        _reraise(eager_cast_error(func, args, kwargs, e) or e, func, (args, list(kwargs.values())))


def raised_by(func, inputs, more: str = "") -> str:
    """The line an error of ``func`` ends with: the op and its inputs' dtypes and shapes
    (``describe``), then ``more`` (what to do about it)."""
    return f"\n  (xla_compat: raised by {func} with inputs {describe(inputs)}{more})"


def _reraise(e: Exception, func, args):
    msg = str(e)
    if str(func) not in msg:
        msg = msg + raised_by(func, args)
    try:
        err = type(e)(msg)
    except Exception:
        raise e
    raise err.with_traceback(e.__traceback__) from None


def describe(args) -> str:
    parts = []
    for a in _flat_tensors(args):
        parts.append(f"{str(a.dtype).replace('torch.', '')}{list(a.shape)}")
    return ", ".join(parts) or "no tensors"


# ----------------------------------------------------------------------------------------------
# The entry point.

_SPECIAL: dict = {}
special = op_table(_SPECIAL)


class PathMixError(RuntimeError):
    """One op got tensors that live on two different paths."""


def check_paths(types, func) -> None:
    """Raise if ``types`` (from __torch_dispatch__) hold LazyTensors of more than one path."""
    names = sorted({t.path_name for t in types if issubclass(t, LazyTensor)})
    if len(names) > 1:
        raise path_mix_error(func, names)


def path_mix_error(func, names) -> PathMixError:
    """The error for ``func`` getting tensors of the paths ``names`` (sorted, at least two)."""
    op = func if isinstance(func, torch._ops.OpOverload) else \
        getattr(func, "__qualname__", None) or getattr(func, "__name__", func)
    return PathMixError(
        f"xla_compat: {op} got tensors from the {names[0]} and the {names[1]} path in one op. "
        f"Tensors remember the path they were created on; move one across with "
        f"xc.to_path(tensor, {names[0]!r}) (or {names[1]!r}) before combining them.")


_MUTATING_DUNDERS = frozenset({"__setitem__", "__iadd__", "__isub__", "__imul__", "__itruediv__",
                               "__ifloordiv__", "__imod__", "__ipow__", "__iand__", "__ior__",
                               "__ixor__", "__ilshift__", "__irshift__", "__imatmul__"})


def is_mutating_function(func, kwargs) -> bool:
    """Does this torch-function-level call write into one of its arguments?"""
    name = getattr(func, "__name__", "")
    return ((name.endswith("_") and not name.endswith("__")) or name in _MUTATING_DUNDERS
            or (kwargs is not None and kwargs.get("out") is not None))


def check_mutation_paths(cls, func, args, kwargs) -> None:
    """Raise PathMixError if a mutation of a ``cls`` tensor gets a device tensor of another path.

    Checked at the torch-function level because a functional wrapper argument makes PyTorch's
    Functionalize kernel fail with an internal assert before __torch_dispatch__ is reached."""
    from .. import paths
    mine = cls.path_name
    for x in (*args, *(kwargs or {}).values()):
        for t in (x if isinstance(x, (list, tuple)) else (x,)):
            if isinstance(t, torch.Tensor) and type(t) is not cls and t.device.type == DEVICE.type:
                other = paths.of(t)
                if other is not None and other != mine:
                    raise path_mix_error(func, sorted((mine, other)))


def trace(cls, func, args, kwargs):
    with lock:
        handler = _SPECIAL.get(func)
        if handler is not None:
            return handler(cls, func, args, kwargs)
        if func._schema.is_mutable:
            return trace_mutation(cls, func, args, kwargs)
        rule = registry.lookup(func)
        if rule is not None:
            return trace_rule(cls, func, rule, args, kwargs)
        return decompose_or_fallback(cls, func, args, kwargs)


def trace_rule(cls, func, rule, args, kwargs):
    """``func`` by its lowering ``rule``: from the call's plan, else the cached meta kernel with
    eager's checks, the node and the outputs, remembered as a plan. Also what a special
    handler calls once it has looked at the values (``host_values``: index bounds): its op's
    plan never replays before the handler (``_remember_plan``)."""
    planned = not rule.random
    if planned:          # (a path's handler that declined the op may bring it here)
        out = replay(cls, func, args, CHECKED, kwargs)
        if out is not None:
            return out
    meta_out, _ = meta(func, args, kwargs)
    node = make_node(func, rule, args, kwargs, _flat_tensors(meta_out))
    if planned:
        _remember_plan(cls, func, args, kwargs, node, meta_out)
    return wrap_outputs(cls, meta_out, node)


# ----------------------------------------------------------------------------------------------
# Trace plans: the fast path. Once an op has been traced with some argument geometry, the next
# call with the same op, tensor geometries and static values repeats what ``trace`` did (the
# same rule, template, output shapes and strides) without the schema, meta-cache and template
# work: one key, one dictionary lookup, the node and the output tensors.

class Plan:
    """What ``trace`` did for one op and argument geometry, to be done again."""

    __slots__ = ("op", "rule", "args", "kwargs", "kinds", "avals", "outs", "single", "sig",
                 "geos", "level", "tensors_at")

    def __init__(self, op, rule, args, kwargs, kinds, avals, outs, single, sig, level):
        self.op, self.rule, self.args, self.kwargs = op, rule, args, kwargs
        self.kinds, self.avals, self.outs, self.single, self.sig = kinds, avals, outs, single, sig
        self.level = level        # how far a call must have come to replay it (``replay``)
        # single: None for one output tensor, else the type of the output sequence
        # each output's geometry as a plan key holds it (see _geometry_of)
        self.geos = tuple(None if m is None else (tuple(m.shape), tuple(m.stride), m.dtype,
                                                  m.offset) for m in outs)
        self.tensors_at = tensors_at(kinds)


def tensors_at(kinds: tuple):
    """The positions of a plan's tensor arguments when tensors are all it takes (no lifted
    number, no list): ``plan_node``'s fast path, most ops' case; else None."""
    if all(k == _TENSOR or k == 0 for k in kinds):
        return tuple(i for i, k in enumerate(kinds) if k == _TENSOR)
    return None


def keep(table: dict, key, value, limit: int):
    """``table[key] = value`` in a memo bounded to ``limit`` entries (full: it starts over; the
    memos hold what tracing a few shapes gives, so a loop refills them at once). ``value``."""
    if len(table) >= limit:
        table.clear()
    table[key] = value
    return value


# Plan argument kinds (0: static, already in the template): a tensor, a lifted number, and lists
# of each (a foreach op's Tensor[] and Scalar[]).
_TENSOR, _SCALAR, _TENSORS, _SCALARS = 1, 2, 3, 4
_PLANS: dict = {}
_PLAN_LIMIT = 65536


def _plan_key(cls, func, args, kwargs=None):
    """The plan key of a call whose arguments are ``cls`` tensors, numbers, static values or
    lists of ints, floats or ``cls`` tensors (``arg_key``); None for anything else (the call
    takes the full tracer). Runs once per traced op (``replay``): a tensor's geometry comes
    from its cache. Keyword arguments follow the positional ones by name (``call_values``
    lists their values in that order)."""
    parts = [id(func), cls]
    for x in args:
        tx = type(x)
        if tx is cls:
            g = x._geo                     # geometry(x), inline: this runs for every op
            parts.append(g if g is not None and not CHECK_GEOMETRY else _geometry_of(x))
        elif tx is int:
            parts.append((tx, x))          # static_key's for a number, inline
        elif tx is float:                  # arg_key's, inline (W1's x * 0.5)
            free = _FREE.get(id(func))
            if free is None:
                free = free_floats(func)
            parts.append(float if free and -_HALF_MAX <= x <= _HALF_MAX else
                         (tx, x) if x == x and x else ir.typed(x))
        else:
            k = arg_key(func, x, cls)
            if k is NO_KEY:
                return None
            parts.append(k)
    if kwargs:
        for name in sorted(kwargs):
            x = kwargs[name]
            parts.append(name)
            parts.append(geometry(x) if type(x) is cls else arg_key(func, x, cls))
        if NO_KEY in parts:
            return None
    return tuple(parts)


def call_values(args, kwargs) -> tuple:
    """The arguments in the order plan keys and templates list them: positional, then keyword
    by name."""
    if not kwargs:
        return args
    return (*args, *(kwargs[n] for n in sorted(kwargs)))


# Ops whose Python-float arguments all sit in Scalar (or wrapped-number) positions, which are
# lifted to run-time parameters and decide nothing at trace time: not the output's shape, dtype
# or strides, and no check of eager's (alpha, clamp bounds and exponents are checked for
# overflow, so only floats that no float dtype overflows on qualify). A plan key holds such a
# float's type, not its value: a learning rate, bias correction or step size that changes every
# step replays one plan, and the graph takes the value at run time (ScalarParam) as before.
_FREE_FLOAT_OPS = frozenset({"add", "sub", "rsub", "mul", "div", "true_divide", "addcmul",
                             "addcdiv", "lerp", "clamp", "clamp_min", "clamp_max", "pow",
                             "addmm", "addmv", "addbmm", "baddbmm", "addr"})
_FREE_FLOAT_OPS |= {"_foreach_" + name for name in _FREE_FLOAT_OPS}
_HALF_MAX = 65504.0             # float16's largest finite value (the narrowest float dtype)
_FREE: dict = {}                # id(func) -> are its floats free (see _free_floats)


def arg_key(func, x, cls=None):
    """What a plan key holds for ``func``'s argument ``x`` (not a ``cls`` tensor):
    ``static_key``'s, but only the type of a free float (or the type and length of a list of
    them; ``_FREE_FLOAT_OPS``), and each geometry of a list of ``cls`` tensors."""
    tx = type(x)
    if tx is float:
        if -_HALF_MAX <= x <= _HALF_MAX and free_floats(func):
            return float
    elif (tx is list or tx is tuple) and x:
        t0 = type(x[0])
        if t0 is cls and all(type(e) is cls for e in x):
            return (tx, _TENSORS, tuple(map(geometry, x)))
        if (t0 is float and all(type(e) is float and -_HALF_MAX <= e <= _HALF_MAX for e in x)
                and free_floats(func)):
            return (tx, float, len(x))
    return static_key(x)


def free_floats(func) -> bool:
    """Are ``func``'s floats free (``_FREE_FLOAT_OPS``)? Decided once per op."""
    free = _FREE.get(id(func))
    if free is None:
        free = _FREE[id(func)] = _free_floats(func)
    return free


def _free_floats(func) -> bool:
    name = func._schema.name.split("::", 1)[1]
    functional = mutation_info(func)[2] if func._schema.is_mutable else None
    rule = registry.lookup(func) or (registry.lookup(functional) if functional else None)
    if rule is None or rule.static or rule.random:
        return False
    if rule.lift_floats:
        return True                 # (every float-typed argument is lifted: scalar_args)
    if name.rstrip("_") not in _FREE_FLOAT_OPS:
        return False
    # every argument that can hold a float is lifted (no float-typed static argument)
    return not any(isinstance(a.type, torch.FloatType) or (
        isinstance(a.type, (torch.OptionalType, torch.ListType))
        and isinstance(a.type.getElementType(), torch.FloatType))
        for a in func._schema.arguments)


def free_float_kinds_ok(func, args, kwargs, kinds) -> bool:
    """Does every free float of the call take lifted slots (kind _SCALAR or _SCALARS) in a
    plan's template? A plan whose key holds only a float's type must not bake its value in."""
    for x, kind in zip(call_values(args, kwargs), kinds):
        if kind != _SCALAR and kind != _SCALARS:
            k = arg_key(func, x)
            if k is float or (type(k) is tuple and len(k) == 3 and k[1] is float):
                return False
    return True


NO_KEY = object()


def static_key(x):
    """What a plan key holds for a non-tensor argument (numbers by type and value: 1, 1.0 and
    True promote differently), or NO_KEY for one no plan may hold."""
    tx = type(x)
    if tx in _NUMBER:
        # a zero's sign and NaN by their bits (-0.0 == 0.0, and nan is unequal to itself)
        return (tx, x) if x == x and x else ir.typed(x)
    if x is None or tx in _STATIC:
        return x
    if tx is list or tx is tuple:
        if all(type(e) is int for e in x):
            return (tx, tuple(x))
        if all(type(e) is bool for e in x):          # (an output mask: kept apart from 0, 1)
            return (tx, bool, tuple(x))
    return NO_KEY


# Static argument types a plan key holds as they are (hashable, and equal only when alike).
_STATIC = frozenset({torch.dtype, torch.memory_format, torch.layout, torch.device, str})


def _remember_plan(cls, func, args, kwargs, node: Node, meta_out, kinds=None,
                   special_ok=False) -> None:
    """Keep what tracing this call gave as its plan. ``kinds``: each call value's kind, where a
    handler built the node from other arguments than the call's (``_to_copy``); by default
    read off the node's templates, which then follow the call's arguments. A plan of an op with
    a special handler replays only once the handler ran, unless ``special_ok`` (the handler
    decides on what the key holds)."""
    key = _plan_key(cls, func, args, kwargs)
    if key is None:
        return
    if kinds is None:
        kinds = []
        templates = (*node.args, *(t for _, t in node.kwargs))
        for x, t in zip(call_values(args, kwargs), templates):
            if type(t) is Slot:
                kinds.append(_TENSOR if isinstance(x, torch.Tensor) else _SCALAR)
            elif type(t) is tuple and any(type(e) is Slot for e in t):
                if not all(type(e) is Slot for e in t):
                    return                # a list mixing tensors or lifted numbers with others
                kinds.append(_TENSORS if isinstance(x[0], torch.Tensor) else _SCALARS)
            else:
                kinds.append(0)
    if not free_float_kinds_ok(func, args, kwargs, kinds):
        return
    if isinstance(meta_out, TMeta):
        outs, single = (meta_out,), None
    elif (type(meta_out) in (tuple, list) and any(type(m) is TMeta for m in meta_out)
          and all(type(m) is TMeta or m is None for m in meta_out)):
        # (None: an output the call's mask left out, convolution_backward's grad_input of a
        # first layer; decided by the mask, which the key holds)
        outs, single = tuple(meta_out), type(meta_out)
    else:
        return
    if func in _SPECIAL and not special_ok:
        level = CHECKED        # never before the special handler (it looks at index values)
    else:
        level = 0 if cls.plans_ok(func) else 1
    keep(_PLANS, key, Plan(node.op, node.rule, node.args, node.kwargs, tuple(kinds), node.avals,
                           outs, single, node.sig_id(), level), _PLAN_LIMIT)


# Other caches of what tracing an op gives (a path's own), dropped with the plans.
plan_memos: list = []


def forget_plans() -> None:
    """Drop every plan (a rule was replaced: ``registry.override``)."""
    _PLANS.clear()
    _FREE.clear()
    scalar_args.cache_clear()
    for memo in plan_memos:
        memo.clear()


CHECKED = 2     # ``replay``'s ``handled`` once a special handler has looked at the values


def replay(cls, func, args, handled=False, kwargs=None):
    """The result of ``trace(cls, func, args, kwargs)`` from its plan, or None without one.

    How far the call has come (``handled``) decides which plans may replay (their ``level``):
    first thing in a path's ``__torch_dispatch__`` (False) only ops the path leaves to the
    tracer (``plans_ok``); once the path has handled the op (True) every op's plan (a plan is
    what the tracer alone did), except those of ops with a special handler, which replay only
    from ``trace_rule`` after the handler's checks (``CHECKED``)."""
    key = _plan_key(cls, func, args, kwargs)
    plan = _PLANS.get(key) if key is not None else None
    if plan is None or handled < plan.level:
        return None
    with lock:
        node = plan_node(plan, call_values(args, kwargs), 3)   # past replay's caller
        if plan.single is None:
            m = plan.outs[0]
            t = cls(_value_of(node, 0), m.shape, m.dtype, m.stride, m.offset)
            t._geo = plan.geos[0]
            return t
        outs = []
        i = 0                 # the node's output (an output a mask left out is None, no output)
        for m, geo in zip(plan.outs, plan.geos):
            if m is None:
                outs.append(None)
                continue
            t = cls(_value_of(node, i), m.shape, m.dtype, m.stride, m.offset)
            t._geo = geo
            outs.append(t)
            i += 1
        return outs if plan.single is list else tuple(outs)


def restrided_plan(plan, outs) -> Plan | None:
    """``plan`` giving outputs laid out as ``outs`` (tensors of the same shapes and dtypes, e.g.
    with eager's strides where a path restrides the tracer's result), replayable first thing,
    or None where they are not alike. A path that always restrides an op's result keeps it in
    the plan's place: the tracer's own callers then get the restrided tensors too."""
    if len(outs) != len(plan.outs) or any(m is None or tuple(t.shape) != tuple(m.shape)
                                          or t.dtype != m.dtype for t, m in zip(outs, plan.outs)):
        return None
    metas = tuple(TMeta(tuple(t.shape), t.dtype, tuple(t.stride()), t.storage_offset())
                  for t in outs)
    return Plan(plan.op, plan.rule, plan.args, plan.kwargs, plan.kinds, plan.avals, metas,
                plan.single, plan.sig, 0)


def _value_of(node: Node, index: int) -> Value:
    """``Value(node, index)`` without the named tuple's Python-level ``__new__`` (per traced op)."""
    return _new_tuple(Value, (node, index))


_new_tuple = tuple.__new__


def plan_node(plan, args, depth: int = 1) -> Node:
    """The node a plan (op, rule, argument and keyword templates, ``kinds`` of the arguments and
    ``tensors_at`` of them, avals, interned signature) builds on ``args`` (``call_values``'
    order): their values where it takes tensors, new lifted numbers where it takes numbers.
    Called with the tracer lock held; ``depth`` as for ``traced_node``."""
    at = plan.tensors_at
    if at is not None:                   # tensors only: no kind to look at
        inputs = []
        for i in at:
            v = args[i]._value
            if type(v.node) is _POISONED:
                raise v.node.error
            inputs.append(v)
        return traced_node(plan.op, plan.rule, plan.args, tuple(inputs), plan.avals, plan.sig,
                           depth + 1, plan.kwargs)
    inputs = []
    for kind, x in zip(plan.kinds, args):
        if kind == _TENSOR:
            v = x._value
            if type(v.node) is _POISONED:
                raise v.node.error
            inputs.append(v)
        elif kind == _SCALAR:
            inputs.append(_new_tuple(Value, (ScalarParam(x), 0)))
        elif kind == _TENSORS:
            for t in x:
                v = t._value
                if type(v.node) is _POISONED:
                    raise v.node.error
                inputs.append(v)
        elif kind == _SCALARS:
            inputs.extend(_new_tuple(Value, (ScalarParam(e), 0)) for e in x)
    return traced_node(plan.op, plan.rule, plan.args, tuple(inputs), plan.avals, plan.sig,
                       depth + 1, plan.kwargs)


_COUNTERS = metrics._counters


def traced_node(op: str, rule, template: tuple, inputs: tuple, avals: tuple, sig,
                depth: int = 1, kw_template: tuple = ()) -> Node:
    """A new node of the user's program (``template`` and ``kw_template``: its positional and
    keyword templates), its source line recorded when XLA_IR_DEBUG is on and counted in IrNodes. Called with the tracer lock held. The search for
    the user's line starts ``depth`` frames up from this function (1: its caller); a caller
    that knows the frames above it are library code passes more."""
    node = Node(op, rule, template, kw_template, inputs, avals,
                ir.user_frame(depth + 1) if settings.get().ir_debug else None, sig)
    _COUNTERS["IrNodes"] += 1         # metrics.bump, inline: the tracer lock is held
    return node


# A tensor's geometry is cached on it (``_geo``, set from its plan or at first use, forgotten by
# ``tensor.take_geometry``). With CHECK_GEOMETRY (on in the test suite) every use recomputes it
# and a stale cache raises: a metadata change that bypassed take_geometry would pick wrong plans.
CHECK_GEOMETRY = False


def geometry(x) -> tuple:
    """A device tensor's geometry as plan keys hold it, from its cache."""
    g = x._geo
    if g is None or CHECK_GEOMETRY:
        g = _geometry_of(x)
    return g


def _geometry_of(x) -> tuple:
    g = (tuple(x.shape), x.stride(), x.dtype, x.storage_offset())
    if CHECK_GEOMETRY and x._geo is not None and x._geo != g:
        raise AssertionError(f"xla_compat: stale cached geometry {x._geo} on a tensor that is "
                             f"now {g}; its metadata changed without tensor.take_geometry")
    x._geo = g
    return g


_POISONED = ir.Poisoned


@functools.lru_cache(maxsize=None)
def _decompositions() -> dict:
    # Core-aten decompositions only: the full table lowers to prims, which we do not lower.
    return dict(core_aten_decompositions())


def decompose_or_fallback(cls, func, args, kwargs):
    _check_before_decomposing(func, args, kwargs)
    decomposed = func.decompose(*args, **kwargs)
    if decomposed is not NotImplemented:
        return decomposed
    decomp = _decompositions().get(func)
    if decomp is not None:
        metrics.inc("Decomposed")
        return decomp(*args, **kwargs)
    return cpu_fallback(cls, func, args, kwargs)


# meta_key()s of decomposed calls whose every-op checks passed (they run once per signature, as
# with a meta kernel's).
_CHECKED_DECOMPOSED: dict = {}


def _check_before_decomposing(func, args, kwargs) -> None:
    """An op without a rule runs as its decomposition, whose parts may take dtypes the op's CPU
    kernel refuses (``logaddexp`` of integers decomposes to ops that take them): the every-op
    checks (``eager_checks.cpu_kernel_dtypes``) ask about the op itself first."""
    if not _EVERY_OP_CHECKS:
        return
    key = meta_key(func, args, kwargs)
    if key is not None and key in _CHECKED_DECOMPOSED:
        return
    every_op_checks(func, args, kwargs)
    if key is not None:
        keep(_CHECKED_DECOMPOSED, key, True, _META_CACHE_LIMIT)


def functional_results(cls, func, args, kwargs):
    """Trace a mutating op out of place.

    Returns (meta_out, node, mutated) where ``mutated`` pairs each mutated argument with the
    Value it should take; the node's first outputs are the op's fresh returns.
    """
    names, fresh, functional = mutation_info(func)
    rule = registry.lookup(func)
    target = func
    if rule is None and functional is not None:
        rule = registry.lookup(functional)
        target = functional
    if rule is None:
        return None
    meta_out, after = meta(func, args, kwargs)
    bound = bind(func, args, kwargs)
    mutated_tensors = []
    for n in names:
        v = bound[n]
        mutated_tensors += list(v) if isinstance(v, (list, tuple)) else [v]
    for m in mutated_tensors:
        if not isinstance(m, LazyTensor):
            raise RuntimeError(
                f"xla_compat: {func} would write into a {m.device} tensor from {DEVICE} "
                f"(in-place ops cannot mix devices); move it with .to('hlo') first")
    fresh_metas = _flat_tensors(meta_out)[:fresh] if fresh else []
    # The functional variant has no out= arguments.
    if target is not func:
        f_args, f_kwargs = _drop_out_args(func, args, kwargs, names)
    else:
        f_args, f_kwargs = args, kwargs
    computed = None
    if functional is not None:
        computed = check_result_cast(func, functional,
                                     _drop_out_args(func, args, kwargs, names), mutated_tensors)
    # The meta kernel resized out= twins where eager would resize the real tensors.
    position = {id(t): i for i, t in enumerate(_flat_tensors((args, list(kwargs.values()))))}
    written = [after[position[id(m)]] for m in mutated_tensors]
    if computed is not None and _pointwise(functional):
        written = [_computed_in(w, dtype) for w, dtype in zip(written, computed)]
    out_metas = fresh_metas + written
    node = make_node(target, rule, f_args, f_kwargs, out_metas)
    pairs = [(m, Value(node, fresh + i)) for i, m in enumerate(mutated_tensors)]
    return meta_out, node, pairs, fresh


def check_result_cast(func, functional, f_call, mutated) -> list | None:
    """Raise eager's error when a write's result dtype cannot be cast into the written tensor;
    else the functional variant's result dtypes (None where they are not known).

    Meta kernels of in-place ops skip this check (``int_tensor.mul_(0.5)`` passes on meta), so
    without it the device would silently truncate where eager raises."""
    try:
        out, _ = meta(functional, *f_call)
    except (RuntimeError, TypeError):
        # the dispatcher drops arguments equal to the in-place op's defaults, which the
        # functional variant may not have (bernoulli_(p=0.5) -> bernoulli.p needs p); the
        # in-place op's own meta kernel already ran, so no eager error is lost here
        return None
    results = _flat_tensors(out)
    if len(results) != len(mutated):
        return None
    for r, m in zip(results, mutated):
        if r.dtype != m.dtype and not torch.can_cast(r.dtype, m.dtype):
            raise RuntimeError(
                f"result type {type_name(r.dtype)} can't be cast to the desired output type "
                f"{type_name(m.dtype)}" + raised_by(func, f_call))
    return [r.dtype for r in results]


@functools.lru_cache(maxsize=None)
def _pointwise(func) -> bool:
    """Pointwise by eager's kernels: tagged so, or listed by opmath (floor_divide...)."""
    from ..lowering.opmath import POINTWISE_NAMES
    return torch.Tag.pointwise in func.tags or func._schema.name.split("::")[1] in POINTWISE_NAMES


def _computed_in(written, dtype):
    """The meta of a pointwise write's result as its node computes it: a tensor written with
    operands of a wider common dtype (``uint8.floor_divide_(int8)`` divides in int16,
    ``float32.sub_(float64)`` subtracts in float64) gets that dtype, and ``rebind`` converts
    it on writing, as TensorIterator casts on storing. A float16/bfloat16 tensor keeps its
    own: opmath computes its node wide and rounds once (``_common_wider``), with a rounding
    XLA cannot drop as it may drop a bare convert pair between fused ops."""
    if written.dtype == dtype or written.dtype in (torch.float16, torch.bfloat16):
        return written
    if isinstance(written, TMeta):
        return written._replace(dtype=dtype)
    return TMeta(tuple(written.shape), dtype, tuple(written.stride()), written.storage_offset())


# Meta kernels' own words for a result dtype a write cannot take (torch._prims_common.wrappers,
# the add_/sub_ meta kernel); eager's TensorIterator says "result type X can't be cast ...".
_META_CAST = re.compile(r"Attempting to cast from torch\.(\w+) to out tensor with dtype "
                        r"torch\.(\w+)|Promotion of (?:int|bool)\.add/sub_\(")


def eager_cast_error(func, args, kwargs, e: BaseException):
    """``e`` (a meta kernel's refusal of a write's result dtype) in eager's words, or None."""
    m = _META_CAST.match(str(e)) if isinstance(e, RuntimeError) else None
    if m is None:
        return None
    if m.group(1):
        result, written = getattr(torch, m.group(1)), getattr(torch, m.group(2))
    else:              # the meta kernel does not say: the functional variant's result dtype
        names, _, functional = mutation_info(func)
        written = bind(func, args, kwargs).get(names[0]) if names else None
        try:
            result = run_meta(functional, *_drop_out_args(func, args, kwargs, names))
        except Exception:   # noqa: BLE001 - no functional variant or meta kernel: keep e
            return None
        if type(written) in (list, tuple) and type(result) in (list, tuple):
            # a foreach write: the first position whose result the written tensor cannot take
            for r, w in zip(result, written):
                if (isinstance(w, torch.Tensor) and isinstance(r, torch.Tensor)
                        and not torch.can_cast(r.dtype, w.dtype)):
                    result, written = r, w
                    break
        if not isinstance(written, torch.Tensor) or not isinstance(result, torch.Tensor):
            return None
        result, written = result.dtype, written.dtype
    return RuntimeError(f"result type {type_name(result)} can't be cast to the desired output "
                        f"type {type_name(written)}")


def _non_overlapping_and_dense(shape, stride) -> bool:
    expected = 1
    for n, st in sorted(((n, st) for n, st in zip(shape, stride) if n != 1), key=lambda p: p[1]):
        if st != expected:
            return False
        expected *= n
    return True


def partial_overlap(a, b) -> bool:
    """Eager's ``MemOverlapStatus::Partial`` for two tensors known to share one storage.

    ``a`` and ``b`` are (shape, stride, storage_offset) in elements of one size. Like eager, only
    non-overlapping dense layouts are compared (anything else is "too hard": no error); the same
    range with other strides (``x.t()`` and ``x``) is partial, the same layout is not."""
    (sa, ta, oa), (sb, tb, ob) = a, b
    na, nb = math.prod(sa), math.prod(sb)
    if not na or not nb:
        return False
    if not (_non_overlapping_and_dense(sa, ta) and _non_overlapping_and_dense(sb, tb)):
        return False
    if (oa, oa + na) == (ob, ob + nb):
        return tuple(ta) != tuple(tb)
    return oa < ob + nb and ob < oa + na


PARTIAL_OVERLAP = ("unsupported operation: some elements of the input tensor and the written-to "
                   "tensor refer to a single memory location. Please clone() the tensor before "
                   "performing the operation.")


def type_name(dtype) -> str:
    """``dtype`` as eager's error messages name it ("Float", "BFloat16", "Long")."""
    return {torch.float32: "Float", torch.float64: "Double", torch.float16: "Half",
            torch.bfloat16: "BFloat16", torch.int64: "Long", torch.int32: "Int",
            torch.int16: "Short", torch.int8: "Char", torch.uint8: "Byte", torch.bool: "Bool",
            torch.complex64: "ComplexFloat", torch.complex128: "ComplexDouble"}.get(
                dtype, str(dtype).replace("torch.", ""))


def bind(func, args, kwargs) -> dict:
    """{argument name: value} of a call of ``func`` as given (defaults left out)."""
    out = {}
    for i, a in enumerate(func._schema.arguments):
        if i < len(args) and not a.kwarg_only:
            out[a.name] = args[i]
        elif a.name in kwargs:
            out[a.name] = kwargs[a.name]
    return out


def _drop_out_args(func, args, kwargs, names):
    drop = {a.name for a in func._schema.arguments if a.name in names and a.kwarg_only}
    return args, {k: v for k, v in kwargs.items() if k not in drop}


def trace_mutation(cls, func, args, kwargs):
    res = functional_results(cls, func, args, kwargs)
    if res is None:
        return decompose_or_fallback(cls, func, args, kwargs)
    meta_out, node, pairs, fresh = res
    for tensor, value in pairs:
        rebind(tensor, value)
    return _returns_of_mutation(cls, func, args, kwargs, meta_out, node)


def rebind(tensor: LazyTensor, value: Value) -> None:
    """Make ``value`` the tensor's value, cast to its dtype (in-place ops keep self's dtype).

    An out= tensor of another shape is resized, as eager does.
    """
    want = _jax.to_jax_dtype(tensor.dtype)
    shape = tuple(value.aval.shape)
    if shape != tuple(tensor.shape):
        resize(tensor, shape)
    if value.aval.dtype != want:
        value = convert(value, want, shape)
    if tensor._sharding is not None:     # SPMD: an in-place op keeps the tensor's layout
        from .. import sharding
        value = sharding.constrain(value, tensor._sharding)
    tensor._value = value


def resize(tensor: LazyTensor, shape) -> None:
    """Give a wrapper tensor new sizes (contiguous strides) in place."""
    probe = type(tensor)(tensor._value, shape, tensor.dtype)
    _tensor.take_geometry(tensor, probe)


def convert(value: Value, dtype, shape) -> Value:
    node = Node("convert_element_type", _convert_rule(dtype), (Slot(0),), (), (value,),
                (Aval(tuple(shape), dtype),))
    return Value(node, 0)


@functools.lru_cache(maxsize=None)
def _convert_rule(dtype):
    from ..lowering._helpers import cast

    def convert_element_type(x):
        return cast(x, dtype)
    return convert_element_type


def _returns_of_mutation(cls, func, args, kwargs, meta_out, node):
    """Returns that alias a mutated argument are that argument; fresh ones are new tensors."""
    schema = func._schema
    if not schema.returns:
        return None
    bound = bind(func, args, kwargs)
    by_set = {}
    for a in schema.arguments:
        if a.alias_info is not None and a.alias_info.is_write:
            for s in a.alias_info.before_set:
                by_set[s] = bound.get(a.name)
    outs, fresh_i = [], 0
    metas = meta_out if isinstance(meta_out, (list, tuple)) and len(schema.returns) > 1 else [meta_out]
    for r, m in zip(schema.returns, metas):
        if r.alias_info is not None:
            outs.append(by_set[next(iter(r.alias_info.before_set))])
        else:
            outs.append(wrap_outputs(cls, m, node, fresh_i))
            fresh_i += len(_flat_tensors(m))
    return outs[0] if len(schema.returns) == 1 else tuple(outs)


# ----------------------------------------------------------------------------------------------
# CPU fallback.

_warned: set = set()


def _counter_name(func) -> str:
    return func._schema.name  # "aten::histc"


def _fallback_message(cls, func, args, forbidden: bool) -> str:
    name = _counter_name(func)
    path = getattr(cls, "path_name", "core")
    head = f"xla_compat: no lowering for {func} on the {path} path (input {describe(args)})"
    if forbidden:
        return (f"{head}, and XLA_CPU_FALLBACK=error forbids running it on the CPU.\n"
                f"  Unset XLA_CPU_FALLBACK (or set it to warn) to run it on the CPU, or see "
                f"migration_guide/ops.md for adding a lowering.")
    return (f"{head}; it ran on the CPU instead and was counted as {name}.\n"
            f"  Set XLA_CPU_FALLBACK=error to make this an error, or see migration_guide/ops.md.")


def not_dense_error(doing: str, x: torch.Tensor) -> UnsupportedOpError:
    """The error for a sparse (or other non-strided) tensor meant for the device, which holds
    dense arrays only: ``doing`` says what made or moved it (op, path, shapes)."""
    return UnsupportedOpError(
        f"xla_compat: {doing} a {x.layout} tensor ({describe([x])}); the hlo device holds dense "
        f"(torch.strided) tensors only. Keep sparse tensors on the CPU, or call .to_dense() "
        f"before moving one to the device (an Embedding's sparse=True gradient is dense there "
        f"already: see migration_guide/ops.md).")


def cpu_fallback(cls, func, args, kwargs):
    mode = settings.get().cpu_fallback
    if mode == "error":
        raise UnsupportedOpError(_fallback_message(cls, func, args, True))
    if mode == "warn" and func not in _warned:
        _warned.add(func)
        warnings.warn(_fallback_message(cls, func, args, False), stacklevel=3)
    metrics.inc(_counter_name(func))
    lazies: dict[int, tuple] = {}

    def to_cpu(x):
        if isinstance(x, LazyTensor):
            c = materialize_cpu(x)
            lazies[id(c)] = (x, c)
            return c
        if isinstance(x, torch.device) and x.type == DEVICE.type:
            return torch.device("cpu")
        return x

    cargs = map_nested(args, to_cpu)
    ckwargs = {k: (torch.device("cpu") if k == "device" and v is not None
                   else map_nested(v, to_cpu))
               for k, v in kwargs.items()}
    out = func(*cargs, **ckwargs)
    for x in _flat_tensors(out):
        if x.layout != torch.strided:
            raise not_dense_error(f"{func} on the {getattr(cls, 'path_name', 'core')} path "
                                  f"(input {describe(args)}) ran on the CPU and made", x)
    names, _, _ = mutation_info(func)
    if names:        # only arguments the schema says are written come back
        bound = bind(func, cargs, ckwargs)
        for n in names:
            vals = bound[n]
            for c in (vals if isinstance(vals, (list, tuple)) else [vals]):
                lazy, _ = lazies[id(c)]
                lazy._value = ir.leaf(_jax.from_torch(c))
                metrics.inc("TransferToDevice")
    back = {id(c): lazy for lazy, c in lazies.values()}

    def to_dev(x):
        if isinstance(x, torch.Tensor):
            if id(x) in back:
                return back[id(x)]
            metrics.inc("TransferToDevice")
            return cls(ir.leaf(_jax.from_torch(x)), x.shape, x.dtype)
        return x

    return map_nested(out, to_dev)


# ----------------------------------------------------------------------------------------------
# Materialisation.

def materialize(t: LazyTensor):
    """The tensor's jax array, running its pending graph (and only it) if needed."""
    node = t._value.node
    if type(node) is DeviceData:
        return node.array
    if type(node) is ir.Poisoned:
        raise node.error
    from .. import executor
    executor.sync_tensors([t])
    node = t._value.node
    if type(node) is ir.Poisoned:
        raise node.error
    return node.array


def materialize_cpu(t: LazyTensor) -> torch.Tensor:
    arr = materialize(t)
    metrics.inc("TransferFromDevice")
    out = _jax.to_torch(arr)
    if tuple(out.shape) != tuple(t.shape):
        out = out.reshape(t.shape)
    return out


def fresh_copy(t: LazyTensor) -> LazyTensor:
    return type(t)(t._value, t.shape, t.dtype)


# ----------------------------------------------------------------------------------------------
# Special handlers.

@special(aten._to_copy.default)
def _to_copy(cls, func, args, kwargs):
    (x,) = args
    device = kwargs.get("device")
    dtype = kwargs.get("dtype") or x.dtype
    if device is not None and torch.device(device).type == "cpu":
        cpu = materialize_cpu(x)
        return cpu.to(dtype) if cpu.dtype != dtype else cpu
    if not _jax.supported(dtype):
        try:
            _jax.to_jax_dtype(dtype)
        except UnsupportedDtypeError as e:
            raise UnsupportedDtypeError(f"{e} (in {func}, input {describe(args)})") from None
    rule = registry.lookup(func)
    meta_out, _ = meta(func, args, {k: v for k, v in kwargs.items() if k != "device"})
    node = make_node(func, rule, args, {"dtype": dtype}, [meta_out])
    # The next cast of this geometry to this dtype (autocast's, every step) replays: the node
    # takes ``x`` alone, every keyword is static and in the plan's key. Not a cast that eager
    # refuses for an in-place op's result (float to int): a path may raise for those on what
    # no key holds (the functional path's ``writes_eager._written_cast``).
    if torch.can_cast(x.dtype, dtype):
        _remember_plan(cls, func, args, kwargs, node, meta_out, (_TENSOR,) + (0,) * len(kwargs),
                       special_ok=True)
    return cls(Value(node, 0), meta_out.shape, dtype, meta_out.stride, meta_out.offset)


@special(aten.copy_.default, aten._copy_from.default)
def _copy(cls, func, args, kwargs):
    if func is aten._copy_from.default:
        src, dst = args[0], args[1]
    else:
        dst, src = args[0], args[1]
    return copy_into(dst, src)


def copy_into(dst, src):
    """``dst.copy_(src)`` where either side may be on the CPU."""
    cls = type(dst) if isinstance(dst, LazyTensor) else type(src)
    if not isinstance(dst, LazyTensor):
        dst.copy_(materialize_cpu(src))
        return dst
    if src.layout != torch.strided:
        raise not_dense_error(f"copying into a {getattr(dst, 'path_name', 'core')}-path tensor "
                              f"({describe([dst])}) from", src)
    meta(aten.copy_.default, (dst, src), {})     # eager's checks (cached per geometry)
    if not isinstance(src, LazyTensor):
        metrics.inc("TransferToDevice")
        host = src.detach().to(dst.dtype).expand(dst.shape)
        dst._value = ir.leaf(_jax.from_torch(host))
        dst._last_data = dst._value
        return dst
    if (src.dtype == dst.dtype and src.shape == dst.shape and src._value == dst._value):
        return dst        # it already holds that value (``v += 1`` then ``x[i] = v`` writes v back)
    res = functional_results(cls, aten.copy_.default, (dst, src), {})
    for tensor, value in res[2]:
        rebind(tensor, value)
    return dst


@special(aten._local_scalar_dense.default)
def _item(cls, func, args, kwargs):
    return materialize_cpu(args[0]).item()


@special(aten.detach.default, aten.alias.default, aten.lift_fresh.default,
         aten._conj.default, aten._neg_view.default)
def _share(cls, func, args, kwargs):
    x = args[0]
    if func in (aten._conj.default, aten._neg_view.default):
        return trace(cls, {aten._conj.default: aten.conj_physical.default,
                           aten._neg_view.default: aten.neg.default}[func], args, kwargs)
    return cls(x._value, x.shape, x.dtype, x.stride(), x.storage_offset())


@special(aten.set_.source_Tensor)
def _set(cls, func, args, kwargs):
    dst, src = args
    if tuple(dst.shape) != tuple(src.shape) or dst.dtype != src.dtype:
        raise NotImplementedError(
            f"xla_compat: {func} changing shape or dtype ({describe(args)}) is not supported on "
            f"hlo; assign through .data instead")
    dst._value = src._value
    return dst


@special(aten.is_pinned.default)
def _is_pinned(cls, func, args, kwargs):
    return False


@special(aten.is_same_size.default)
def _same_size(cls, func, args, kwargs):
    return tuple(args[0].shape) == tuple(args[1].shape)


@special(aten._has_same_storage_numel.default)
def _same_storage_numel(cls, func, args, kwargs):
    """Forward-mode AD asks whether a tangent's storage holds as many elements as its primal
    base's: answered from the storages' sizes, as eager does, without reading either tensor."""
    a, b = args
    return (a.untyped_storage().nbytes() // a.element_size()
            == b.untyped_storage().nbytes() // b.element_size())


@special(aten._has_compatible_shallow_copy_type.default)
def _compatible(cls, func, args, kwargs):
    return type(args[0]) is type(args[1])


_tensor.bind_tracer(sys.modules[__name__])
