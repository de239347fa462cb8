"""Writes through views whose elements share memory (unfold windows with step < size,
overlapping ``as_strided``), as eager's element walk leaves them.

Eager runs a write into such a view element by element over the shared memory, in its
TensorIterator's order (``lowering/views.py: iteration_order``). Upstream functionalization writes
the new view back as the SUM of the windows (``unfold_backward``) or keeping one element of each
group (``as_strided_scatter``). Here the written view's value is first made what eager's walk
leaves, the same for every element of one memory element, so that writing it back element by
element is right. What the write was is read off the node that computed the new view, ``new``,
from the view ``read`` before the write:

* a pointwise op of ``read`` (``v.mul_(2)``, ``v.add_(v)``): each element sees the op once per
  view element it is in, each time on what the last one left: the node is applied again round by
  round;
* an accumulating index op of ``read`` (``index_add``, ``scatter_add``, ``index_put`` with
  accumulate): every contribution adds up;
* another op of ``read`` (``index_put``, ``scatter``, ``index_fill``...): it writes only some
  elements; of those it changed, the last in the walk wins;
* anything else (an out= result, a copied source): every element is written, the last wins;
* an op on a view of ``read`` (``v[1:3].mul_(2)``, ``v.t()[1].fill_(0)``), put back through the
  inverse views: the op is walked over that view's own memory positions first, by the rules
  above, then each memory element keeps the value its changed copies hold.

The walk's order comes from the view's eager strides and its operands'. For an out= result the
result's own eager strides stand for its inputs' (eager lays a result out from its inputs, so they
order the view's stride ties the same way). For an in-place op the other operands are taken as
contiguous: the in-place result arrives with the written view's strides, so where a permuted
operand decides eager's order (``v.lerp_(w.t(), 0.25)``) the functional path can differ.
``copy_`` is resolved earlier, where the source's strides are known (``copy_walk``).
"""
from __future__ import annotations

from dataclasses import dataclass

import jax.numpy as jnp
import numpy as np
import torch

from xla_compat import write_checks
from xla_compat.lazy import tracer
from xla_compat.lazy.ir import Aval, Node, Slot, Value
from xla_compat.lowering import views as lv

from .writes import Gather, find_node, is_plain, storage_to_logical, unfold_positions

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


def _same(v: Value, read: Value) -> bool:
    """Is ``v`` the view's value before the write: ``read`` itself, or the same read made again
    (upstream reads a view once for the op and again for a write-back through a view of it,
    ``v[:, 1].fill_(5)``: two equal ``unfold_copy`` nodes of one base value)?"""
    if v == read:
        return True
    a, b = v.node, read.node
    return (v.index == read.index and a.op == b.op and a.rule is not None and a.rule == b.rule
            and a.inputs == b.inputs and a.args == b.args and a.kwargs == b.kwargs)


def _replay(node, index, read, cur) -> Value:
    """``node`` computed again with ``cur`` wherever it read ``read``."""
    inputs = tuple(cur if _same(v, read) else v for v in node.inputs)
    return Value(Node(node.op, node.rule, node.args, node.kwargs, inputs, node.avals), index)


def _windows_geometry(sizes, dim, size, step):
    """(view shape, view strides over a contiguous base, base position of each element)."""
    base_stride = lv.contiguous_strides(sizes)
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


def unfold_walk(read: Value, new: Value, sizes, dim, size, step, new_stride=None) -> Value:
    """The windows' value after eager's walk, from the windows ``read`` before the write and the
    value ``new`` upstream would write back (``new_stride``: its eager strides, where known)."""
    shape, stride, pos = _windows_geometry(tuple(sizes), dim, size, step)
    return walk(read, new, shape, stride, pos, new_stride)


def walk(read: Value, new: Value, shape, stride, pos, new_stride=None) -> Value:
    """The value of a view whose elements overlap after eager's walk writes ``new`` into it: the
    view has ``shape`` and eager ``stride``; ``pos`` (of ``shape``) numbers each element's place
    in the base (equal numbers: one element of memory); ``read`` is the view's value before the
    write (``new`` itself where the write did not read it). ``new_stride`` is the written
    result's eager layout: where the write did not read the view (an out= result), the layout
    eager gave it from its inputs stands for theirs in the walk order (it breaks the view's
    stride ties as they do); otherwise the other inputs are taken as contiguous."""
    shape = tuple(shape)
    aval = Aval(shape, read.aval.dtype)
    if new.aval.dtype != read.aval.dtype or tuple(new.aval.shape) != shape:
        return new
    through = _through_a_view(read, new, shape, stride, pos, aval)
    if through is not None:
        return through
    node = new.node
    first = _first_input(node)
    on_read = first is not None and _same(first, read)
    if on_read and _accumulates(node):
        w = lv.OverlapWalk(pos, np.arange(pos.size))
        return lv.walk_node(lv.SumChanges(lv._table(w.group), w.groups), (read, new), aval)
    if not on_read and new_stride is not None:
        operands = [tuple(stride), lv.broadcast_strides(shape, shape, tuple(new_stride))]
    else:
        operands = [stride, stride] + [
            lv.broadcast_strides(shape, tuple(v.aval.shape), lv.contiguous_strides(tuple(v.aval.shape)))
            for v in node.inputs if not _same(v, read)]
    w = lv.OverlapWalk(pos, lv.iteration_order(shape, operands))
    if on_read and _pointwise(node):
        cur, res = read, new
        for r, src in enumerate(w.rounds):
            if r:
                res = _replay(node, new.index, read, cur)
            cur = lv.walk_node(lv.TakeRound(lv._table(src)), (cur, res), aval)
        return cur
    if on_read:
        rule = lv.LastChanged(lv._table(w.group), w.groups, lv._table(w.rank))
        inputs = (read, new)
        if node.op in _SETTING and not _accumulates(node):
            # Written: the elements whose result does not depend on what they held.
            inputs += tuple(_replay(node, new.index, read, lv.walk_node(FullLike(v), (read,), aval))
                            for v in (0, 1))
        return lv.walk_node(rule, inputs, aval)
    return lv.walk_node(lv.TakeLast(lv._table(w.last)), (read, new), aval)


# -- a write through a view of the overlapping view -------------------------------------------------
# ``v[1:3].mul_(2)`` reaches the write-back as ``slice_scatter(read, mul(view_read(read)))``,
# ``v.t().mul_(2)`` as ``t_copy(mul(t_copy(read)))``: the op ran on a view of the windows and its
# result was put back through the inverse views. Eager's walk is over that view: the op's node is
# walked there (over the view's own memory positions and strides), which leaves one value per
# memory element wherever it wrote, and the windows then keep, per memory element, the value a
# changed copy holds (the others are stale copies of what the op did not write).

# The view nodes an op on a view of the windows reads them through.
_VIEW_READS = frozenset((
    "functional.view_read", "aten.slice_copy.Tensor", "aten.select_copy.int",
    "aten.t_copy.default", "aten.transpose_copy.int", "aten.permute_copy.default",
    "aten.diagonal_copy.default", "aten.unsqueeze_copy.default", "aten.squeeze_copy.dim",
    "aten.squeeze_copy.dims", "aten.squeeze_copy.default", "aten.view_copy.default",
    "aten._reshape_alias_copy.default", "aten.narrow_copy.default", "aten.alias_copy.default",
    "aten.unfold_copy.default", "aten.movedim_copy.int"))
_SCATTERS = frozenset(("aten.slice_scatter.default", "aten.select_scatter.default",
                       "aten.diagonal_scatter.default", "aten.as_strided_scatter.default"))
_LIMIT = 2000


def _viewed(v: Value, read: Value) -> bool:
    """Is ``v`` a view of ``read`` (not ``read`` itself)?"""
    n = v.node
    return n.op in _VIEW_READS and len(n.inputs) == 1 and _same(n.inputs[0], read) \
        and not _same(v, read)


def _op_on_a_view(new: Value, read: Value):
    """The node in ``new``'s graph of an op whose first input is a view of ``read``, or None."""
    def wanted(n) -> bool:
        if n.op in _VIEW_READS or n.op in _SCATTERS or n.rule is None:
            return False
        first = _first_input(n)
        return first is not None and _viewed(first, read)
    return find_node(new, wanted, _LIMIT)


def _positions(view: Value, pos):
    """``pos`` seen through the view node ``view`` (what each of its elements is in memory)."""
    from xla_compat.executor import _call_rule
    try:
        out = _call_rule(view.node, [jnp.asarray(pos)])
    except Exception:  # noqa: BLE001 - a view the positions cannot go through: no walk here
        return None
    out = out[view.index] if isinstance(out, (tuple, list)) else out
    out = np.asarray(out)
    return out if out.shape == tuple(view.aval.shape) else None


def _strides_of(p) -> tuple:
    """The memory strides of a strided view whose elements are at positions ``p``."""
    origin = p[(0,) * p.ndim] if p.size else 0
    out = []
    for d, n in enumerate(p.shape):
        if n > 1:
            at = [0] * p.ndim
            at[d] = 1
            out.append(int(p[tuple(at)] - origin))
        else:
            out.append(1)
    return tuple(out)


def _substitute(value: Value, old, replacement: Value):
    """``value`` recomputed with ``replacement`` for the node ``old`` (None past ``_LIMIT``)."""
    memo: dict = {}
    count = [0]

    def rebuilt(v: Value):
        n = v.node
        if n is old:
            return replacement
        if n.rule is None or not n.inputs:
            return v
        got = memo.get(id(n))
        if got is None:
            count[0] += 1
            if count[0] > _LIMIT:
                raise OverflowError
            ins = tuple(rebuilt(i) for i in n.inputs)
            got = n if all(a is b for a, b in zip(ins, n.inputs)) else Node(
                n.op, n.rule, n.args, n.kwargs, ins, n.avals)
            memo[id(n)] = got
        return v if got is n else Value(got, v.index)
    try:
        return rebuilt(value)
    except (OverflowError, RecursionError):
        return None


def _through_a_view(read: Value, new: Value, shape, stride, pos, aval):
    """The windows' value after eager's walk where ``new`` wrote through a view of them; None
    where the write did not (the op read the windows themselves, or not at all)."""
    op = _op_on_a_view(new, read)
    if op is None:
        return None
    view = _first_input(op)
    sub_pos = _positions(view, pos)
    if sub_pos is None:
        return None
    value = Value(op, 0)
    if np.unique(sub_pos).size < sub_pos.size:      # the view's own elements share memory
        value = walk(view, value, sub_pos.shape, _strides_of(sub_pos), sub_pos)
    written = _substitute(new, op, value)
    if written is None:
        return None
    w = lv.OverlapWalk(pos, lv.iteration_order(shape, [tuple(stride), tuple(stride)]))
    rule = lv.LastChanged(lv._table(w.group), w.groups, lv._table(w.rank))
    return lv.walk_node(rule, (read, written), aval)


def _as_strided_read(value: Value, base_shape, size, stride, offset, gather):
    """The node that read the view ``as_strided(size, stride, offset)`` of a base of
    ``base_shape``, searched in ``value``'s graph (``gather``: the rule reading it where the base
    is not plain, see ``writes.as_strided_read``)."""
    def reads(node) -> bool:
        if len(node.inputs) != 1 or tuple(node.inputs[0].aval.shape) != base_shape:
            return False
        if node.op == "aten.as_strided_copy.default":
            a = node.args
            at = a[3] if len(a) > 3 else dict(node.kwargs).get("storage_offset")
            return (tuple(a[1]), tuple(a[2]), at or 0) == (size, stride, offset or 0)
        return node.op == "functional.as_strided_gather" and node.rule == gather
    return find_node(value, reads)


def _shares_memory(size, stride) -> bool:
    """Do two elements of this layout share memory, without it being expanded (eager raises
    before writing an expanded view)?"""
    return not lv.expanded(size, stride) and write_checks.shares_memory(size, stride)


def as_strided_walk(cls, base, src, size, stride, offset):
    """``src`` made what eager's walk leaves in ``base.as_strided(size, stride, offset)`` where
    that view's elements overlap (and are not expanded), so that its write-back, which keeps the
    last changed element, is right; None for any other view (every ordinary write-back)."""
    if not _shares_memory(size, stride):
        return None                        # (every ordinary write-back: one dict lookup)
    offset = base.storage_offset() if offset is None else offset
    pos = lv.strided_index(size, stride, offset)
    gather = None
    if not is_plain(base):
        pos = storage_to_logical(base, pos, "as_strided_scatter")
        gather = Gather(np.ascontiguousarray(pos, dtype=np.int64).tobytes(), tuple(size))
    new = src._value
    node = _as_strided_read(new, tuple(base.shape), size, stride, offset, gather)
    if node is None:            # a write that did not read the view (out=): the last write wins
        value = walk(new, new, size, stride, pos, src.stride())
    else:
        value = walk(Value(node, 0), new, size, stride, pos)
    if value is new:
        return None
    return cls(value, tuple(size), src.dtype)


def copy_walk(cls, dst, src):
    """``copy(dst, src)`` where ``dst`` is a view whose elements overlap (and are not
    expanded): each element takes the last value eager's walk over (dst, src) writes there, so
    the write-back is right whatever order it writes in. None for any other ``dst``."""
    shape = tuple(dst.shape)
    if lv.expanded(shape, dst.stride()):
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
