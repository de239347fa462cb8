"""Reductions: sum/mean/prod, min/max/argmin/argmax, var/std, norms, logsumexp, any/all, cumulative ops."""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from ._helpers import acc_dtype, cast, dim, dims, is_float
from .registry import aten, lowering


def _red_dims(x, d):
    if d is None or (isinstance(d, (list, tuple)) and len(d) == 0):
        return tuple(range(x.ndim))
    return dims(d, x.ndim)


@lowering(aten.sum.default, aten.sum.dim_IntList, meta=True)
def sum_(x, d=None, keepdim=False, *, dtype=None, aval):
    acc = acc_dtype(aval.dtype) if is_float(aval.dtype) else aval.dtype
    x = cast(x, acc)
    return jnp.sum(x, axis=_red_dims(x, d), keepdims=keepdim)


@lowering(aten.mean.default, aten.mean.dim, meta=True)
def mean(x, d=None, keepdim=False, *, dtype=None, aval):
    x = cast(x, acc_dtype(aval.dtype))
    return jnp.mean(x, axis=_red_dims(x, d), keepdims=keepdim)


@lowering(aten.prod.default, aten.prod.dim_int, meta=True)
def prod(x, d=None, keepdim=False, *, dtype=None, aval):
    x = cast(x, acc_dtype(aval.dtype))
    if x.ndim == 0:
        return x
    return jnp.prod(x, axis=None if d is None else dim(d, x.ndim), keepdims=keepdim)


@lowering(aten._is_all_true.default)
def is_all_true(x):
    """(``torch.distributions`` checks every argument with it)"""
    return jnp.all(x)


@lowering(aten._is_any_true.default)
def is_any_true(x):
    return jnp.any(x)


@lowering(aten.amax.default)
def amax(x, d=(), keepdim=False):
    return jnp.max(x, axis=_red_dims(x, d), keepdims=keepdim)


@lowering(aten.amin.default)
def amin(x, d=(), keepdim=False):
    return jnp.min(x, axis=_red_dims(x, d), keepdims=keepdim)


@lowering(aten.max.default)
def max_(x):
    return jnp.max(x)


@lowering(aten.min.default)
def min_(x):
    return jnp.min(x)


def _arg(fn, x, d, keepdim):
    if d is None:
        return fn(jnp.reshape(x, (-1,)), axis=0, keepdims=False).reshape(
            (1,) * x.ndim if keepdim else ())
    if x.ndim == 0:
        return jnp.zeros((), jnp.int64)
    return fn(x, axis=dim(d, x.ndim), keepdims=keepdim)


@lowering(aten.argmax.default)
def argmax(x, d=None, keepdim=False):
    return _arg(jnp.argmax, x, d, keepdim)


@lowering(aten.argmin.default)
def argmin(x, d=None, keepdim=False):
    return _arg(jnp.argmin, x, d, keepdim)


@lowering(aten.max.dim)
def max_dim(x, d, keepdim=False):
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    d = dim(d, x.ndim)
    return jnp.max(x, axis=d, keepdims=keepdim), jnp.argmax(x, axis=d, keepdims=keepdim)


@lowering(aten.min.dim)
def min_dim(x, d, keepdim=False):
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    d = dim(d, x.ndim)
    return jnp.min(x, axis=d, keepdims=keepdim), jnp.argmin(x, axis=d, keepdims=keepdim)


def _correction(correction, unbiased):
    if correction is not None:
        return correction
    return 1 if unbiased is None or unbiased else 0


def _accumulated(x, aval):
    """``x`` in the accumulation dtype of the (real) result's dtype; a complex ``x`` stays complex
    (the variance of complex values is the mean of ``|x - mean|**2``, and the norms take ``|x|``:
    a cast to the real result dtype first would keep only the real parts)."""
    acc = acc_dtype(aval.dtype)
    if jnp.iscomplexobj(x):
        acc = jnp.result_type(acc, jnp.complex64)
    return cast(x, acc)


@lowering(aten.var.correction, static=True, meta=True)
def var(x, d=None, *, correction=None, keepdim=False, aval):
    x = _accumulated(x, aval)
    return jnp.var(x, axis=_red_dims(x, d), ddof=_correction(correction, None), keepdims=keepdim)


@lowering(aten.std.correction, static=True, meta=True)
def std(x, d=None, *, correction=None, keepdim=False, aval):
    x = _accumulated(x, aval)
    return jnp.std(x, axis=_red_dims(x, d), ddof=_correction(correction, None), keepdims=keepdim)


@lowering(aten.var_mean.correction, static=True)
def var_mean(x, d=None, *, correction=None, keepdim=False):
    ax = _red_dims(x, d)
    return (jnp.var(x, axis=ax, ddof=_correction(correction, None), keepdims=keepdim),
            jnp.mean(x, axis=ax, keepdims=keepdim))


@lowering(aten.std_mean.correction, static=True)
def std_mean(x, d=None, *, correction=None, keepdim=False):
    ax = _red_dims(x, d)
    return (jnp.std(x, axis=ax, ddof=_correction(correction, None), keepdims=keepdim),
            jnp.mean(x, axis=ax, keepdims=keepdim))


@lowering(aten.logsumexp.default)
def logsumexp(x, d, keepdim=False):
    import jax.scipy.special as sp
    if not is_float(x.dtype):
        x = x.astype(jnp.float32)
    return sp.logsumexp(x, axis=_red_dims(x, d), keepdims=keepdim)


@lowering(aten.any.default, aten.any.dim, aten.any.dims)
def any_(x, d=None, keepdim=False):
    return jnp.any(x != 0, axis=None if d is None else _red_dims(x, d), keepdims=keepdim)


@lowering(aten.all.default, aten.all.dim, aten.all.dims)
def all_(x, d=None, keepdim=False):
    return jnp.all(x != 0, axis=None if d is None else _red_dims(x, d), keepdims=keepdim)


@lowering(aten.linalg_vector_norm.default, static=True, meta=True)
def vector_norm(x, ord=2, d=None, keepdim=False, *, dtype=None, aval):
    x = jnp.abs(x) if jnp.iscomplexobj(x) else x      # |z| of complex values, in their precision
    x = jnp.abs(cast(x, aval.dtype))
    ax = _red_dims(x, d)
    if ord == float("inf"):
        return jnp.max(x, axis=ax, keepdims=keepdim)
    if ord == float("-inf"):
        return jnp.min(x, axis=ax, keepdims=keepdim)
    if ord == 0:
        return jnp.sum((x != 0).astype(x.dtype), axis=ax, keepdims=keepdim)
    if ord == 1:
        return jnp.sum(x, axis=ax, keepdims=keepdim)
    if ord == 2:
        return jnp.sqrt(jnp.sum(x * x, axis=ax, keepdims=keepdim))
    return jnp.sum(x ** ord, axis=ax, keepdims=keepdim) ** (1.0 / ord)


@lowering(aten.dist.default, static=True, meta=True)
def dist(x, other, p=2, *, aval):
    """``norm(x - other, p)`` over the broadcast difference, accumulated like vector_norm."""
    acc = acc_dtype(aval.dtype)
    diff = _accumulated(x, aval) - _accumulated(other, aval)
    return cast(vector_norm(diff, p, None, False, aval=jax.ShapeDtypeStruct((), acc)), aval.dtype)


@lowering(aten.cumsum.default, meta=True)
def cumsum(x, d, *, dtype=None, aval):
    # Eager accumulates bfloat16/float16 in float32 and rounds each running value once.
    x = cast(x, acc_dtype(aval.dtype))
    return cast(jnp.cumsum(x, axis=dim(d, x.ndim)) if x.ndim else x, aval.dtype)


@lowering(aten.cumprod.default, meta=True)
def cumprod(x, d, *, dtype=None, aval):
    x = cast(x, acc_dtype(aval.dtype))
    return cast(jnp.cumprod(x, axis=dim(d, x.ndim)) if x.ndim else x, aval.dtype)


def _cum_extreme(x, d, op):
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    d = dim(d, x.ndim)
    n = x.shape[d]
    idx = lax.broadcasted_iota(jnp.int64, x.shape, d)

    def combine(a, b):
        va, ia = a
        vb, ib = b
        if is_float(x.dtype):
            take_b = op(vb, va) | (vb == va) | jnp.isnan(vb)
            take_b = take_b & ~(jnp.isnan(va) & ~jnp.isnan(vb))
        else:
            take_b = op(vb, va) | (vb == va)
        return jnp.where(take_b, vb, va), jnp.where(take_b, ib, ia)

    if n == 0:
        return x, idx
    return lax.associative_scan(combine, (x, idx), axis=d)


@lowering(aten.cummax.default)
def cummax(x, d):
    return _cum_extreme(x, d, jnp.greater)


@lowering(aten.cummin.default)
def cummin(x, d):
    return _cum_extreme(x, d, jnp.less)


@lowering(aten.logcumsumexp.default)
def logcumsumexp(x, d):
    if x.ndim == 0:
        return x
    if jnp.iscomplexobj(x):
        return _complex_logcumsumexp(x, dim(d, x.ndim))
    return lax.cumlogsumexp(x, axis=dim(d, x.ndim))


def _complex_logcumsumexp(x, axis: int):
    """Eager's scan for complex inputs: one element at a time, in complex128 (CPU's accumulation
    type), ``acc = log1p(exp(min - max)) + max`` with min and max ordered by their real parts.
    The imaginary part is the larger term's plus a principal angle, never brought back into
    (-pi, pi], so it depends on the order of the terms: jax's cumlogsumexp takes another
    route and lands 2*pi away from eager in about half the elements."""
    wide = jnp.complex128
    xs = jnp.moveaxis(x, axis, 0).astype(wide)

    def step(acc, v):
        acc = _log_add_exp(v, acc)
        return acc, acc

    init = jnp.full(xs.shape[1:], -jnp.inf, wide)
    _, out = lax.scan(step, init, xs)
    return jnp.moveaxis(out, 0, axis).astype(x.dtype)


def _log_add_exp(x, y):
    """ATen's ``_log_add_exp_helper`` for complex ``x`` (the new term) and ``y`` (the sum so
    far): NaN anywhere gives NaN + NaNj; equal infinite real parts give ``min`` (both -inf) or
    ``log(exp(min) + exp(max))`` (both +inf)."""
    nan = (jnp.isnan(x.real) | jnp.isnan(x.imag) | jnp.isnan(y.real) | jnp.isnan(y.imag))
    x_lower = x.real < y.real
    lo, hi = jnp.where(x_lower, x, y), jnp.where(x_lower, y, x)
    both_inf = ~jnp.isfinite(lo.real) & (lo.real == hi.real)
    usual = jnp.log1p(jnp.exp(lo - hi)) + hi
    inf = jnp.where(lo.real < 0, lo, jnp.log(jnp.exp(lo) + jnp.exp(hi)))
    out = jnp.where(both_inf, inf, usual)
    return jnp.where(nan, jnp.asarray(complex(jnp.nan, jnp.nan), out.dtype), out)


@lowering(aten.hash_tensor.default, meta=True)
def hash_tensor(x, d=(), keepdim=False, *, mode=0, aval):
    """XOR of the 64-bit patterns of the elements (mode 0, ATen's only one): floats widened to
    float64, integers sign-extended to int64, bools 0/1, each bit pattern read as uint64."""
    wide = jnp.float64 if is_float(x.dtype) else jnp.int64
    bits = lax.bitcast_convert_type(cast(x, wide), jnp.uint64)
    axes = _red_dims(bits, d)
    out = lax.reduce(bits, jnp.uint64(0), lax.bitwise_xor, axes) if bits.ndim else bits
    if keepdim:
        out = jnp.reshape(out, aval.shape)
    return out
