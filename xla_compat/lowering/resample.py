"""Resampling: nearest/linear/cubic upsampling, grid sampling, reflection and replication
padding, pixel and channel shuffles.

Source indices and interpolation weights depend only on sizes and scales, so they are computed
once in numpy, in the precision PyTorch's CPU kernel uses (float32 for float and half inputs),
and become constants of the graph. Backward ops are the vjp of the forward gathers.
"""
from __future__ import annotations

import itertools
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from . import opmath
from ._helpers import acc_dtype
from .registry import aten, lowering


def _opmath(dtype):
    return np.float64 if dtype == jnp.float64 else np.float32


def _scale(n_in, n_out, scale, t):
    """compute_scales_value: 1/scale when the caller gave one, else in/out."""
    if scale is not None and scale > 0:
        return t(1.0 / scale)
    return t(n_in) / t(n_out)


def _take(x, idx, axis):
    return jnp.take(x, jnp.asarray(idx), axis=axis)


def _scales(positional, named) -> tuple:
    """The optional per-dim scales, however the caller passed them (positionally or by name)."""
    if positional:
        return positional
    return tuple(named.get(k) for k in ("scales", "scales_d", "scales_h", "scales_w") if k in named)


def _along(w, axis, ndim):
    shape = [1] * ndim
    shape[axis] = -1
    return w.reshape(shape)


# -- nearest ----------------------------------------------------------------------------------------

def _nearest_index(n_in, n_out, scale, exact):
    dst = np.arange(n_out)
    if not exact:
        if n_out == n_in:
            return dst
        if n_out == 2 * n_in:
            return dst >> 1
    s = _scale(n_in, n_out, scale, np.float32)
    src = (dst + 0.5) * np.float64(s) if exact else dst.astype(np.float32) * s
    return np.minimum(np.floor(src.astype(np.float32)).astype(np.int64), n_in - 1)


def _nearest(x, output_size, scales, exact):
    n = len(output_size)
    scales = list(scales) + [None] * (n - len(scales))
    for d, (n_out, s) in enumerate(zip(output_size, scales)):
        ax = x.ndim - n + d
        x = _take(x, _nearest_index(x.shape[ax], n_out, s, exact), ax)
    return x


def _nearest_rules(op, op_bw, exact):
    @lowering(op, static=True)
    def forward(x, output_size, *scales, **named):
        return _nearest(x, output_size, _scales(scales, named), exact)

    @lowering(op_bw, static=True)
    def backward(grad, output_size, input_size, *scales, **named):
        scales = _scales(scales, named)
        zeros = jnp.zeros(tuple(input_size), grad.dtype)
        return jax.vjp(lambda v: _nearest(v, output_size, scales, exact), zeros)[1](grad)[0]

    forward.__name__ = op.name().split("::")[1]
    backward.__name__ = op_bw.name().split("::")[1]


for _n in (1, 2, 3):
    _nearest_rules(getattr(aten, f"upsample_nearest{_n}d").default,
                   getattr(aten, f"upsample_nearest{_n}d_backward").default, exact=False)
    _nearest_rules(getattr(aten, f"_upsample_nearest_exact{_n}d").default,
                   getattr(aten, f"_upsample_nearest_exact{_n}d_backward").default, exact=True)


# -- linear and cubic -------------------------------------------------------------------------------

def _source(n_in, n_out, align_corners, scale, t, cubic):
    """area_pixel_compute_source_index for every output position, in precision ``t``."""
    dst = np.arange(n_out).astype(t)
    if align_corners:
        s = t(n_in - 1) / t(n_out - 1) if n_out > 1 else t(0)
        return (s * dst).astype(t)
    s = _scale(n_in, n_out, scale, t)
    src = (s * (dst + t(0.5)) - t(0.5)).astype(t)
    return src if cubic else np.maximum(src, t(0))


def _linear_taps(n_in, n_out, align_corners, scale, t):
    src = _source(n_in, n_out, align_corners, scale, t, cubic=False)
    i0 = np.minimum(np.floor(src).astype(np.int64), n_in - 1)
    l1 = np.clip(src - i0.astype(t), 0, 1).astype(t)
    i1 = i0 + (i0 < n_in - 1)
    return [(i0, (t(1) - l1).astype(t)), (i1, l1)]


def _cubic_taps(n_in, n_out, align_corners, scale, t, a=-0.75):
    src = _source(n_in, n_out, align_corners, scale, t, cubic=True)
    i = np.floor(src).astype(np.int64)
    f = (src - i.astype(t)).astype(t)
    a = t(a)

    def cc1(v):
        return ((a + 2) * v - (a + 3)) * v * v + 1

    def cc2(v):
        return ((a * v - 5 * a) * v + 8 * a) * v - 4 * a

    ws = [cc2(f + 1), cc1(f), cc1(1 - f), cc2(2 - f)]
    return [(np.clip(i - 1 + k, 0, n_in - 1), w.astype(t)) for k, w in enumerate(ws)]



def _aa_taps(interp_size, kernel):
    """Antialiased taps (PIL's resampling, ATen's _compute_weights_aa): when downsampling, the
    filter ``kernel`` is stretched by the scale, so each output averages every input it covers;
    weights are normalised to sum to 1. Computed in ATen's mix of float and double."""
    def taps(n_in, n_out, align_corners, scale, t):
        if align_corners:
            s = t(n_in - 1) / t(n_out - 1) if n_out > 1 else t(0)
        else:
            s = _scale(n_in, n_out, scale, t)
        s = t(s)
        support = t(interp_size * 0.5 * s) if s >= 1 else t(interp_size * 0.5)
        width = int(np.ceil(support)) * 2 + 1
        invscale = t(1.0 / float(s)) if s >= 1 else t(1)
        idx = np.zeros((width, n_out), np.int64)
        wts = np.zeros((width, n_out), t)
        for i in range(n_out):
            center = t(float(s) * (i + 0.5))
            xmin = max(int(float(center) - float(support) + 0.5), 0)
            xsize = min(int(float(center) + float(support) + 0.5), n_in) - xmin
            xsize = min(max(xsize, 0), width)
            w = np.array([kernel(t((float(t(j + xmin) - center) + 0.5) * float(invscale)), t)
                          for j in range(xsize)], t)
            total = t(0)
            for v in w:
                total = t(total + v)
            if total != 0:
                w = (w / total).astype(t)
            idx[:xsize, i] = np.arange(xmin, xmin + xsize)
            idx[xsize:, i] = min(xmin, n_in - 1)
            wts[:xsize, i] = w
        return [(idx[k], wts[k]) for k in range(width)]
    return taps


def _triangle(x, t):
    x = abs(x)
    return t(1) - x if x < 1 else t(0)


def _keys_cubic(x, t, a=-0.5):
    x, a = abs(x), t(a)
    if x < 1:
        return t(((a + 2) * x - (a + 3)) * x * x + 1)
    if x < 2:
        return t(((a * x - 5 * a) * x + 8 * a) * x - 4 * a)
    return t(0)


def _interpolate(x, output_size, align_corners, scales, taps):
    """Separable interpolation, last dim first (eager nests it the same way, and the rounding
    follows it). A float16/bfloat16 input (these ops' opmath rule leaves its roundings here) is
    computed as eager's generic kernel does it: each dim's weights computed in float32 and
    stored in the input's dtype (``_stored_taps``), the taps accumulated in float32 as its
    compiled code does (the first product, then a fused multiply-add per further tap), and the
    result rounded once."""
    n = len(output_size)
    scales = list(scales) + [None] * (n - len(scales))
    half = x.dtype in opmath.LOW
    t = np.float32 if half else _opmath(x.dtype)
    y = x.astype(jnp.float32 if half else acc_dtype(x.dtype))
    for d in reversed(range(n)):
        ax = y.ndim - n + d
        args = (y.shape[ax], output_size[d], align_corners, scales[d])
        acc = None
        for idx, w in (_stored_taps(taps, *args, np.dtype(x.dtype)) if half else taps(*args, t)):
            v, w = _take(y, idx, ax), _along(jnp.asarray(w, y.dtype), ax, y.ndim)
            if acc is None:
                acc = v * w
            else:
                acc = opmath.fma(v, w, acc) if half else acc + v * w
        y = acc
    return opmath.round_to(y, x.dtype) if half else y.astype(x.dtype)


def _stored_taps(taps, n_in, n_out, align_corners, scale, low):
    """``taps``' weights as the kernel stores them in the half dtype ``low``, as float32: the
    linear kernel stores lambda1 and then computes lambda0 = 1 - lambda1 in that dtype."""
    out = taps(n_in, n_out, align_corners, scale, np.float32)
    stored = [(i, w.astype(low).astype(np.float32)) for i, w in out]
    if taps is _linear_taps:
        (i0, _), (i1, w1) = stored
        w0 = (np.float32(1) - w1).astype(low).astype(np.float32)
        stored = [(i0, w0), (i1, w1)]
    return stored


# -- uint8 images: eager's fixed-point path ---------------------------------------------------------
# CPU eager resamples uint8 bilinear/bicubic (antialiased or not) its own way (PIL's): one dim at a
# time, the last first, skipping dims whose size does not change, each pass in integers: weights
# computed in double, scaled to int16 by the most bits that keep the largest below 2**15, the
# taps summed in int32 with half of the last bit added, shifted back and clamped to 0..255, and
# stored as uint8 before the next pass. A float computation rounded at the end is off by up to
# a few units.

def _double_scale(n_in, n_out, align_corners, scale):
    """area_pixel_compute_scale<double>."""
    if align_corners:
        return (n_in - 1) / (n_out - 1) if n_out > 1 else 0.0
    return _scale(n_in, n_out, scale, float)


def _uint8_weights(n_in, n_out, align_corners, scale, interp_size, filt, antialias):
    """Per output position: the first input index, how many taps and their double weights
    (ATen's _compute_indices_min_size_weights and its _aa form), and the largest weight."""
    s = _double_scale(n_in, n_out, align_corners, scale)
    if antialias:
        support = interp_size * 0.5 * s if s >= 1.0 else interp_size * 0.5
        width = int(np.ceil(support)) * 2 + 1
    else:
        width = interp_size
    rows, wt_max = [], 0.0
    for i in range(n_out):
        wt = [0.0] * width
        if antialias:
            center = s * (i + 0.5)
            invscale = 1.0 / s if s >= 1.0 else 1.0
            lo = max(int(center - support + 0.5), 0)
            size = min(max(min(int(center + support + 0.5), n_in) - lo, 0), width)
            for j in range(size):
                wt[j] = filt((j + lo - center + 0.5) * invscale)
            total = sum(wt[:size])
            if total != 0.0:
                wt[:size] = [w / total for w in wt[:size]]
                wt_max = max([wt_max, *wt[:size]])
        else:
            cubic = interp_size > 2
            if align_corners:
                real = s * i
            else:
                real = s * (i + 0.5) - 0.5
                real = real if cubic or real >= 0 else 0.0
            index = min(int(np.floor(np.float32(real))), n_in - 1)      # floorf
            lam = min(max(real - index, 0.0), 1.0)
            half = interp_size // 2
            unbound = index - half + 1
            lo = max(unbound, 0)
            size = min(max(min(index + half + 1, n_in) - lo, 0), width)
            k = 0
            for j in range(width):
                wt[j] = 0.0
                w = filt(float(j + 1 - half) - lam)
                if unbound + j <= 0:
                    k = 0
                elif unbound + j >= n_in - 1:
                    k = size - 1
                wt[k] += w
                wt_max = max(wt_max, wt[k])
                k += 1
        rows.append((lo, size, wt))
    return rows, wt_max, width


def _uint8_taps(n_in, n_out, align_corners, scale, interp_size, filt, antialias):
    """(indices, int16 weights as int32, precision): ATen's _compute_index_ranges_int16_weights;
    taps past a position's count weigh 0."""
    rows, wt_max, width = _uint8_weights(n_in, n_out, align_corners, scale, interp_size, filt,
                                         antialias)
    precision = 0
    while precision < 22 and int(0.5 + wt_max * (1 << (precision + 1))) < (1 << 15):
        precision += 1
    idx = np.zeros((width, n_out), np.int64)
    w16 = np.zeros((width, n_out), np.int32)
    for i, (lo, size, wt) in enumerate(rows):
        for j in range(width):
            if j < size:
                v = wt[j] * (1 << precision)
                idx[j, i], w16[j, i] = lo + j, int(v - 0.5) if v < 0 else int(v + 0.5)
            else:
                idx[j, i] = min(lo, n_in - 1)
    return idx, w16, precision


def _interpolate_uint8(x, output_size, align_corners, scales, spec):
    interp_size, filt, antialias = spec
    n = len(output_size)
    scales = list(scales) + [None] * (n - len(scales))
    for d in reversed(range(n)):
        ax = x.ndim - n + d
        if x.shape[ax] == output_size[d]:
            continue
        idx, w16, precision = _uint8_taps(x.shape[ax], output_size[d], align_corners,
                                          scales[d], interp_size, filt, antialias)
        y = x.astype(jnp.int32)
        acc = jnp.int32(1 << (precision - 1))
        for k in range(idx.shape[0]):
            acc = acc + _take(y, idx[k], ax) * _along(jnp.asarray(w16[k]), ax, y.ndim)
        x = jnp.clip(jnp.right_shift(acc, precision), 0, 255).astype(jnp.uint8)
    return x


def _interp_rules(op, op_bw, taps, uint8=None):
    @lowering(op, static=True)
    def forward(x, output_size, align_corners, *scales, **named):
        if x.dtype == jnp.uint8 and uint8 is not None:
            return _interpolate_uint8(x, output_size, align_corners, _scales(scales, named),
                                      uint8)
        return _interpolate(x, output_size, align_corners, _scales(scales, named), taps)

    @lowering(op_bw, static=True)
    def backward(grad, output_size, input_size, align_corners, *scales, **named):
        scales = _scales(scales, named)
        zeros = jnp.zeros(tuple(input_size), grad.dtype)
        f = lambda v: _interpolate(v, output_size, align_corners, scales, taps)  # noqa: E731
        return jax.vjp(f, zeros)[1](grad)[0]

    forward.__name__ = op.name().split("::")[1]
    backward.__name__ = op_bw.name().split("::")[1]


_interp_rules(aten.upsample_linear1d.default, aten.upsample_linear1d_backward.default, _linear_taps)
_interp_rules(aten.upsample_bilinear2d.default, aten.upsample_bilinear2d_backward.default,
              _linear_taps, uint8=(2, partial(_triangle, t=float), False))
_interp_rules(aten.upsample_trilinear3d.default, aten.upsample_trilinear3d_backward.default,
              _linear_taps)
_interp_rules(aten.upsample_bicubic2d.default, aten.upsample_bicubic2d_backward.default,
              _cubic_taps, uint8=(4, partial(_keys_cubic, t=float, a=-0.75), False))
_interp_rules(aten._upsample_bilinear2d_aa.default, aten._upsample_bilinear2d_aa_backward.default,
              _aa_taps(2, _triangle), uint8=(2, partial(_triangle, t=float), True))
_interp_rules(aten._upsample_bicubic2d_aa.default, aten._upsample_bicubic2d_aa_backward.default,
              _aa_taps(4, _keys_cubic), uint8=(4, partial(_keys_cubic, t=float), True))


# -- padding ----------------------------------------------------------------------------------------

def _pad(x, padding, mode):
    """padding = (last-dim left, right, next-to-last left, right, ...); negative crops."""
    n = len(padding) // 2
    widths = [(0, 0)] * (x.ndim - n)
    for d in reversed(range(n)):
        widths.append((padding[2 * d], padding[2 * d + 1]))
    y = jnp.pad(x, [(max(a, 0), max(b, 0)) for a, b in widths], mode=mode)
    crop = tuple(slice(max(-a, 0), y.shape[i] - max(-b, 0)) for i, (a, b) in enumerate(widths))
    return y[crop]


def _pad_rules(kind, mode):
    for n in (1, 2, 3):
        fwd = getattr(aten, f"{kind}_pad{n}d").default
        bwd = getattr(aten, f"{kind}_pad{n}d_backward").default

        @lowering(fwd, static=True)
        def forward(x, padding):
            return _pad(x, padding, mode)

        @lowering(bwd, static=True)
        def backward(grad, x, padding):
            return jax.vjp(lambda v: _pad(v, padding, mode), x)[1](grad.astype(x.dtype))[0]

        forward.__name__, backward.__name__ = f"{kind}_pad{n}d", f"{kind}_pad{n}d_backward"


_pad_rules("reflection", "reflect")
_pad_rules("replication", "edge")


# -- shuffles ---------------------------------------------------------------------------------------

@lowering(aten.pixel_shuffle.default, static=True)
def pixel_shuffle(x, r):
    *lead, c, h, w = x.shape
    y = x.reshape(*lead, c // (r * r), r, r, h, w)
    k = len(lead)
    y = jnp.transpose(y, tuple(range(k)) + (k, k + 3, k + 1, k + 4, k + 2))
    return y.reshape(*lead, c // (r * r), h * r, w * r)


@lowering(aten.pixel_unshuffle.default, static=True)
def pixel_unshuffle(x, r):
    *lead, c, h, w = x.shape
    y = x.reshape(*lead, c, h // r, r, w // r, r)
    k = len(lead)
    y = jnp.transpose(y, tuple(range(k)) + (k, k + 2, k + 4, k + 1, k + 3))
    return y.reshape(*lead, c * r * r, h // r, w // r)


@lowering(aten.channel_shuffle.default, static=True)
def channel_shuffle(x, groups):
    n, c = x.shape[0], x.shape[1]
    rest = x.shape[2:]
    y = x.reshape((n, groups, c // groups) + rest)
    return jnp.swapaxes(y, 1, 2).reshape(x.shape)



# -- grid_sampler (F.grid_sample): mode 0 bilinear, 1 nearest, 2 bicubic; padding 0 zeros,
#    1 border, 2 reflection ------------------------------------------------------------------------

def _unnormalize(c, size, align_corners, vectorized):
    """Grid coordinate in [-1, 1] -> input index space, as eager's 2-d (vectorized) or 3-d
    kernel writes it."""
    if vectorized:
        if align_corners:
            return (c + 1) * ((size - 1) / 2)
        return (c + 1) * (size / 2) - 0.5
    if align_corners:
        return (c + 1) / 2 * (size - 1)
    return ((c + 1) * size - 1) / 2


def _reflect(c, twice_low, twice_high):
    if twice_low == twice_high:
        return jnp.zeros_like(c)
    low, span = twice_low / 2, (twice_high - twice_low) / 2
    c = jnp.abs(c - low)
    extra = jnp.fmod(c, span)
    flips = jnp.floor(c / span)
    return jnp.where(jnp.fmod(flips, 2) == 0, extra + low, span - extra + low)


def _pad_coord(c, size, padding_mode, align_corners):
    """compute_coordinates of PyTorch's GridSampler.h: border clips, reflection folds then clips."""
    if padding_mode == 2:
        c = _reflect(c, 0, 2 * (size - 1)) if align_corners else _reflect(c, -1, 2 * size - 1)
    if padding_mode in (1, 2):
        c = jnp.clip(c, 0, size - 1)
    return c


def _cubic_coeffs(t, a=-0.75):
    def cc1(v):
        return ((a + 2) * v - (a + 3)) * v * v + 1

    def cc2(v):
        return ((a * v - 5 * a) * v + 8 * a) * v - 4 * a
    return [cc2(t + 1), cc1(t), cc1(1 - t), cc2(2 - t)]


def _inside(idx, sizes):
    """Whether the integer-valued (float) indices ``idx``, one array per spatial dim, lie in the
    input (NaN does not)."""
    valid = True
    for i, size in zip(idx, sizes):
        valid = valid & (i >= 0) & (i <= size - 1)
    return valid


def _gather(x, candidates):
    """``x[n, :, i0, i1(, i2)]`` at every combination of each spatial dim's candidate indices,
    read by ONE gather: ``candidates[d]`` lists dim d's integer-valued (float) index arrays, each
    shaped ``(N,) + out``; the result is ``(N, C, K0, K1(, K2)) + out`` (``Kd``: dim d's number
    of candidates), zero where an index is outside ``x``. Bicubic's 16 taps read one by one (16
    gathers, and 16 scatter-adds in the gradient) made XLA compile for seconds."""
    sizes = x.shape[2:]
    nb, c = x.shape[:2]
    n = len(sizes)
    flat, inside = 0, True
    for d, ks in enumerate(candidates):
        i = jnp.stack(ks)
        i = i.reshape(tuple(len(ks) if e == d else 1 for e in range(n)) + i.shape[1:])
        flat = flat + jnp.clip(i, 0, sizes[d] - 1).astype(jnp.int64) * int(np.prod(sizes[d + 1:]))
        inside = inside & (i >= 0) & (i <= sizes[d] - 1)     # NaN is outside
    taps, out_sp = flat.shape[:n], flat.shape[n + 1:]
    flat = jnp.moveaxis(flat, n, 0)
    v = jnp.take_along_axis(x.reshape(nb, c, -1), flat.reshape(nb, 1, -1), axis=2)
    v = v.reshape((nb, c) + taps + out_sp)
    return jnp.where(jnp.moveaxis(inside, n, 0)[:, None], v, jnp.zeros((), x.dtype))


def _gather_at(x, idx):
    """``_gather`` of one index array per spatial dim: ``(N, C) + out``."""
    v = _gather(x, [[i] for i in idx])
    return v.reshape(v.shape[:2] + v.shape[2 + len(idx):])


def _grid_sample(x, grid, mode, padding_mode, align_corners):
    n = grid.shape[-1]
    sizes = x.shape[2:]
    # Grid components are (x, y[, z]): the last spatial dim comes first.
    coords = [grid[..., n - 1 - d].astype(x.dtype) for d in range(n)]
    src = [_unnormalize(cd, sizes[d], align_corners, n == 2) for d, cd in enumerate(coords)]

    if mode == 2:   # bicubic, 2-d only: along x within each of 4 rows, then along y
        (by, bx) = (jnp.floor(s) for s in src)
        cy, cx = _cubic_coeffs(src[0] - by), _cubic_coeffs(src[1] - bx)
        iys = [_pad_coord(by - 1 + j, sizes[0], padding_mode, align_corners) for j in range(4)]
        ixs = [_pad_coord(bx - 1 + i, sizes[1], padding_mode, align_corners) for i in range(4)]
        v = _gather(x, [iys, ixs])
        out = 0
        for j in range(4):
            row = 0
            for i in range(4):
                row = row + v[:, :, j, i] * cx[i][:, None]
            out = out + row * cy[j][:, None]
        return out
    src = [_pad_coord(s, sizes[d], padding_mode, align_corners) for d, s in enumerate(src)]
    if mode == 1:
        return _gather_at(x, [jnp.round(s) for s in src])   # nearbyint: ties to even
    base = [jnp.floor(s) for s in src]
    v = _gather(x, [[b, b + 1] for b in base])
    out = 0
    for corner in itertools.product((0, 1), repeat=n):
        tap = v[(slice(None), slice(None)) + corner]
        w = 1
        for d, k in enumerate(corner):
            frac = src[d] - base[d]
            w = w * (frac if k else 1 - frac)
        out = out + tap * w[:, None]
    return out


# float16/bfloat16: eager computes these in the tensor's own dtype. Both CPU kernels compute in
# scalar_t: the 2-d one (grid_sampler_2d_cpu_kernel) on Vectorized<Half/BFloat16>, the 3-d one
# (grid_sampler_3d_cpu_impl) on c10::Half/BFloat16 scalars, and every arithmetic operation of
# either is done in float32 and rounded back to the dtype before the next one: the unnormalised
# coordinate, each step of its reflection, the distances, the weights, each product and each
# partial sum. Rounding the coordinate can move it across a pixel border, so the float32
# computation can pick other pixels, not just other low bits. The two kernels spell the steps
# differently, so each has its helpers below (``_vec_*`` for 2-d, ``_scalar_*`` for 3-d). The
# rule (in opmath's _OWN_ROUNDING) gets the half-dtype operands and rounds each step itself.
# Not reproduced: what eager's 2-d kernel reads where its 16-bit gather offsets overflow (an
# image of more than 32767 elements per channel, or a clipped index past a size-1 that the
# dtype cannot hold, beyond 256 or 2048 pixels), and where a non-finite coordinate with zeros
# padding becomes an index (undefined in C++); those read pixel 0 or memory outside the image.

class _Half:
    """float32 arithmetic rounded to a half ``dtype`` after each operation, as one operator of
    c10::Half/BFloat16 (or Vectorized of them) computes: ``h(a * b)`` is their product."""

    def __init__(self, dtype):
        self.dtype = np.dtype(dtype)

    def __call__(self, v):
        return opmath.round_to(v, self.dtype).astype(jnp.float32)

    def const(self, v) -> float:
        """A number as the kernel holds it in the dtype (``static_cast<scalar_t>(v)``)."""
        return float(np.asarray(v, np.float32).astype(self.dtype))


def _vec_clip(c, size, h):
    """The vectorized kernel's clip to [0, size - 1] (NaN goes to 0)."""
    c = jnp.where(c > 0, c, 0.0)
    hi = h.const(size - 1)
    return jnp.where(c < hi, c, hi)


def _vec_unnormalize(g, size, align_corners, h):
    """[-1, 1] -> index space as (g + 1) * s (- 0.5), s being (size - 1) / 2 or size / 2 held in
    the dtype."""
    if align_corners:
        return h(h(g + 1) * h.const(h.const(size - 1) / 2))
    return h(h(h(g + 1) * h.const(h.const(size) / 2)) - 0.5)


def _vec_reflect(c, size, align_corners, h):
    """Reflection about the image's edges (pixel centres with ``align_corners``, else the outer
    edges at -0.5 and size - 0.5): the distance from the low edge less whole double spans (the
    quotient truncated), folded once more where past one span."""
    if align_corners:
        if size <= 1:
            return jnp.zeros_like(c)
        twice_span = h.const(h.const(size - 1) * 2)
        dist = jnp.abs(c)
    else:
        twice_span = h.const(h.const(size) * 2)
        dist = jnp.abs(h(c + 0.5))
    extra = h(dist - h(jnp.trunc(h(dist / twice_span)) * twice_span))
    folded = jnp.minimum(extra, h(twice_span - extra))
    return folded if align_corners else h(folded - 0.5)


def _vec_pad(c, size, padding_mode, align_corners, h):
    """The vectorized kernel's compute_coordinates: border clips, reflection folds then clips."""
    if padding_mode == 2:
        c = _vec_reflect(c, size, align_corners, h)
    if padding_mode in (1, 2):
        c = _vec_clip(c, size, h)
    return c


def _vec_cubic_coeffs(t, h):
    """Keys' cubic weights (A = -0.75) of the four taps around fraction ``t``, each polynomial
    evaluated in the dtype as the vectorized kernel nests it."""
    a = -0.75

    def outer(v):   # 1 < v < 2
        return h(h(h(h(h(h(a * v) - 5 * a) * v) + 8 * a) * v) - 4 * a)

    def inner(v):   # v <= 1
        return h(h(h(h(h((a + 2) * v) - (a + 3)) * v) * v) + 1)
    return [outer(h(t + 1)), inner(t), inner(h(1 - t)), outer(h(2 - t))]


def _weighted_sum(terms, h):
    """sum(v * w) term by term, each product and each partial sum rounded."""
    out = None
    for v, w in terms:
        p = h(v * w)
        out = p if out is None else h(out + p)
    return out


def _half_grid_sample_2d(x, gx, gy, mode, padding_mode, align_corners, h):
    """grid_sampler_2d_cpu_kernel's float16/bfloat16 arithmetic; ``x`` widened to float32."""
    size_h, size_w = x.shape[2:]
    if mode == 2:   # bicubic: taps around the unpadded coordinate, each tap padded itself
        fx = _vec_unnormalize(gx, size_w, align_corners, h)
        fy = _vec_unnormalize(gy, size_h, align_corners, h)
        bx, by = jnp.floor(fx), jnp.floor(fy)
        cx, cy = _vec_cubic_coeffs(h(fx - bx), h), _vec_cubic_coeffs(h(fy - by), h)

        def tap(base, k, size):
            return jnp.trunc(_vec_pad(h(base + (k - 1)), size, padding_mode, align_corners, h))
        iys = [tap(by, j, size_h) for j in range(4)]
        ixs = [tap(bx, i, size_w) for i in range(4)]
        v = _gather(x, [iys, ixs])
        rows = [_weighted_sum([(v[:, :, j, i], cx[i][:, None]) for i in range(4)], h)
                for j in range(4)]
        return _weighted_sum([(rows[j], cy[j][:, None]) for j in range(4)], h)
    fx = _vec_pad(_vec_unnormalize(gx, size_w, align_corners, h), size_w, padding_mode,
                  align_corners, h)
    fy = _vec_pad(_vec_unnormalize(gy, size_h, align_corners, h), size_h, padding_mode,
                  align_corners, h)
    if mode == 1:
        return _gather_at(x, [jnp.round(fy), jnp.round(fx)])   # ties to even
    x_w, y_n = jnp.floor(fx), jnp.floor(fy)
    w, n = h(fx - x_w), h(fy - y_n)        # distances to the west and north sides
    e, s = h(1 - w), h(1 - n)
    v = _gather(x, [[y_n, y_n + 1], [x_w, x_w + 1]])
    corners = [(v[:, :, 0, 0], h(s * e)), (v[:, :, 0, 1], h(s * w)),
               (v[:, :, 1, 0], h(n * e)), (v[:, :, 1, 1], h(n * w))]
    return _weighted_sum([(tap, wt[:, None]) for tap, wt in corners], h)


def _scalar_unnormalize(g, size, align_corners, h):
    """grid_sampler_unnormalize in scalar_t: ((g + 1) / 2) * (size - 1), or
    ((g + 1) * size - 1) / 2."""
    if align_corners:
        return h(h(h(g + 1) / 2) * h.const(size - 1))
    return h(h(h(h(g + 1) * h.const(size)) - 1) / 2)


def _scalar_reflect(c, twice_low, twice_high, h):
    """reflect_coordinates in scalar_t: the distance from the low bound modulo the span, flipped
    when floor(distance / span), a quotient rounded to the dtype first, is odd."""
    if twice_low == twice_high:
        return jnp.zeros_like(c)
    low = h.const(h.const(twice_low) / 2)
    span = h.const(h.const(twice_high - twice_low) / 2)
    dist = jnp.abs(h(c - low))
    extra = jnp.fmod(dist, span)        # exact
    odd = jnp.fmod(jnp.floor(h(dist / span)), 2) != 0
    return jnp.where(odd, h(h(span - extra) + low), h(extra + low))


def _scalar_pad(c, size, padding_mode, align_corners, h):
    """compute_coordinates in scalar_t; its clip std::min(size - 1, std::max(c, 0)) sends NaN to
    size - 1."""
    if padding_mode == 2:
        c = (_scalar_reflect(c, 0, 2 * (size - 1), h) if align_corners
             else _scalar_reflect(c, -1, 2 * size - 1, h))
    if padding_mode in (1, 2):
        c = jnp.where(c < 0, 0.0, c)
        hi = h.const(size - 1)
        c = jnp.where(c < hi, c, hi)
    return c


def _half_grid_sample_3d(x, coords, mode, padding_mode, align_corners, h):
    """grid_sampler_3d_cpu_impl's scalar_t arithmetic; ``coords`` is (z, y, x) and ``x`` widened
    to float32. Trilinear: each corner's weight is the product of its three distances (x's, then
    y's, then z's), and the in-bounds corners are added to a zero output in the order
    tnw, tne, tsw, tse, bnw, bne, bsw, bse."""
    sizes = x.shape[2:]
    src = [_scalar_pad(_scalar_unnormalize(c, size, align_corners, h), size, padding_mode,
                       align_corners, h) for c, size in zip(coords, sizes)]
    if mode == 1:
        return _gather_at(x, [jnp.round(s) for s in src])     # nearbyint: ties to even
    base = [jnp.floor(s) for s in src]
    out = jnp.zeros(x.shape[:2] + coords[0].shape[1:], jnp.float32)
    v = _gather(x, [[b, b + 1] for b in base])
    for corner in itertools.product((0, 1), repeat=3):   # z outermost, x innermost
        wt = None
        for k, b, s in reversed(list(zip(corner, base, src))):     # x, y, z
            d = h(s - h(b)) if k else h(h(b + 1) - s)
            wt = d if wt is None else h(wt * d)
        idx = [b + k for b, k in zip(base, corner)]
        added = h(out + h(v[(slice(None), slice(None)) + corner] * wt[:, None]))
        out = jnp.where(_inside(idx, sizes)[:, None], added, out)
    return out


def _half_grid_sample(x, grid, mode, padding_mode, align_corners):
    """F.grid_sample of a float16/bfloat16 ``x`` (and ``grid``) as eager's CPU kernel rounds it."""
    h = _Half(x.dtype)
    xf, g = x.astype(jnp.float32), grid.astype(jnp.float32)
    if grid.shape[-1] == 2:
        out = _half_grid_sample_2d(xf, g[..., 0], g[..., 1], mode, padding_mode, align_corners, h)
    else:
        coords = [g[..., 2], g[..., 1], g[..., 0]]
        out = _half_grid_sample_3d(xf, coords, mode, padding_mode, align_corners, h)
    return out.astype(x.dtype)      # every value is already one of the dtype's


@lowering(aten.grid_sampler_2d.default, aten.grid_sampler_3d.default, static=True)
def grid_sampler(x, grid, interpolation_mode, padding_mode, align_corners):
    if x.dtype in opmath.LOW:
        return _half_grid_sample(x, grid, interpolation_mode, padding_mode, align_corners)
    return _grid_sample(x, grid, interpolation_mode, padding_mode, align_corners)


@lowering(aten.grid_sampler_2d_backward.default, aten.grid_sampler_3d_backward.default,
          static=True)
def grid_sampler_backward(grad, x, grid, interpolation_mode, padding_mode, align_corners,
                          output_mask):
    f = lambda v, g: _grid_sample(v, g, interpolation_mode, padding_mode, align_corners)  # noqa
    _, vjp = jax.vjp(f, x, grid)
    gx, gg = vjp(grad.astype(x.dtype))
    return (gx if output_mask[0] else None), (gg if output_mask[1] else None)
