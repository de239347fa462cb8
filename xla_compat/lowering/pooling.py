"""Pooling: max (with PyTorch's flat indices), average and adaptive pools in 1-3 spatial dims.

A pool gathers every window into a trailing axis (strided slices of the padded input, or
per-dimension gathers for adaptive pools) and reduces it. Max pools pick what CPU eager picks:
the first maximum in window order, or the last NaN if the window holds one; an index is the
flat position in the input's spatial dims. Backward of a max pool scatters by those indices.
"""
from __future__ import annotations

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from . import opmath
from ._helpers import acc_dtype, is_float
from ._meta import grad_like_self
from .registry import aten, lowering


def _tuple(v, n: int, default=None) -> tuple:
    v = tuple(v) if isinstance(v, (list, tuple)) else (v,)
    if not v and default is not None:
        return tuple(default)
    return v * n if len(v) == 1 else v


def _lowest(dtype):
    return -jnp.inf if is_float(dtype) else jnp.iinfo(dtype).min


# -- gathering windows ----------------------------------------------------------------------------

def _windows(x, kernel, stride, padding, dilation, out_sizes, fill):
    """x [..., *in] -> (values [..., *out, K], flat index [*out, K]; -1 marks padding)."""
    n = len(kernel)
    in_sizes = x.shape[-n:]
    lead = x.ndim - n
    high = [(o - 1) * s + (k - 1) * d + 1 - (i + p)
            for o, s, k, d, i, p in zip(out_sizes, stride, kernel, dilation, in_sizes, padding)]
    pads = [(p, max(h, 0)) for p, h in zip(padding, high)]
    xp = jnp.pad(x, [(0, 0)] * lead + pads, constant_values=fill)
    ip = np.pad(np.arange(math.prod(in_sizes)).reshape(in_sizes), pads, constant_values=-1)
    vals, idxs = [], []
    for offs in itertools.product(*(range(k) for k in kernel)):
        sl = tuple(slice(o * d, o * d + s * (m - 1) + 1, s)
                   for o, d, s, m in zip(offs, dilation, stride, out_sizes))
        vals.append(xp[(Ellipsis,) + sl])
        idxs.append(ip[sl])
    return jnp.stack(vals, axis=-1), np.stack(idxs, axis=-1)


def _adaptive_ranges(n_in: int, n_out: int):
    """PyTorch's adaptive windows: [floor(j*n/o), ceil((j+1)*n/o)) for each output j."""
    start = np.array([(j * n_in) // n_out for j in range(n_out)])
    end = np.array([-(-((j + 1) * n_in) // n_out) for j in range(n_out)])
    return start, end


def _adaptive_windows(x, out_sizes):
    """x [..., *in] -> (values [..., *out, K], flat index [*out, K], mask [*out, K], counts)."""
    n = len(out_sizes)
    in_sizes = x.shape[-n:]
    lead = x.ndim - n
    flat = np.arange(math.prod(in_sizes)).reshape(in_sizes)
    masks, counts = [], []
    for d, (ni, no) in enumerate(zip(in_sizes, out_sizes)):
        start, end = _adaptive_ranges(ni, no)
        kmax = int((end - start).max())
        pos = start[:, None] + np.arange(kmax)[None, :]
        ok = pos < end[:, None]
        pos = np.minimum(pos, ni - 1)
        ax = lead + 2 * d
        x = jnp.take(x, jnp.asarray(pos.reshape(-1)), axis=ax)
        x = x.reshape(x.shape[:ax] + (no, kmax) + x.shape[ax + 1:])
        flat = np.take(flat, pos.reshape(-1), axis=2 * d).reshape(
            flat.shape[:2 * d] + (no, kmax) + flat.shape[2 * d + 1:])
        masks.append(ok)
        counts.append(end - start)
    # [..., o1, k1, o2, k2, ...] -> [..., o1, o2, ..., k1, k2, ...]
    perm_sp = [2 * d for d in range(n)] + [2 * d + 1 for d in range(n)]
    x = jnp.transpose(x, tuple(range(lead)) + tuple(lead + p for p in perm_sp))
    flat = np.transpose(flat, perm_sp)
    mask = masks[0]
    for m in masks[1:]:
        mask = _outer(mask, m)
    out_shape = tuple(out_sizes)
    k_total = flat.size // math.prod(out_shape)
    return (x.reshape(x.shape[:lead] + out_shape + (k_total,)),
            flat.reshape(out_shape + (k_total,)),
            mask.reshape(out_shape + (k_total,)), counts)


def _outer(a, b):
    """Mask of windows: a [*o_a, *k_a] x b [o_b, k_b] -> [*o_a, o_b, *k_a, k_b]."""
    na = a.ndim // 2
    a = a.reshape(a.shape[:na] + (1,) + a.shape[na:] + (1,))
    return a & b.reshape((1,) * na + (b.shape[0],) + (1,) * na + (b.shape[1],))


def _pick_max(vals, flat, mask):
    """(max value, flat index) over the trailing window axis, as CPU eager picks them."""
    low = _lowest(vals.dtype)
    mask = jnp.broadcast_to(jnp.asarray(mask), vals.shape)
    low = jnp.asarray(low, vals.dtype)
    v = jnp.where(mask, vals, low)
    nan = jnp.isnan(v) if is_float(vals.dtype) else jnp.zeros(v.shape, bool)
    v = jnp.where(nan, low, v)
    # argmax gives the first maximum; a window of lowest values keeps its first real element.
    pos = jnp.where(jnp.max(v, axis=-1) == low, jnp.argmax(mask, axis=-1), jnp.argmax(v, axis=-1))
    last_nan = v.shape[-1] - 1 - jnp.argmax(jnp.flip(nan, axis=-1), axis=-1)
    pos = jnp.where(jnp.any(nan, axis=-1), last_nan, pos)
    value = jnp.take_along_axis(vals, pos[..., None], axis=-1)[..., 0]
    flat = jnp.broadcast_to(jnp.asarray(flat), vals.shape)
    index = jnp.take_along_axis(flat, pos[..., None], axis=-1)[..., 0]
    return value, index.astype(jnp.int64)


def _scatter_by_index(grad, x, indices, n: int):
    """Gradient of a max pool: each output's gradient added at its flat input index."""
    lead = x.shape[:x.ndim - n]
    b = math.prod(lead)
    g = grad.reshape(b, -1)
    idx = indices.reshape(b, -1)
    out = jnp.zeros((b, math.prod(x.shape[-n:])), grad.dtype)
    out = out.at[jnp.arange(b)[:, None], idx].add(g)
    return out.reshape(x.shape)


# -- max pools ------------------------------------------------------------------------------------

def _max_pool(x, kernel_size, stride, padding, dilation, aval, n):
    kernel = _tuple(kernel_size, n)
    stride = _tuple(stride, n, default=kernel)
    padding, dilation = _tuple(padding, n), _tuple(dilation, n)
    out_sizes = aval[0].shape[-n:]
    vals, flat = _windows(x, kernel, stride, padding, dilation, out_sizes, _lowest(x.dtype))
    return _pick_max(vals, flat, flat >= 0)


@lowering(aten.max_pool2d_with_indices.default, static=True, meta=True)
def max_pool2d_with_indices(x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False,
                            *, aval):
    return _max_pool(x, kernel_size, stride, padding, dilation, aval, 2)


@lowering(aten.max_pool3d_with_indices.default, static=True, meta=True)
def max_pool3d_with_indices(x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False,
                            *, aval):
    return _max_pool(x, kernel_size, stride, padding, dilation, aval, 3)


@lowering(aten.max_pool2d_with_indices_backward.default, static=True)
def max_pool2d_with_indices_backward(grad, x, kernel_size, stride, padding, dilation, ceil_mode,
                                     indices):
    return _scatter_by_index(grad, x, indices, 2)


@lowering(aten.max_pool3d_with_indices_backward.default, static=True)
def max_pool3d_with_indices_backward(grad, x, kernel_size, stride, padding, dilation, ceil_mode,
                                     indices):
    return _scatter_by_index(grad, x, indices, 3)


@lowering(aten.adaptive_max_pool2d.default, aten.adaptive_max_pool3d.default, static=True)
def adaptive_max_pool(x, output_size):
    vals, flat, mask, _ = _adaptive_windows(x, tuple(output_size))
    return _pick_max(vals, flat, mask)


@lowering(aten.adaptive_max_pool2d_backward.default, static=True)
def adaptive_max_pool2d_backward(grad, x, indices):
    return _scatter_by_index(grad, x, indices, 2)


@lowering(aten.adaptive_max_pool3d_backward.default, static=True)
def adaptive_max_pool3d_backward(grad, x, indices):
    return _scatter_by_index(grad, x, indices, 3)


# -- average pools --------------------------------------------------------------------------------

def _divisors(in_sizes, out_sizes, kernel, stride, padding, count_include_pad):
    """Per-output divisor of an average pool, as PyTorch's CPU kernel counts it."""
    per_dim = []
    for i, o, k, s, p in zip(in_sizes, out_sizes, kernel, stride, padding):
        start = np.arange(o) * s - p
        end = np.minimum(start + k, i + p)
        if count_include_pad:
            per_dim.append(end - start)
        else:
            per_dim.append(np.minimum(end, i) - np.maximum(start, 0))
    div = per_dim[0]
    for d in per_dim[1:]:
        div = np.multiply.outer(div, d)
    return div


def _avg_pool(x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override,
              out_sizes, n):
    kernel = _tuple(kernel_size, n)
    stride = _tuple(stride, n, default=kernel)
    padding = _tuple(padding, n)
    in_sizes = x.shape[-n:]
    dtype = acc_dtype(x.dtype) if is_float(x.dtype) else x.dtype
    vals, _ = _windows(x.astype(dtype), kernel, stride, padding, (1,) * n, out_sizes, 0)
    total = jnp.sum(vals, axis=-1)
    if divisor_override:
        div = np.full(tuple(out_sizes), divisor_override)
    else:
        div = _divisors(in_sizes, out_sizes, kernel, stride, padding, count_include_pad)
    if is_float(dtype):
        return (total / jnp.asarray(div, dtype)).astype(x.dtype)
    return lax.div(total, jnp.broadcast_to(jnp.asarray(div, dtype), total.shape))


@lowering(aten.avg_pool2d.default, static=True, meta=True)
def avg_pool2d(x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
               divisor_override=None, *, aval):
    return _avg_pool(x, kernel_size, stride, padding, ceil_mode, count_include_pad,
                     divisor_override, aval.shape[-2:], 2)


@lowering(aten.avg_pool3d.default, static=True, meta=True)
def avg_pool3d(x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
               divisor_override=None, *, aval):
    return _avg_pool(x, kernel_size, stride, padding, ceil_mode, count_include_pad,
                     divisor_override, aval.shape[-3:], 3)


def _avg_pool_backward(grad, x, kernel_size, stride, padding, ceil_mode, count_include_pad,
                       divisor_override, n):
    def f(v):
        return _avg_pool(v, kernel_size, stride, padding, ceil_mode, count_include_pad,
                         divisor_override, grad.shape[-n:], n)
    return jax.vjp(f, x)[1](grad.astype(x.dtype))[0]


@lowering(aten.avg_pool2d_backward.default, static=True)
def avg_pool2d_backward(grad, x, kernel_size, stride, padding, ceil_mode, count_include_pad,
                        divisor_override):
    return _avg_pool_backward(grad, x, kernel_size, stride, padding, ceil_mode,
                              count_include_pad, divisor_override, 2)


@lowering(aten.avg_pool3d_backward.default, static=True)
def avg_pool3d_backward(grad, x, kernel_size, stride, padding, ceil_mode, count_include_pad,
                        divisor_override):
    return _avg_pool_backward(grad, x, kernel_size, stride, padding, ceil_mode,
                              count_include_pad, divisor_override, 3)


def _adaptive_avg(x, output_size):
    n = len(output_size)
    if n == 3 and x.dtype in opmath.LOW:
        return _adaptive_avg3d_half(x, tuple(output_size))
    dtype = acc_dtype(x.dtype)
    vals, _, mask, counts = _adaptive_windows(x.astype(dtype), tuple(output_size))
    total = jnp.sum(jnp.where(jnp.asarray(mask), vals, jnp.zeros((), dtype)), axis=-1)
    # CPU eager divides by each window extent in turn.
    for d, c in enumerate(counts):
        shape = [1] * n
        shape[d] = -1
        total = total / jnp.asarray(c.reshape(shape), dtype)
    return total.astype(x.dtype)


def _adaptive_avg3d_half(x, output_size):
    """CPU eager's 3-d kernel for float16/bfloat16 (its opmath rule leaves this op's roundings
    to the rule): it adds each window's elements in the tensor's own dtype, one rounding per
    addition in (t, h, w) order, then divides by each window extent in turn, rounding each
    quotient (sum / kT / kH / kW). Summed in float32 and rounded once, 2317 of 6056 bfloat16
    elements of its OpInfo samples differed from eager."""
    dtype = x.dtype
    vals, _, mask, counts = _adaptive_windows(x, output_size)
    vals = jnp.moveaxis(vals, -1, 0).astype(jnp.float32)
    keep = jnp.asarray(np.moveaxis(mask, -1, 0))

    def add(acc, item):
        v, m = item
        return opmath.round_to(acc + jnp.where(m, v, 0.0), dtype).astype(jnp.float32), None

    total, _ = lax.scan(add, jnp.zeros(vals.shape[1:], jnp.float32), (vals, keep))
    for d, c in enumerate(counts):
        shape = [1] * 3
        shape[d] = -1
        total = opmath.round_to(total / jnp.asarray(c.reshape(shape), jnp.float32),
                                dtype).astype(jnp.float32)
    return total.astype(dtype)


@lowering(aten._adaptive_avg_pool2d.default, aten._adaptive_avg_pool3d.default, static=True)
def adaptive_avg_pool(x, output_size):
    return _adaptive_avg(x, output_size)


def _adaptive_avg_backward(grad, x, n):
    return jax.vjp(lambda v: _adaptive_avg(v, grad.shape[-n:]), x)[1](grad.astype(x.dtype))[0]


@lowering(aten._adaptive_avg_pool2d_backward.default)
def adaptive_avg_pool2d_backward(grad, x):
    return _adaptive_avg_backward(grad, x, 2)


@lowering(aten._adaptive_avg_pool3d_backward.default)
def adaptive_avg_pool3d_backward(grad, x):
    return _adaptive_avg_backward(grad, x, 3)


# -- fractional max pools (the random window starts arrive as an input tensor) --------------------

grad_like_self("fractional_max_pool3d_backward")

def _fractional_starts(u, n_in, n_out, k):
    """generate_intervals of PyTorch's kernel for samples ``u`` [...]: starts [..., n_out]."""
    if n_out == 1:
        return jnp.full(u.shape + (1,), n_in - k, jnp.int64)
    alpha = jnp.asarray(np.float32(n_in - k) / np.float32(n_out - 1), u.dtype)
    i = jnp.arange(n_out - 1, dtype=u.dtype)
    seq = (jnp.floor((i + u[..., None]) * alpha) - jnp.floor(u[..., None] * alpha)).astype(jnp.int64)
    last = jnp.full(u.shape + (1,), n_in - k, jnp.int64)
    return jnp.concatenate([seq, last], axis=-1)


def _fractional_max_pool(x, kernel_size, output_size, samples, n):
    lead = x.ndim - n
    in_sizes = x.shape[-n:]
    out_sizes = tuple(output_size)
    kernel = _tuple(kernel_size, n)
    u = samples.astype(x.dtype).reshape(x.shape[:lead] + (n,))
    # The kernel reads the samples as (W, H) in 2-d and (T, H, W) in 3-d.
    order = (1, 0) if n == 2 else (0, 1, 2)
    starts = [_fractional_starts(u[..., order[d]], in_sizes[d], out_sizes[d], kernel[d])
              for d in range(n)]
    strides = [math.prod(in_sizes[d + 1:]) for d in range(n)]
    flat_x = x.reshape(x.shape[:lead] + (math.prod(in_sizes),))   # not -1: the batch may be empty
    vals, idxs = [], []
    for offs in itertools.product(*(range(k) for k in kernel)):
        flat = 0
        for d in range(n):
            pos = starts[d] + offs[d]
            shape = [1] * n
            shape[d] = out_sizes[d]
            flat = flat + pos.reshape(pos.shape[:-1] + tuple(shape)) * strides[d]
        flat = jnp.broadcast_to(flat, x.shape[:lead] + out_sizes)
        v = jnp.take_along_axis(flat_x, flat.reshape(x.shape[:lead] + (math.prod(out_sizes),)),
                                axis=-1)
        vals.append(v.reshape(flat.shape))
        idxs.append(flat)
    vals, idxs = jnp.stack(vals, axis=-1), jnp.stack(idxs, axis=-1)
    return _pick_max(vals, idxs, jnp.ones(idxs.shape, bool))


@lowering(aten.fractional_max_pool2d.default, static=True)
def fractional_max_pool2d(x, kernel_size, output_size, random_samples):
    return _fractional_max_pool(x, kernel_size, output_size, random_samples, 2)


@lowering(aten.fractional_max_pool3d.default, static=True)
def fractional_max_pool3d(x, kernel_size, output_size, random_samples):
    return _fractional_max_pool(x, kernel_size, output_size, random_samples, 3)


@lowering(aten.fractional_max_pool2d_backward.default, static=True)
def fractional_max_pool2d_backward(grad, x, kernel_size, output_size, indices):
    return _scatter_by_index(grad, x, indices, 2)


@lowering(aten.fractional_max_pool3d_backward.default, static=True)
def fractional_max_pool3d_backward(grad, x, kernel_size, output_size, indices):
    return _scatter_by_index(grad, x, indices, 3)
