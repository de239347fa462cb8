"""Miscellaneous math matches CPU eager: shifts, gcd/lcm, nextafter, frexp/ldexp, complex
construction, angle, renorm, histograms, bincount, equal/allclose."""
from __future__ import annotations

import pytest
import torch

import xla_compat as xc
import xla_compat.legacy  # noqa: F401  (registers the legacy path)
from xla_compat import paths, settings
from tests.conftest import assert_same
from tests.lowering._core import core_no_fallback, dev  # noqa: F401 (autouse fixture)

NAN, INF = float("nan"), float("inf")


INTS = torch.tensor([-7, 3, 0, 12, -1, 5, torch.iinfo(torch.int64).max, -9])
SHIFTS = torch.tensor([0, 1, 63, 64, -1, 70, 1, 3])


def test_shifts_past_the_bit_width_give_zero_or_the_sign_like_eager():
    assert_same(torch.bitwise_left_shift(dev(INTS), dev(SHIFTS)),
                torch.bitwise_left_shift(INTS, SHIFTS))
    assert_same(torch.bitwise_right_shift(dev(INTS), dev(SHIFTS)),
                torch.bitwise_right_shift(INTS, SHIFTS))
    assert_same(dev(INTS) << 3, INTS << 3)
    assert_same(dev(INTS) >> 2, INTS >> 2)
    u = torch.tensor([200, 1, 255], dtype=torch.uint8)
    s = torch.tensor([1, 9, 3], dtype=torch.uint8)
    assert_same(dev(u) >> dev(s), u >> s)


def test_gcd_and_lcm_with_zeros_and_negative_values():
    a, b = INTS[:6], torch.tensor([6, 0, 0, -8, -1, 10])
    assert_same(torch.gcd(dev(a), dev(b)), torch.gcd(a, b))
    assert_same(torch.lcm(dev(a), dev(b)), torch.lcm(a, b))
    assert_same(torch.gcd(dev(a[:, None]), dev(b)), torch.gcd(a[:, None], b))   # broadcast


FLOATS = torch.tensor([0., -0., 1., -3.5, INF, -INF, NAN, 1e-40, -3e-39, 1e-45, 3e38, 0.75])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_frexp_including_subnormals_and_non_finite(dtype):
    x = FLOATS.to(dtype)
    assert_same(torch.frexp(dev(x)), torch.frexp(x))


def test_nextafter_and_ldexp():
    x, y = FLOATS, FLOATS.flip(0)
    assert_same(torch.nextafter(dev(x), dev(y)), torch.nextafter(x, y))
    e = torch.tensor([1, 2, 3, -4, 5, 6, 7, -150, 8, -1, 200, 0])
    assert_same(torch.ldexp(dev(x), dev(e)), torch.ldexp(x, e))
    assert_same(torch.ldexp(dev(e), dev(e)), torch.ldexp(e, e))   # ints promote to float


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_ldexp_with_an_integer_exponent_scales_exactly_and_a_float_one_overflows_as_eager(dtype):
    # Eager scales exactly by an integer exponent (1e-30 * 2**200 is finite, 0 * 2**200 is 0);
    # the device computed x * 2.0**e, which overflowed to inf (and 0 * inf to NaN).
    x = torch.tensor([0.0, float("inf"), 3.0, 1e-30, 1e30, float("nan"), -0.0], dtype=dtype)
    e = torch.tensor([200, -200, 5, 200, -200, 0, 3000])
    assert_same(torch.ldexp(dev(x), dev(e)), torch.ldexp(x, e), rtol=0, atol=0)
    assert_same(torch.ldexp(dev(x), dev(e.to(dtype))), torch.ldexp(x, e.to(dtype)), rtol=0, atol=0)


@pytest.mark.parametrize("self_dtype,exp_dtype", [
    (torch.float32, torch.float16), (torch.float32, torch.bfloat16),
    (torch.float64, torch.float16), (torch.float16, torch.bfloat16),
    (torch.bfloat16, torch.float16), (torch.float16, torch.float16)], ids=str)
def test_ldexp_by_a_half_precision_exponent_scales_by_a_power_rounded_to_it(self_dtype,
                                                                            exp_dtype):
    # Eager's scale is pow(2.0, exponent) in the exponent's dtype (2 ** 2.5 rounded to float16),
    # then a product in the result's: the device took the power in the result's dtype, which
    # moved 485-499 of 500 results (up to 4e-3 relative).
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(500, generator=g) * 3).to(self_dtype)
    e = (torch.randn(500, generator=g) * 4).to(exp_dtype)
    assert_same(torch.ldexp(dev(x), dev(e)), torch.ldexp(x, e), rtol=0, atol=0)


def test_complex_polar_angle():
    re, im = torch.randn(3, 4), torch.randn(4)
    assert_same(torch.complex(dev(re), dev(im)), torch.complex(re, im))
    r = re.abs()
    assert_same(torch.polar(dev(r), dev(im)), torch.polar(r, im))
    normal = FLOATS[(FLOATS.abs() > 1e-30) | (FLOATS == 0) | FLOATS.isnan()]
    # (subnormals excluded: XLA's CPU flushes them, so -1e-40 < 0 is False there)
    assert_same(torch.angle(dev(normal)), torch.angle(normal))
    assert_same(torch.angle(dev(INTS)), torch.angle(INTS))


@pytest.mark.parametrize("p,d,maxnorm", [(2, 1, 1.0), (1, 0, 0.5), (float("inf"), -1, 0.3),
                                         (3, 2, 0.7)])
def test_renorm_scales_only_slices_over_maxnorm(p, d, maxnorm):
    torch.manual_seed(0)
    x = torch.randn(4, 5, 3)
    assert_same(torch.renorm(dev(x), p, d, maxnorm), torch.renorm(x, p, d, maxnorm))


def test_renorm_in_place_through_a_view(path):
    torch.manual_seed(0)
    x = torch.randn(4, 6)
    d = dev(x)
    d[:, 1:4].renorm_(2, 0, 0.5)
    expected = x.clone()
    expected[:, 1:4].renorm_(2, 0, 0.5)
    assert_same(d, expected)


def test_histc_ranges_from_the_data_or_given():
    torch.manual_seed(0)
    x = torch.randn(40)
    assert_same(torch.histc(dev(x), 7), torch.histc(x, 7))
    assert_same(torch.histc(dev(x), 5, -1, 1), torch.histc(x, 5, -1, 1))
    assert_same(torch.histc(dev(torch.ones(4)), 3), torch.histc(torch.ones(4), 3))  # min == max
    edge = torch.tensor([0., 0.25, 0.5, 1., 1., NAN, 2.])
    assert_same(torch.histc(dev(edge), 4, 0, 1), torch.histc(edge, 4, 0, 1))


def test_histogram_with_bin_count_edges_weights_and_density():
    torch.manual_seed(0)
    x, w = torch.randn(4, 5), torch.rand(4, 5)
    assert_same(torch.histogram(dev(x), 6), torch.histogram(x, 6))
    assert_same(torch.histogram(dev(x), 6, range=(-1., 1.), weight=dev(w), density=True),
                torch.histogram(x, 6, range=(-1., 1.), weight=w, density=True))
    bins = torch.tensor([-2., -0.5, 0., 3.])
    assert_same(torch.histogram(dev(x), dev(bins)), torch.histogram(x, bins))


def test_histogramdd_counts_and_explicit_edges():
    torch.manual_seed(0)
    x = torch.randn(30, 2)
    got, exp = torch.histogramdd(dev(x), [3, 4]), torch.histogramdd(x, [3, 4])
    assert_same(got.hist, exp.hist)
    assert_same(list(got.bin_edges), list(exp.bin_edges))
    edges = [torch.tensor([-1., 0, 1]), torch.tensor([-2., 0, 0.5, 2])]
    got = torch.histogramdd(dev(x), [dev(e) for e in edges], density=True)
    assert_same(got.hist, torch.histogramdd(x, edges, density=True).hist)


def test_bincount_sizes_from_the_data():
    x = torch.tensor([1, 3, 3, 0, 7])
    assert_same(torch.bincount(dev(x)), torch.bincount(x))
    w = torch.rand(5)
    assert_same(torch.bincount(dev(x), dev(w), minlength=10), torch.bincount(x, w, minlength=10))
    empty = torch.tensor([], dtype=torch.int64)
    assert_same(torch.bincount(dev(empty), minlength=3), torch.bincount(empty, minlength=3))
    with pytest.raises(RuntimeError):
        torch.bincount(dev(torch.tensor([1, -1])))


def test_equal_and_allclose_return_python_bools():
    torch.manual_seed(0)
    x = torch.randn(3, 4)
    assert torch.equal(dev(x), dev(x.clone())) is True
    assert torch.equal(dev(x), dev(x + 1)) is False
    assert torch.equal(dev(x), dev(x[:2])) is False
    assert torch.allclose(dev(x), dev(x + 1e-9)) is True
    assert torch.allclose(dev(x), dev(x + 1)) is False
    n = torch.tensor([NAN, 1.])
    assert torch.allclose(dev(n), dev(n)) is False
    assert torch.allclose(dev(n), dev(n), equal_nan=True) is True
