"""View ops as copies (``*_copy`` semantics) and their inverse ``*_scatter`` write-backs.

The core computes what a view reads; aliasing is the paths' job. Every view overload and its
``_copy`` twin share one rule.
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
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
    changed = vals != flat[idx]
    order = jnp.arange(idx.size, dtype=kind)
    last = jnp.full(flat.shape, -1, kind).at[idx].max(jnp.where(changed, order, -1))
    return jnp.where(last >= 0, vals[jnp.clip(last, 0, idx.size - 1)], flat)


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
    if step == 1:
        return lax.dynamic_update_slice_in_dim(x, src, start, axis=d)
    index = [slice(None)] * x.ndim
    index[d] = slice(start, end, step)
    return x.at[tuple(index)].set(src)


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
    return jnp.reshape(flat[:n], aval.shape)


@tracer.special(aten.resize_as_.default)
def _resize_as(cls, func, args, kwargs):
    """``x.resize_as_(other)`` is ``x.resize_(other.shape)`` (which has a functional variant)."""
    return args[0].resize_(args[1].shape)
