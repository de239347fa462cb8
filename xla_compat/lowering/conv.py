"""Convolutions (1d/2d/3d, strided, dilated, grouped, transposed) and im2col/col2im.

Every convolution is one ``lax.conv_general_dilated`` at HIGHEST precision (CPU eager computes in
full float32; XLA's default may use bf16 passes on accelerators). Backward is its vjp. The one
exception is a float16/bfloat16 transposed convolution that CPU eager runs through its
im2col-style kernel, which rounds every partial sum (``_transposed_by_columns``).
"""
from __future__ import annotations

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from ..lazy import tracer
from . import opmath
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
        pads = [(max(a, 0), max(b, 0)) for a, b in zip(lo, hi)]
        if _operands_may_swap(x.shape[2:], k, stride, dilation, pads):
            # XLA swaps the operands of a convolution whose kernel outnumbers its input, and
            # the swap of a base-dilated window can abort the process ("Window dimensions do
            # not match RHS shape"). Such an input is small: dilate and pad it explicitly.
            x = lax.pad(x, jnp.zeros((), x.dtype), [(0, 0, 0), (0, 0, 0)]
                        + [(a, b, s - 1) for (a, b), s in zip(pads, stride)])
            stride, pads = (1,) * n, [(0, 0)] * n
        y = lax.conv_general_dilated(
            x, wt, window_strides=(1,) * n, padding=pads,
            lhs_dilation=stride, rhs_dilation=dilation, dimension_numbers=_spec(n),
            feature_group_count=groups, precision=_HIGHEST)
        # Padding larger than the kernel reach crops the result instead.
        crop = tuple(slice(max(-a, 0), y.shape[2 + i] - max(-b, 0))
                     for i, (a, b) in enumerate(zip(lo, hi)))
        y = y[(slice(None), slice(None)) + crop]
    if bias is not None:
        y = y + bias.reshape((1, -1) + (1,) * n).astype(y.dtype)
    return y


def _operands_may_swap(size, k, stride, dilation, pads) -> bool:
    """Whether XLA's convolution operand swap may take a transposed convolution's window: a
    product of kernel sizes larger than that of input sizes, with or without the dims the swap
    leaves alone (a kernel of 2 over a base dilation of 2, no padding, no kernel dilation)."""
    kernel = input_ = kept_kernel = kept_input = 1
    for n, kk, s, d, (a, b) in zip(size, k, stride, dilation, pads):
        kernel, input_ = kernel * kk, input_ * n
        if not (kk == 2 and s == 2 and d == 1 and a == b == 0):
            kept_kernel, kept_input = kept_kernel * kk, kept_input * n
    return kernel > input_ or kept_kernel > kept_input


def _batched(x, w):
    """An unbatched input (one dim short of the weight) gets a batch dim of one."""
    return x[None] if x.ndim == w.ndim - 1 else x


# -- float16/bfloat16 transposed convolution as CPU eager computes it ---------------------------

@functools.lru_cache(maxsize=None)
def _onednn_supports(dtype) -> bool:
    """Whether this CPU has the instructions eager wants before it runs float16/bfloat16
    convolutions through oneDNN (avx512 bf16/fp16 or AMX on x86)."""
    if dtype == np.dtype(jnp.bfloat16):
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    return bool(torch.ops.mkldnn._is_mkldnn_fp16_supported())


def _eager_rounds_columns(x, w, bias, stride, padding, dilation, transposed, output_padding,
                          groups, *rest) -> bool:
    """The rule's ``own_rounding``: True for a float16/bfloat16 transposed convolution that
    eager's CPU backend choice sends to slow_conv_transpose2d/3d rather than oneDNN.

    Eager takes oneDNN for a half input only when mkldnn is enabled, the CPU has native
    bf16/fp16 support, and (transposed) no output padding reaches its stride; otherwise the
    "slow" kernel, whose roundings ``_transposed_by_columns`` spells out. A oneDNN result is
    float32 arithmetic rounded once: the ordinary widened rule."""
    if not transposed or x.dtype not in opmath.LOW:
        return False
    n = w.ndim - 2
    big_padding = any(o >= s for o, s in zip(_expand(output_padding or (0,), n),
                                             _expand(stride, n)))
    onednn = torch._C._get_mkldnn_enabled() and _onednn_supports(x.dtype) and not big_padding
    return not onednn


def _columns(x, w, groups):
    """Eager's GEMM into the columns buffer: columns[n, oc, *kernel, *input] = the sum over the
    group's input channels of x * w, stored in the half dtype (values returned in float32).

    Eager's reduced-precision CPU GEMM (cpublas, no oneDNN) keeps a float32 accumulator per
    output and adds the products channel after channel, in channel order; a product of two
    half values is exact in float32, so only the adds round. A dot in XLA sums in another
    order, and float16 results then differ in the last bit now and then: the sum is spelled
    out as a scan over the input channels."""
    n = w.ndim - 2
    N, cin = x.shape[:2]
    cin_g, cout_g = cin // groups, w.shape[1]
    # per input channel l: x[n, g, 1, 1.., *input] and w[1, g, oc, *kernel, 1..]
    xs = x.astype(jnp.float32).reshape((N, groups, cin_g) + x.shape[2:])
    xs = jnp.moveaxis(xs, 2, 0).reshape((cin_g, N, groups, 1) + (1,) * n + x.shape[2:])
    ws = w.astype(jnp.float32).reshape((groups, cin_g, cout_g) + w.shape[2:])
    ws = jnp.moveaxis(ws, 1, 0).reshape((cin_g, 1, groups, cout_g) + w.shape[2:] + (1,) * n)

    def add_channel(acc, xw):
        xl, wl = xw
        return acc + xl * wl, None

    shape = (N, groups, cout_g) + w.shape[2:] + x.shape[2:]
    cols, _ = lax.scan(add_channel, jnp.zeros(shape, jnp.float32), (xs, ws))
    cols = cols.reshape((N, groups * cout_g) + w.shape[2:] + x.shape[2:])
    return opmath.round_to(cols, x.dtype).astype(jnp.float32)


def _placement(k, size_in, size_out, stride, padding, dilation):
    """``lax.pad`` config that puts input index i of kernel tap k at output index
    i*stride - padding + k*dilation, or None when no input lands inside the output."""
    lo = k * dilation - padding
    if not any(0 <= lo + i * stride < size_out for i in range(size_in)):
        return None
    hi = size_out - lo - (size_in - 1) * stride - 1
    return (lo, hi, stride - 1)


def _transposed_by_columns(x, w, bias, stride, padding, dilation, output_padding, groups):
    """A float16/bfloat16 transposed convolution of a batched ``x`` as CPU eager's
    slow_conv_transpose2d/3d computes it (1-d runs as 2-d with a unit height).

    Per batch element eager multiplies the weight by the input into a columns buffer (one
    float32-accumulated dot per output channel, kernel tap and input position, stored in the
    half dtype), then col2im/col2vol scatters the columns into a zeroed output with one
    half-precision ``+=`` per contribution, looping over kernel taps in order (kernel depth,
    height, width) and input positions inside; each output element therefore sums its
    contributions in kernel-tap order, rounding after every add. The bias is added last, one
    more rounded add (the same with a 1x1 kernel, stride 1 and no padding, where eager writes
    the GEMM straight into the output). Groups run one after another on disjoint channels.
    Each rounding is ``opmath.round_to`` so XLA keeps it."""
    n = w.ndim - 2
    stride, padding, dilation = _expand(stride, n), _expand(padding, n), _expand(dilation, n)
    output_padding = _expand(output_padding, n) if output_padding else (0,) * n
    low = x.dtype
    ins, ks = x.shape[2:], w.shape[2:]
    outs = tuple((i - 1) * s - 2 * p + d * (k - 1) + 1 + op for i, s, p, d, k, op in
                 zip(ins, stride, padding, dilation, ks, output_padding))
    cols = _columns(x, w, groups)
    out = jnp.zeros(x.shape[:1] + (cols.shape[1],) + outs, jnp.float32)
    for tap in itertools.product(*(range(k) for k in ks)):
        config = [_placement(*a) for a in zip(tap, ins, outs, stride, padding, dilation)]
        if None in config:
            continue
        part = lax.pad(cols[(slice(None), slice(None)) + tap], jnp.float32(0),
                       [(0, 0, 0), (0, 0, 0)] + config)
        out = opmath.round_to(out + part, low).astype(jnp.float32)
    if bias is not None:
        out = out + bias.astype(jnp.float32).reshape((1, -1) + (1,) * n)
    return opmath.round_to(out, low)


def _empty_transposed(bound):
    """For a batched transposed convolution whose output has a spatial size of exactly 0 (CPU
    eager returns that empty output; torch's meta kernel calls it "too small"): the padding that
    gives the meta kernel a size of 2 there, and the empty output's shape; else None."""
    x, w = bound.get("input"), bound.get("weight")
    if (not bound.get("transposed") or not isinstance(x, torch.Tensor)
            or not isinstance(w, torch.Tensor) or x.dim() != w.dim() or w.dim() < 3):
        return None
    n = w.dim() - 2
    stride, padding, dilation, output_padding = (
        _expand(bound[k], n) for k in ("stride", "padding", "dilation", "output_padding"))
    sizes = [(x.shape[2 + i] - 1) * stride[i] - 2 * padding[i]
             + dilation[i] * (w.shape[2 + i] - 1) + output_padding[i] + 1 for i in range(n)]
    if min(sizes) < 0 or 0 not in sizes:
        return None     # (a negative size: eager raises too)
    padding = [p - 1 if size == 0 else p for p, size in zip(padding, sizes)]
    return padding, (x.shape[0], w.shape[1] * bound["groups"], *sizes)


@tracer.meta_arguments(aten.convolution.default, aten._convolution.default)
def _meta_padding(func, args, kwargs):
    empty = _empty_transposed(tracer.bind(func, args, kwargs))
    if empty is None:
        return args, kwargs
    args = list(args)
    if len(args) > 4:
        args[4] = empty[0]
    else:
        kwargs = {**kwargs, "padding": empty[0]}
    return tuple(args), kwargs


@tracer.eager_output(aten.convolution.default, aten._convolution.default)
def _empty_output(func, bound, out):
    empty = _empty_transposed(bound)
    if empty is None:
        return out
    return torch.empty(empty[1], dtype=out.dtype, device="meta")


@lowering(aten.convolution.default, static=True, own_rounding=_eager_rounds_columns)
def convolution(x, w, bias, stride, padding, dilation, transposed, output_padding, groups):
    xb = _batched(x, w)
    if transposed and x.dtype in opmath.LOW:    # only where _eager_rounds_columns says so
        y = _transposed_by_columns(xb, w, bias, stride, padding, dilation, output_padding, groups)
    else:
        y = _conv(xb, w, bias, stride, padding, dilation, transposed, output_padding, groups)
    return y[0] if x.ndim == w.ndim - 1 else y


@lowering(aten._convolution.default, static=True, own_rounding=_eager_rounds_columns)
def _convolution(x, w, bias, stride, padding, dilation, transposed, output_padding, groups,
                 benchmark=False, deterministic=False, cudnn_enabled=True, allow_tf32=True):
    return convolution(x, w, bias, stride, padding, dilation, transposed, output_padding, groups)


@lowering(aten.convolution_backward.default, static=True)
def convolution_backward(grad, x, w, bias_sizes, stride, padding, dilation, transposed,
                         output_padding, groups, output_mask):
    unbatched = x.ndim == w.ndim - 1
    xb = _batched(x, w)
    gb = (grad[None] if unbatched else grad).astype(xb.dtype)

    def f(xx, ww):
        return _conv(xx, ww, None, stride, padding, dilation, transposed, output_padding, groups)

    if transposed:
        _, vjp = jax.vjp(f, xb, w)
        gx, gw = vjp(gb)
    else:
        # The input's gradient is the transposed convolution of the output's gradient, taken
        # through _conv (whose guard keeps XLA's operand swap off base-dilated windows: jax's
        # own vjp would hand XLA exactly such a window).
        gx = _conv(gb, w, None, stride, padding, dilation, True,
                   _covering_padding(xb.shape[2:], gb.shape[2:], w.shape[2:], stride, padding,
                                     dilation), groups) if output_mask[0] else None
        gw = jax.vjp(lambda ww: f(xb, ww), w)[1](gb)[0] if output_mask[1] else None
    gbias = jnp.sum(gb, axis=(0,) + tuple(range(2, gb.ndim))) if output_mask[2] else None
    return (
        (gx[0] if unbatched else gx) if output_mask[0] else None,
        gw if output_mask[1] else None,
        gbias,
    )


def _covering_padding(size, out, k, stride, padding, dilation) -> tuple:
    """The output padding that makes the transposed convolution of an output of spatial size
    ``out`` as large as the input (``size``) it came from: the input's last elements a stride
    skipped get gradient zero."""
    n = len(k)
    stride, padding, dilation = _expand(stride, n), _expand(padding, n), _expand(dilation, n)
    return tuple(i - ((o - 1) * s - 2 * p + d * (kk - 1) + 1)
                 for i, o, kk, s, p, d in zip(size, out, k, stride, padding, dilation))


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
