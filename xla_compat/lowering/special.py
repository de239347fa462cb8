"""Special functions (``torch.special``, gamma family, Bessel, orthogonal polynomials).

Each rule follows the algorithm CPU eager runs (ATen/native/Math.h), in the result dtype, so
edge cases (poles, negative integers, infinities) give eager's values; where eager accumulates
in double (zeta, polygamma) so does the rule.
"""
from __future__ import annotations

import math

import jax.numpy as jnp
import jax.scipy.special as jsp
from jax import lax

from ..lazy import tracer
from . import _special_tables as tab
from ._helpers import cast, to
from .opmath import store
from .registry import aten, lowering


def _horner(coeffs, z):
    acc = jnp.zeros_like(z)
    for c in coeffs:
        acc = acc * z + jnp.asarray(c, z.dtype)
    return acc


def _clenshaw(coeffs, y):
    """Cephes ``chbevl`` as Math.h spells it: 0.5 * (b0 - b2)."""
    p = q = jnp.zeros_like(y)
    a = jnp.full_like(y, coeffs[0])
    for c in coeffs[1:]:
        p, q = q, a
        a = y * q - p + jnp.asarray(c, y.dtype)
    return 0.5 * (a - p)


def _c(v, like):
    return jnp.asarray(v, like.dtype)


def _opmath(dtype):
    """Eager's CPU kernels compute bfloat16/float16 in float32 and round the result once."""
    return jnp.float32 if dtype in (jnp.bfloat16, jnp.float16) else dtype


def _float_unary(*ops):
    """Register ``fn(x)`` computed in the result dtype (ints promote to the default float)."""
    def register(fn):
        def rule(x, *, aval):
            return cast(fn(cast(x, _opmath(aval.dtype))), aval.dtype)
        rule.__name__ = fn.__name__.lstrip("_")
        lowering(*ops, meta=True)(rule)
        return fn
    return register


# -- Bessel functions of the first and second kind -------------------------------------------------

_SQ2OPI = 0.797884560802865355879892119868763737  # sqrt(2/pi)
_PIO4, _3PIO4 = 0.785398163397448309615660845819875721, 2.356194490192344928846982537459627163
_TWOOPI = 0.636619772367581343075535053490057448


def _asymptotic(t, x, z, phase, sin_first):
    pp, pq = _horner(t["PP"], z), _horner(t["PQ"], z)
    qp, qq = _horner(t["QP"], z), _horner(t["QQ"], z)
    a, b = (jnp.sin, jnp.cos) if sin_first else (jnp.cos, jnp.sin)
    sign = 1 if sin_first else -1
    return (pp / pq * a(x - _c(phase, x)) + sign * _c(5.0, x) / x * (qp / qq) * b(x - _c(phase, x))
            ) * _c(_SQ2OPI, x) / jnp.sqrt(x)


def _j0(x):
    x = jnp.abs(x)
    t = tab.BESSEL_J0
    xs = jnp.where(x <= 5, x, 1)
    xx = xs * xs
    small = (xx - _c(5.78318596294678452118e+00, x)) * (xx - _c(3.04712623436620863991e+01, x)) \
        * _horner(t["RP"], xx) / _horner(t["RQ"], xx)
    small = jnp.where(x < 1e-5, 1 - x * x / 4, small)
    xl = jnp.where(x > 5, x, 10)
    large = _asymptotic(t, xl, _c(25.0, x) / (xl * xl), _PIO4, False)
    return jnp.where(x <= 5, small, jnp.where(jnp.isnan(x), x, large))


def _j1(x):
    neg = x < 0
    x = jnp.abs(x)
    t = tab.BESSEL_J1
    xs = jnp.where(x <= 5, x, 1)
    xx = xs * xs
    small = _horner(t["RP"], xx) / _horner(t["RQ"], xx) * xs \
        * (xx - _c(1.46819706421238932572e+01, x)) * (xx - _c(4.92184563216946036703e+01, x))
    xl = jnp.where(x > 5, x, 10)
    w = _c(5.0, x) / xl
    large = _asymptotic(t, xl, w * w, _3PIO4, False)
    out = jnp.where(x <= 5, small, jnp.where(jnp.isnan(x), x, large))
    return jnp.where(neg, -out, out)


def _y0(x):
    t = tab.BESSEL_Y0
    xs = jnp.where((x <= 5) & (x > 0), x, 1)
    xx = xs * xs
    small = _horner(t["YP"], xx) / _horner(t["YQ"], xx) + _c(_TWOOPI, x) * jnp.log(xs) * _j0(xs)
    small = jnp.where(x == 0, -jnp.inf, jnp.where(x < 0, jnp.nan, small))
    xl = jnp.where(x > 5, x, 10)
    large = _asymptotic(t, xl, _c(25.0, x) / (xl * xl), _PIO4, True)
    return jnp.where(x <= 5, small, jnp.where(jnp.isnan(x), x, large))


def _y1(x):
    t = tab.BESSEL_Y1
    xs = jnp.where((x <= 5) & (x > 0), x, 1)
    xx = xs * xs
    small = xs * (_horner(t["YP"], xx) / _horner(t["YQ"], xx)) \
        + _c(_TWOOPI, x) * (_j1(xs) * jnp.log(xs) - 1 / xs)
    small = jnp.where(x == 0, -jnp.inf, jnp.where(x < 0, jnp.nan, small))
    xl = jnp.where(x > 5, x, 10)
    w = _c(5.0, x) / xl
    large = _asymptotic(t, xl, w * w, _3PIO4, True)
    return jnp.where(x <= 5, small, jnp.where(jnp.isnan(x), x, large))


_float_unary(aten.special_bessel_j0)(_j0)
_float_unary(aten.special_bessel_j1)(_j1)
_float_unary(aten.special_bessel_y0)(_y0)
_float_unary(aten.special_bessel_y1)(_y1)


@_float_unary(aten.special_spherical_bessel_j0)
def spherical_bessel_j0(x):
    x2 = x * x
    series = 1 + x2 * (-1 / 6 + x2 * (1 / 120 + x2 * (-1 / 5040 + x2 * (
        1 / 362880 + x2 * (-1 / 39916800 + x2 * (1 / 6227020800))))))
    big = jnp.sin(x) / jnp.where(jnp.abs(x) < 0.5, 1, x)
    return jnp.where(jnp.isinf(x), 0, jnp.where(jnp.abs(x) < 0.5, series.astype(x.dtype), big))


# -- modified Bessel functions ---------------------------------------------------------------------

def _i0(x):
    ax = jnp.abs(x)
    t = tab.MODIFIED_BESSEL_I0
    a = _clenshaw(t["A"], ax / 2 - 2)
    b = _clenshaw(t["B"], _c(32.0, x) / jnp.where(ax > 8, ax, 16) - 2)
    return jnp.where(ax <= 8, jnp.exp(ax) * a, jnp.exp(ax) * b / jnp.sqrt(ax))


def _i1(x):
    ax = jnp.abs(x)
    t = tab.MODIFIED_BESSEL_I1
    a = _clenshaw(t["A"], ax / 2 - 2) * ax * jnp.exp(ax)
    b = jnp.exp(ax) * _clenshaw(t["B"], _c(32.0, x) / jnp.where(ax > 8, ax, 16) - 2) / jnp.sqrt(ax)
    out = jnp.where(ax <= 8, a, b)
    return jnp.where(x < 0, -out, out)


def _k_small(x, table, order):
    xs = jnp.where((x <= 2) & (x > 0), x, 1)
    a = _clenshaw(table["A"], xs * xs - 2)
    if order == 0:
        return a - jnp.log(0.5 * xs) * _i0(xs), xs
    return jnp.log(0.5 * xs) * _i1(xs) + a / xs, xs


def _k_large(x, table):
    xl = jnp.where(x > 2, x, 4)
    return _clenshaw(table["B"], _c(8.0, x) / xl - 2) / jnp.sqrt(xl), xl


def _k(x, order, scaled):
    table = tab.MODIFIED_BESSEL_K0 if order == 0 else tab.MODIFIED_BESSEL_K1
    small, xs = _k_small(x, table, order)
    large, xl = _k_large(x, table)
    if scaled:
        small = small * jnp.exp(xs)
    else:
        large = jnp.exp(-xl) * large
    out = jnp.where(x <= 2, small, large)
    out = jnp.where(x == 0, jnp.inf, jnp.where(x < 0, jnp.nan, out))
    return jnp.where(jnp.isnan(x), x, out)


_float_unary(aten.special_modified_bessel_i0)(_i0)
_float_unary(aten.special_modified_bessel_i1)(_i1)


@_float_unary(aten.special_modified_bessel_k0)
def modified_bessel_k0(x):
    return _k(x, 0, False)


@_float_unary(aten.special_modified_bessel_k1)
def modified_bessel_k1(x):
    return _k(x, 1, False)


@_float_unary(aten.special_scaled_modified_bessel_k0)
def scaled_modified_bessel_k0(x):
    return _k(x, 0, True)


@_float_unary(aten.special_scaled_modified_bessel_k1)
def scaled_modified_bessel_k1(x):
    return _k(x, 1, True)


@_float_unary(aten.special_i0e)
def i0e(x):
    return jsp.i0e(x)


@_float_unary(aten.special_i1)
def i1(x):
    return jsp.i1(x)


@_float_unary(aten.special_i1e)
def i1e(x):
    return jsp.i1e(x)


# -- Airy ------------------------------------------------------------------------------------------

@_float_unary(aten.special_airy_ai)
def airy_ai(x):
    t = tab.AIRY_AI
    # x < -2.09: oscillating asymptotic expansion.
    xn = jnp.where(x < -2.09, x, -4)
    zn = 1 / (-2 * xn * jnp.sqrt(-xn) / 3)
    zz = zn * zn
    phase = -2 * xn * jnp.sqrt(-xn) / 3 + _c(0.25 * math.pi, x)
    neg = _c(5.64189583547756286948e-01, x) / jnp.sqrt(jnp.sqrt(-xn)) * (
        jnp.sin(phase) * (1 + zz * _horner(t["AFN"], zz) / _horner(t["AFD"], zz))
        - jnp.cos(phase) * (zn * _horner(t["AGN"], zz) / _horner(t["AGD"], zz)))
    # x >= 2.09: decaying asymptotic expansion.
    xp = jnp.where(x >= 2.09, x, 4)
    zeta = 2 * xp * jnp.sqrt(xp) / 3
    pos = _c(5.64189583547756286948e-01, x) * (_horner(t["AN"], 1 / zeta) / _horner(t["AD"], 1 / zeta)) \
        / (2 * jnp.sqrt(jnp.sqrt(xp)) * jnp.exp(zeta))
    # otherwise: the Maclaurin series, summed until its terms drop below eps (as eager loops).
    xm = jnp.where((x >= -2.09) & (x < 2.09), x, 0)
    eps = jnp.finfo(x.dtype).eps
    z = xm * xm * xm

    def cond(c):
        return jnp.any(c[-1])

    def body(c):
        f, g, k, m, n, live = c
        m2 = m * z
        k2 = k + 1
        m2 = m2 / k2
        n2 = n * z
        k2 = k2 + 1
        n2 = n2 / k2
        m2 = m2 / k2
        f2 = f + m2
        k2 = k2 + 1
        n2 = n2 / k2
        g2 = g + n2
        keep = live
        still = keep & (jnp.abs(m2 / f2) > eps)
        sel = lambda new, old: jnp.where(keep, new, old)  # noqa: E731
        return sel(f2, f), sel(g2, g), sel(k2, k), sel(m2, m), sel(n2, n), still

    one = jnp.ones_like(xm)
    f, g, *_ = lax.while_loop(cond, body, (one, xm, one, one, xm, jnp.ones(xm.shape, bool)))
    series = _c(0.355028053887817239260, x) * f - _c(0.258819403792806798405, x) * g
    out = jnp.where(x < -2.09, neg, jnp.where(x >= 2.09, pos, series))
    out = jnp.where(x > 103.892, 0, out)
    return jnp.where(jnp.isinf(x) | jnp.isnan(x), jnp.nan, out)


# -- normal distribution, error functions ----------------------------------------------------------

@_float_unary(aten.special_ndtr)
def ndtr(x):
    return jsp.ndtr(x)


@_float_unary(aten.special_ndtri)
def ndtri(x):
    return jsp.ndtri(x)


def _erfcx64(x):
    """erfcx of a float64 array. jax's float32 erfcx returns 0 near x = 9.2 and its float64 one
    returns 0 on [26.54, 26.64] (an intermediate below float64's normal range, flushed); above
    x = 20 the asymptotic series 1/(x sqrt(pi)) * sum_k (-1)^k (2k-1)!! / (2x^2)^k, ten terms,
    is exact to double precision (its first omitted term is below 1e-17)."""
    big = x > 20
    xb = jnp.where(big, x, 20.0)
    z = 1 / (2 * xb * xb)
    total, term = jnp.ones_like(xb), jnp.ones_like(xb)
    for k in range(1, 11):
        term = term * (-(2 * k - 1)) * z
        total = total + term
    return jnp.where(big, total / (xb * math.sqrt(math.pi)), jsp.erfcx(x))


@_float_unary(aten.special_erfcx)
def erfcx(x):
    return _erfcx64(x.astype(jnp.float64)).astype(x.dtype)


@_float_unary(aten.special_log_ndtr)
def log_ndtr(x):
    xd = x.astype(jnp.float64)
    t = xd * math.sqrt(0.5)
    lo = jnp.log(_erfcx64(-t) / 2) - t * t
    return jnp.where(xd < -1, lo, jnp.log1p(-jsp.erfc(t) / 2)).astype(x.dtype)


@_float_unary(aten.special_entr)
def entr(x):
    safe = jnp.where(x > 0, x, 1)
    return jnp.where(x > 0, -safe * jnp.log(safe),
                     jnp.where(x == 0, 0, jnp.where(x < 0, -jnp.inf, x)))


@lowering(aten.special_xlog1py.default, aten.special_xlog1py.self_scalar,
          aten.special_xlog1py.other_scalar, meta=True)
def xlog1py(x, y, *, aval):
    x, y = to(_opmath(aval.dtype), x, y)
    out = jnp.where(jnp.isnan(y), y, jnp.where(x == 0, jnp.zeros((), x.dtype), x * jnp.log1p(y)))
    return cast(out, aval.dtype)


# -- gamma family ----------------------------------------------------------------------------------

def _zeta(x, q):
    """Hurwitz zeta as Math.h's ``zeta`` (Euler-Maclaurin), with its domain rules."""
    # jax's zeta gives nan for q <= 0, where eager sums its series from q (integer x only), and
    # for x above ~1e20 or infinite, where eager's series stops at its first term: q**-x is 1
    # for q = 1, inf below (nan for q > 1 and x = inf, as eager's Euler-Maclaurin step gives).
    series = (q <= 0) & (q != jnp.floor(q)) & (x == jnp.floor(x)) & (x > 1) & jnp.isfinite(q)
    series = series | ((x > 1e10) & (q > 0) & jnp.isfinite(q))
    out = jsp.zeta(x, q)
    out = jnp.where(series, _zeta_series(jnp.where(series, x, 2), jnp.where(series, q, -0.5)), out)
    bad_q = (q <= 0) & (q == jnp.floor(q))
    out = jnp.where(bad_q, jnp.inf, jnp.where((q <= 0) & (x != jnp.floor(x)), jnp.nan, out))
    return jnp.where(x == 1, jnp.inf, jnp.where(x < 1, jnp.nan, out))


def _zeta_series(x, q):
    """Math.h's zeta loop, for q <= 0 with integer x, where jax returns nan."""
    machep = 1.11022302462515654042e-16
    s = jnp.power(q, -x)
    a, b = q, jnp.zeros_like(q)

    def cond(c):
        return jnp.any(~c[4])

    def body(c):
        i, a, b, s, done, conv = c
        a2 = a + 1
        b2 = jnp.power(a2, -x)
        s2 = s + b2
        live = ~done
        now = live & (-machep * s2 < b2) & (b2 < machep * s2)
        a, b, s = jnp.where(live, a2, a), jnp.where(live, b2, b), jnp.where(live, s2, s)
        return i + 1, a, b, s, done | now | (live & (i + 1 >= 9) & (a2 > 9)), conv | now

    none = jnp.zeros(q.shape, bool)
    _, a, b, s, _, conv = lax.while_loop(cond, body, (0, a, b, s, none, none))
    first = s
    w = a
    s = s + b * w / (x - 1) - 0.5 * b
    coeffs = (12.0, -720.0, 30240.0, -1209600.0, 47900160.0, -1.8924375803183791606e9,
              7.47242496e10, -2.950130727918164224e12, 1.1646782814350067249e14,
              -4.5979787224074726105e15, 1.8152105401943546773e17, -7.1661652561756670113e18)
    a, k = jnp.ones_like(x), jnp.zeros_like(x)
    done = jnp.zeros(s.shape, bool)
    for c in coeffs:
        a = a * (x + k)
        b = b / w
        t = a * b / c
        s = jnp.where(done, s, s + t)
        done = done | (jnp.abs(t / s) < machep)
        k = k + 1
        a = a * (x + k)
        b = b / w
        k = k + 1
    return jnp.where(conv, first, s)


@lowering(aten.special_zeta.default, aten.special_zeta.self_scalar,
          aten.special_zeta.other_scalar, meta=True)
def zeta(x, q, *, aval):
    x, q = to(jnp.float64, x, q)
    x, q = jnp.broadcast_arrays(x, q)
    return cast(_zeta(x, q), aval.dtype)


def _trigamma(x):
    neg = x < 0.5
    s = jnp.sin(_c(math.pi, x) * x)
    result = jnp.where(neg, -(_c(math.pi * math.pi, x)) / (s * s), 0)
    x = jnp.where(neg, 1 - x, x)
    for _ in range(6):
        result = result + 1 / (x * x)
        x = x + 1
    ixx = 1 / (x * x)
    result = result + (1 + 1 / (2 * x) + ixx * (_c(1 / 6, x) - ixx * (_c(1 / 30, x) - ixx * _c(1 / 42, x)))) / x
    return jnp.where(neg, -result, result)


def _digamma(x):
    """Math.h ``calc_digamma``: +-inf at +-0, nan at negative integers, reflection below 0."""
    is_int = x == jnp.trunc(x)
    xr = jnp.where(x < 0, 1 - x, x)
    r = x - jnp.trunc(x)  # modf's fractional part
    refl = (math.pi / jnp.tan(math.pi * r.astype(jnp.float64))).astype(x.dtype)
    out = jsp.digamma(xr)
    out = jnp.where(x < 0, out - refl, out)
    out = jnp.where((x < 0) & is_int, jnp.nan, out)
    return jnp.where(x == 0, jnp.copysign(jnp.inf, -x), out)


@lowering(aten.polygamma.default, aten.special_polygamma.default, meta=True)
def polygamma(n, x, *, aval):
    x = cast(x, _opmath(aval.dtype))
    if n == 0:
        return cast(_digamma(x), aval.dtype)
    if n == 1:
        return cast(_trigamma(x), aval.dtype)
    sign = 1.0 if n % 2 else -1.0
    z = _zeta(jnp.full(x.shape, n + 1, jnp.float64), x.astype(jnp.float64)).astype(x.dtype)
    return cast(_c(sign, x) * jnp.exp(lax.lgamma(_c(n + 1.0, x))) * z, aval.dtype)


_float_unary(aten.digamma, aten.special_digamma, aten.special_psi)(_digamma)


@lowering(aten.mvlgamma.default, aten.special_multigammaln.default, meta=True)
def mvlgamma(x, p, *, aval):
    # Eager's composite in the result's dtype: x + (arange(p) - (p - 1)) / 2, lgamma_, sum(-1),
    # then add_ of the constant (a Scalar, converted to that dtype); in float16/bfloat16 each
    # of those steps rounds (opmath's _OWN_ROUNDING: this rule sees the node's own dtype).
    dtype, op = aval.dtype, _opmath(aval.dtype)
    j = jnp.arange(p, dtype=op) / 2
    terms = cast(store(lax.lgamma(cast(store(cast(x, op)[..., None] - j, dtype), op)), dtype), op)
    total = cast(store(jnp.sum(terms, axis=-1), dtype), op)
    const = cast(store(_c(p * (p - 1) / 4 * math.log(math.pi), total), dtype), op)
    return cast(total + const, dtype)


def _igamma_edges(a, x, value, upper):
    nan = jnp.nan
    one, zero = (0.0, 1.0) if upper else (1.0, 0.0)
    out = value
    out = jnp.where(x == jnp.inf, jnp.where(a == jnp.inf, nan, one), out)
    out = jnp.where((a == jnp.inf) & (x != jnp.inf), zero, out)
    out = jnp.where(x == 0, jnp.where(a == 0, nan, zero), out)
    out = jnp.where((a == 0) & (x > 0), one, out)
    return jnp.where((a < 0) | (x < 0) | jnp.isnan(a) | jnp.isnan(x), nan, out)


@lowering(aten.igamma.default, aten.special_gammainc.default, meta=True)
def igamma(a, x, *, aval):
    a, x = jnp.broadcast_arrays(*to(_opmath(aval.dtype), a, x))
    value = jsp.gammainc(jnp.where(a > 0, a, 1), jnp.where(x > 0, x, 1))
    return cast(_igamma_edges(a, x, value, False), aval.dtype)


@lowering(aten.igammac.default, aten.special_gammaincc.default, meta=True)
def igammac(a, x, *, aval):
    a, x = jnp.broadcast_arrays(*to(_opmath(aval.dtype), a, x))
    value = jsp.gammaincc(jnp.where(a > 0, a, 1), jnp.where(x > 0, x, 1))
    return cast(_igamma_edges(a, x, value, True), aval.dtype)


# -- orthogonal polynomials ------------------------------------------------------------------------

def _poly_args(x, n, dtype):
    x, n = jnp.broadcast_arrays(*to(_opmath(dtype), x, n))
    if jnp.issubdtype(n.dtype, jnp.floating):
        n = jnp.where(jnp.isfinite(n), n, -1)   # eager's int cast of inf/nan is unspecified
    return x, n.astype(jnp.int64)


def _recur(x, n, q0, step):
    """Three-term recurrence: p=1, q=q0; for i in 1..n-1: p, q = q, step(i, p, q). Returns q."""
    nmax = jnp.max(n) if n.size else jnp.int64(0)

    def cond(c):
        return c[0] < nmax

    def body(c):
        i, p, q = c
        r = step(i.astype(x.dtype), p, q)
        live = i < n
        return i + 1, jnp.where(live, q, p), jnp.where(live, r, q)

    _, _, q = lax.while_loop(cond, body, (jnp.int64(1), jnp.ones_like(x), q0))
    return q


def _parity(n, even, odd):
    return jnp.where(n % 2 == 0, even, odd)


def _chebyshev(kind, y, n, trig_over):
    """T/U/V/W of y with Math.h's special values at |y| == 1 and its trig form for large n."""
    nf = n.astype(y.dtype)
    q0 = {"t": y, "u": y + y, "v": y + y - 1, "w": y + y + 1}[kind]
    rec = _recur(y, n, q0, lambda i, p, q: (y + y) * q - p)
    rec = jnp.where(n == 0, 1, jnp.where(n == 1, q0, rec))
    inside = (n > trig_over) & (jnp.abs(y) < 1)
    th = jnp.arccos(jnp.where(inside, y, 0))
    two_n1 = 2 * nf + 1
    if kind == "t":
        trig = jnp.cos(nf * th)
        edge = jnp.where((y > 0) | (n % 2 == 0), 1, -1)
    elif kind == "u":
        s = jnp.sin(th)
        trig = jnp.where(s != 0, jnp.sin((nf + 1) * th) / s, (nf + 1) * jnp.cos((nf + 1) * th) / y)
        edge = jnp.where((y > 0) | (n % 2 == 0), nf + 1, -(nf + 1))
    elif kind == "v":
        trig = jnp.where(jnp.sin(th / 2) != 1, jnp.cos((nf + 0.5) * th) / jnp.cos(th / 2),
                         _parity(n, two_n1, -two_n1))
        edge = jnp.where(y > 0, 1, _parity(n, two_n1, -two_n1))
    else:
        trig = jnp.where(jnp.cos(th / 2) != 1, jnp.sin((nf + 0.5) * th) / jnp.sin(th / 2),
                         jnp.where(y > 0, two_n1, _parity(n, 1, -1)))
        edge = jnp.where(y > 0, two_n1, _parity(n, 1, -1))
    out = jnp.where(inside, trig, rec)
    out = jnp.where(jnp.abs(y) == 1, edge, out)
    return jnp.where(n < 0, 0, out).astype(y.dtype)


def _register_chebyshev(kind, trig_over, shifted_trig_over):
    plain = getattr(aten, f"special_chebyshev_polynomial_{kind}")
    shifted = getattr(aten, f"special_shifted_chebyshev_polynomial_{kind}")

    @lowering(plain.default, plain.x_scalar, plain.n_scalar, meta=True)
    def chebyshev(x, n, *, aval):
        x, n = _poly_args(x, n, aval.dtype)
        return _chebyshev(kind, x, n, trig_over)

    @lowering(shifted.default, shifted.x_scalar, shifted.n_scalar, meta=True)
    def shifted_chebyshev(x, n, *, aval):
        x, n = _poly_args(x, n, aval.dtype)
        return _chebyshev(kind, x + x - 1, n, shifted_trig_over)

    chebyshev.__name__ = f"chebyshev_polynomial_{kind}"
    shifted_chebyshev.__name__ = f"shifted_chebyshev_polynomial_{kind}"


for _kind, _over, _shifted_over in (("t", 6, 6), ("u", 8, 6), ("v", 8, 6), ("w", 8, 4)):
    _register_chebyshev(_kind, _over, _shifted_over)


def _finish(n, out, n1_value, x):
    out = jnp.where(n == 0, 1, jnp.where(n == 1, n1_value, out))
    return jnp.where(n < 0, 0, out).astype(x.dtype)


@lowering(aten.special_hermite_polynomial_h.default, aten.special_hermite_polynomial_h.x_scalar,
          aten.special_hermite_polynomial_h.n_scalar, meta=True)
def hermite_polynomial_h(x, n, *, aval):
    x, n = _poly_args(x, n, aval.dtype)
    limit = 128 if x.dtype == jnp.float32 else 512 if x.dtype == jnp.float64 else 1024
    out = _recur(x, jnp.minimum(n, limit + 1), x + x, lambda i, p, q: (x + x) * q - (2 * i) * p)
    return _finish(n, jnp.where(n > limit, jnp.nan, out), x + x, x)


@lowering(aten.special_hermite_polynomial_he.default, aten.special_hermite_polynomial_he.x_scalar,
          aten.special_hermite_polynomial_he.n_scalar, meta=True)
def hermite_polynomial_he(x, n, *, aval):
    x, n = _poly_args(x, n, aval.dtype)
    limit = 128 if x.dtype == jnp.float32 else 512 if x.dtype == jnp.float64 else 1024
    out = _recur(x, jnp.minimum(n, limit + 1), x, lambda i, p, q: x * q - i * p)
    return _finish(n, jnp.where(n > limit, jnp.nan, out), x, x)


@lowering(aten.special_laguerre_polynomial_l.default, aten.special_laguerre_polynomial_l.x_scalar,
          aten.special_laguerre_polynomial_l.n_scalar, meta=True)
def laguerre_polynomial_l(x, n, *, aval):
    x, n = _poly_args(x, n, aval.dtype)
    out = _recur(x, n, 1 - x, lambda i, p, q: (((i + i) + (1 - x)) * q - i * p) / (i + 1))
    out = jnp.where(x == 0, 1, out)
    return jnp.where(n < 0, 0, jnp.where(n == 0, 1, jnp.where(n == 1, 1 - x, out))).astype(x.dtype)


@lowering(aten.special_legendre_polynomial_p.default, aten.special_legendre_polynomial_p.x_scalar,
          aten.special_legendre_polynomial_p.n_scalar, meta=True)
def legendre_polynomial_p(x, n, *, aval):
    x, n = _poly_args(x, n, aval.dtype)
    out = _recur(x, n, x, lambda i, p, q: ((i + i + 1) * x * q - i * p) / (i + 1))
    out = jnp.where(jnp.abs(x) == 1, jnp.where((x > 0) | (n % 2 == 0), 1, -1), _finish(n, out, x, x))
    return jnp.where(n < 0, 0, out).astype(x.dtype)



# polygamma_(self, n) lists its arguments in the other order than polygamma(n, self), so the
# tracer cannot pair it with its functional variant: compute out of place and write back.
@tracer.special(aten.polygamma_.default)
def _polygamma_inplace(cls, func, args, kwargs):
    b = tracer.bind(func, args, kwargs)
    return aten.copy_.default(b["self"], aten.polygamma.default(b["n"], b["self"]))
