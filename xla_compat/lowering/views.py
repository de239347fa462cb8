"""View ops as copies (``*_copy`` semantics) and their inverse ``*_scatter`` write-backs.

The core computes what a view reads; aliasing is the paths' job. Every view overload and its
``_copy`` twin share one rule.
"""
from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from ..lazy import tracer
from ._helpers import dim
from .registry import aten, lowering


@lowering(aten.view.default, aten.view_copy.default, aten._unsafe_view.default,
          aten.reshape.default, aten._reshape_alias.default, aten._reshape_alias_copy.default,
          aten.view.dtype, meta=True)
def view(x, *shape, aval):
    if x.dtype != aval.dtype:  # view.dtype: reinterpret bits
        return _bitcast(x, aval)
    return jnp.reshape(x, aval.shape)


def _bitcast(x, aval):
    # XLA reinterprets no complex type: a complex is its two parts, real then imaginary, as in
    # memory (view_as_real), on either side
    if jnp.issubdtype(x.dtype, jnp.complexfloating):
        parts = jnp.stack([x.real, x.imag], axis=-1)
        return _bitcast(parts.reshape(x.shape[:-1] + (2 * x.shape[-1],) if x.ndim else (2,)),
                        aval)
    if jnp.issubdtype(aval.dtype, jnp.complexfloating):
        shape = aval.shape[:-1] + (2 * aval.shape[-1],) if aval.shape else (2,)
        real = jnp.zeros((), aval.dtype).real.dtype
        parts = _bitcast(x, jax.ShapeDtypeStruct(shape, real)).reshape(shape[:-1] + (-1, 2))
        return lax.complex(parts[..., 0], parts[..., 1]).reshape(aval.shape)
    src, dst = np.dtype(x.dtype).itemsize, np.dtype(aval.dtype).itemsize
    if x.dtype == jnp.bool_:
        x = x.astype(jnp.uint8)
    target = aval.dtype if aval.dtype != jnp.bool_ else jnp.uint8
    if src == dst:
        out = lax.bitcast_convert_type(x, target)
    elif src > dst:
        out = lax.bitcast_convert_type(x, target).reshape(aval.shape)
    else:
        ratio = dst // src
        out = lax.bitcast_convert_type(x.reshape(x.shape[:-1] + (x.shape[-1] // ratio, ratio)),
                                       target)
    return out.astype(jnp.bool_) if aval.dtype == jnp.bool_ else out.reshape(aval.shape)


@lowering(aten.permute.default, aten.permute_copy.default)
def permute(x, dims_):
    return jnp.transpose(x, [dim(d, x.ndim) for d in dims_]) if x.ndim else x


@lowering(aten.t.default, aten.t_copy.default)
def t(x):
    return x.T if x.ndim == 2 else x


@lowering(aten.transpose.int, aten.transpose_copy.int)
def transpose(x, d0, d1):
    if x.ndim < 2:
        return x
    return jnp.swapaxes(x, dim(d0, x.ndim), dim(d1, x.ndim))


@lowering(aten.expand.default, aten.expand_copy.default, meta=True)
def expand(x, size, *, implicit=False, aval):
    return jnp.broadcast_to(x, aval.shape)


@lowering(aten.squeeze.default, aten.squeeze.dim, aten.squeeze.dims, aten.squeeze_copy.default,
          aten.squeeze_copy.dim, aten.squeeze_copy.dims, aten.unsqueeze.default,
          aten.unsqueeze_copy.default, aten.alias.default, aten.flatten.using_ints,
          aten.unflatten.int, meta=True)
def reshape_to(x, *args, aval):
    return jnp.reshape(x, aval.shape)


@lowering(aten.select.int, aten.select_copy.int)
def select(x, d, index):
    d = dim(d, x.ndim)
    index = index + x.shape[d] if index < 0 else index
    return lax.index_in_dim(x, index, d, keepdims=False)


def _slice_bounds(size, start, end, step):
    start = 0 if start is None else start
    end = size if end is None else end
    start = start + size if start < 0 else start
    end = end + size if end < 0 else end
    start = min(max(start, 0), size)
    end = min(max(end, start), size)
    return start, end, step


@lowering(aten.slice.Tensor, aten.slice_copy.Tensor)
def slice_(x, d=0, start=None, end=None, step=1):
    d = dim(d, x.ndim)
    start, end, step = _slice_bounds(x.shape[d], start, end, step)
    return lax.slice_in_dim(x, start, end, step, axis=d)


@lowering(aten.narrow.default, aten.narrow_copy.default)
def narrow(x, d, start, length):
    d = dim(d, x.ndim)
    start = start + x.shape[d] if start < 0 else start
    return lax.slice_in_dim(x, start, start + length, 1, axis=d)


@lowering(aten.split.Tensor, aten.split_copy.Tensor)
def split(x, split_size, d=0):
    d = dim(d, x.ndim)
    n = x.shape[d]
    sizes = [min(split_size, n - i) for i in range(0, n, split_size)] if split_size else []
    return _split_sizes(x, sizes or [n], d) if n or not split_size else [x]


def _split_sizes(x, sizes, d):
    out, start = [], 0
    for s in sizes:
        out.append(lax.slice_in_dim(x, start, start + s, 1, axis=d))
        start += s
    return out


@lowering(aten.split_with_sizes.default, aten.split_with_sizes_copy.default)
def split_with_sizes(x, sizes, d=0):
    return _split_sizes(x, sizes, dim(d, x.ndim))


@lowering(aten.unbind.int, aten.unbind_copy.int)
def unbind(x, d=0):
    d = dim(d, x.ndim)
    return [lax.index_in_dim(x, i, d, keepdims=False) for i in range(x.shape[d])]


def diag_index(shape, offset, d1, d2):
    """Index arrays (along d1, along d2) of the diagonal ``offset`` of a tensor of ``shape``."""
    n1, n2 = shape[d1], shape[d2]
    if offset >= 0:
        length = max(min(n1, n2 - offset), 0)
        return np.arange(length), np.arange(length) + offset
    length = max(min(n1 + offset, n2), 0)
    return np.arange(length) - offset, np.arange(length)


@lowering(aten.diagonal.default, aten.diagonal_copy.default)
def diagonal(x, offset=0, dim1=0, dim2=1):
    d1, d2 = dim(dim1, x.ndim), dim(dim2, x.ndim)
    i1, i2 = diag_index(x.shape, offset, d1, d2)
    moved = jnp.moveaxis(x, (d1, d2), (-2, -1))
    return moved[..., i1, i2]


@lowering(aten.diagonal_scatter.default)
def diagonal_scatter(x, src, offset=0, dim1=0, dim2=1):
    d1, d2 = dim(dim1, x.ndim), dim(dim2, x.ndim)
    i1, i2 = diag_index(x.shape, offset, d1, d2)
    moved = jnp.moveaxis(x, (d1, d2), (-2, -1))
    moved = moved.at[..., i1, i2].set(src.astype(x.dtype))
    return jnp.moveaxis(moved, (-2, -1), (d1, d2))


def contiguous_strides(shape) -> tuple:
    """Row-major strides of ``shape`` (a size-0 or size-1 dim steps like size 1)."""
    out, acc = [], 1
    for n in reversed(shape):
        out.append(acc)
        acc *= max(n, 1)
    return tuple(reversed(out))


def expanded(size, stride) -> bool:
    """Does a dim of more than one element step 0 (eager's internal overlap "yes": writes
    refused)? Never for a tensor of no elements (eager finds it non-overlapping and dense)."""
    return 0 not in size and any(n > 1 and s == 0 for n, s in zip(size, stride))


def surely_distinct(size, stride) -> bool:
    """A quick sufficient test that no two elements of a strided layout share a storage
    position: taken by increasing stride, each dim's stride passes the span of the dims before
    it. (False means "maybe not": ``strided_index`` and a count tell for sure.)"""
    span = 0
    for s, n in sorted((abs(s), n) for n, s in zip(size, stride) if n > 1):
        if s <= span:
            return False
        span += (n - 1) * s
    return True


def strided_index(size, stride, offset):
    """Storage position of every element of a tensor with this geometry (shape ``size``)."""
    idx = np.full(tuple(size), offset, dtype=np.int64)
    for d, (n, s) in enumerate(zip(size, stride)):
        shape = [1] * len(size)
        shape[d] = n
        idx = idx + (np.arange(n, dtype=np.int64) * s).reshape(shape)
    return idx


@lowering(aten.as_strided.default, aten.as_strided_copy.default)
def as_strided(x, size, stride, storage_offset=None):
    idx = strided_index(size, stride, storage_offset or 0)
    return jnp.reshape(x, (-1,))[idx] if idx.size else jnp.zeros(tuple(size), x.dtype)


def write_positions(flat, idx, vals, overlapping=None):
    """``flat`` with ``vals`` written at storage positions ``idx`` (a static numpy array, or a
    jax array with ``overlapping`` given).

    Where a position repeats (the view overlaps itself: expand, zero strides) only the elements
    the write CHANGED count, the last changed one winning: eager writes just the elements an op
    touches, so ``x.as_strided((3,), (0,), 2)[1] = 3`` leaves storage element 2 at 3 whatever the
    other, unwritten copies hold. Shared by the paths' write-backs through such views."""
    if not idx.size:
        return flat
    if overlapping is None:
        overlapping = np.unique(idx).size < idx.size
    if not overlapping:
        return flat.at[idx].set(vals)
    kind = jnp.int32 if flat.size < 2 ** 31 else jnp.int64
    changed = differs(vals, flat[idx])
    order = jnp.arange(idx.size, dtype=kind)
    last = jnp.full(flat.shape, -1, kind).at[idx].max(jnp.where(changed, order, -1))
    return jnp.where(last >= 0, vals[jnp.clip(last, 0, idx.size - 1)], flat)


def differs(a, b):
    """Elementwise: do ``a`` and ``b`` hold different bit patterns? (A write of 0.0 over -0.0
    changes the element; a NaN over the same NaN does not.)"""
    if jnp.issubdtype(a.dtype, jnp.complexfloating):
        return differs(jnp.real(a), jnp.real(b)) | differs(jnp.imag(a), jnp.imag(b))
    if jnp.issubdtype(a.dtype, jnp.floating):
        bits = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint64}[a.dtype.itemsize]
        return lax.bitcast_convert_type(a, bits) != lax.bitcast_convert_type(b, bits)
    return a != b


def dense_box(shape, size, stride, offset):
    """Where the window (size, stride, offset) of a contiguous tensor of ``shape`` is a dense box
    of it, whatever the window's dim order: (order, box shape, box start), with ``order`` the
    window dims (size > 1) from outermost to innermost. None for any other window."""
    kept = [d for d, n in enumerate(size) if n > 1]
    if any(stride[d] <= 0 for d in kept) or any(n == 0 for n in size) or not shape:
        return None
    order = tuple(sorted(kept, key=lambda d: -stride[d]))
    idx = strided_index([size[d] for d in order], [stride[d] for d in order], offset).reshape(-1)
    if idx.size and int(idx[-1]) >= int(np.prod(shape)):
        return None
    coords = np.stack(np.unravel_index(idx, shape))
    start, box = coords.min(axis=1), coords.max(axis=1) - coords.min(axis=1) + 1
    if int(np.prod(box)) != idx.size:
        return None
    contiguous = np.cumprod((1,) + tuple(shape[:0:-1]))[::-1]
    expected = strided_index(tuple(box), contiguous, int(np.dot(start, contiguous)))
    if not np.array_equal(expected.reshape(-1), idx):
        return None
    return order, tuple(int(b) for b in box), tuple(int(s) for s in start)


@lowering(aten.as_strided_scatter.default)
def as_strided_scatter(x, src, size, stride, storage_offset=None):
    """One dynamic_update_slice where the window is a dense box of ``x``; a scatter otherwise."""
    box = dense_box(x.shape, size, stride, storage_offset or 0)
    if box is not None:
        order, shape, start = box
        kept = [d for d, n in enumerate(size) if n > 1]
        value = jnp.reshape(src, [size[d] for d in kept])
        value = jnp.transpose(value, [kept.index(d) for d in order])
        return lax.dynamic_update_slice(x, jnp.reshape(value, shape).astype(x.dtype), start)
    idx = strided_index(size, stride, storage_offset or 0).reshape(-1)
    vals = jnp.reshape(src, (-1,)).astype(x.dtype)
    return write_positions(jnp.reshape(x, (-1,)), idx, vals).reshape(x.shape)


@lowering(aten.unfold.default, aten.unfold_copy.default)
def unfold(x, d, size, step):
    if x.ndim == 0:
        return jnp.reshape(x, (1,))
    d = dim(d, x.ndim)
    n = (x.shape[d] - size) // step + 1
    idx = (np.arange(n)[:, None] * step + np.arange(size)[None, :])
    taken = jnp.take(x, idx.reshape(-1), axis=d)
    taken = taken.reshape(x.shape[:d] + (n, size) + x.shape[d + 1:])
    return jnp.moveaxis(taken, d + 1, -1)


@lowering(aten.slice_scatter.default)
def slice_scatter(x, src, d=0, start=None, end=None, step=1):
    d = dim(d, x.ndim)
    start, end, step = _slice_bounds(x.shape[d], start, end, step)
    src = src.astype(x.dtype)
    sliced = x.shape[:d] + (len(range(start, end, step)),) + x.shape[d + 1:]
    if tuple(src.shape) != sliced:
        return _resized_slice_scatter(x, src, d, start)
    if step == 1:
        return lax.dynamic_update_slice_in_dim(x, src, start, axis=d)
    index = [slice(None)] * x.ndim
    index[d] = slice(start, end, step)
    return x.at[tuple(index)].set(src)


def _resized_slice_scatter(x, src, d, start):
    """The write-back of a slice view that an out= op resized to another shape: eager's
    ``resize_`` keeps the view's storage and offset with contiguous strides, so ``src`` lands,
    flattened, on the storage elements from the slice's first one (``x`` laid out contiguously,
    as the base of a view is here)."""
    offset = start * int(np.prod(x.shape[d + 1:], dtype=np.int64))
    flat = jnp.reshape(x, (-1,))
    if offset + src.size > flat.size:
        raise ValueError(f"slice_scatter: a resized view of {src.size} elements from storage "
                         f"offset {offset} does not fit in a base of {flat.size} elements")
    return jnp.reshape(lax.dynamic_update_slice(flat, jnp.reshape(src, (-1,)), (offset,)),
                       x.shape)


@lowering(aten.select_scatter.default)
def select_scatter(x, src, d, index):
    d = dim(d, x.ndim)
    index = index + x.shape[d] if index < 0 else index
    return lax.dynamic_update_index_in_dim(x, src.astype(x.dtype), index, d)


@lowering(aten.view_as_real.default, aten.view_as_real_copy.default)
def view_as_real(x):
    return jnp.stack([jnp.real(x), jnp.imag(x)], axis=-1)


@lowering(aten.view_as_complex.default, aten.view_as_complex_copy.default)
def view_as_complex(x):
    return lax.complex(x[..., 0], x[..., 1])


@lowering(aten.movedim.int, aten.movedim.intlist)
def movedim(x, source, destination):
    return jnp.moveaxis(x, source, destination)




@lowering(aten.unfold_backward.default, meta=True)
def unfold_backward(grad, input_sizes, d, size, step, *, aval):
    """Sum every window back to where it came from; elements in no window get zero."""
    if not aval.shape:
        return jnp.reshape(grad, ()).astype(aval.dtype)
    d = dim(d, len(aval.shape))
    n = (aval.shape[d] - size) // step + 1
    idx = (np.arange(n)[:, None] * step + np.arange(size)[None, :]).reshape(-1)
    windows = jnp.moveaxis(grad, -1, d + 1)
    windows = windows.reshape(aval.shape[:d] + (idx.size,) + aval.shape[d + 1:])
    index = [slice(None)] * len(aval.shape)
    index[d] = idx
    at = jnp.zeros(aval.shape, aval.dtype).at[tuple(index)]
    if aval.dtype == jnp.bool_:  # bool has no add: overlapping windows combine with `or`
        return at.max(windows.astype(aval.dtype))
    return at.add(windows.astype(aval.dtype))


@lowering(aten.view_copy.dtype, meta=True)
def view_copy_dtype(x, dtype, *, aval):
    return view(x, aval=aval)


@lowering(aten.resize.default, meta=True)
def resize(x, size, *, memory_format=None, aval):
    """Functional ``resize_``: the first elements in row-major order keep their values; elements
    past the old size are uninitialised in eager and zero here."""
    flat, n = jnp.reshape(x, (-1,)), int(np.prod(aval.shape, dtype=np.int64))
    if n > flat.shape[0]:
        flat = jnp.concatenate([flat, jnp.zeros((n - flat.shape[0],), x.dtype)])
    if memory_format in (None, torch.contiguous_format, torch.preserve_format) or n == 0:
        return jnp.reshape(flat[:n], aval.shape)
    # channels_last: the same storage read through that format's (dense) strides
    stride = torch.empty(aval.shape, device="meta", memory_format=memory_format).stride()
    return flat[strided_index(aval.shape, stride, 0)]


@tracer.special(aten.resize_as_.default)
def _resize_as(cls, func, args, kwargs):
    """``x.resize_as_(other)`` is ``x.resize_(other.shape)`` (which has a functional variant)."""
    return args[0].resize_(args[1].shape)


# ----------------------------------------------------------------------------------------------
# Writes into a view whose elements overlap (unfold windows with step < size, as_strided): eager
# runs the op element by element over the shared memory, in its TensorIterator's order, so a
# storage element reached by k view elements sees k writes in a row, each reading the last.

def broadcast_strides(shape, op_shape, op_stride) -> tuple:
    """An operand's strides over the iteration ``shape`` (0 on broadcast dims), as eager's
    TensorIterator computes them."""
    out = [0] * len(shape)
    lead = len(shape) - len(op_shape)
    for i, (n, s) in enumerate(zip(op_shape, op_stride)):
        out[lead + i] = 0 if (n == 1 and shape[lead + i] != 1) else s
    return tuple(out)


def iteration_order(shape, operand_strides) -> np.ndarray:
    """Flat (C-order) indices of the elements of ``shape`` in the order eager's CPU
    TensorIterator visits them (``reorder_dimensions``: the dims sorted by the operands' strides,
    outputs first, ties broken by size, then by the next operand; broadcast dims never decide).
    Exact for the serial loop, i.e. below the grain size (32768 elements) where eager does not
    split the walk across threads."""
    shape = tuple(int(n) for n in shape)
    flat = np.arange(int(np.prod(shape, dtype=np.int64)), dtype=np.int64)
    nd = len(shape)
    if nd <= 1:
        return flat
    perm = list(range(nd - 1, -1, -1))      # perm[0]: the fastest moving dim

    def should_swap(d0, d1):
        for st in operand_strides:
            s0, s1 = st[d0], st[d1]
            if s0 == 0 or s1 == 0:
                continue
            if s0 != s1:
                return -1 if s0 < s1 else 1
            if shape[d0] > shape[d1]:
                return 1
        return 0

    for i in range(1, nd):
        d1 = i
        for d0 in range(i - 1, -1, -1):
            c = should_swap(perm[d0], perm[d1])
            if c > 0:
                perm[d0], perm[d1] = perm[d1], perm[d0]
                d1 = d0
            elif c < 0:
                break
    return np.transpose(flat.reshape(shape), perm[::-1]).reshape(-1)


class OverlapWalk:
    """Eager's walk over a view whose elements share storage: the view elements at storage
    ``positions`` (any shape, C order) visited in ``order`` (flat indices). Elements sharing a
    position form a group; ``rounds[r][e]`` is the r-th visited element of e's group (-1 where the
    group is smaller), ``last[e]`` its last visited element, ``group[e]`` its group number."""

    def __init__(self, positions, order):
        pos = np.asarray(positions, dtype=np.int64).reshape(-1)
        n = pos.size
        rank = np.empty(n, np.int64)
        rank[np.asarray(order, dtype=np.int64)] = np.arange(n, dtype=np.int64)
        by = np.lexsort((rank, pos))                  # grouped by position, visit order inside
        starts = np.r_[True, pos[by][1:] != pos[by][:-1]] if n else np.zeros(0, bool)
        gid_sorted = np.cumsum(starts) - 1
        self.group = np.empty(n, np.int64)
        self.group[by] = gid_sorted
        self.groups = int(gid_sorted[-1]) + 1 if n else 0
        first = np.flatnonzero(starts)
        sizes = np.diff(np.r_[first, n])
        self.depth = int(sizes.max()) if n else 0
        self.rounds = np.full((self.depth, n), -1, np.int64)
        for r in range(self.depth):
            ok = sizes > r
            who = by[first[ok] + r]                   # the r-th visited element of each group
            table = np.full(self.groups, -1, np.int64)
            table[np.flatnonzero(ok)] = who
            self.rounds[r] = table[self.group]
        self.last = by[first + sizes - 1][self.group] if n else np.zeros(0, np.int64)
        self.rank = rank

    @property
    def overlaps(self) -> bool:
        return self.depth > 1


def _table(a) -> bytes:
    return np.ascontiguousarray(a, dtype=np.int64).tobytes()


def _array(b: bytes):
    return np.frombuffer(b, dtype=np.int64)


@dataclass(frozen=True)
class TakeRound:
    """IR rule, one round of the walk: elements whose group has an r-th element take the value
    ``res`` computed for that element; the others keep ``cur``."""

    src: bytes

    def __call__(self, cur, res):
        src = _array(self.src)
        flat_res = jnp.reshape(res, (-1,)).astype(cur.dtype)
        taken = flat_res[np.maximum(src, 0)]
        return jnp.reshape(jnp.where(src >= 0, taken, jnp.reshape(cur, (-1,))), cur.shape)


@dataclass(frozen=True)
class TakeLast:
    """IR rule: every element takes the value its group's last visited element was given (a
    plain write of every element: the last write wins)."""

    src: bytes

    def __call__(self, x, new):
        flat = jnp.reshape(jnp.broadcast_to(new, x.shape), (-1,)).astype(x.dtype)
        return jnp.reshape(flat[_array(self.src)], x.shape)


@dataclass(frozen=True)
class SumChanges:
    """IR rule: every element takes its old value plus the changes of its whole group (an
    accumulating write: each element's contribution adds into the shared memory). ``new`` is
    the written value, or each element's contribution where ``is_delta``."""

    group: bytes
    groups: int
    is_delta: bool = False

    def __call__(self, x, new):
        gid = _array(self.group)
        new = jnp.broadcast_to(new, x.shape).astype(x.dtype)
        delta = jnp.reshape(new if self.is_delta else new - x, (-1,))
        if x.dtype == jnp.bool_:
            total = jnp.zeros(self.groups, jnp.bool_).at[gid].max(delta)
        else:
            total = jnp.zeros(self.groups, x.dtype).at[gid].add(delta)
        return jnp.reshape(jnp.reshape(x, (-1,)) + total[gid], x.shape)


@dataclass(frozen=True)
class LastChanged:
    """IR rule: every element takes the value of its group's last visited element that the write
    wrote, or keeps its own (a write of some elements only: index_put_, scatter_, ...). Written
    are the elements where the op's results ``a`` and ``b`` on two different inputs agree (a
    write does not read the element it writes), or without them those it changed."""

    group: bytes
    groups: int
    rank: bytes

    def __call__(self, x, new, a=None, b=None):
        gid, rank = _array(self.group), _array(self.rank)
        flat_x = jnp.reshape(x, (-1,))
        flat_new = jnp.reshape(new, (-1,)).astype(x.dtype)
        written = (flat_new != flat_x) if a is None else (jnp.reshape(a, (-1,))
                                                          == jnp.reshape(b, (-1,)))
        key = jnp.where(written, rank, -1)
        best = jnp.full(self.groups, -1, jnp.int64).at[gid].max(key)[gid]
        chosen = flat_new[jnp.asarray(np.argsort(rank))[jnp.maximum(best, 0)]]
        return jnp.reshape(jnp.where(best >= 0, chosen, flat_x), x.shape)


def walk_node(rule, inputs, aval):
    """A Value of one of the rules above applied to ``inputs`` (Values)."""
    from ..lazy.ir import Node, Slot, Value
    node = Node(f"overlap.{type(rule).__name__}", rule, tuple(Slot(i) for i in range(len(inputs))),
                (), tuple(inputs), (aval,))
    return Value(node, 0)
