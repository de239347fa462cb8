"""Activations on hlo match CPU eager, including their gradients exactly at the kinks."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import xla_compat as xc
from xla_compat import paths, settings
from xla_compat.lowering import registry
from xla_compat.lowering.registry import aten

from ._nn_check import check



@pytest.fixture(autouse=True)
def _seed_each_test():
    torch.manual_seed(0)     # inputs do not depend on which tests ran before

# Random values plus the points where the activations change branch.
KINKS = torch.tensor([-3.0, 3.0, 0.0, -0.5, 0.5, -1.0, 1.0, 20.0, -20.0, 25.0])


def _x(*shape):
    return torch.cat([torch.randn(*shape).flatten() * 3, KINKS]).reshape(-1, 2)


def test_activation_ops_have_rules():
    for op in (aten.elu_backward.default, aten.softplus_backward.default, aten.hardswish.default,
               aten.hardswish_backward.default, aten.hardsigmoid.default,
               aten.hardsigmoid_backward.default, aten.mish.default,
               aten.log_sigmoid_forward.default, aten.log_sigmoid_backward.default,
               aten.glu.default, aten.glu_backward.default, aten._prelu_kernel.default,
               aten._prelu_kernel_backward.default, aten.rrelu_with_noise_functional.default,
               aten.rrelu_with_noise_backward.default, aten.celu.default,
               aten.hardshrink.default, aten.hardshrink_backward.default,
               aten.softshrink.default, aten.softshrink_backward.default):
        assert registry.lookup(op) is not None, op


@pytest.mark.parametrize("fn", [
    F.elu,
    lambda x: F.elu(x, alpha=0.7),
    F.selu,
    F.celu,
    lambda x: F.celu(x, alpha=2.5),
    F.softplus,
    lambda x: F.softplus(x, beta=2, threshold=5),
    F.hardswish,
    F.hardsigmoid,
    F.mish,
    F.logsigmoid,
    F.hardshrink,
    lambda x: F.hardshrink(x, 1.0),
    F.softshrink,
    lambda x: F.softshrink(x, 1.0),
    F.tanhshrink,
    F.relu6,
], ids=lambda f: getattr(f, "__name__", "lambda"))
def test_activation_and_gradient(fn):
    check(fn, _x(6, 4))


@pytest.mark.parametrize("fn", [torch.relu, F.hardshrink, F.softshrink, F.tanhshrink, F.leaky_relu,
                                F.silu, F.mish, F.softplus, F.hardtanh, F.elu, F.selu, F.celu],
                         ids=lambda f: f.__name__)
def test_activations_of_nan_and_signed_zeros_are_eagers(fn):
    # Session 29's sweep: softshrink(NaN) was 0 and relu(-0.0) +0.0 (eager: NaN and -0.0).
    # (Not gelu: eager's own gelu(inf) is inf for a 1-element tensor and NaN in its vector loop.)
    x = torch.tensor([float("nan"), -0.0, 0.0, float("inf"), -float("inf"), -1.0, 1.0])
    got, want = fn(x.to(xc.device())).cpu(), fn(x)
    assert torch.equal(got.isnan(), want.isnan()), (got, want)
    assert torch.allclose(got.nan_to_num(), want.nan_to_num(), rtol=1e-6, atol=1e-7), (got, want)
    assert torch.equal(got.signbit() & (got == 0), want.signbit() & (want == 0)), (got, want)


@pytest.mark.parametrize("fn", [F.elu, lambda x: F.elu(x, alpha=0.7), F.selu,
                                lambda x: F.celu(x, alpha=2.5)], ids=["elu", "elu_alpha", "selu",
                                                                       "celu"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_elu_family_of_tiny_negative_inputs_is_eagers_expm1(path, fn, dtype):
    # exp(x) - 1 is 0 below the dtype's epsilon: elu(-1e-8) was 0 in float32 (eager: -1e-8).
    # (Normal numbers only: XLA's CPU flushes subnormals, migration_guide/ops.md.)
    x = -torch.logspace(-30, 0, 61, dtype=dtype)
    got, want = fn(x.to(xc.device())).cpu(), fn(x)
    torch.testing.assert_close(got, want, rtol=4 * torch.finfo(dtype).eps, atol=0)


def test_elu_backward_through_the_result():
    # In-place elu saves its result, so the backward op takes the is_result branch.
    check(lambda x: F.elu(x * 1.0, alpha=1.3, inplace=True), _x(4, 4))


@pytest.mark.parametrize("d", [-1, 0, 1])
def test_glu(d):
    check(lambda x: F.glu(x, d), torch.randn(4, 6, 2))


@pytest.mark.parametrize("wshape", [(1,), (3,)])
def test_prelu(wshape):
    check(F.prelu, torch.randn(2, 3, 4, 5), torch.rand(wshape))
    check(F.prelu, torch.randn(5, 3), torch.rand(wshape))


def test_rrelu_eval_uses_the_mean_slope():
    check(lambda x: F.rrelu(x, 0.1, 0.3, training=False), _x(5, 4))


def test_rrelu_training_draws_slopes_in_range_and_backprops_them():
    x = torch.randn(64, 8)
    with paths.activated("core"), settings.override(cpu_fallback="error"):
        dev = xc.device()
        xd = x.to(dev).requires_grad_()
        xc.manual_seed(3)
        y = F.rrelu(xd, 0.1, 0.3, training=True)
        y.backward(torch.ones_like(y))
        out, g = y.detach().cpu(), xd.grad.cpu()
        y2 = F.rrelu(x.to(dev), 0.1, 0.3, training=True).cpu()
        xc.manual_seed(3)
        y3 = F.rrelu(x.to(dev), 0.1, 0.3, training=True).cpu()
    pos = x > 0
    torch.testing.assert_close(out[pos], x[pos], rtol=0, atol=0)
    slope = out[~pos] / x[~pos]
    assert bool(((slope >= 0.1 - 1e-6) & (slope <= 0.3 + 1e-6)).all())
    assert slope.std() > 0.01                      # a slope per element, not one shared
    torch.testing.assert_close(g[pos], torch.ones_like(g[pos]))
    torch.testing.assert_close(g[~pos], slope, rtol=1e-5, atol=1e-6)
    assert not torch.equal(out, y2)                # fresh slopes each call
    torch.testing.assert_close(out, y3, rtol=0, atol=0)   # ... and repeatable under a seed


def test_rrelu_in_place_writes_self_and_its_noise_on_both_paths(path):
    x = torch.randn(64, 8)
    with settings.override(cpu_fallback="error"):
        d = x.to(xc.device())
        F.rrelu(d, 0.1, 0.3, training=True, inplace=True)
        out = d.cpu()
        e = x.to(xc.device())
        F.rrelu_(e, 0.1, 0.3, training=False)          # eval: the mean slope, in place
        assert_eval = e.cpu()
        noise = torch.zeros(64, 8).to(xc.device())
        r = torch.ops.aten.rrelu_with_noise(x.to(xc.device()), noise, 0.1, 0.3, True)
        r, noise = r.cpu(), noise.cpu()
    pos = x > 0
    torch.testing.assert_close(out[pos], x[pos], rtol=0, atol=0)
    slope = out[~pos] / x[~pos]
    assert bool(((slope >= 0.1 - 1e-6) & (slope <= 0.3 + 1e-6)).all()) and slope.std() > 0.01
    torch.testing.assert_close(assert_eval, F.rrelu(x, 0.1, 0.3, training=False))
    # the out-of-place overload writes the slopes it drew into `noise` (1 where x > 0)
    torch.testing.assert_close(noise[pos], torch.ones_like(noise[pos]))
    torch.testing.assert_close(r, x * noise)


@pytest.mark.parametrize("dtype", [None, torch.float64, torch.float16])
def test_safe_softmax_zeroes_fully_masked_rows_like_eager(path, dev, dtype):
    # scaled_dot_product_attention's math path calls it every step (it was decomposed each call)
    inf = float("-inf")
    x = torch.tensor([[inf, inf, inf], [1.0, 2.0, inf], [-1e5, 0.5, 3.0], [float("nan"), 1.0, inf]])
    for d in (1, -1, 0):
        want = torch.ops.aten._safe_softmax(x, d, dtype=dtype)
        got = torch.ops.aten._safe_softmax(x.to(dev), d, dtype=dtype)
        assert got.dtype == want.dtype
        torch.testing.assert_close(got.cpu(), want, equal_nan=True, rtol=1e-3 if dtype else 1e-6,
                                   atol=1e-6)
    mask = torch.tensor([[False] * 4] + [[True] * 4] * 3)    # the first query sees nothing
    check(lambda q, m: torch.nn.functional.scaled_dot_product_attention(q, q, q, attn_mask=m),
          torch.randn(2, 4, 8), mask)
