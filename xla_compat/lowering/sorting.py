"""Sorting and order statistics: sort/argsort/msort, topk, kthvalue, median/nanmedian, mode,
searchsorted/bucketize.

Everything is built on one stable sort that orders values the way PyTorch does (NaN greater than
every number, -0.0 equal to 0.0, descending keeps equal elements in their original order).
PyTorch's CPU sort without ``stable=True`` (and topk, median, mode) leave the order of equal
elements to std::sort/nth_element; here they come out in the stable order. kthvalue follows
eager's own quickselect, so its index for ties is eager's.
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


def _gt_or_nan(x, y):
    if is_float(x.dtype):
        return (jnp.isnan(x) & ~jnp.isnan(y)) | (x > y)
    return x > y


def _swap_if(a, ix, p, q, cond):
    ap, aq, ip, iq = a[p], a[q], ix[p], ix[q]
    a = a.at[p].set(jnp.where(cond, aq, ap)).at[q].set(jnp.where(cond, ap, aq))
    ix = ix.at[p].set(jnp.where(cond, iq, ip)).at[q].set(jnp.where(cond, ip, iq))
    return a, ix


def _quick_select_row(a, k):
    """(value, index) of eager CPU kthvalue on one row: the same Sedgewick quickselect (median of
    three, Hoare partition), so ties return eager's index. Each Hoare partition is computed at
    once: the m-th left stop (a >= pivot) swaps with the m-th right stop (a <= pivot) while they
    have not crossed; only the partitions (about log n of them) run sequentially."""
    n = a.shape[0]
    pos = jnp.arange(n)
    far = n + 8

    def partition(a, ix, lo, hi):
        a, ix = _swap_if(a, ix, (lo + hi) >> 1, lo + 1, True)
        a, ix = _swap_if(a, ix, lo + 1, hi, _gt_or_nan(a[lo + 1], a[hi]))
        a, ix = _swap_if(a, ix, lo, hi, _gt_or_nan(a[lo], a[hi]))
        a, ix = _swap_if(a, ix, lo + 1, lo, _gt_or_nan(a[lo + 1], a[lo]))
        piv = a[lo]
        istop = (pos >= lo + 2) & (pos <= hi) & ~_gt_or_nan(piv, a)
        jstop = (pos >= lo + 1) & (pos <= hi - 1) & ~_gt_or_nan(a, piv)
        ri, rj = jnp.cumsum(istop), jnp.cumsum(jstop[::-1])[::-1]  # 1-based stop ranks
        # p[m]: m-th left stop (p[0] = -1), q[m]: m-th right stop (q[0] = far)
        p = jnp.full(n + 3, far).at[0].set(-1).at[jnp.where(istop, ri, far)].set(pos, mode="drop")
        q = jnp.full(n + 3, -1).at[0].set(far).at[jnp.where(jstop, rj, far)].set(pos, mode="drop")
        m = jnp.sum(p[1:] < q[1:])  # swaps made before the pointers meet
        same = p[m + 1] == q[m + 1]  # both pointers stop on one pivot-equal element: a no-op swap
        i = jnp.minimum(jnp.where(same, p[m + 2], p[m + 1]), q[m])
        j = jnp.maximum(jnp.where(same, q[m + 2], q[m + 1]), p[m])
        src = jnp.where(istop & (ri <= m), q[ri], pos)
        src = jnp.where(jstop & (rj <= m), p[rj], src)
        a, ix = _swap_if(a[src], ix[src], lo, j, True)
        return a, ix, jnp.where(j <= k, i, lo), jnp.where(j >= k, j - 1, hi)

    def step(state):
        a, ix, lo, hi = state
        a2, ix2 = _swap_if(a, ix, lo, hi, _gt_or_nan(a[lo], a[hi]))  # two elements left
        ap, ixp, lop, hip = partition(a, ix, lo, hi)
        more = hi > lo + 1
        return (jnp.where(more, ap, a2), jnp.where(more, ixp, ix2),
                jnp.where(more, lop, lo), jnp.where(more, hip, lo))

    state = (a, jnp.arange(n, dtype=jnp.int64), jnp.int64(0), jnp.int64(n - 1))
    a, ix, _, _ = lax.while_loop(lambda s: s[3] > s[2], step, state)
    return a[k], ix[k]


@lowering(aten.kthvalue.default)
def kthvalue(x, k, d=-1, keepdim=False):
    def last(v):
        rows = jnp.reshape(v, (-1, v.shape[-1]))
        rows = rows.astype(jnp.uint8) if rows.dtype == jnp.bool_ else rows
        vals, idx = jax.vmap(lambda r: _quick_select_row(r, k - 1))(rows)
        lead = v.shape[:-1] + (1,)
        return jnp.reshape(vals, lead).astype(v.dtype), jnp.reshape(idx, lead)
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
