"""Samplers behind ``torch.distributions`` and the out= forms of random factories run on the
device on both paths, with eager's distributions (the numbers come from the device generator,
so moments are compared, never values), and with no CPU fallback.

Before session 25 every one of them fell back to the CPU (``poisson``, ``binomial``,
``_standard_gamma``, ``_sample_dirichlet``, ``rand(out=)``, ``randint(out=)``,
``_is_all_true`` in every distribution's argument check), and ``torch.normal(mean_tensor,
1.0)`` failed to lower.
"""
from __future__ import annotations

import pytest
import torch

import xla_compat as xc
from tests.conftest import assert_same
from tests.sampling import one_path_each

N = 40_000


@pytest.fixture(autouse=True)
def _seeded():
    torch.manual_seed(0)


def _no_fallback():
    assert xc.metrics.fallback_ops() == []


def test_poisson_has_the_rate_as_mean_and_variance(path, dev):
    rates = torch.tensor([0.0, 0.5, 4.0, 30.0])
    got = torch.poisson(rates.repeat(N // 4).to(dev)).cpu().view(-1, 4)
    assert got.dtype == torch.float32 and bool((got == got.round()).all()) and got.min() >= 0
    assert bool((got[:, 0] == 0).all())
    tol = 0.1 * rates.clamp(min=1)
    assert bool(((got.mean(0) - rates).abs() < tol).all())
    assert bool(((got.var(0) - rates).abs() < 3 * tol).all())
    _no_fallback()


def test_binomial_matches_count_times_prob(path, dev):
    count = torch.tensor([0., 1., 10., 50.]).repeat(N // 4)
    prob = torch.tensor([0.3, 0.5, 0.2, 0.9]).repeat(N // 4)
    got = torch.binomial(count.to(dev), prob.to(dev)).cpu().view(-1, 4)
    assert bool((got >= 0).all()) and bool((got <= count.view(-1, 4)).all())
    mean = torch.tensor([0., 0.5, 2., 45.])
    var = torch.tensor([0., 0.25, 1.6, 4.5])
    assert torch.allclose(got.mean(0), mean, atol=0.08)
    assert torch.allclose(got.var(0), var, rtol=0.1, atol=0.02)
    _no_fallback()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_standard_gamma_mean_and_variance_are_alpha(path, dev, dtype):
    alpha = torch.tensor([0.3, 1.0, 2.5, 9.0], dtype=dtype).repeat(N // 4)
    got = torch._standard_gamma(alpha.to(dev)).cpu().view(-1, 4)
    assert got.dtype == dtype and bool((got > 0).all())
    a = alpha[:4]
    assert torch.allclose(got.mean(0), a, rtol=0.05)
    assert torch.allclose(got.var(0), a, rtol=0.12)
    _no_fallback()


def test_standard_gamma_grad_matches_eager(path, dev):
    """The reparameterisation gradient is deterministic: compared with eager value for value."""
    # each of eager's branches: x < 0.8; alpha > 8 near its mode and away from it; the rest
    alpha = torch.tensor([0.2, 0.7, 1.0, 3.0, 12.0, 40.0]).repeat_interleave(5)
    x = torch.tensor([0.01, 0.5, 1.3, 7.0, 38.0]).repeat(6)
    for dtype in (torch.float32, torch.float64):
        a, s = alpha.to(dtype), x.to(dtype)
        assert_same(torch._standard_gamma_grad(a.to(dev), s.to(dev)),
                    torch._standard_gamma_grad(a, s), rtol=1e-6, atol=1e-9)
    _no_fallback()


def test_dirichlet_rows_sum_to_one_with_eagers_mean(path, dev):
    alpha = torch.tensor([0.5, 1.0, 3.0])
    got = torch._sample_dirichlet(alpha.expand(N // 4, 3).contiguous().to(dev)).cpu()
    assert torch.allclose(got.sum(-1), torch.ones(N // 4), atol=1e-5)
    assert torch.allclose(got.mean(0), alpha / alpha.sum(), atol=0.01)
    _no_fallback()


DISTRIBUTIONS = {
    "Normal": lambda d: torch.distributions.Normal(torch.zeros(N, device=d), 2.0).sample(),
    "Gamma": lambda d: torch.distributions.Gamma(torch.full((N,), 2.0, device=d), 4.0).sample(),
    "Beta": lambda d: torch.distributions.Beta(torch.full((N,), 2.0, device=d), 6.0).sample(),
    "Poisson": lambda d: torch.distributions.Poisson(torch.full((N,), 3.0, device=d)).sample(),
    "Uniform": lambda d: torch.distributions.Uniform(torch.zeros(N, device=d), 4.0).sample(),
    "Categorical": lambda d: torch.distributions.Categorical(
        probs=torch.tensor([0.1, 0.2, 0.7], device=d)).sample((N,)).float(),
}


@pytest.mark.parametrize("path,name", one_path_each(DISTRIBUTIONS), indirect=["path"])
def test_distributions_sample_on_the_device(path, dev, name):
    """Each distribution checks its arguments (``_is_all_true``) and samples, all on the device;
    the sample's mean is the distribution's. (Each on one path in ``make test``, alternately;
    ``make test-slow`` runs the other.)"""
    cpu = DISTRIBUTIONS[name]("cpu")
    got = DISTRIBUTIONS[name](dev)
    assert got.device == dev
    got = got.cpu()
    assert got.shape == cpu.shape and got.dtype == cpu.dtype
    assert abs(got.mean() - cpu.mean()) < 0.05 * max(1.0, float(cpu.std()))
    _no_fallback()


def test_gamma_rsample_backward_runs_on_the_device(path, dev):
    conc = torch.full((N,), 2.0, device=dev, requires_grad=True)
    torch.distributions.Gamma(conc, 1.0).rsample().mean().backward()
    # d E[x] / d alpha = 1 for Gamma(alpha, 1)
    assert abs(conc.grad.cpu().sum() - 1.0) < 0.05
    _no_fallback()


@pytest.mark.parametrize("mean_std", ["tensor, float", "float, tensor", "tensor, tensor"])
def test_normal_with_a_default_or_scalar_std(path, dev, mean_std):
    m = torch.full((N,), 3.0, device=dev)
    got = {"tensor, float": lambda: torch.normal(m, 1.0),
           "float, tensor": lambda: torch.normal(3.0, torch.ones(N, device=dev)),
           "tensor, tensor": lambda: torch.normal(m, torch.ones(N, device=dev))}[mean_std]()
    got = got.cpu()
    assert abs(got.mean() - 3) < 0.03 and abs(got.std() - 1) < 0.03
    _no_fallback()


@pytest.mark.parametrize("fill", [
    lambda out: torch.rand(N, out=out),
    lambda out: torch.randn(N, out=out),
    lambda out: torch.rand(N, generator=None, out=out),
], ids=["rand", "randn", "rand generator"])
def test_float_random_factories_write_their_out_tensor(path, dev, fill):
    out = torch.empty(0, device=dev)
    assert fill(out) is out
    got = out.cpu()
    assert got.shape == (N,)
    want = fill(torch.empty(0))
    assert abs(got.mean() - want.mean()) < 0.03 and abs(got.std() - want.std()) < 0.03
    _no_fallback()


@pytest.mark.parametrize("args", [(7,), (-3, 4)], ids=["high", "low, high"])
def test_randint_writes_its_out_tensor(path, dev, args):
    out = torch.empty(0, dtype=torch.int64, device=dev)
    torch.randint(*args, (N,), out=out)
    got = out.cpu()
    lo, hi = (0, args[0]) if len(args) == 1 else args
    assert got.min() == lo and got.max() == hi - 1
    _no_fallback()


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128], ids=str)
def test_rand_of_a_complex_dtype_draws_both_parts(path, dev, dtype):
    """Eager's complex ``rand``/``rand_like`` draw the real and the imaginary part uniformly
    (``uniform_`` of ``view_as_real``); ``rand_like`` failed in jax's words."""
    for got in (torch.rand_like(torch.zeros(N // 2, dtype=dtype, device=dev)),
                torch.rand(N // 2, dtype=dtype, device=dev)):
        got = got.cpu()
        assert got.dtype == dtype
        for part in (got.real, got.imag):
            assert 0 <= part.min() and part.max() < 1
            assert abs(part.mean().item() - 0.5) < 0.02
    _no_fallback()
