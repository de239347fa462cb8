"""Writes through unfold windows that share elements, as eager's element walk leaves them.

Eager runs a write into overlapping windows element by element over the shared memory, in its
TensorIterator's order (``lowering/views.py: iteration_order``). Upstream functionalization writes
the new windows back as their SUM (``unfold_backward``). Here the written windows' value is first
made what eager's walk leaves, the same for every window element of one base element, so that
writing it back element by element is right. What the write was is read off the node that
computed the new windows, ``new``, from the windows ``read`` before the write:

* a pointwise op of ``read`` (``v.mul_(2)``, ``v.add_(v)``, ``torch.mul(v, 2, out=v)``): each
  element sees the op once per window it is in, each time on what the last one left: the node
  is applied again round by round;
* an accumulating index op of ``read`` (``index_add``, ``scatter_add``, ``index_put`` with
  accumulate): every window's contribution adds up;
* another op of ``read`` (``index_put``, ``scatter``, ``index_fill``...): it writes only some
  elements; of those it changed, the last in the walk wins;
* anything else (an out= result, a copied source): every element is written, the last wins.

The walk's order is known here only from the view's own layout (its base contiguous) and the
shapes of the node's inputs, which are taken as contiguous: where eager's order depends on another
operand's strides (an out= whose input is transposed) the functional path can differ. ``copy_``
is resolved earlier, where the source's strides are known (``copy_walk``).
"""
from __future__ import annotations

from dataclasses import dataclass

import jax.numpy as jnp
import numpy as np
import torch

from xla_compat.lazy import tracer
from xla_compat.lazy.ir import Aval, Node, Slot, Value
from xla_compat.lowering import views as lv

from .writes import unfold_positions

aten = torch.ops.aten

_ACCUMULATING = {"aten.index_add.default", "aten.scatter_add.default"}
# Ops that write some elements of their first input without reading them.
_SETTING = {"aten.index_put.default", "aten.index_fill.int_Scalar", "aten.index_fill.int_Tensor",
            "aten.index_copy.default", "aten.scatter.src", "aten.scatter.value",
            "aten.masked_scatter.default", "aten.put.default"}


@dataclass(frozen=True)
class FullLike:
    """IR rule: ``x`` with every element ``value``."""

    value: int

    def __call__(self, x):
        return jnp.full_like(x, self.value)


def _replay(node, index, read, cur) -> Value:
    """``node`` computed again with ``cur`` wherever it read ``read``."""
    inputs = tuple(cur if v == read else v for v in node.inputs)
    return Value(Node(node.op, node.rule, node.args, node.kwargs, inputs, node.avals), index)


def _contiguous(shape) -> tuple:
    out, acc = [], 1
    for n in reversed(shape):
        out.append(acc)
        acc *= max(n, 1)
    return tuple(reversed(out))


def _windows_geometry(sizes, dim, size, step):
    """(view shape, view strides over a contiguous base, base position of each element)."""
    base_stride = _contiguous(sizes)
    n = (sizes[dim] - size) // step + 1
    shape = sizes[:dim] + (n,) + sizes[dim + 1:] + (size,)
    stride = base_stride[:dim] + (step * base_stride[dim],) + base_stride[dim + 1:] \
        + (base_stride[dim],)
    idx = np.arange(int(np.prod(sizes, dtype=np.int64)), dtype=np.int64).reshape(sizes)
    taken = np.take(idx, unfold_positions(sizes, dim, size, step).reshape(-1), axis=dim)
    taken = taken.reshape(sizes[:dim] + (n, size) + sizes[dim + 1:])
    return shape, stride, np.moveaxis(taken, dim + 1, -1)


def _accumulates(node) -> bool:
    if node.op in _ACCUMULATING:
        return True
    if node.op == "aten.index_put.default":
        acc = node.args[3] if len(node.args) > 3 else dict(node.kwargs).get("accumulate", False)
        return acc is True
    return False


def _pointwise(node) -> bool:
    op = tracer.overload_named(node.op) if isinstance(node.op, str) else None
    return op is not None and torch.Tag.pointwise in op.tags and len(node.avals) == 1


def _first_input(node):
    first = node.args[0] if node.args else None
    return node.inputs[first.k] if type(first) is Slot else None


def unfold_walk(read: Value, new: Value, sizes, dim, size, step) -> Value:
    """The windows' value after eager's walk, from the windows ``read`` before the write and the
    value ``new`` upstream would write back."""
    shape, stride, pos = _windows_geometry(tuple(sizes), dim, size, step)
    aval = Aval(tuple(shape), read.aval.dtype)
    node = new.node
    if new.aval.dtype != read.aval.dtype or tuple(new.aval.shape) != tuple(shape):
        return new
    on_read = _first_input(node) == read
    if on_read and _accumulates(node):
        walk = lv.OverlapWalk(pos, np.arange(pos.size))
        return lv.walk_node(lv.SumChanges(lv._table(walk.group), walk.groups), (read, new), aval)
    operands = [stride, stride] + [
        lv.broadcast_strides(shape, tuple(v.aval.shape), _contiguous(tuple(v.aval.shape)))
        for v in node.inputs if v != read]
    walk = lv.OverlapWalk(pos, lv.iteration_order(shape, operands))
    if on_read and _pointwise(node):
        cur, res = read, new
        for r, src in enumerate(walk.rounds):
            if r:
                res = _replay(node, new.index, read, cur)
            cur = lv.walk_node(lv.TakeRound(lv._table(src)), (cur, res), aval)
        return cur
    if on_read:
        rule = lv.LastChanged(lv._table(walk.group), walk.groups, lv._table(walk.rank))
        inputs = (read, new)
        if node.op in _SETTING and not _accumulates(node):
            # Written: the elements whose result does not depend on what they held.
            inputs += tuple(_replay(node, new.index, read, lv.walk_node(FullLike(v), (read,), aval))
                            for v in (0, 1))
        return lv.walk_node(rule, inputs, aval)
    return lv.walk_node(lv.TakeLast(lv._table(walk.last)), (read, new), aval)


def copy_walk(cls, dst, src):
    """``copy(dst, src)`` where ``dst`` is a view whose elements overlap (and are not
    expanded): each element takes the last value eager's walk over (dst, src) writes there, so
    the write-back is right whatever order it writes in. None for any other ``dst``."""
    shape = tuple(dst.shape)
    if any(n > 1 and s == 0 for n, s in zip(shape, dst.stride())):
        return None
    if lv.surely_distinct(shape, dst.stride()):
        return None                        # (every ordinary copy_: no index set to build)
    pos = lv.strided_index(shape, dst.stride(), dst.storage_offset())
    if np.unique(pos).size == pos.size:
        return None
    operands = [tuple(dst.stride()),
                lv.broadcast_strides(shape, tuple(src.shape), tuple(src.stride()))]
    walk = lv.OverlapWalk(pos, lv.iteration_order(shape, operands))
    aval = Aval(shape, dst._value.aval.dtype)
    value = lv.walk_node(lv.TakeLast(lv._table(walk.last)), (dst._value, src._value), aval)
    return cls(value, shape, dst.dtype, tuple(dst.stride()), dst.storage_offset())
