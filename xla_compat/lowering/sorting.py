"""Sorting and order statistics: sort/argsort/msort, topk, kthvalue, median/nanmedian, mode,
searchsorted/bucketize.

Everything is built on one stable sort that orders values the way PyTorch does (NaN greater than
every number, -0.0 equal to 0.0, descending keeps equal elements in their original order).
PyTorch's CPU sort without ``stable=True`` (and topk, kthvalue, median) leave the order of equal
elements unspecified; here they always come out in the stable order.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from ._helpers import dim as wrap_dim, is_float
from .registry import aten, lowering


def _descending_keys(x) -> list:
    """Sort keys whose ascending order is ``x``'s descending order, NaN first."""
    if x.dtype == jnp.bool_:
        return [~x.astype(jnp.uint8)]
    if is_float(x.dtype):
        return [(~jnp.isnan(x)).astype(jnp.int32), -x]
    return [~x]  # bitwise not reverses integer order without overflow


def sort_last(x, descending: bool = False):
    """Stable sort along the last axis: (values, int64 indices)."""
    iota = lax.broadcasted_iota(jnp.int64, x.shape, x.ndim - 1)
    keys = _descending_keys(x) if descending else [x.astype(jnp.uint8) if x.dtype == jnp.bool_ else x]
    out = lax.sort((*keys, x, iota), dimension=x.ndim - 1, is_stable=True, num_keys=len(keys))
    return out[-2], out[-1]


def _along(fn, x, d, *args):
    """Apply ``fn`` (working on the last axis) along dim ``d``; outputs move back to ``d``."""
    if x.ndim == 0:
        outs = fn(jnp.reshape(x, (1,)), *args)
        return tuple(jnp.reshape(o, o.shape[1:] if o.ndim else ()) for o in outs)
    d = wrap_dim(d, x.ndim)
    outs = fn(jnp.moveaxis(x, d, -1), *args)
    return tuple(jnp.moveaxis(o, -1, d) if o.ndim == x.ndim else o for o in outs)


@lowering(aten.sort.default, aten.sort.stable)
def sort(x, d=-1, descending=False, *, stable=None, dim=None):
    if dim is not None:  # sort.stable passes everything but self by keyword
        d = dim
    return _along(sort_last, x, d, descending)


@lowering(aten.argsort.default, aten.argsort.stable)
def argsort(x, d=-1, descending=False, *, stable=None, dim=None):
    return sort(x, d, descending, stable=stable, dim=dim)[1]


@lowering(aten.msort.default)
def msort(x):
    return sort(x, 0)[0]


@lowering(aten.topk.default)
def topk(x, k, d=-1, largest=True, sorted=True):
    def last(v):
        values, idx = sort_last(v, largest)
        return values[..., :k], idx[..., :k]
    return _along(last, x, d)


def _pick(values, idx, pos, keepdim):
    """Element ``pos`` (an index array over the leading dims) of each row along the last axis."""
    v = jnp.take_along_axis(values, pos[..., None], axis=-1)
    i = jnp.take_along_axis(idx, pos[..., None], axis=-1)
    return (v, i) if keepdim else (v[..., 0], i[..., 0])


def _keepdim_along(fn, x, d, keepdim):
    """Like ``_along`` for reductions along ``d`` computed on the last axis with keepdim=True."""
    if x.ndim == 0:
        v, i = fn(jnp.reshape(x, (1,)))
        return jnp.reshape(v, ()), jnp.reshape(i, ())
    d = wrap_dim(d, x.ndim)
    v, i = fn(jnp.moveaxis(x, d, -1))
    v, i = jnp.moveaxis(v, -1, d), jnp.moveaxis(i, -1, d)
    return (v, i) if keepdim else (jnp.squeeze(v, d), jnp.squeeze(i, d))


@lowering(aten.kthvalue.default)
def kthvalue(x, k, d=-1, keepdim=False):
    def last(v):
        values, idx = sort_last(v)
        return _pick(values, idx, jnp.full(v.shape[:-1], k - 1, jnp.int32), True)
    return _keepdim_along(last, x, d, keepdim)


def _median_last(v, ignore_nan: bool):
    """Lower median along the last axis; NaN propagates (median) or is skipped (nanmedian)."""
    values, idx = sort_last(v)  # NaNs sort last, the first of them keeps its original order
    n = v.shape[-1]
    valid = jnp.sum(~jnp.isnan(v), axis=-1) if is_float(v.dtype) else jnp.full(v.shape[:-1], n)
    if ignore_nan:
        pos = jnp.where(valid == 0, 0, (valid - 1) // 2)
    else:
        pos = jnp.where(valid < n, valid, (n - 1) // 2)  # any NaN: the first NaN is the answer
    return _pick(values, idx, pos.astype(jnp.int32), True)


@lowering(aten.median.default)
def median(x):
    if x.size == 0:
        return jnp.full((), jnp.nan, x.dtype)
    return _median_last(jnp.reshape(x, (-1,)), False)[0][0]


@lowering(aten.nanmedian.default)
def nanmedian(x):
    if x.size == 0:
        return jnp.full((), jnp.nan, x.dtype)
    return _median_last(jnp.reshape(x, (-1,)), True)[0][0]


@lowering(aten.median.dim)
def median_dim(x, d, keepdim=False):
    return _keepdim_along(lambda v: _median_last(v, False), x, d, keepdim)


@lowering(aten.nanmedian.dim)
def nanmedian_dim(x, d, keepdim=False):
    return _keepdim_along(lambda v: _median_last(v, True), x, d, keepdim)


def _mode_last(v):
    """Most frequent value along the last axis (the smallest on ties) and its last index."""
    values, idx = sort_last(v)
    n = v.shape[-1]
    pos = lax.broadcasted_iota(jnp.int32, values.shape, values.ndim - 1)
    same_prev = jnp.concatenate(
        [jnp.zeros(values.shape[:-1] + (1,), bool), values[..., 1:] == values[..., :-1]], -1)
    same_next = jnp.concatenate(
        [values[..., :-1] == values[..., 1:], jnp.zeros(values.shape[:-1] + (1,), bool)], -1)
    start = lax.cummax(jnp.where(same_prev, 0, pos), axis=values.ndim - 1)
    end = lax.cummin(jnp.where(same_next, n - 1, pos), axis=values.ndim - 1, reverse=True)
    best = jnp.argmax(end - start, axis=-1).astype(jnp.int32)
    last = jnp.take_along_axis(end, best[..., None], axis=-1)[..., 0]
    v = jnp.take_along_axis(values, best[..., None], axis=-1)
    i = jnp.take_along_axis(idx, last[..., None], axis=-1)
    return v, i


@lowering(aten.mode.default)
def mode(x, d=-1, keepdim=False):
    return _keepdim_along(_mode_last, x, d, keepdim)


# -- searching a sorted sequence -------------------------------------------------------------------

def _searchsorted(seq, values, right: bool, sorter=None):
    if sorter is not None:
        seq = jnp.take_along_axis(seq, sorter, axis=-1)
    side = "right" if right else "left"
    if seq.ndim <= 1:
        return jnp.searchsorted(seq, values, side=side).astype(jnp.int64)
    lead = seq.shape[:-1]
    flat_seq = jnp.reshape(seq, (-1, seq.shape[-1]))
    flat_val = jnp.reshape(values, (flat_seq.shape[0], -1))
    out = jax.vmap(lambda s, v: jnp.searchsorted(s, v, side=side))(flat_seq, flat_val)
    return jnp.reshape(out, lead + values.shape[len(lead):]).astype(jnp.int64)


@lowering(aten.searchsorted.Tensor, aten.searchsorted.Scalar, static=True)
def searchsorted(seq, values, *, out_int32=False, right=False, side=None, sorter=None):
    return _searchsorted(seq, jnp.asarray(values), right or side == "right", sorter)


@lowering(aten.bucketize.Tensor, aten.bucketize.Scalar, static=True)
def bucketize(values, boundaries, *, out_int32=False, right=False):
    return _searchsorted(boundaries, jnp.asarray(values), right)
