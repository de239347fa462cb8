"""Dropout on both paths draws its mask on the device, with no CPU fallback: elements (or whole
channels for dropout2d/3d) are zeroed with probability p and the rest scaled by 1/(1-p), in place
too; ``bernoulli_`` with its default p (which the dispatcher drops from the call) works."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import xla_compat as xc
from tests.lowering._core import core_no_fallback, dev  # noqa: F401 (autouse fixture)

CASES = {
    "dropout": (F.dropout, (16, 32, 8), ()),
    "dropout2d": (F.dropout2d, (16, 32, 4, 4), (2, 3)),
    "dropout3d": (F.dropout3d, (16, 32, 2, 2, 2), (2, 3, 4)),
}


@pytest.mark.parametrize("inplace", [False, True])
@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("p", [0.5, 0.25])
def test_dropout_zeroes_with_probability_p_and_scales_the_rest(path, name, inplace, p):
    fn, shape, channel_dims = CASES[name]
    x = torch.rand(*shape) + 1.0                      # never 0 by itself
    d = dev(x)
    y = fn(d, p, training=True, inplace=inplace)
    if inplace:
        assert y is d
    y = y.cpu()
    kept = y != 0
    if channel_dims:                                  # whole channels go together
        assert bool((kept.all(channel_dims) | (~kept).all(channel_dims)).all())
    torch.testing.assert_close(y[kept], x[kept] / (1 - p))
    frac = 1 - kept.float().mean().item()
    assert abs(frac - p) < 0.1, frac


def test_bernoulli_in_place_with_the_default_p(path):
    t = dev(torch.zeros(4000))
    t.bernoulli_()                                    # p=0.5, dropped by the dispatcher
    t.bernoulli_(0.5)
    v = t.cpu()
    assert set(v.unique().tolist()) <= {0.0, 1.0}
    assert abs(v.mean().item() - 0.5) < 0.05
    assert not xc.metrics.counters().get("aten::bernoulli_")


@pytest.mark.parametrize("gdtype", [torch.bool, torch.int64, torch.float32])
@pytest.mark.parametrize("scale", [2.0, 0.5])
def test_native_dropout_backward_promotes_a_bool_or_int_grad_like_eager(path, gdtype, scale):
    torch.manual_seed(0)
    grad = torch.randint(-3, 4, (5, 5, 5)).to(gdtype)
    mask = torch.rand(5, 5, 5) > 0.5
    expected = torch.ops.aten.native_dropout_backward(grad, mask, scale)
    actual = torch.ops.aten.native_dropout_backward(dev(grad), dev(mask), scale)
    assert actual.dtype == expected.dtype
    torch.testing.assert_close(actual.cpu(), expected, rtol=0, atol=0)
