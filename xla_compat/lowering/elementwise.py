"""Elementwise ops: arithmetic, math functions, comparisons, logic, activations.

Arithmetic is computed in the result dtype PyTorch reports (``aval``), as TensorIterator does:
inputs are cast to the common dtype first, so weakly typed scalars never widen a result.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .. import _jax
from ._helpers import cast, is_float, is_int, to
from .registry import aten, lowering


def compute_dtype(dtype):
    """Eager's CPU kernels compute bfloat16/float16 math in float32 and round once at the end."""
    return jnp.float32 if dtype in (jnp.bfloat16, jnp.float16) else dtype


def _unary(op, fn, *, float_only=False, wide=False):
    @lowering(op, meta=True)
    def rule(x, *args, aval, **kwargs):
        if wide and aval.dtype in _WIDENED:      # in float64, rounded to float32 once (eager's)
            return cast(cast(fn(cast(x, jnp.float64)), jnp.float32), aval.dtype)
        if float_only or is_float(aval.dtype):
            return cast(fn(cast(x, compute_dtype(aval.dtype))), aval.dtype)
        return fn(x)
    rule.__name__ = str(op).split(".")[1]
    return rule


def _exp2(x):
    """2**x as 2**n * 2**(x - n), n = round(x): exact for integers (XLA's exp2 is exp(x ln 2),
    44 ulps off in float64 at |x| ~ 1000)."""
    if not jnp.issubdtype(x.dtype, jnp.floating):
        return jnp.exp2(x)
    n = jnp.round(x)
    frac = jnp.where(jnp.isinf(x), jnp.zeros((), x.dtype), x - n)
    scale = jnp.clip(jnp.where(jnp.isnan(n), 0, n), -2200, 2200).astype(jnp.int32)
    return jnp.ldexp(jnp.exp(frac * jnp.asarray(np.log(2.0), x.dtype)), scale)


# XLA's float32 versions of these are 6 to 50,000 ulps off in parts of their range (exp2 34 at
# |x| ~ 100, sinh/cosh 13, erfc 32, erfinv 6, lgamma near its roots; eager's are within one):
# float32, float16 and bfloat16 inputs compute in float64 and round to float32 once, as eager's
# float32 kernels (then to the half dtype, as eager's half kernels do from float32).
_WIDENED = (jnp.float32, jnp.float16, jnp.bfloat16)
_WIDE_UNARY = {aten.exp2, aten.sinh, aten.cosh, aten.erfc, aten.erfinv, aten.lgamma}


_FLOAT_UNARY = {
    aten.exp: jnp.exp, aten.exp2: _exp2, aten.expm1: jnp.expm1, aten.log: jnp.log,
    aten.log2: jnp.log2, aten.log10: jnp.log10, aten.log1p: jnp.log1p, aten.sqrt: jnp.sqrt,
    aten.rsqrt: lax.rsqrt, aten.sin: jnp.sin, aten.cos: jnp.cos, aten.tan: jnp.tan,
    aten.asin: jnp.arcsin, aten.acos: jnp.arccos, aten.atan: jnp.arctan, aten.sinh: jnp.sinh,
    aten.cosh: jnp.cosh, aten.tanh: jnp.tanh, aten.asinh: jnp.arcsinh, aten.acosh: jnp.arccosh,
    aten.atanh: jnp.arctanh, aten.erf: jax.scipy.special.erf, aten.erfc: jax.scipy.special.erfc,
    aten.erfinv: jax.scipy.special.erfinv, aten.sigmoid: jax.nn.sigmoid,
    aten.reciprocal: lambda x: 1 / x, aten.lgamma: jax.scipy.special.gammaln,
    aten.digamma: jax.scipy.special.digamma, aten.i0: jax.scipy.special.i0,
    aten.sinc: jnp.sinc, aten.deg2rad: jnp.deg2rad, aten.rad2deg: jnp.rad2deg,
}
for _op, _fn in _FLOAT_UNARY.items():
    _unary(_op.default, _fn, float_only=True, wide=_op in _WIDE_UNARY)


@lowering(aten.neg.default, aten.negative.default)
def neg(x):
    return -x if x.dtype != jnp.bool_ else x


@lowering(aten.abs.default, aten.absolute.default)
def abs_(x):
    return jnp.abs(x) if x.dtype != jnp.bool_ else x


@lowering(aten.sign.default, aten.sgn.default)
def sign(x):
    """Eager's ``(0 < x) - (x < 0)`` for real numbers: NaN and -0.0 give +0.0 (jnp.sign keeps
    both). Complex ``sgn`` is ``x / |x|``."""
    if x.dtype == jnp.bool_ or jnp.issubdtype(x.dtype, jnp.complexfloating):
        return x if x.dtype == jnp.bool_ else jnp.sign(x)
    return (x > 0).astype(x.dtype) - (x < 0).astype(x.dtype)


@lowering(aten.floor.default)
def floor(x):
    return jnp.floor(x) if is_float(x.dtype) else x


@lowering(aten.ceil.default)
def ceil(x):
    return jnp.ceil(x) if is_float(x.dtype) else x


@lowering(aten.trunc.default, aten.fix.default)
def trunc(x):
    return jnp.trunc(x) if is_float(x.dtype) else x


@lowering(aten.frac.default)
def frac(x):
    return x - jnp.trunc(x)


@lowering(aten.round.default)
def round_(x):
    return jnp.round(x) if is_float(x.dtype) else x


@lowering(aten.round.decimals, static=True)
def round_decimals(x, *, decimals=0):
    scale = 10.0 ** decimals
    return jnp.round(x * scale) / scale


# -- binary arithmetic ----------------------------------------------------------------------------

def _alpha_op(x, y, alpha, aval, fn):
    """``fn(x, y * alpha)`` as eager's add/sub kernels do it: operands and alpha converted to the
    result dtype, bfloat16/float16 math in float32 rounded once. A literal alpha of 1 is skipped
    (a runtime scalar multiplies: it may change between calls)."""
    acc = compute_dtype(aval.dtype)
    x, y = to(acc, *to(aval.dtype, x, y))
    if jnp.issubdtype(aval.dtype, jnp.complexfloating) and type(alpha) in (int, float, complex):
        y = _times_literal_alpha(y, complex(alpha))
    elif not (type(alpha) is int and alpha == 1):
        y = y * cast(cast(alpha, aval.dtype), acc)
    return cast(fn(x, y), aval.dtype)


def _times_literal_alpha(y, alpha: complex):
    """``y * alpha`` for a complex ``y`` as eager's kernels multiply, alpha of 1 included: part
    by part, so a non-finite part of ``y`` makes a NaN where eager's does (``0j + (inf + 1j)``
    is ``inf + nanj`` there). XLA folds a product by the constant ``1 + 0j`` away, never
    ``0 * part``."""
    re, im = jnp.real(y), jnp.imag(y)
    return lax.complex(re * alpha.real - im * alpha.imag, im * alpha.real + re * alpha.imag)


@lowering(aten.add.Tensor, aten.add.Scalar, meta=True)
def add(x, y, alpha=1, *, aval):      # (the Scalar overload passes alpha positionally)
    if aval.dtype == jnp.bool_:
        x, y = to(aval.dtype, x, y)
        return x | (y & (cast(alpha, jnp.bool_)))
    return _alpha_op(x, y, alpha, aval, jnp.add)


@lowering(aten.sub.Tensor, aten.sub.Scalar, meta=True)
def sub(x, y, alpha=1, *, aval):
    return _alpha_op(x, y, alpha, aval, jnp.subtract)


@lowering(aten.rsub.Tensor, aten.rsub.Scalar, meta=True)
def rsub(x, y, alpha=1, *, aval):
    return _alpha_op(y, x, alpha, aval, jnp.subtract)


@lowering(aten.mul.Tensor, aten.mul.Scalar, meta=True)
def mul(x, y, *, aval):
    x, y = to(aval.dtype, x, y)
    return x & y if aval.dtype == jnp.bool_ else x * y


def _same_shape(aval, *xs):
    """lax's integer div/rem do not broadcast."""
    return tuple(jnp.broadcast_to(x, aval.shape) for x in xs)


def _floor_div_int(x, y):
    q = lax.div(x, y)
    fix = (lax.rem(x, y) != 0) & ((x < 0) != (y < 0))
    return q - fix.astype(q.dtype)


@lowering(aten.div.Tensor, aten.div.Scalar, meta=True)
def div(x, y, *, aval):
    x, y = to(aval.dtype, x, y)
    return x / y


@lowering(aten.div.Tensor_mode, aten.div.Scalar_mode, meta=True)
def div_mode(x, y, *, rounding_mode=None, aval):
    x, y = _same_shape(aval, *to(aval.dtype, x, y))
    if rounding_mode is None:
        return x / y
    if is_int(aval.dtype):
        return lax.div(x, y) if rounding_mode == "trunc" else _floor_div_int(x, y)
    q = x / y
    if rounding_mode == "trunc":
        return jnp.trunc(q)
    return _python_floor_div(x, y)


def _python_floor_div(x, y):
    # torch.div(..., rounding_mode="floor") on floats follows Python's divmod.
    mod = jnp.fmod(x, y)
    div = (x - mod) / y
    fix = (mod != 0) & ((y < 0) != (mod < 0))
    div = jnp.where(fix, div - 1, div)
    floordiv = jnp.where(div != 0, jnp.floor(div), jnp.copysign(jnp.zeros_like(div), x / y))
    floordiv = jnp.where(div - jnp.floor(div) > 0.5, jnp.floor(div) + 1, floordiv)
    return jnp.where(y == 0, x / y, floordiv)


@lowering(aten.floor_divide.default, aten.floor_divide.Scalar, meta=True)
def floor_divide(x, y, *, aval):
    x, y = _same_shape(aval, *to(aval.dtype, x, y))
    return _floor_div_int(x, y) if is_int(aval.dtype) else _python_floor_div(x, y)


@lowering(aten.remainder.Tensor, aten.remainder.Scalar, aten.remainder.Scalar_Tensor, meta=True)
def remainder(x, y, *, aval):
    x, y = _same_shape(aval, *to(aval.dtype, x, y))
    if is_int(aval.dtype):
        r = lax.rem(x, y)
        return jnp.where((r != 0) & ((r < 0) != (y < 0)), r + y, r)
    r = jnp.fmod(x, y)
    return jnp.where((r != 0) & ((r < 0) != (y < 0)), r + y, r)


@lowering(aten.fmod.Tensor, aten.fmod.Scalar, meta=True)
def fmod(x, y, *, aval):
    x, y = _same_shape(aval, *to(aval.dtype, x, y))
    return lax.rem(x, y) if is_int(aval.dtype) else jnp.fmod(x, y)


@lowering(aten.pow.Tensor_Tensor, meta=True)
def pow_tt(x, y, *, aval):
    x, y = to(aval.dtype, x, y)
    return _pow(x, y)


def _pow(x, y):
    if is_int(x.dtype) or x.dtype == jnp.bool_:
        return _powi(x, cast(y, x.dtype))
    dtype = x.dtype
    if not jnp.issubdtype(dtype, jnp.complexfloating):
        acc = compute_dtype(dtype)
        return cast(jnp.power(cast(x, acc), cast(y, acc)), dtype)
    # complex64 in complex128: XLA's float32 complex power (atan2, log, exp, sin, cos of the
    # parts) lands tens of ulps from the exact power where the exponent is large; eager's
    # (glibc's cpowf) a few
    if _jax.platform() == "tpu":
        # XLA:TPU aborts the process compiling a complex128 power (a failed check in its
        # precision rewriter): complex64 stays in complex64, complex128 takes exp(y * log(x))
        x, y = cast(x, dtype), cast(y, dtype)
        out = jnp.power(x, y) if dtype == jnp.complex64 else jnp.exp(y * jnp.log(x))
    else:
        x, y = cast(x, jnp.complex128), cast(y, jnp.complex128)
        out = jnp.power(x, y)
    return cast(jnp.where(x == 0, _complex_pow_of_zero(x, y), out), dtype)


def _complex_pow_of_zero(x, y):
    """Eager's complex ``0 ** y``: C's ``cexp(y * clog(0))``, with clog(0) = -inf + i*arg(x),
    the product as c10 multiplies (``-inf * 0`` is nan) and cexp's answers where its argument is
    not finite (C99 Annex G): 0 where the real part is -inf (y.real > 0), (inf, nan) where it is
    +inf and nan otherwise. XLA's complex power gives nan for every y but 0 and positive reals."""
    a, b = jnp.real(y), jnp.imag(y)
    theta = jnp.arctan2(jnp.imag(x), jnp.real(x))
    re = -jnp.inf * a - theta * b
    im = -jnp.inf * b + theta * a
    mag = jnp.exp(re)
    finite = jnp.where(im == 0, lax.complex(mag, im), lax.complex(mag * jnp.cos(im),
                                                                    mag * jnp.sin(im)))
    inf_re = jnp.where(jnp.isfinite(im), finite, lax.complex(jnp.inf * jnp.ones_like(re),
                                                             jnp.nan * jnp.ones_like(re)))
    out = jnp.where(re == jnp.inf, inf_re, finite)
    return jnp.where(re == -jnp.inf, jnp.zeros_like(out), out)


def _powi(x, y):
    """Eager's integer power: square-and-multiply with wrap-around; a negative exponent gives
    1 for base 1, +-1 for base -1 and 0 otherwise."""
    if x.dtype == jnp.bool_:
        return x | ~y
    x, y = jnp.broadcast_arrays(x, y)
    bits = np.dtype(x.dtype).itemsize * 8

    def body(_, state):
        result, base, e = state
        result = jnp.where((e & 1) == 1, result * base, result)
        return result, base * base, e >> 1

    one = jnp.ones((), x.dtype)
    result, _, _ = lax.fori_loop(0, bits, body, (jnp.ones_like(x), x, jnp.maximum(y, 0)))
    negative = jnp.where(x == 1, one, jnp.where(x == -1, jnp.where(y % 2 == 0, one, -one),
                                                 jnp.zeros((), x.dtype)))
    return jnp.where(y < 0, negative, result)


@lowering(aten.pow.Tensor_Scalar, meta=True, static=True)
def pow_ts(x, exponent, *, aval):
    # Eager multiplies out small integer powers in the tensor's dtype (x*x*x, 1/(x*x)) and
    # computes other powers in float32 for bfloat16, rounding once.
    from . import opmath
    if exponent == 0:             # eager fills ones (0 ** 0j included) and copies for 1
        return jnp.ones(aval.shape, aval.dtype)
    if exponent == 1:
        return cast(x, aval.dtype)
    if aval.dtype in opmath.LOW:
        return _pow_low(x, exponent, aval.dtype)
    x = cast(x, aval.dtype)
    if isinstance(exponent, int) and not isinstance(exponent, bool):
        if exponent >= 0 or is_float(aval.dtype):
            return lax.integer_pow(x, exponent) if abs(exponent) <= 64 else _pow(
                x, cast(exponent, aval.dtype))
    if exponent == 0.5 and is_float(aval.dtype):
        return cast(jnp.sqrt(cast(x, compute_dtype(aval.dtype))), aval.dtype)
    return _pow(x, cast(exponent, aval.dtype))


def _pow_low(x, exponent, dt):
    """float16/bfloat16 ``x ** exponent`` as eager's kernel computes it: 2, 3, -1, -2, 0.5 and
    -0.5 special-cased (for bfloat16 each operation rounded: x*x*x is two roundings); any other
    exponent rounded to the dtype, then one float32 power, rounded once."""
    from .opmath import round_to
    f32 = jnp.float32

    def r(v):
        # bfloat16 rounds each operation (its kernel works on Vectorized<BFloat16>); float16's
        # multiplies out in float32 and rounds once (checked against eager bit for bit)
        return round_to(v, dt).astype(f32) if dt == jnp.bfloat16 else v
    x = cast(x, dt).astype(f32)
    if exponent == 2:
        return round_to(x * x, dt)
    if exponent == 3:
        return round_to(r(x * x) * x, dt)
    if exponent == -1:
        return round_to(1.0 / x, dt)
    if exponent == -2:
        return round_to(1.0 / r(x * x), dt)
    if exponent == 0.5:
        return round_to(jnp.sqrt(x), dt)
    if exponent == -0.5:
        return round_to(lax.rsqrt(x), dt)
    e = round_to(jnp.asarray(exponent, f32), dt).astype(f32)
    return round_to(jnp.power(x, e), dt)


@lowering(aten.pow.Scalar, meta=True)
def pow_st(x, y, *, aval):
    x, y = to(aval.dtype, x, y)
    return _pow(x, y)


@lowering(aten.float_power.Tensor_Tensor, aten.float_power.Tensor_Scalar,
          aten.float_power.Scalar, meta=True)
def float_power(x, y, *, aval):
    x, y = to(aval.dtype, x, y)
    return jnp.power(x, y)


@lowering(aten.atan2.default, aten.arctan2.default, meta=True)
def atan2(x, y, *, aval):
    x, y = to(aval.dtype, x, y)
    return jnp.arctan2(x, y)


@lowering(aten.hypot.default, meta=True)
def hypot(x, y, *, aval):
    x, y = to(aval.dtype, x, y)
    return jnp.hypot(x, y)


@lowering(aten.copysign.Tensor, aten.copysign.Scalar, meta=True)
def copysign(x, y, *, aval):
    x, y = to(aval.dtype, x, y)
    return jnp.copysign(x, y)


@lowering(aten.maximum.default, aten.max.other, meta=True)
def maximum(x, y, *, aval):
    x, y = to(aval.dtype, x, y)
    return jnp.maximum(x, y)


@lowering(aten.minimum.default, aten.min.other, meta=True)
def minimum(x, y, *, aval):
    x, y = to(aval.dtype, x, y)
    return jnp.minimum(x, y)


@lowering(aten.fmax.default, meta=True)
def fmax(x, y, *, aval):
    x, y = to(aval.dtype, x, y)
    return jnp.fmax(x, y)


@lowering(aten.fmin.default, meta=True)
def fmin(x, y, *, aval):
    x, y = to(aval.dtype, x, y)
    return jnp.fmin(x, y)


@lowering(aten.lerp.Scalar, aten.lerp.Tensor, meta=True)
def lerp(x, end, weight, *, aval):
    x, end, weight = to(compute_dtype(aval.dtype), x, end, weight)
    # torch switches formula at |weight| >= 0.5 for accuracy at the end points.
    return cast(jnp.where(jnp.abs(weight) < 0.5, x + weight * (end - x),
                          end - (end - x) * (1 - weight)), aval.dtype)


@lowering(aten.addcmul.default, meta=True)
def addcmul(x, t1, t2, *, value=1, aval):
    acc = compute_dtype(aval.dtype)
    x, t1, t2 = to(acc, x, t1, t2)
    return cast(x + cast(value, acc) * t1 * t2, aval.dtype)


@lowering(aten.addcdiv.default, meta=True)
def addcdiv(x, t1, t2, *, value=1, aval):
    acc = compute_dtype(aval.dtype)
    x, t1, t2 = to(acc, x, t1, t2)
    return cast(x + cast(value, acc) * t1 / t2, aval.dtype)     # eager: (value * t1) / t2


# -- comparisons and logic -------------------------------------------------------------------------

def _common(x, y):
    dt = jnp.result_type(x, y)
    return cast(x, dt), cast(y, dt)


def _compare(ops, fn):
    @lowering(*ops)
    def rule(x, y):
        return fn(*_common(x, y))
    rule.__name__ = fn.__name__
    return rule


_compare((aten.eq.Tensor, aten.eq.Scalar), jnp.equal)
_compare((aten.ne.Tensor, aten.ne.Scalar), jnp.not_equal)
_compare((aten.lt.Tensor, aten.lt.Scalar, aten.less.Tensor, aten.less.Scalar), jnp.less)
_compare((aten.le.Tensor, aten.le.Scalar), jnp.less_equal)
_compare((aten.gt.Tensor, aten.gt.Scalar, aten.greater.Tensor, aten.greater.Scalar), jnp.greater)
_compare((aten.ge.Tensor, aten.ge.Scalar), jnp.greater_equal)


@lowering(aten.logical_not.default)
def logical_not(x):
    return x == 0


@lowering(aten.logical_and.default)
def logical_and(x, y):
    return (x != 0) & (y != 0)


@lowering(aten.logical_or.default)
def logical_or(x, y):
    return (x != 0) | (y != 0)


@lowering(aten.logical_xor.default)
def logical_xor(x, y):
    return (x != 0) ^ (y != 0)


@lowering(aten.isnan.default)
def isnan(x):
    return jnp.isnan(x) if is_float(x.dtype) else jnp.zeros(x.shape, bool)


@lowering(aten.isinf.default)
def isinf(x):
    return jnp.isinf(x) if is_float(x.dtype) else jnp.zeros(x.shape, bool)


@lowering(aten.isfinite.default)
def isfinite(x):
    return jnp.isfinite(x) if is_float(x.dtype) else jnp.ones(x.shape, bool)


@lowering(aten.isposinf.default)
def isposinf(x):
    return jnp.isposinf(x) if is_float(x.dtype) else jnp.zeros(x.shape, bool)


@lowering(aten.isneginf.default)
def isneginf(x):
    return jnp.isneginf(x) if is_float(x.dtype) else jnp.zeros(x.shape, bool)


@lowering(aten.signbit.default)
def signbit(x):
    return jnp.signbit(x) if x.dtype != jnp.bool_ else jnp.zeros(x.shape, bool)


@lowering(aten.nan_to_num.default, static=True, meta=True)
def nan_to_num(x, nan=None, posinf=None, neginf=None, *, aval):
    if not is_float(x.dtype):
        return x
    if jnp.iscomplexobj(x):        # eager replaces in the real and imaginary parts alike
        parts = (nan_to_num(p, nan, posinf, neginf, aval=aval) for p in (x.real, x.imag))
        return jax.lax.complex(*parts)
    info = jnp.finfo(x.dtype)
    # Every mask is taken on x itself (jnp.nan_to_num replaces one after another, so with
    # posinf=-inf and neginf=inf a +inf became -inf and then +inf again).
    nan = jnp.asarray(0.0 if nan is None else nan, x.dtype)
    posinf = jnp.asarray(info.max if posinf is None else posinf, x.dtype)
    neginf = jnp.asarray(info.min if neginf is None else neginf, x.dtype)
    return jnp.where(jnp.isnan(x), nan, jnp.where(jnp.isposinf(x), posinf,
                                                  jnp.where(jnp.isneginf(x), neginf, x)))


@lowering(aten.where.self, aten.where.ScalarSelf, aten.where.ScalarOther, aten.where.Scalar,
          meta=True)
def where(cond, x, y, *, aval):
    x, y = to(aval.dtype, x, y)
    return jnp.where(cond, x, y)


@lowering(aten.clamp.default, aten.clamp.Tensor, meta=True)
def clamp(x, min=None, max=None, *, aval):
    x = cast(x, aval.dtype)
    if min is not None:
        x = jnp.maximum(x, cast(min, aval.dtype)) if not is_float(aval.dtype) else jnp.where(
            jnp.isnan(x), x, jnp.maximum(x, cast(min, aval.dtype)))
    if max is not None:
        x = jnp.minimum(x, cast(max, aval.dtype)) if not is_float(aval.dtype) else jnp.where(
            jnp.isnan(x), x, jnp.minimum(x, cast(max, aval.dtype)))
    return x


@lowering(aten.clamp_min.default, aten.clamp_min.Tensor, meta=True)
def clamp_min(x, min, *, aval):
    return clamp(x, min, None, aval=aval)


@lowering(aten.clamp_max.default, aten.clamp_max.Tensor, meta=True)
def clamp_max(x, max, *, aval):
    return clamp(x, None, max, aval=aval)


@lowering(aten.masked_fill.Scalar, aten.masked_fill.Tensor, meta=True)
def masked_fill(x, mask, value, *, aval):
    return jnp.where(mask, cast(value, aval.dtype), cast(x, aval.dtype))


# -- copies and casts ------------------------------------------------------------------------------

@lowering(aten.clone.default, aten.contiguous.default, aten.lift_fresh_copy.default,
          aten.alias_copy.default, aten.detach_copy.default, aten.positive.default,
          aten.resolve_conj.default, aten.resolve_neg.default)
def identity(x, *, memory_format=None):
    return x


# Lazy tensors never carry the conj/neg bits: `_conj` and `_neg_view` are traced as the physical
# ops (tracer), the functional path's `*_copy` twins land here, so resolve_* above are copies.
@lowering(aten.conj_physical.default, aten._conj_physical.default, aten._conj_copy.default)
def conj_physical(x):
    return jnp.conj(x) if jnp.iscomplexobj(x) else x


@lowering(aten._neg_view_copy.default)
def neg_view_copy(x):
    return -x


@lowering(aten._to_copy.default, meta=True)
def to_copy(x, *, dtype=None, aval, **_):
    return cast(x, aval.dtype)


@lowering(aten.copy.default, meta=True)
def copy(x, src, non_blocking=False, *, aval):
    return jnp.broadcast_to(cast(src, aval.dtype), aval.shape)


@lowering(aten.fill.Scalar, aten.fill.Tensor, meta=True)
def fill(x, value, *, aval):
    return jnp.full(aval.shape, cast(value, aval.dtype), aval.dtype)


@lowering(aten.zero.default, meta=True)
def zero(x, *, aval):
    return jnp.zeros(aval.shape, aval.dtype)


# -- activations and their backward ---------------------------------------------------------------

@lowering(aten.relu.default)
def relu(x):
    """-0.0 stays -0.0 and NaN stays NaN, as in eager (jnp.maximum(-0.0, 0) is +0.0)."""
    return jnp.where(x < 0, jnp.zeros((), x.dtype), x) if x.dtype != jnp.bool_ else x


@lowering(aten.threshold.default, meta=True)
def threshold(x, threshold, value, *, aval):
    x = cast(x, aval.dtype)
    return jnp.where(x <= cast(threshold, aval.dtype), cast(value, aval.dtype), x)


@lowering(aten.threshold_backward.default, meta=True)
def threshold_backward(grad, x, threshold, *, aval):
    return jnp.where(x <= threshold, jnp.zeros((), aval.dtype), cast(grad, aval.dtype))


@lowering(aten.gelu.default, static=True)
def gelu(x, *, approximate="none"):
    return jax.nn.gelu(x, approximate=approximate == "tanh")


@lowering(aten.gelu_backward.default, static=True)
def gelu_backward(grad, x, *, approximate="none"):
    _, vjp = jax.vjp(lambda v: jax.nn.gelu(v, approximate=approximate == "tanh"), x)
    return vjp(grad)[0]


@lowering(aten.sigmoid_backward.default)
def sigmoid_backward(grad, y):
    return grad * (1 - y) * y


@lowering(aten.tanh_backward.default)
def tanh_backward(grad, y):
    return grad * (1 - y * y)


@lowering(aten.silu.default)
def silu(x):
    return x * jax.nn.sigmoid(x)


@lowering(aten.silu_backward.default)
def silu_backward(grad, x):
    s = jax.nn.sigmoid(x)
    return grad * s * (1 + x * (1 - s))


@lowering(aten.leaky_relu.default, meta=True)
def leaky_relu(x, negative_slope=0.01, *, aval):
    return jnp.where(x > 0, x, x * cast(negative_slope, aval.dtype))


@lowering(aten.leaky_relu_backward.default, meta=True)
def leaky_relu_backward(grad, x, negative_slope, self_is_result, *, aval):
    return jnp.where(x > 0, grad, grad * cast(negative_slope, aval.dtype))


@lowering(aten.hardtanh.default, meta=True)
def hardtanh(x, min_val=-1, max_val=1, *, aval):
    return jnp.clip(x, cast(min_val, aval.dtype), cast(max_val, aval.dtype))


@lowering(aten.hardtanh_backward.default, meta=True)
def hardtanh_backward(grad, x, min_val, max_val, *, aval):
    return jnp.where((x <= min_val) | (x >= max_val), jnp.zeros((), aval.dtype), grad)


@lowering(aten.softplus.default, meta=True)
def softplus(x, beta=1, threshold=20, *, aval):
    bx = x * cast(beta, aval.dtype)
    return jnp.where(bx > threshold, x, jnp.log1p(jnp.exp(bx)) / cast(beta, aval.dtype))


@lowering(aten.elu.default, meta=True)
def elu(x, alpha=1, scale=1, input_scale=1, *, aval):
    a, s, i = to(aval.dtype, alpha, scale, input_scale)
    # expm1, as eager: exp(x) - 1 is 0 for |x| below the dtype's epsilon (elu(-1e-8) gave 0)
    return jnp.where(x > 0, x * s, jnp.expm1(x * i) * (a * s))


@lowering(aten.logit.default, meta=True, static=True)
def logit(x, eps=None, *, aval):
    x = cast(x, aval.dtype)       # integers in the float result dtype (1 - x wrapped for uint8)
    if eps is not None:
        x = jnp.clip(x, eps, 1 - eps)
    return jnp.log(x / (1 - x))


@lowering(aten.xlogy.Tensor, aten.xlogy.Scalar_Self, aten.xlogy.Scalar_Other, meta=True)
def xlogy(x, y, *, aval):
    from . import opmath
    dt = aval.dtype
    if dt in opmath.LOW:
        # eager's float16/bfloat16 kernel rounds log(y) to the dtype before multiplying
        x, y = to(jnp.float32, x, y)
        log_y = opmath.round_to(jnp.log(y), dt).astype(jnp.float32)
        out = jnp.where(jnp.isnan(y), jnp.nan, jnp.where(x == 0, 0.0, x * log_y))
        return opmath.round_to(out, dt)
    x, y = to(dt, x, y)
    return jax.scipy.special.xlogy(x, y)

