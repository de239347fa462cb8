"""Advanced indexing and its writes: index/index_put, take/put, index_select, the backward ops
of select/slice/diagonal, diag_embed and trace.

Indices reach these rules as integer arrays (boolean masks are turned into integer indices by
``host.py`` before tracing, and out-of-range indices are caught there when their values are
known on the host). Writes with repeated indices keep the last write, as CPU eager's serial loop
does, instead of leaving the winner to the scatter implementation.
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from ._helpers import cast, dim
from .registry import aten, lowering


def wrap_index(idx, size):
    """Negative indices count from the end, as in eager."""
    idx = jnp.asarray(idx)
    if idx.dtype == jnp.bool_ or not jnp.issubdtype(idx.dtype, jnp.signedinteger):
        return idx.astype(jnp.int64)
    return jnp.where(idx < 0, idx + size, idx)


def last_write_wins(idx_arrays, sizes):
    """Mask over the broadcast index shape: True where no later position writes the same place.

    ``idx_arrays`` are wrapped (non-negative) integer arrays that broadcast together; together
    they address one element of a tensor whose indexed dims have ``sizes``.
    """
    shape = jnp.broadcast_shapes(*(a.shape for a in idx_arrays))
    lin = jnp.zeros(shape, jnp.int64)
    for a, n in zip(idx_arrays, sizes):
        lin = lin * n + jnp.broadcast_to(a, shape).astype(jnp.int64)
    flat = jnp.reshape(lin, (-1,))
    order = jnp.arange(flat.shape[0], dtype=jnp.int64)
    sorted_lin, perm = lax.sort((flat, order), num_keys=1, is_stable=True)
    last = jnp.concatenate([sorted_lin[1:] != sorted_lin[:-1], jnp.ones((1,), bool)]) \
        if flat.shape[0] else jnp.zeros((0,), bool)
    keep = jnp.zeros(flat.shape, bool).at[perm].set(last)
    return jnp.reshape(keep, shape)


def _index_tuple(x, indices):
    """Indices (None = whole dim) as a jnp index tuple with negative indices wrapped."""
    return tuple(slice(None) if i is None else wrap_index(i, x.shape[d])
                 for d, i in enumerate(indices))


@lowering(aten.index.Tensor)
def index(x, indices):
    if not any(i is not None for i in indices):
        return x
    return x[_index_tuple(x, indices)]


def _index_put(x, indices, values, accumulate):
    idx = _index_tuple(x, indices)
    values = cast(values, x.dtype)
    if accumulate:
        if x.dtype == jnp.bool_:
            return x.at[idx].max(values, mode="drop")
        return x.at[idx].add(values, mode="drop")
    adv = [(d, a) for d, a in enumerate(idx) if not isinstance(a, slice)]
    if not adv:
        return x.at[idx].set(values)
    keep = last_write_wins([a for _, a in adv], [x.shape[d] for d, _ in adv])
    idx = list(idx)
    for d, a in adv:  # a dropped write points past the end and is discarded
        idx[d] = jnp.where(keep, a, x.shape[d])
    return x.at[tuple(idx)].set(values, mode="drop")


@lowering(aten.index_put.default, aten._index_put_impl.default, aten._index_put_impl_.default)
def index_put(x, indices, values, accumulate=False, unsafe=False):
    return _index_put(x, indices, values, accumulate)


@lowering(aten.take.default)
def take(x, index):
    flat = jnp.reshape(x, (-1,))
    return flat[wrap_index(index, flat.shape[0])]


@lowering(aten.put.default)
def put(x, index, source, accumulate=False):
    flat = jnp.reshape(x, (-1,))
    index = jnp.reshape(wrap_index(index, flat.shape[0]), (-1,))
    out = _index_put(flat, [index], jnp.reshape(source, (-1,)), accumulate)
    return jnp.reshape(out, x.shape)


@lowering(aten.index_select.default)
def index_select(x, d, index):
    if x.ndim == 0:  # eager returns the 0-d tensor itself
        return x
    d = dim(d, x.ndim)
    return jnp.take(x, jnp.reshape(wrap_index(index, x.shape[d]), (-1,)), axis=d)


@lowering(aten.nonzero_static.default, static=True)
def nonzero_static(x, *, size, fill_value=-1):
    """nonzero with a fixed row count: padded with ``fill_value``, or cut off at ``size``."""
    if x.ndim == 0:
        return jnp.zeros((size, 0), jnp.int64)
    return jnp.stack(jnp.nonzero(x, size=size, fill_value=fill_value), axis=-1)


# -- backward of views: put the gradient where the view lived in a zero tensor -----------------------

@lowering(aten.select_backward.default, meta=True)
def select_backward(grad, input_sizes, d, i, *, aval):
    d = dim(d, len(input_sizes))
    i = i + input_sizes[d] if i < 0 else i
    zeros = jnp.zeros(aval.shape, aval.dtype)
    return lax.dynamic_update_index_in_dim(zeros, cast(grad, aval.dtype), i, d)


@lowering(aten.slice_backward.default, meta=True)
def slice_backward(grad, input_sizes, d, start, end, step, *, aval):
    from .views import _slice_bounds
    d = dim(d, len(input_sizes))
    start, end, step = _slice_bounds(input_sizes[d], start, end, step)
    index = [slice(None)] * len(input_sizes)
    index[d] = slice(start, end, step)
    return jnp.zeros(aval.shape, aval.dtype).at[tuple(index)].set(cast(grad, aval.dtype))


@lowering(aten.diagonal_backward.default, meta=True)
def diagonal_backward(grad, input_sizes, offset, dim1, dim2, *, aval):
    from .views import diagonal_scatter
    return diagonal_scatter(jnp.zeros(aval.shape, aval.dtype), grad, offset, dim1, dim2)


@lowering(aten.diag_embed.default, meta=True)
def diag_embed(x, offset=0, dim1=-2, dim2=-1, *, aval):
    from .views import diagonal_scatter
    # The output's diagonal (dims dim1, dim2) is x's last dim; its other dims are x's others.
    return diagonal_scatter(jnp.zeros(aval.shape, aval.dtype), x, offset, dim1, dim2)


@lowering(aten.trace.default, meta=True)
def trace(x, *, aval):
    n = min(x.shape)
    return jnp.sum(cast(x[np.arange(n), np.arange(n)], aval.dtype))
