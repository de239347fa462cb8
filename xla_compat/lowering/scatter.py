"""gather and the scatter family: scatter (src/value/reduce), scatter_add, scatter_reduce,
index_add/index_copy/index_fill/index_reduce, masked_scatter.

``gather``/``scatter`` address ``self`` with an index tensor of the same rank: element ``p`` of
``index`` names a position along ``dim``, the other coordinates are ``p``'s own. Writes with
repeated indices keep the last write (CPU eager's serial order); reductions combine them all.
"""
from __future__ import annotations

import math

import jax.numpy as jnp
from jax import lax

import torch

from ..lazy import tracer
from ._helpers import cast, dim, is_float
from .indexing import last_write_wins, wrap_index
from .registry import aten, lowering


def _coords(index, d):
    """The full coordinate tuple addressing, for each element of ``index``, its target."""
    return tuple(index if a == d else lax.broadcasted_iota(jnp.int64, index.shape, a)
                 for a in range(index.ndim))


def _prep(x, d, index):
    """0-d tensors act as 1-element 1-d tensors; returns (x, d, index, 0-d?)."""
    scalar = x.ndim == 0
    if scalar:
        x = jnp.reshape(x, (1,))
    if index.ndim == 0:
        index = jnp.reshape(index, (1,) * x.ndim)
    d = dim(d, x.ndim)
    return x, d, wrap_index(index, x.shape[d]), scalar


@lowering(aten.gather.default)
def gather(x, d, index, *, sparse_grad=False):
    shape = index.shape
    if index.size == 0:     # eager accepts an empty index of any rank
        return jnp.zeros(shape, x.dtype)
    x, d, index, _ = _prep(x, d, index)
    return jnp.reshape(x[_coords(index, d)], shape)


def _src_for(src, index):
    """The part of ``src`` the index covers (src may be larger than index), or a broadcast scalar."""
    if jnp.ndim(src) == 0:
        return jnp.broadcast_to(src, index.shape)
    if src.ndim != index.ndim:  # a 0-d self was widened to 1-d
        src = jnp.reshape(src, (1,) * (index.ndim - src.ndim) + src.shape)
    return src[tuple(slice(0, n) for n in index.shape)]


def _scatter(x, d, index, src, reduce=None):
    shape = x.shape
    if index.size == 0:     # nothing to write (the index may have any rank when empty)
        return x
    x, d, index, _ = _prep(x, d, index)
    src = cast(_src_for(src, index), x.dtype)
    coords = _coords(index, d)
    if reduce is None:
        keep = last_write_wins(coords, x.shape)
        coords = tuple(jnp.where(keep, c, n) for c, n in zip(coords, x.shape))
        out = x.at[coords].set(src, mode="drop")
    elif reduce in ("add", "sum"):
        out = x.at[coords].max(src) if x.dtype == jnp.bool_ else x.at[coords].add(src)
    elif reduce in ("multiply", "prod"):
        out = x.at[coords].min(src) if x.dtype == jnp.bool_ else x.at[coords].multiply(src)
    elif reduce == "amax":
        out = x.at[coords].max(src)
    elif reduce == "amin":
        out = x.at[coords].min(src)
    else:
        raise ValueError(f"unknown scatter reduction {reduce!r}")
    return jnp.reshape(out, shape)


@lowering(aten.scatter.src, aten.scatter.value)
def scatter(x, d, index, src):
    return _scatter(x, d, index, src)


@lowering(aten.scatter.reduce, aten.scatter.value_reduce)
def scatter_reduce_legacy(x, d, index, src, *, reduce):
    return _scatter(x, d, index, src, reduce)


@lowering(aten.scatter_add.default)
def scatter_add(x, d, index, src):
    return _scatter(x, d, index, src, "add")


def _identity(reduce, dtype):
    if reduce in ("sum", "mean"):
        return jnp.zeros((), dtype)
    if reduce == "prod":
        return jnp.ones((), dtype)
    if dtype == jnp.bool_:
        return jnp.asarray(reduce == "amin")
    if is_float(dtype):
        return jnp.asarray(-jnp.inf if reduce == "amax" else jnp.inf, dtype)
    info = jnp.iinfo(dtype)
    return jnp.asarray(info.min if reduce == "amax" else info.max, dtype)


def _scatter_reduce(x, d, index, src, reduce, include_self):
    """scatter_reduce.two: ``reduce`` over self (if ``include_self``) and every src aimed at a place."""
    shape = x.shape
    if index.size == 0:
        return x
    x, d, index, _ = _prep(x, d, index)
    src = cast(_src_for(src, index), x.dtype)
    coords = _coords(index, d)
    touched = jnp.zeros(x.shape, bool).at[coords].set(True)
    base = x if include_self else jnp.where(touched, _identity(reduce, x.dtype), x)
    if reduce == "mean":
        total = base.at[coords].add(src) if x.dtype != jnp.bool_ else base.at[coords].max(src)
        count = jnp.zeros(x.shape, jnp.int64).at[coords].add(1) + (1 if include_self else 0)
        count = jnp.maximum(count, 1)
        if is_float(x.dtype):
            out = jnp.where(touched, total / count.astype(x.dtype), x)
        else:
            out = jnp.where(touched, jnp.floor_divide(total, count.astype(x.dtype)), x)
    else:
        out = _scatter(base, d, index, src, reduce)
    return jnp.reshape(out, shape)


@lowering(aten.scatter_reduce.two)
def scatter_reduce(x, d, index, src, reduce, *, include_self=True):
    return _scatter_reduce(x, d, index, src, reduce, include_self)


# -- index_* ops: one index vector along ``dim``, whole slices of ``source`` -----------------------

def _along_index(x, d, index, source):
    """(x, d, full index tensor, source) turning index_*(dim, index) into a scatter along dim."""
    if x.ndim == 0:
        x = jnp.reshape(x, (1,))
        source = jnp.reshape(source, (-1,)) if jnp.ndim(source) else source
    d = dim(d, x.ndim)
    index = jnp.reshape(wrap_index(index, x.shape[d]), (-1,))
    src_shape = x.shape[:d] + (index.shape[0],) + x.shape[d + 1:]
    if jnp.ndim(source):
        source = jnp.reshape(source, src_shape)
    shape = [1] * x.ndim
    shape[d] = index.shape[0]
    full = jnp.broadcast_to(jnp.reshape(index, shape), src_shape)
    return x, d, full, source


@tracer.meta_arguments(aten.index_add.default, aten.index_add_.default, aten.index_add.out)
def _integral_alpha(func, args, kwargs):
    """CPU eager's index_add into an integer tensor takes a float alpha as the integer C++'s cast
    makes of it (1.7 -> 1, 0.5 -> 0); torch's meta kernel refuses it ("alpha argument of type
    float cannot be safely cast"). The meta kernel runs on that integer alpha; the lowering casts
    alpha to the result dtype alike (truncation toward zero)."""
    alpha = kwargs.get("alpha")
    x = args[0] if args else kwargs.get("self")
    if (type(alpha) is float and isinstance(x, torch.Tensor)
            and not (x.dtype.is_floating_point or x.dtype.is_complex or x.dtype == torch.bool)
            and math.isfinite(alpha)):
        return args, {**kwargs, "alpha": int(alpha)}
    return args, kwargs


@lowering(aten.index_add.default, meta=True)
def index_add(x, d, index, source, *, alpha=1, aval):
    xs, d, full, source = _along_index(x, d, index, source)
    # bool: eager computes source * alpha first, so alpha=False adds nothing (True | False)
    source = cast(source, aval.dtype) * cast(alpha, aval.dtype) if aval.dtype != jnp.bool_ \
        else cast(source, aval.dtype) & cast(alpha, jnp.bool_)
    return jnp.reshape(_scatter(xs, d, full, source, "add"), x.shape)


@lowering(aten.index_copy.default)
def index_copy(x, d, index, source):
    xs, d, full, source = _along_index(x, d, index, source)
    return jnp.reshape(_scatter(xs, d, full, source), x.shape)


@lowering(aten.index_fill.int_Scalar, aten.index_fill.int_Tensor)
def index_fill(x, d, index, value):
    if x.ndim == 0:
        return jnp.where(jnp.size(index) > 0, cast(value, x.dtype), x)
    d = dim(d, x.ndim)
    idx = [slice(None)] * x.ndim
    idx[d] = jnp.reshape(wrap_index(index, x.shape[d]), (-1,))
    return x.at[tuple(idx)].set(cast(value, x.dtype))


@lowering(aten.index_reduce.default)
def index_reduce(x, d, index, source, reduce, *, include_self=True):
    xs, d, full, source = _along_index(x, d, index, source)
    return jnp.reshape(_scatter_reduce(xs, d, full, source, reduce, include_self), x.shape)


@lowering(aten.masked_scatter.default, meta=True)
def masked_scatter(x, mask, source, *, aval):
    """Copies source's elements, in order, into the places where ``mask`` is True."""
    mask = jnp.reshape(jnp.broadcast_to(mask, aval.shape), (-1,))
    flat = jnp.reshape(jnp.broadcast_to(x, aval.shape), (-1,))
    src = jnp.reshape(cast(source, aval.dtype), (-1,))
    if src.shape[0] == 0:
        return jnp.reshape(flat, aval.shape)
    k = jnp.clip(jnp.cumsum(mask.astype(jnp.int64)) - 1, 0, src.shape[0] - 1)
    return jnp.reshape(jnp.where(mask, src[k], flat), aval.shape)


@lowering(aten.masked_scatter_backward.default, meta=True)
def masked_scatter_backward(grad, mask, sizes, *, aval):
    """The gradient of source: grad's masked elements in order, zero-padded to ``sizes``."""
    mask = jnp.reshape(jnp.broadcast_to(mask, grad.shape), (-1,))
    g = jnp.reshape(grad, (-1,))
    n = math.prod(aval.shape)
    pos = jnp.where(mask, jnp.cumsum(mask.astype(jnp.int64)) - 1, n)
    out = jnp.zeros((n,), aval.dtype).at[pos].set(cast(g, aval.dtype), mode="drop")
    return jnp.reshape(out, aval.shape)
