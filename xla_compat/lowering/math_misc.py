"""Miscellaneous math: shifts, gcd/lcm, nextafter, frexp/ldexp, complex construction, angle,
renorm, histograms (static bin counts) and bincount (size from a host round trip),
allclose/equal (Python bools: the comparison runs on the device, one scalar comes back).
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from ..lazy import tracer
from ..lazy.tensor import LazyTensor
from ._helpers import cast, dim, to
from .opmath import store, work
from .registry import aten, lowering

# -- integer bit ops ------------------------------------------------------------------------------


_SHIFTS = (aten.bitwise_left_shift.Tensor, aten.bitwise_left_shift.Tensor_Scalar,
           aten.bitwise_left_shift.Scalar_Tensor, aten.__lshift__.Tensor, aten.__lshift__.Scalar,
           aten.bitwise_right_shift.Tensor, aten.bitwise_right_shift.Tensor_Scalar,
           aten.bitwise_right_shift.Scalar_Tensor, aten.__rshift__.Tensor,
           aten.__rshift__.Scalar)


@tracer.meta_arguments(*_SHIFTS)
def _bool_operands_promote(func, args, kwargs):
    """Eager shifts a bool operand as the promoted integer type (``ints << mask``); the meta
    kernels refuse bool: they run on stand-ins of the promoted dtype (two bools promote to
    bool, which eager refuses too)."""
    x, y = args[0], args[1]
    if not any(isinstance(t, torch.Tensor) and t.dtype == torch.bool for t in (x, y)):
        return args, kwargs
    dtype = torch.result_type(x, y)
    stand_in = [torch.empty_strided(t.shape, t.stride(), dtype=dtype, device="meta")
                if isinstance(t, torch.Tensor) else t for t in (x, y)]
    return (*stand_in, *args[2:]), kwargs


@lowering(aten.bitwise_left_shift.Tensor, aten.bitwise_left_shift.Tensor_Scalar,
          aten.bitwise_left_shift.Scalar_Tensor, aten.__lshift__.Tensor, aten.__lshift__.Scalar,
          meta=True)
def bitwise_left_shift(x, y, *, aval):
    # XLA, like eager, gives 0 for shifts that are negative or >= the bit width.
    x, y = jnp.broadcast_arrays(*to(aval.dtype, x, y))
    return lax.shift_left(x, y)


@lowering(aten.bitwise_right_shift.Tensor, aten.bitwise_right_shift.Tensor_Scalar,
          aten.bitwise_right_shift.Scalar_Tensor, aten.__rshift__.Tensor, aten.__rshift__.Scalar,
          meta=True)
def bitwise_right_shift(x, y, *, aval):
    # Out-of-range shifts fill with the sign bit (signed) or zeros (unsigned), as eager does.
    x, y = jnp.broadcast_arrays(*to(aval.dtype, x, y))
    if jnp.issubdtype(aval.dtype, jnp.unsignedinteger):
        return lax.shift_right_logical(x, y)
    return lax.shift_right_arithmetic(x, y)


@lowering(aten.gcd.default, meta=True)
def gcd(x, y, *, aval):
    return jnp.gcd(*to(aval.dtype, x, y))


@lowering(aten.lcm.default, meta=True)
def lcm(x, y, *, aval):
    x, y = to(aval.dtype, x, y)
    g = jnp.gcd(x, y)
    return jnp.where(g == 0, jnp.zeros((), aval.dtype), jnp.abs(x // jnp.where(g == 0, 1, g) * y))


# -- floating-point representation -----------------------------------------------------------------

@lowering(aten.nextafter.default, meta=True)
def nextafter(x, y, *, aval):
    return jnp.nextafter(*to(aval.dtype, x, y))


_FLOAT_BITS = {jnp.dtype(jnp.float32): (jnp.int32, 23, 8), jnp.dtype(jnp.float64): (jnp.int64, 52, 11),
               jnp.dtype(jnp.bfloat16): (jnp.int16, 7, 8), jnp.dtype(jnp.float16): (jnp.int16, 10, 5)}


@lowering(aten.frexp.Tensor)
def frexp(x):
    """On the bits, so subnormals (which XLA's CPU flushes to zero in arithmetic) stay exact."""
    src = x if x.dtype in _FLOAT_BITS else x.astype(jnp.float32)
    itype, mbits, ebits = _FLOAT_BITS[src.dtype]
    bias = (1 << (ebits - 1)) - 2                       # 126 / 1022: exponent of [0.5, 1)
    bits = lax.bitcast_convert_type(src, itype)
    one = jnp.asarray(1, itype)
    frac_mask = (one << mbits) - 1
    field = (bits >> mbits) & ((one << ebits) - 1)
    frac = bits & frac_mask
    sign = bits & ~((one << (mbits + ebits)) - 1)
    # subnormal: move the leading 1 of the fraction to the implicit bit
    shift = lax.clz(frac) - (8 * jnp.dtype(itype).itemsize - 1 - mbits)
    sub = field == 0
    exponent = jnp.where(sub, 1 - bias - shift, field - bias)
    special = (~jnp.isfinite(src)) | (sub & (frac == 0))
    frac = jnp.where(sub, (frac << jnp.where(sub, shift, 0)) & frac_mask, frac)
    mantissa = lax.bitcast_convert_type(sign | (jnp.asarray(bias, itype) << mbits) | frac,
                                        src.dtype)
    mantissa = jnp.where(special, src, mantissa).astype(x.dtype)
    return mantissa, jnp.where(special, 0, exponent).astype(jnp.int32)


@lowering(aten.ldexp.Tensor, meta=True)
def ldexp(x, other, *, aval):
    # eager: an integer exponent scales exactly (1e-30 * 2**200 is 1.6e30, 0 * 2**200 is 0);
    # a float one is self * pow(2.0, other) in the promoted float dtype (2**200 overflows).
    other = jnp.asarray(other)
    if jnp.issubdtype(other.dtype, jnp.integer) and not jnp.issubdtype(aval.dtype,
                                                                        jnp.complexfloating):
        exponent = jnp.clip(other.astype(jnp.int64), -100000, 100000).astype(jnp.int32)
        return jnp.ldexp(cast(x, aval.dtype), exponent)
    if jnp.issubdtype(other.dtype, jnp.floating) and not jnp.issubdtype(aval.dtype,
                                                                         jnp.complexfloating):
        # A real self: pow(2.0, other) is computed in other's own dtype, then multiplied in the
        # result's (ldexp(float32, float16) scales by 2 ** 2.5 rounded to float16). A complex
        # self's scale is a complex pow, in the result's dtype (below).
        scale = store(jnp.power(2.0, other.astype(work(other.dtype))), other.dtype)
        wide = work(aval.dtype)
        return store(cast(x, aval.dtype).astype(wide) * cast(scale, aval.dtype).astype(wide),
                     aval.dtype)
    x, other = to(aval.dtype, x, other)
    return x * jnp.power(jnp.asarray(2, aval.dtype), other)


# -- complex numbers -------------------------------------------------------------------------------

@lowering(aten.complex.default)
def complex_(real, imag):
    return lax.complex(*jnp.broadcast_arrays(real, imag))


@lowering(aten.polar.default)
def polar(r, theta):
    r, theta = jnp.broadcast_arrays(r, theta)
    return lax.complex(r * jnp.cos(theta), r * jnp.sin(theta))


@lowering(aten.angle.default, meta=True)
def angle(x, *, aval):
    if jnp.issubdtype(x.dtype, jnp.complexfloating):
        return jnp.arctan2(jnp.imag(x), jnp.real(x))
    x = cast(x, aval.dtype)
    return jnp.where(jnp.isnan(x), x, jnp.where(x < 0, jnp.asarray(np.pi, aval.dtype),
                                                 jnp.zeros((), aval.dtype)))



# -- renorm ----------------------------------------------------------------------------------------

@lowering(aten.renorm.default, meta=True, static=True)
def renorm(x, p, d, maxnorm, *, aval):
    """Each slice along ``d`` whose p-norm exceeds maxnorm is scaled to maxnorm (eager's 1e-7)."""
    x = cast(x, aval.dtype)
    acc = jnp.float32 if aval.dtype in (jnp.bfloat16, jnp.float16) else aval.dtype
    xa = jnp.abs(x.astype(acc))
    axes = tuple(i for i in range(x.ndim) if i != dim(d, x.ndim))
    if p == float("inf"):
        norm = jnp.max(xa, axis=axes, keepdims=True)
    elif p == 0:
        norm = jnp.sum((xa != 0).astype(acc), axis=axes, keepdims=True)
    elif p == 1:
        norm = jnp.sum(xa, axis=axes, keepdims=True)
    elif p == 2:
        norm = jnp.sqrt(jnp.sum(xa * xa, axis=axes, keepdims=True))
    else:
        norm = jnp.sum(xa ** p, axis=axes, keepdims=True) ** (1.0 / p)
    factor = jnp.where(norm > maxnorm, maxnorm / (norm + 1e-7), 1.0).astype(aval.dtype)
    return x * factor


# -- histograms ------------------------------------------------------------------------------------
# torch ships no meta kernels for these; the tracer needs their output shapes.

_LIB = torch.library.Library("aten", "IMPL")


def _meta_histogram_bin_ct(x, bins=100, *, range=None, weight=None, density=False):
    return x.new_empty((bins,)), x.new_empty((bins + 1,))


def _meta_histogram_bins_tensor(x, bins, *, weight=None, density=False):
    return x.new_empty((bins.numel() - 1,)), x.new_empty((bins.numel(),))


def _meta_histogramdd_bin_edges(x, bins, *, range=None, weight=None, density=False):
    return [x.new_empty((b + 1,)) for b in bins]


def _meta_histogramdd_from_bin_cts(x, bins, *, range=None, weight=None, density=False):
    return x.new_empty(tuple(bins))


def _meta_histogramdd_from_bin_tensors(x, bins, *, weight=None, density=False):
    return x.new_empty(tuple(b.numel() - 1 for b in bins))


for _name, _fn in (("histogram.bin_ct", _meta_histogram_bin_ct),
                   ("histogram.bins_tensor", _meta_histogram_bins_tensor),
                   ("_histogramdd_bin_edges", _meta_histogramdd_bin_edges),
                   ("_histogramdd_from_bin_cts", _meta_histogramdd_from_bin_cts),
                   ("_histogramdd_from_bin_tensors", _meta_histogramdd_from_bin_tensors)):
    if not torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{_name}", "Meta"):
        _LIB.impl(_name, _fn, "Meta")

def _linspace(lo, hi, steps, dtype):
    """torch.linspace's CPU formula: from the start for the first half, from the end after."""
    lo, hi = jnp.asarray(lo, dtype), jnp.asarray(hi, dtype)
    if steps == 1:
        return lo[None]
    step = (hi - lo) / (steps - 1)
    i = jnp.arange(steps, dtype=dtype)
    return jnp.where(jnp.arange(steps) < steps // 2, lo + step * i, hi - step * (steps - 1 - i))


def _outer_edges(x2, d, rng, pad):
    """(left, right) of dim ``d``: the given range, else the data's min/max; equal ends widen."""
    if rng is not None:
        lo, hi = jnp.asarray(rng[2 * d], jnp.float64), jnp.asarray(rng[2 * d + 1], jnp.float64)
    elif x2.shape[0] == 0:
        lo, hi = jnp.asarray(0.0, jnp.float64), jnp.asarray(1.0, jnp.float64)
    else:
        lo, hi = (jnp.min(x2[:, d]).astype(jnp.float64), jnp.max(x2[:, d]).astype(jnp.float64))
    same = lo == hi
    return jnp.where(same, lo - pad, lo), jnp.where(same, hi + pad, hi)


def _bin_index(col, edges, linear):
    """Eager's bin of each value (-1 outside the edges or NaN); the last bin includes its end."""
    n = edges.shape[0] - 1
    left, right = edges[0], edges[-1]
    inside = (col >= left) & (col <= right)
    if linear:   # histc: plain interpolation, no search
        pos = ((col - left) * n / (right - left)).astype(jnp.int64)
    else:
        pos = jnp.searchsorted(edges, col, side="right").astype(jnp.int64) - 1
    pos = jnp.where(pos == n, n - 1, pos)
    return jnp.where(inside, pos, -1)


def _histdd(x, edges: list, weight, density, linear=False):
    n = x.shape[-1]
    x2 = jnp.reshape(x, (-1, n))
    shape = tuple(e.shape[0] - 1 for e in edges)
    flat = jnp.zeros((x2.shape[0],), jnp.int64)
    ok = jnp.ones((x2.shape[0],), bool)
    for d, e in enumerate(edges):
        pos = _bin_index(x2[:, d], e, linear)
        ok = ok & (pos >= 0)
        flat = flat * shape[d] + pos
    w = jnp.ones((x2.shape[0],), x.dtype) if weight is None else jnp.reshape(weight, (-1,))
    size = int(np.prod(shape)) if shape else 1
    hist = jnp.zeros((size,), x.dtype).at[jnp.where(ok, flat, size)].add(w, mode="drop")
    hist = jnp.reshape(hist, shape)
    if density:
        hist = hist / jnp.sum(hist)
        for d, e in enumerate(edges):
            hist = hist / jnp.reshape(jnp.diff(e), [-1 if i == d else 1 for i in range(n)])
    return hist


@lowering(aten.histc.default, static=True)
def histc(x, bins=100, min=0, max=0):
    flat = jnp.reshape(x, (-1, 1))
    if min == max and flat.shape[0]:
        lo, hi = jnp.min(flat).astype(jnp.float64), jnp.max(flat).astype(jnp.float64)
    else:
        lo, hi = jnp.asarray(float(min), jnp.float64), jnp.asarray(float(max), jnp.float64)
    same = lo == hi
    lo, hi = jnp.where(same, lo - 1, lo), jnp.where(same, hi + 1, hi)
    edges = _linspace(lo.astype(x.dtype), hi.astype(x.dtype), bins + 1, x.dtype)
    return _histdd(flat, [edges], None, False, linear=True)


def _edges_from_counts(x, bins, rng):
    n = x.shape[-1]
    x2 = jnp.reshape(x, (-1, n))
    out = []
    for d in range(n):
        lo, hi = _outer_edges(x2, d, rng, 0.5)
        out.append(_linspace(lo.astype(x.dtype), hi.astype(x.dtype), bins[d] + 1, x.dtype))
    return out


@lowering(aten._histogramdd_bin_edges.default, static=True)
def histogramdd_bin_edges(x, bins, *, range=None, weight=None, density=False):
    return _edges_from_counts(x, bins, range)


@lowering(aten._histogramdd_from_bin_cts.default, static=True)
def histogramdd_from_bin_cts(x, bins, *, range=None, weight=None, density=False):
    return _histdd(x, _edges_from_counts(x, bins, range), weight, density)


@lowering(aten._histogramdd_from_bin_tensors.default, static=True)
def histogramdd_from_bin_tensors(x, bins, *, weight=None, density=False):
    return _histdd(x, list(bins), weight, density)


@lowering(aten.histogram.bin_ct, static=True)
def histogram_bin_ct(x, bins=100, *, range=None, weight=None, density=False):
    col = jnp.reshape(x, (-1, 1))
    edges = _edges_from_counts(col, [bins], range)
    w = None if weight is None else jnp.reshape(weight, (-1,))
    return _histdd(col, edges, w, density), edges[0]


@lowering(aten.histogram.bins_tensor, static=True)
def histogram_bins_tensor(x, bins, *, weight=None, density=False):
    col = jnp.reshape(x, (-1, 1))
    w = None if weight is None else jnp.reshape(weight, (-1,))
    return _histdd(col, [bins], w, density), bins


# -- bincount: the output length is max(x) + 1, read on the host -----------------------------------

def _bincount(x, weights, length, dtype):
    w = jnp.ones(x.shape, dtype) if weights is None else weights.astype(dtype)
    return jnp.zeros((length,), dtype).at[x].add(w, mode="drop")


@tracer.special(aten.bincount.default)
def _bincount_special(cls, func, args, kwargs):
    from . import host_values
    b = tracer.bind(func, args, kwargs)
    x, weights, minlength = b["self"], b.get("weights"), int(b.get("minlength", 0) or 0)
    if (x.dim() != 1 or x.dtype.is_floating_point or x.dtype.is_complex or x.dtype == torch.bool
            or minlength < 0 or (weights is not None and weights.shape != x.shape)):
        host_values.raise_like_cpu(func, args, kwargs)   # eager's own error
    top = -1
    if x.numel():
        lo_hi = torch.aminmax(host_values._host_values(x))
        if int(lo_hi.min) < 0:
            host_values.raise_like_cpu(func, args, kwargs)
        top = int(lo_hi.max)
    length = max(minlength, top + 1)
    if weights is None:
        dtype = torch.int64
    else:
        dtype = weights.dtype if weights.dtype in (torch.float32, torch.float64) else torch.float64
    jdt = {torch.int64: jnp.int64, torch.float32: jnp.float32, torch.float64: jnp.float64}[dtype]
    out = host_values._node(func, _bincount, (x, weights, length, jdt),
                            [host_values._meta((length,), dtype)], cls)
    return out[0]


# -- comparisons that return a Python bool ---------------------------------------------------------

@tracer.special(aten.equal.default)
def _equal(cls, func, args, kwargs):
    x, y = args
    if x.shape != y.shape:
        return False
    if not isinstance(y, LazyTensor) or not isinstance(x, LazyTensor):
        tracer.run_meta(aten.eq.Tensor, (x, y), {})  # eager's device-mismatch error
    return bool(torch.ops.aten.eq.Tensor(x, y).all().item())


@tracer.special(aten.allclose.default)
def _allclose(cls, func, args, kwargs):
    b = tracer.bind(func, args, kwargs)
    x, y = b["self"], b["other"]
    if x.dtype != y.dtype:   # eager raises; let it say so in its own words
        from . import host_values
        host_values.raise_like_cpu(func, args, kwargs)
    close = torch.ops.aten.isclose.default(x, y, b.get("rtol", 1e-5), b.get("atol", 1e-8),
                                           b.get("equal_nan", False))
    return bool(close.all().item())

