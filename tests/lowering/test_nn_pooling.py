"""Pools on hlo match CPU eager: values, PyTorch's flat indices (ties, NaN, padding) and gradients."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from xla_compat.lowering import registry
from xla_compat.lowering.registry import aten

from ._nn_check import check



@pytest.fixture(autouse=True)
def _seed_each_test():
    torch.manual_seed(0)     # inputs do not depend on which tests ran before


def test_pool_ops_have_rules():
    for op in (aten.max_pool2d_with_indices.default, aten.max_pool2d_with_indices_backward.default,
               aten.max_pool3d_with_indices.default, aten.max_pool3d_with_indices_backward.default,
               aten.avg_pool2d.default, aten.avg_pool2d_backward.default,
               aten.avg_pool3d.default, aten.avg_pool3d_backward.default,
               aten._adaptive_avg_pool2d.default, aten._adaptive_avg_pool2d_backward.default,
               aten._adaptive_avg_pool3d.default, aten._adaptive_avg_pool3d_backward.default,
               aten.adaptive_max_pool2d.default, aten.adaptive_max_pool2d_backward.default,
               aten.adaptive_max_pool3d.default, aten.adaptive_max_pool3d_backward.default):
        assert registry.lookup(op) is not None, op


@pytest.mark.parametrize("kw", [
    {"kernel_size": 2},
    {"kernel_size": 3, "stride": 2, "padding": 1},
    {"kernel_size": (3, 2), "stride": (2, 1), "dilation": (2, 1)},
    {"kernel_size": 3, "stride": 2, "ceil_mode": True},
    {"kernel_size": 2, "stride": 2, "padding": 1, "ceil_mode": True},
])
def test_max_pool2d_values_indices_and_grad(kw):
    check(lambda x: F.max_pool2d(x, return_indices=True, **kw), torch.randn(2, 3, 9, 8))


def test_max_pool2d_ties_pick_the_first_maximum():
    x = torch.tensor([[[[1., 3., 3.], [3., 0., 3.], [2., 3., 1.]]]])
    check(lambda x: F.max_pool2d(x, 2, stride=1, return_indices=True), x)
    check(lambda x: F.max_pool2d(x, 3, stride=1, padding=1, return_indices=True),
          torch.full((1, 1, 3, 3), -float("inf")), grad=False)


def test_max_pool2d_nan_wins_and_last_nan_is_taken():
    x = torch.randn(1, 2, 4, 4)
    x[0, 0, 0, 1] = float("nan")
    x[0, 0, 1, 0] = float("nan")
    x[0, 1, 2, 2] = float("nan")
    check(lambda x: F.max_pool2d(x, 2, return_indices=True), x, grad=False)


def test_max_pool_unbatched_1d_and_3d():
    check(lambda x: F.max_pool2d(x, 2, return_indices=True), torch.randn(3, 6, 5))
    check(lambda x: F.max_pool1d(x, 3, stride=2, padding=1, return_indices=True),
          torch.randn(2, 3, 10))
    check(lambda x: F.max_pool3d(x, (2, 3, 2), stride=(1, 2, 2), padding=(1, 1, 0),
                                 return_indices=True), torch.randn(2, 2, 5, 7, 6))
    check(lambda x: F.max_pool3d(x, 2, ceil_mode=True, return_indices=True),
          torch.randn(1, 2, 5, 5, 5))


def test_max_pool_overlapping_windows_accumulate_gradient():
    # With stride 1 the same maximum feeds several outputs; its gradient is their sum.
    x = torch.zeros(1, 1, 5, 5)
    x[0, 0, 2, 2] = 5.0
    check(lambda x: F.max_pool2d(x, 3, stride=1), x)


@pytest.mark.parametrize("kw", [
    {"kernel_size": 2},
    {"kernel_size": 3, "stride": 2, "padding": 1},
    {"kernel_size": 3, "stride": 2, "padding": 1, "count_include_pad": False},
    {"kernel_size": 3, "stride": 2, "padding": 1, "ceil_mode": True},
    {"kernel_size": 3, "stride": 2, "padding": 1, "ceil_mode": True, "count_include_pad": False},
    {"kernel_size": (2, 3), "padding": (1, 1), "divisor_override": 4},
])
def test_avg_pool2d(kw):
    check(lambda x: F.avg_pool2d(x, **kw), torch.randn(2, 3, 9, 8))


def test_avg_pool1d_3d_and_unbatched():
    check(lambda x: F.avg_pool1d(x, 3, stride=2, padding=1, ceil_mode=True), torch.randn(2, 3, 10))
    check(lambda x: F.avg_pool3d(x, (2, 3, 2), stride=2, padding=1, count_include_pad=False),
          torch.randn(2, 2, 5, 7, 6))
    check(lambda x: F.avg_pool3d(x, 2, ceil_mode=True, divisor_override=3), torch.randn(1, 2, 5, 5, 5))
    check(lambda x: F.avg_pool2d(x, 2), torch.randn(3, 6, 5))


def test_avg_pool2d_integer_input_truncates_like_eager():
    check(lambda x: F.avg_pool2d(x, 2, padding=1), torch.randint(-50, 50, (1, 2, 5, 5)), grad=False)


@pytest.mark.parametrize("size", [(3, 3), (1, 1), (4, 2), (7, 5), (None, 2)])
def test_adaptive_avg_pool2d(size):
    check(lambda x: F.adaptive_avg_pool2d(x, size), torch.randn(2, 3, 7, 6))


def test_adaptive_avg_pool_1d_3d_and_inf_stays_in_its_window():
    check(lambda x: F.adaptive_avg_pool1d(x, 4), torch.randn(2, 3, 10))
    check(lambda x: F.adaptive_avg_pool3d(x, (2, 3, 1)), torch.randn(2, 2, 5, 7, 6))
    x = torch.randn(1, 1, 6, 6)
    x[0, 0, 0, 0] = float("inf")
    check(lambda x: F.adaptive_avg_pool2d(x, 3), x, grad=False)


@pytest.mark.parametrize("size", [(3, 3), (1, 1), (4, 2), (7, 6)])
def test_adaptive_max_pool2d(size):
    check(lambda x: F.adaptive_max_pool2d(x, size, return_indices=True), torch.randn(2, 3, 7, 6))


def test_adaptive_max_pool_1d_3d_unbatched():
    check(lambda x: F.adaptive_max_pool1d(x, 4, return_indices=True), torch.randn(2, 3, 10))
    check(lambda x: F.adaptive_max_pool3d(x, (2, 3, 2), return_indices=True),
          torch.randn(2, 2, 5, 7, 6))
    check(lambda x: F.adaptive_max_pool2d(x, 2, return_indices=True), torch.randn(3, 5, 5))


@pytest.mark.parametrize("kw", [{"output_size": (4, 3)}, {"output_ratio": (0.5, 0.5)},
                                {"output_size": 1}, {"output_size": (5, 6)}])
def test_fractional_max_pool2d_with_given_samples(kw):
    x = torch.randn(2, 3, 9, 7)
    samples = torch.rand(2, 3, 2)
    check(lambda x, s: F.fractional_max_pool2d(x, (3, 2), _random_samples=s, return_indices=True,
                                               **kw), x, samples, frozen=(1,))
    check(lambda x, s: F.fractional_max_pool2d(x, 2, output_size=(3, 3), _random_samples=s,
                                               return_indices=True), x[0], samples[:1], frozen=(1,))


def test_fractional_max_pool3d_with_given_samples():
    x, samples = torch.randn(2, 2, 7, 6, 8), torch.rand(2, 2, 3)
    check(lambda x, s: F.fractional_max_pool3d(x, (2, 3, 2), output_size=(4, 3, 5),
                                               _random_samples=s, return_indices=True),
          x, samples, frozen=(1,))


@pytest.mark.parametrize("n,shape,kernel", [(2, (0, 1, 5, 4), (2, 2)),
                                            (3, (0, 1, 4, 5, 4), (2, 2, 1))])
def test_fractional_max_pool_of_an_empty_batch_gives_empty_outputs(path, n, shape, kernel):
    import xla_compat as xc
    from xla_compat import settings
    pool = F.fractional_max_pool2d if n == 2 else F.fractional_max_pool3d
    x, samples = torch.randn(shape), torch.rand(0, shape[1], n)
    expected = pool(x, kernel, output_size=2, return_indices=True, _random_samples=samples)
    d = xc.device()
    with settings.override(cpu_fallback="error"):
        actual = pool(x.to(d), kernel, output_size=2, return_indices=True,
                      _random_samples=samples.to(d))
        actual = [t.cpu() for t in actual]
    for a, e in zip(actual, expected):
        assert a.dtype == e.dtype and a.shape == e.shape == (0, shape[1]) + (2,) * n
