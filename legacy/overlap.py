"""Writes into a view whose elements share storage (unfold with step < size, as_strided), as
eager's element-by-element walk over the shared memory leaves them.

Eager lets TensorIterator ops write such a view (its overlap check answers "too hard", not
"yes"), and runs them element by element in its iteration order (``views.iteration_order``):
a pointwise in-place op reads each element's memory as the previous write left it, so an element
in k windows is written k times in a row (``mul_(2)`` doubles it k times); a plain write
(``copy_``, out=) leaves the last value written; an accumulating index op (``index_add_``) adds
every contribution. Each is computed here as the view's new value, the same for every view
element of one storage element, and written back through the view's chain as usual.
"""
from __future__ import annotations

import numpy as np
import torch

from xla_compat import _jax
from xla_compat.lazy import tracer
from xla_compat.lazy.ir import Aval
from xla_compat.lowering import views as lv

from . import views
from .tensor import LegacyTensor

aten = torch.ops.aten

# In-place ops whose writes add into the memory they reach (their functional variant on zeros
# gives each element's contribution).
ACCUMULATING = frozenset({aten.index_add_.default, aten.scatter_add_.default})
# In-place ops that write some elements without reading them (the last written one wins).
SETTING = frozenset({aten.index_put_.default, aten.index_fill_.int_Scalar,
                     aten.index_fill_.int_Tensor, aten.index_copy_.default, aten.scatter_.src,
                     aten.scatter_.value, aten.masked_scatter_.default, aten.put_.default})


def positions(t) -> np.ndarray | None:
    """Storage position of each element of ``t`` when ``t`` is a legacy view whose elements
    overlap without being expanded (eager: "too hard" to tell, so it runs the op); else None."""
    if (not isinstance(t, LegacyTensor) or views.injective(t._chain)
            or not all(step.keeps_elements for step in t._chain)):
        return None
    if lv.expanded(t.shape, t.stride()):
        return None                        # expanded: eager's overlap check says yes
    if lv.surely_distinct(tuple(t.shape), t.stride()):
        return None
    pos = lv.strided_index(tuple(t.shape), t.stride(), t.storage_offset())
    return pos if np.unique(pos).size < pos.size else None


def _strides(t, operands) -> list:
    shape = tuple(t.shape)
    out = [tuple(t.stride())]
    for o in operands:
        if isinstance(o, torch.Tensor):
            out.append(lv.broadcast_strides(shape, tuple(o.shape), tuple(o.stride())))
    return out


def _tensor(value, like) -> LegacyTensor:
    return LegacyTensor(value, tuple(like.shape), like.dtype)


def _apply(rule, x, new) -> LegacyTensor:
    aval = Aval(tuple(x.shape), _jax.to_jax_dtype(x.dtype))
    return _tensor(lv.walk_node(rule, (x._value, new._value), aval), x)


def _shares_storage(t, operands) -> bool:
    return any(isinstance(o, LegacyTensor) and o is not t and o._alias is t._alias
               for o in operands)


def _refuse_live_reads(func, t, operands) -> None:
    if _shares_storage(t, operands):
        raise NotImplementedError(
            f"xla_compat: {func} writes a view whose elements overlap (size {list(t.shape)}, "
            f"stride {list(t.stride())}) while reading another view of the same storage; eager "
            f"reads that view as its own walk rewrites it, which the legacy path does not "
            f"reproduce. .clone() the other operand first.")


def last_write(t, src, operands) -> bool:
    """Write ``src`` into ``t`` as a plain write (copy_, out=) whose iteration also sees
    ``operands``: where ``t`` overlaps itself, the last element written wins. False where ``t``
    does not overlap itself (the caller writes as usual)."""
    pos = positions(t)
    if pos is None:
        return False
    if not isinstance(src, LegacyTensor):
        return False
    _refuse_live_reads(aten.copy_.default, t, [src])
    walk = lv.OverlapWalk(pos, lv.iteration_order(tuple(t.shape), _strides(t, operands)))
    snapshot = _tensor(t._value, t)
    t._value = _apply(lv.TakeLast(lv._table(walk.last)), snapshot, src)._value
    return True


def in_place(func, args, kwargs):
    """An in-place op on an overlapping view, as eager's walk does it; NotImplemented for any
    other call (the caller traces it as usual)."""
    t = args[0] if args else None
    pos = positions(t)
    if pos is None:
        return NotImplemented
    names, fresh, functional = tracer.mutation_info(func)
    if names != ("self",) or fresh:
        return NotImplemented
    operands = tracer._flat_tensors((list(args[1:]), list(kwargs.values())))
    if func is aten.copy_.default:
        tracer.meta(func, args, kwargs)           # eager's errors (shapes)
        src = args[1]
        if src is t:
            return t
        if isinstance(src, LegacyTensor) and last_write(t, src, [t, src]):
            return t
        return NotImplemented
    if functional is None or not (func in ACCUMULATING or func in SETTING
                                  or torch.Tag.pointwise in functional.tags):
        return NotImplemented
    tracer.meta(func, args, kwargs)               # eager's errors (shapes, dtypes)
    # (meta kernels of in-place ops let int_tensor.mul_(0.5) pass; eager refuses the cast)
    tracer.check_result_cast(func, functional, (args, kwargs), [t])
    _refuse_live_reads(func, t, operands)
    snapshot = _tensor(t._value, t)

    def call(cur):
        swap = (lambda a: cur if a is t else a)
        return functional(*[swap(a) for a in args], **{k: swap(v) for k, v in kwargs.items()})

    if func in ACCUMULATING:
        walk = lv.OverlapWalk(pos, np.arange(pos.size))
        zeros = torch.zeros(tuple(t.shape), dtype=t.dtype, device=t.device)
        delta = functional(zeros, *args[1:], **kwargs)
        rule = lv.SumChanges(lv._table(walk.group), walk.groups, True)
        t._value = _apply(rule, snapshot, delta)._value
        return t
    if func in SETTING:
        # Which elements the op writes: those whose result does not depend on what they held.
        a, b = (call(torch.full(tuple(t.shape), v, dtype=t.dtype, device=t.device))
                for v in (0, 1))
        walk = lv.OverlapWalk(pos, np.arange(pos.size))
        rule = lv.LastChanged(lv._table(walk.group), walk.groups, lv._table(walk.rank))
        aval = Aval(tuple(t.shape), _jax.to_jax_dtype(t.dtype))
        inputs = (snapshot._value, call(snapshot)._value, a._value, b._value)
        t._value = lv.walk_node(rule, inputs, aval)
        return t
    order = lv.iteration_order(tuple(t.shape), [tuple(t.stride())] + _strides(t, [t] + operands))
    res = call(snapshot)
    if res.dtype != t.dtype or tuple(res.shape) != tuple(t.shape):
        # Eager computes into a temporary of the common dtype and copies it back (copy_'s walk).
        order = lv.iteration_order(tuple(t.shape), [tuple(t.stride()), lv.contiguous_strides(t.shape)])
        walk = lv.OverlapWalk(pos, order)
        t._value = _apply(lv.TakeLast(lv._table(walk.last)), snapshot, res)._value
        return t
    walk = lv.OverlapWalk(pos, order)
    cur = snapshot
    for r, src in enumerate(walk.rounds):
        if r:
            res = call(cur)
        cur = _apply(lv.TakeRound(lv._table(src)), cur, res)
    t._value = cur._value
    return t
