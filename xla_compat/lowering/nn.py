"""Neural-network ops: softmax family, nll_loss, embedding (+renorm), _trilinear (F.bilinear), pdist.

Backward ops are lowered as the vjp of their forward rule where PyTorch's closed form adds
nothing; XLA fuses the result.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax import lax
import numpy as np

from . import opmath
from ._helpers import acc_dtype, cast, dim
from .registry import aten, lowering


@lowering(aten._softmax.default, aten.softmax.int, meta=True)
def softmax(x, d, half_to_float=False, *, aval=None, dtype=None):
    y = jax.nn.softmax(cast(x, acc_dtype(x.dtype)), axis=dim(d, x.ndim)) if x.ndim else jnp.ones_like(x)
    return cast(y, aval.dtype)


@lowering(aten._safe_softmax.default, meta=True)
def safe_softmax(x, d, dtype=None, *, aval):
    """softmax, with 0 (not NaN) on rows that are all -inf (scaled_dot_product_attention's math
    path, a fully masked query). As eager: ``softmax(x, d, dtype)`` (x converted to ``dtype``
    first), the rows found on ``x`` itself."""
    y = softmax(cast(x, aval.dtype), d, aval=aval)
    if not x.ndim:
        return y
    empty = jnp.all(x == -jnp.inf, axis=dim(d, x.ndim), keepdims=True)
    return jnp.where(empty, jnp.zeros((), aval.dtype), y)


@lowering(aten._log_softmax.default, aten.log_softmax.int, meta=True)
def log_softmax(x, d, half_to_float=False, *, aval=None, dtype=None):
    if not x.ndim:
        return cast(jnp.zeros_like(x), aval.dtype)
    axis = dim(d, x.ndim)
    if axis == x.ndim - 1 and x.dtype in (jnp.bfloat16, jnp.float16) and aval.dtype == x.dtype:
        return _log_softmax_lastdim_reduced(x, axis)
    return cast(jax.nn.log_softmax(cast(x, acc_dtype(x.dtype)), axis=axis), aval.dtype)


def _log_softmax_lastdim_reduced(x, axis):
    """Eager's CPU kernel over the last dim of a bfloat16/float16 tensor computes in float32 but
    keeps each row's sum of exponentials and its log in the input's dtype: a row whose other
    elements add less than half an ulp to 1 gets exactly 0 at its maximum, where one rounding at
    the end gives -0.0039 (the conformance samples of log_softmax in bfloat16)."""
    xf = cast(x, jnp.float32)
    m = jnp.max(xf, axis=axis, keepdims=True, initial=-jnp.inf)
    m = jnp.where(jnp.isfinite(m), m, jnp.zeros_like(m))
    shifted = xf - m
    total = cast(cast(jnp.sum(jnp.exp(shifted), axis=axis, keepdims=True), x.dtype), jnp.float32)
    return cast(shifted - cast(cast(jnp.log(total), x.dtype), jnp.float32), x.dtype)


@lowering(aten._softmax_backward_data.default, meta=True)
def softmax_backward(grad, y, d, input_dtype, *, aval):
    d = dim(d, y.ndim)
    g = grad * y
    return cast(g - y * jnp.sum(g, axis=d, keepdims=True), aval.dtype)


@lowering(aten._log_softmax_backward_data.default, meta=True)
def log_softmax_backward(grad, y, d, input_dtype, *, aval):
    d = dim(d, y.ndim)
    return cast(grad - jnp.exp(y) * jnp.sum(grad, axis=d, keepdims=True), aval.dtype)


def _nll(x, target, weight, reduction, ignore_index):
    """(loss, total_weight) of nll_loss for x [N, C] or [C] and target [N] or []."""
    batched = x.ndim == 2
    if not batched:
        x, target = x[None], target[None]
    c = x.shape[1]
    valid = target != ignore_index
    safe = jnp.where(valid, target, 0)
    picked = jnp.take_along_axis(x, safe[:, None], axis=1)[:, 0]
    w = jnp.ones((c,), x.dtype) if weight is None else weight.astype(x.dtype)
    wt = jnp.where(valid, w[safe], jnp.zeros((), x.dtype))
    losses = -picked * wt
    total = jnp.sum(wt)
    if reduction == 0:
        return (losses if batched else losses[0]), total
    if reduction == 1:
        return jnp.sum(losses) / total, total
    return jnp.sum(losses), total


@lowering(aten.nll_loss_forward.default, static=True)
def nll_loss_forward(x, target, weight, reduction, ignore_index):
    return _nll(x, target, weight, reduction, ignore_index)


@lowering(aten.nll_loss_backward.default, static=True)
def nll_loss_backward(grad, x, target, weight, reduction, ignore_index, total_weight):
    _, vjp = jax.vjp(lambda v: _nll(v, target, weight, reduction, ignore_index)[0], x)
    return vjp(grad.astype(x.dtype))[0]


def _nll2d(x, target, weight, reduction, ignore_index):
    n, c = x.shape[0], x.shape[1]
    flat = jnp.moveaxis(x, 1, -1).reshape(-1, c)
    loss, total = _nll(flat, target.reshape(-1), weight, reduction, ignore_index)
    if reduction == 0:
        loss = loss.reshape(target.shape)
    return loss, total


@lowering(aten.nll_loss2d_forward.default, static=True)
def nll_loss2d_forward(x, target, weight, reduction, ignore_index):
    return _nll2d(x, target, weight, reduction, ignore_index)


@lowering(aten.nll_loss2d_backward.default, static=True)
def nll_loss2d_backward(grad, x, target, weight, reduction, ignore_index, total_weight):
    _, vjp = jax.vjp(lambda v: _nll2d(v, target, weight, reduction, ignore_index)[0], x)
    return vjp(grad.astype(x.dtype))[0]


@lowering(aten.embedding.default, static=True)
def embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    return jnp.take(weight, indices, axis=0)


@lowering(aten.embedding_dense_backward.default, static=True, meta=True)
def embedding_dense_backward(grad, indices, num_weights, padding_idx, scale_grad_by_freq, *, aval):
    flat_idx = indices.reshape(-1)
    g = grad.reshape(-1, grad.shape[-1])
    if padding_idx >= 0:
        g = jnp.where((flat_idx == padding_idx)[:, None], jnp.zeros((), g.dtype), g)
    if scale_grad_by_freq:
        counts = jnp.zeros((num_weights,), g.dtype).at[flat_idx].add(1)
        g = g / counts[flat_idx][:, None]
    return jnp.zeros(aval.shape, aval.dtype).at[flat_idx].add(g.astype(aval.dtype))


@lowering(aten.embedding_renorm.default, static=True)
def embedding_renorm(weight, indices, max_norm, norm_type):
    """The new weight of embedding_renorm_: rows looked up whose p-norm exceeds max_norm shrink.

    Eager computes the norm, then the scale ``max_norm / (norm + 1e-7)`` in double precision,
    and multiplies each row once however often it was looked up.
    """
    used = jnp.zeros((weight.shape[0],), bool).at[indices.reshape(-1)].set(True)
    a = jnp.abs(weight.astype(acc_dtype(weight.dtype)))
    if norm_type == math.inf:
        norm = jnp.max(a, axis=1)
    elif norm_type == 0:
        norm = jnp.sum(a != 0, axis=1).astype(a.dtype)
    elif norm_type == 2:
        norm = jnp.sqrt(jnp.sum(a * a, axis=1))
    else:
        norm = jnp.sum(a ** norm_type, axis=1) ** (1.0 / norm_type)
    norm = norm.astype(jnp.float64)
    scale = jnp.where(used & (norm > max_norm), max_norm / (norm + 1e-7), 1.0)
    return weight * scale.astype(weight.dtype)[:, None]


@lowering(aten._trilinear.default, static=True, meta=True)
def trilinear(i1, i2, i3, expand1, expand2, expand3, sumdim, unroll_dim=1, *, aval):
    """sum over ``sumdim`` of i1 * i2 * i3, each unsqueezed at its ``expand`` dims (F.bilinear)."""
    ndim = i1.ndim + len(expand1)
    letters = "abcdefghijklmnopqrstuvwxyz"[:ndim]
    subs = [
        "".join(letters[d] for d in range(ndim) if d not in set(e))
        for e in (expand1, expand2, expand3)]
    present = set("".join(subs))
    out = "".join(letters[d] for d in range(ndim) if d not in set(sumdim) and letters[d] in present)
    if i1.dtype not in opmath.LOW:
        y = jnp.einsum(f"{subs[0]},{subs[1]},{subs[2]}->{out}", i1, i2, i3,
                       precision=jax.lax.Precision.HIGHEST)
        return y.reshape(aval.shape)
    return _trilinear_half(i1, i2, i3, letters, subs, set(sumdim), set(expand3), unroll_dim,
                           out).reshape(aval.shape)


def _trilinear_half(i1, i2, i3, letters, subs, sumdim, expand3, unroll, out):
    """``_trilinear`` of float16/bfloat16 operands (its opmath rule leaves the roundings here)
    with eager's roundings: it multiplies in two products, i1 with i2 summing the dims i3 lacks,
    rounded to the dtype, then with i3 summing the rest, rounded; a summed ``unroll_dim`` (the
    backward's calls) is added up slice by slice in the dtype. F.bilinear's OpInfo samples: 169
    of 390 bfloat16 elements differed from eager computed in float32 and rounded once; none
    this way."""
    dtype = i1.dtype
    u = letters[unroll]
    d12 = {letters[d] for d in sumdim & expand3 if d != unroll}
    d23 = {letters[d] for d in sumdim - expand3 if d != unroll}
    order = letters.index
    pair = "".join(c for c in sorted(set(subs[0]) | set(subs[1]), key=order) if c not in d12)
    both = "".join(c for c in sorted(set(pair) | set(subs[2]), key=order) if c not in d23)
    wide = [x.astype(jnp.float32) for x in (i1, i2, i3)]
    hi = jax.lax.Precision.HIGHEST
    y = opmath.round_to(jnp.einsum(f"{subs[0]},{subs[1]}->{pair}", wide[0], wide[1],
                                   precision=hi), dtype).astype(jnp.float32)
    y = opmath.round_to(jnp.einsum(f"{pair},{subs[2]}->{both}", y, wide[2], precision=hi),
                        dtype).astype(jnp.float32)
    if unroll in sumdim and u in both:          # output.add_(slice k) for each k, in the dtype
        def add(acc, part):
            return opmath.round_to(acc + part, dtype).astype(jnp.float32), None
        axis = both.index(u)
        y, _ = lax.scan(add, jnp.zeros(y.shape[:axis] + y.shape[axis + 1:], jnp.float32),
                        jnp.moveaxis(y, axis, 0))
        both = both.replace(u, "")
    return opmath.round_to(jnp.einsum(f"{both}->{out}", y), dtype)


# -- pdist: distances between the rows of x, pairs (i < j) in row-major order ---------------------

def _pairs(x):
    i, j = np.triu_indices(x.shape[0], 1)
    return i, j, x[i] - x[j]


@lowering(aten._pdist_forward.default, static=True)
def pdist_forward(x, p=2.0):
    _, _, d = _pairs(x)
    a = jnp.abs(d)
    if p == 0:
        return jnp.sum(a != 0, axis=-1).astype(x.dtype)
    if p == 1:
        return jnp.sum(a, axis=-1)
    if p == 2:
        return jnp.sqrt(jnp.sum(a * a, axis=-1))
    if p == math.inf:
        return jnp.max(a, axis=-1, initial=0)
    return jnp.sum(a ** p, axis=-1) ** (1.0 / p)


@lowering(aten._pdist_backward.default, static=True)
def pdist_backward(grad, x, p, dist):
    """Closed forms of PyTorch's kernel (zero where the distance is zero), summed per row."""
    i, j, d = _pairs(x)
    g, dist = grad[:, None], dist[:, None]
    zero = jnp.zeros((), x.dtype)
    a = jnp.abs(d)
    if p == 0:
        pair = jnp.zeros_like(d)
    elif p == 1:
        pair = jnp.sign(d) * g
    elif p < 2:
        bad = (dist == 0) | ((d == 0) & (p < 1))
        pair = jnp.where(bad, zero, jnp.sign(d) * a ** (p - 1) * g / dist ** (p - 1))
    elif p == 2:
        pair = jnp.where(dist == 0, zero, g * d / dist)
    elif p == math.inf:
        pair = g * jnp.sign(d) * (a == dist).astype(x.dtype)
    else:
        pair = jnp.where(dist == 0, zero, d * a ** (p - 2) * g / dist ** (p - 1))
    out = jnp.zeros_like(x).at[i].add(pair)
    return out.at[j].add(-pair)


# -- embedding_bag (mode 0 sum, 1 mean, 2 max; indices 1-d, bags start at offsets) ---------------

def _bags(indices, offsets, include_last_offset, padding_idx):
    """(bag of each position, which positions count, number of bags)."""
    n_bags = offsets.shape[0] - (1 if include_last_offset else 0)
    pos = jnp.arange(indices.shape[0])
    bag = jnp.searchsorted(offsets[:n_bags], pos, side="right") - 1
    keep = indices != padding_idx
    if include_last_offset:
        keep = keep & (pos < offsets[-1])
    return bag, keep, n_bags


def _bag_rounding(out, dtype):
    """Each bag's float32 sum in ``dtype`` as CPU eager rounds it: its bfloat16 kernel (fbgemm's)
    rounds halfway cases away from zero, where a cast rounds them to even (measured: 120 of 120
    random bags equal eager's this way, 70 with the cast); float16 rounds to even."""
    if out.dtype == dtype:
        return out
    if dtype != jnp.bfloat16:
        return out.astype(dtype)
    bits = lax.bitcast_convert_type(out.astype(jnp.float32), jnp.uint32)
    top = ((bits + jnp.uint32(0x8000)) >> 16).astype(jnp.uint16)
    away = lax.bitcast_convert_type(top, jnp.bfloat16)
    return jnp.where(jnp.isnan(out), out.astype(dtype), away)


@lowering(aten._embedding_bag.default, aten._embedding_bag_forward_only.default, static=True,
          meta=True)
def embedding_bag(weight, indices, offsets, scale_grad_by_freq=False, mode=0, sparse=False,
                  per_sample_weights=None, include_last_offset=False, padding_idx=-1, *, aval):
    """(output, offset2bag, bag_size, max_indices) as CPU eager fills them."""
    bag, keep, n_bags = _bags(indices, offsets, include_last_offset, padding_idx)
    rows = jnp.take(weight, indices, axis=0)
    if mode != 2:
        rows = rows.astype(acc_dtype(rows.dtype))     # (eager sums a half weight in float32)
    if per_sample_weights is not None:
        rows = rows * per_sample_weights[:, None].astype(rows.dtype)
    zero = jnp.zeros((), rows.dtype)
    count = jax.ops.segment_sum(keep.astype(jnp.int64), bag, n_bags)
    max_idx = jnp.zeros(aval[3].shape, jnp.int64)
    if mode == 2:
        low = jnp.asarray(-jnp.inf, rows.dtype)
        best = jax.ops.segment_max(jnp.where(keep[:, None], rows, low), bag, n_bags)
        hit = keep[:, None] & (rows == best[bag])
        first = jax.ops.segment_min(jnp.where(hit, jnp.arange(rows.shape[0])[:, None],
                                              rows.shape[0]), bag, n_bags)
        empty = (count == 0)[:, None]
        out = jnp.where(empty, zero, best)
        max_idx = jnp.where(empty, 0, jnp.take(indices, jnp.minimum(first, rows.shape[0] - 1)))
    else:
        out = _bag_rounding(jax.ops.segment_sum(jnp.where(keep[:, None], rows, zero), bag,
                                                n_bags), weight.dtype)
        if mode == 1:      # (eager divides the sum as rounded, then rounds the mean to even)
            mean = out.astype(rows.dtype) / jnp.maximum(count, 1)[:, None].astype(rows.dtype)
            out = jnp.where((count == 0)[:, None], jnp.zeros((), out.dtype),
                            mean.astype(out.dtype))
    bag_size = count if mode != 0 else jnp.zeros_like(count)
    # With include_last_offset eager's bag_size still has one entry per offset.
    bag_size = jnp.pad(bag_size, (0, aval[2].shape[0] - n_bags))
    return out, bag, bag_size, max_idx


@lowering(aten._embedding_bag_dense_backward.default, static=True, meta=True)
def embedding_bag_dense_backward(grad, indices, offset2bag, bag_size, max_idx, num_weights,
                                 scale_freq, mode, psw, padding_idx=-1, *, aval):
    """Dense weight gradient from the forward's offset2bag, bag_size and max_indices."""
    out = jnp.zeros(aval.shape, grad.dtype)
    if mode == 2:
        cols = jnp.arange(grad.shape[1])[None, :]
        g = jnp.where((bag_size[:grad.shape[0]] > 0)[:, None], grad, jnp.zeros((), grad.dtype))
        return out.at[max_idx, cols].add(g)
    keep = indices != padding_idx
    g = grad[offset2bag]
    if psw is not None:
        g = g * psw[:, None].astype(g.dtype)
    if mode == 1:
        g = g / jnp.maximum(bag_size[offset2bag], 1)[:, None].astype(g.dtype)
    if scale_freq:
        g = g / _eager_bag_counts(indices, num_weights)[:, None].astype(g.dtype)
    return out.at[indices].add(jnp.where(keep[:, None], g, jnp.zeros((), g.dtype)))


def _eager_bag_counts(indices, num_weights):
    """The count CPU eager divides each occurrence by under scale_grad_by_freq.

    Its kernel walks the unique values in sorted order and, for the s-th one, reads
    ``counts[sorted_indices[s]]`` (a position used as a segment number), so a value can get
    another value's count. Reproduced, since eager is the reference.
    """
    counts = jnp.zeros((num_weights,), jnp.int64).at[indices].add(1)
    srt = jnp.sort(indices)
    is_new = jnp.concatenate([jnp.ones((1,), bool), srt[1:] != srt[:-1]])
    segment = jnp.cumsum(is_new) - 1
    s = segment[jnp.searchsorted(srt, indices, side="left")]
    return counts[srt[s]]


@lowering(aten._embedding_bag_per_sample_weights_backward.default, static=True)
def embedding_bag_per_sample_weights_backward(grad, weight, indices, offsets, offset2bag, mode,
                                              padding_idx=-1):
    dots = jnp.sum(grad[offset2bag] * jnp.take(weight, indices, axis=0), axis=1)
    return jnp.where(indices != padding_idx, dots, jnp.zeros((), dots.dtype))
