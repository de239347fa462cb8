"""Special functions match CPU eager, edge values included (poles, zeros, infinities, NaN)."""
from __future__ import annotations

import pytest
import torch

import xla_compat as xc
import xla_compat.legacy  # noqa: F401  (registers the legacy path)
from xla_compat import paths, settings
from tests.conftest import assert_same
from tests.lowering._core import core_no_fallback, dev  # noqa: F401 (autouse fixture)

NAN, INF = float("nan"), float("inf")
S = torch.special


# Every branch of the Cephes approximations: |x| < 1e-5, <= 2, <= 5, <= 8, the asymptotic tails,
# the Airy breakpoints +-2.09 and 8.32, and the non-finite values.
EDGES = torch.tensor([0., -0., 1e-6, -1e-6, 0.5, 1., 1.5, 2., 2.09, -2.09, 3., 5., 5.5, 8., 8.3,
                      8.4, 12., 30., 100., 120., -1., -2., -3.5, -7.25, -30., INF, -INF, NAN])
GRID = torch.cat([torch.linspace(-25, 25, 301), EDGES])

UNARY = ["bessel_j0", "bessel_j1", "bessel_y0", "bessel_y1", "modified_bessel_i0",
         "modified_bessel_i1", "modified_bessel_k0", "modified_bessel_k1",
         "scaled_modified_bessel_k0", "scaled_modified_bessel_k1", "spherical_bessel_j0",
         "airy_ai", "i0e", "i1", "i1e", "ndtr", "erfcx", "log_ndtr", "entr", "digamma", "psi"]


@pytest.mark.parametrize("name", UNARY)
def test_unary_special_function_matches_eager_on_every_branch(name):
    fn = getattr(S, name)
    assert_same(fn(dev(GRID)), fn(GRID), rtol=1e-5, atol=1e-5, msg=name)


@pytest.mark.parametrize("name", ["bessel_j0", "modified_bessel_k1", "airy_ai", "digamma"])
def test_integer_input_promotes_to_float(name):
    x = torch.arange(-4, 12)
    fn = getattr(S, name)
    assert_same(fn(dev(x)), fn(x), rtol=1e-5, msg=name)


def test_ndtri_inside_and_at_the_ends_of_the_unit_interval():
    torch.manual_seed(0)
    p = torch.cat([torch.rand(50), torch.tensor([0., 1., -0.1, 1.1, 1e-30, 1 - 1e-7, NAN])])
    assert_same(S.ndtri(dev(p)), S.ndtri(p), rtol=1e-5)


def test_erfcx_large_arguments_where_jax_float32_loses_the_value():
    x = torch.tensor([9.2, 9.25, 10., 50., 1e4, 1e20, -10., -30.])
    assert_same(S.erfcx(dev(x)), S.erfcx(x))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_erfcx_and_log_ndtr_where_jax_float64_loses_the_value(dtype):
    # jax's float64 erfcx returns 0 on [26.54, 26.64] (session 29's accuracy sweep): erfcx was
    # 0 there and log_ndtr -inf on [-37.68, -37.54]; the asymptotic series takes over above 20.
    x = torch.linspace(26.4, 26.8, 81, dtype=dtype)
    assert_same(S.erfcx(dev(x)), S.erfcx(x), rtol=1e-6 if dtype == torch.float32 else 1e-13)
    assert_same(S.log_ndtr(dev(-x * 2 ** 0.5)), S.log_ndtr(-x * 2 ** 0.5),
                rtol=1e-6 if dtype == torch.float32 else 1e-13)
    big = torch.tensor([20.0, 20.5, 1e3, 1e8, 1e200, INF], dtype=torch.float64)
    assert_same(S.erfcx(dev(big)), S.erfcx(big), rtol=1e-14, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_zeta_of_huge_and_infinite_x_is_eagers(dtype):
    # jax's zeta is NaN above x ~ 1e20; eager's series stops at q**-x (session 29's sweep).
    x = torch.tensor([INF, INF, INF, 1e6, 1e6, 3.4e38, 3.4e38, 1e30, 1e11, 1e11], dtype=dtype)
    q = torch.tensor([1.0, 0.5, 2.0, 2.0, 0.9, 1.0, 0.5, 1.0, 2.0, 0.999], dtype=dtype)
    assert_same(S.zeta(dev(x), dev(q)), S.zeta(x, q))


def test_xlog1py_zero_times_log_and_nan():
    x = torch.tensor([0., 0., 2., -1., 3., NAN])
    y = torch.tensor([-1., NAN, 0.5, -2., INF, 1.])
    assert_same(S.xlog1py(dev(x), dev(y)), S.xlog1py(x, y))
    assert_same(S.xlog1py(2.0, dev(y)), S.xlog1py(2.0, y))


def test_zeta_domain_rules_and_negative_q():
    x = torch.tensor([2., 3., 1., 0.5, 2., 2., 4., 2.5, NAN, INF, 5.])
    q = torch.tensor([1., 2.5, 3., 1., -2., -2.5, -3.25, -1.5, 1., 2., 1e3])
    assert_same(S.zeta(dev(x), dev(q)), S.zeta(x, q), rtol=1e-5)
    assert_same(S.zeta(dev(x), 2.0), S.zeta(x, 2.0), rtol=1e-5)


@pytest.mark.parametrize("n", [0, 1, 2, 3, 4])
def test_polygamma_orders_including_poles(n):
    x = torch.cat([torch.linspace(-6.5, 10, 67), torch.tensor([0., -1., -2., 1e-3, NAN, INF])])
    assert_same(torch.polygamma(n, dev(x)), torch.polygamma(n, x), rtol=2e-5, atol=1e-4)


def test_polygamma_in_place_writes_through_a_view_on_legacy():
    # (functional: upstream functionalization has no kernel for polygamma_ and raises before
    # the op reaches this backend)
    x = torch.linspace(0.1, 5, 20).reshape(4, 5)
    with paths.activated("legacy"):
        d = dev(x)
        d.t()[1:3].polygamma_(2)
        expected = x.clone()
        expected.t()[1:3].polygamma_(2)
        assert_same(d, expected, rtol=2e-5)


def test_mvlgamma():
    x = torch.linspace(2.1, 9, 12).reshape(3, 4)
    for p in (1, 3, 5):
        assert_same(torch.mvlgamma(dev(x), p), torch.mvlgamma(x, p), rtol=1e-5)


def test_incomplete_gamma_and_its_edges():
    a = torch.tensor([0.5, 1., 3., 0., 0., -1., 2., INF, INF, 2., 30., NAN])
    x = torch.tensor([0.2, 1., 5., 1., 0., 1., -1., 3., INF, INF, 25., 1.])
    assert_same(torch.igamma(dev(a), dev(x)), torch.igamma(a, x), rtol=1e-5)
    assert_same(torch.igammac(dev(a), dev(x)), torch.igammac(a, x), rtol=1e-5)


POLYS = ["chebyshev_polynomial_t", "chebyshev_polynomial_u", "chebyshev_polynomial_v",
         "chebyshev_polynomial_w", "shifted_chebyshev_polynomial_t",
         "shifted_chebyshev_polynomial_u", "shifted_chebyshev_polynomial_v",
         "shifted_chebyshev_polynomial_w", "hermite_polynomial_h", "hermite_polynomial_he",
         "laguerre_polynomial_l", "legendre_polynomial_p"]


@pytest.mark.parametrize("name", POLYS)
def test_orthogonal_polynomial_per_element_degree(name):
    fn = getattr(S, name)
    x = torch.tensor([-1.5, -1., -0.7, -0.2, 0., 0.25, 0.5, 0.9, 1., 2.])
    n = torch.tensor([-1., 0., 1., 2., 3., 5., 7., 9., 12.])
    xx, nn = x[:, None], n[None, :]           # every degree at every point, broadcast
    assert_same(fn(dev(xx), dev(nn)), fn(xx, nn), rtol=1e-4, atol=1e-4, msg=name)
    assert_same(fn(dev(x), 4), fn(x, 4), rtol=1e-5, msg=name)
    assert_same(fn(0.5, dev(n)), fn(0.5, n), rtol=1e-5, msg=name)


def test_special_functions_run_without_cpu_fallback():
    xc.metrics.reset()
    S.bessel_j0(dev(GRID)).cpu()
    S.chebyshev_polynomial_t(dev(GRID), 3).cpu()
    assert not [k for k in xc.metrics.counters() if "::" in k]


def test_in_place_special_on_both_paths(path):
    x = torch.linspace(-3, 3, 12).reshape(3, 4)
    d = dev(x)
    view = d[1]
    view.digamma_()
    expected = x.clone()
    expected[1].digamma_()
    assert_same(d, expected, rtol=1e-5)
