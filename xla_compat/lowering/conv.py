"""Convolutions (1d/2d/3d, strided, dilated, grouped, transposed) and im2col/col2im.

Every convolution is one ``lax.conv_general_dilated`` at HIGHEST precision (CPU eager computes in
full float32; XLA's default may use bf16 passes on accelerators). Backward is its vjp.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from .registry import aten, lowering

_HIGHEST = lax.Precision.HIGHEST


def _spec(n: int):
    sp = "DHW"[-n:] if n <= 3 else None
    return (f"NC{sp}", f"OI{sp}", f"NC{sp}")


def _expand(v, n: int) -> tuple:
    v = tuple(v)
    return v * n if len(v) == 1 else v


def _conv(x, w, bias, stride, padding, dilation, transposed, output_padding, groups):
    """PyTorch's convolution on a batched input ``x`` [N, C, *spatial]."""
    n = w.ndim - 2
    stride, padding, dilation = _expand(stride, n), _expand(padding, n), _expand(dilation, n)
    output_padding = _expand(output_padding, n) if output_padding else (0,) * n
    if not transposed:
        y = lax.conv_general_dilated(
            x, w, window_strides=stride, padding=[(p, p) for p in padding],
            rhs_dilation=dilation, dimension_numbers=_spec(n), feature_group_count=groups,
            precision=_HIGHEST)
    else:
        # Transposed conv = conv of the stride-dilated input with the flipped kernel whose
        # in/out channels are swapped within each group.
        cin, cout_g = w.shape[0], w.shape[1]
        k = w.shape[2:]
        wt = w.reshape((groups, cin // groups, cout_g) + k)
        wt = jnp.swapaxes(wt, 1, 2).reshape((groups * cout_g, cin // groups) + k)
        wt = jnp.flip(wt, axis=tuple(range(2, 2 + n)))
        lo = [d * (kk - 1) - p for d, kk, p in zip(dilation, k, padding)]
        hi = [l + op for l, op in zip(lo, output_padding)]
        y = lax.conv_general_dilated(
            x, wt, window_strides=(1,) * n,
            padding=[(max(a, 0), max(b, 0)) for a, b in zip(lo, hi)],
            lhs_dilation=stride, rhs_dilation=dilation, dimension_numbers=_spec(n),
            feature_group_count=groups, precision=_HIGHEST)
        # Padding larger than the kernel reach crops the result instead.
        crop = tuple(slice(max(-a, 0), y.shape[2 + i] - max(-b, 0))
                     for i, (a, b) in enumerate(zip(lo, hi)))
        y = y[(slice(None), slice(None)) + crop]
    if bias is not None:
        y = y + bias.reshape((1, -1) + (1,) * n).astype(y.dtype)
    return y


def _batched(x, w):
    """An unbatched input (one dim short of the weight) gets a batch dim of one."""
    return x[None] if x.ndim == w.ndim - 1 else x


@lowering(aten.convolution.default, static=True)
def convolution(x, w, bias, stride, padding, dilation, transposed, output_padding, groups):
    y = _conv(_batched(x, w), w, bias, stride, padding, dilation, transposed, output_padding, groups)
    return y[0] if x.ndim == w.ndim - 1 else y


@lowering(aten._convolution.default, static=True)
def _convolution(x, w, bias, stride, padding, dilation, transposed, output_padding, groups,
                 benchmark=False, deterministic=False, cudnn_enabled=True, allow_tf32=True):
    return convolution(x, w, bias, stride, padding, dilation, transposed, output_padding, groups)


@lowering(aten.convolution_backward.default, static=True)
def convolution_backward(grad, x, w, bias_sizes, stride, padding, dilation, transposed,
                         output_padding, groups, output_mask):
    unbatched = x.ndim == w.ndim - 1
    xb = _batched(x, w)
    gb = grad[None] if unbatched else grad

    def f(xx, ww):
        return _conv(xx, ww, None, stride, padding, dilation, transposed, output_padding, groups)

    _, vjp = jax.vjp(f, xb, w)
    gx, gw = vjp(gb.astype(xb.dtype))
    gbias = jnp.sum(gb, axis=(0,) + tuple(range(2, gb.ndim))) if output_mask[2] else None
    return (
        (gx[0] if unbatched else gx) if output_mask[0] else None,
        gw if output_mask[1] else None,
        gbias,
    )


# -- im2col / col2im (nn.Unfold / nn.Fold) ------------------------------------------------------

@lowering(aten.im2col.default, static=True)
def im2col(x, kernel_size, dilation, padding, stride):
    unbatched = x.ndim == 3
    xb = x[None] if unbatched else x
    # Strided slices, not conv_general_dilated_patches: a one-hot kernel turns inf into nan.
    kh, kw = kernel_size
    (dh, dw), (ph, pw), (sh, sw) = dilation, padding, stride
    xp = jnp.pad(xb, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    n, c, hp, wp = xp.shape
    oh = (hp - (dh * (kh - 1) + 1)) // sh + 1
    ow = (wp - (dw * (kw - 1) + 1)) // sw + 1
    cols = []
    for i in range(kh):
        for j in range(kw):
            cols.append(xp[:, :, i * dh: i * dh + sh * (oh - 1) + 1: sh,
                           j * dw: j * dw + sw * (ow - 1) + 1: sw])
    out = jnp.stack(cols, axis=2).reshape(n, c * kh * kw, oh * ow)
    return out[0] if unbatched else out


@lowering(aten.col2im.default, static=True, meta=True)
def col2im(cols, output_size, kernel_size, dilation, padding, stride, *, aval):
    unbatched = cols.ndim == 2
    shape = aval.shape if not unbatched else (1,) + tuple(aval.shape)
    zeros = jnp.zeros(shape, cols.dtype)
    _, vjp = jax.vjp(lambda v: im2col(v, kernel_size, dilation, padding, stride), zeros)
    out = vjp(cols[None] if unbatched else cols)[0]
    return out[0] if unbatched else out
