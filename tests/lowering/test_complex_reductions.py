"""Norms, variances, dot products, scans and powers of complex tensors match CPU eager on both paths.

Their results are real; the lowerings cast the input to the result's (real) dtype first, which
kept only the real parts (``vector_norm([3+4j])`` read 3), and ``vdot`` did not conjugate its
first operand. Found by a complex64 sweep of the OpInfo database (session 24).
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.conftest import assert_same
from tests.lowering._core import core_no_fallback, dev  # noqa: F401 (autouse fixture)

OPS = {
    "vector_norm 2": lambda x, y: torch.linalg.vector_norm(x),
    "vector_norm 1 dim": lambda x, y: torch.linalg.vector_norm(x, 1, dim=1),
    "vector_norm inf": lambda x, y: torch.linalg.vector_norm(x, float("inf"), dim=0),
    "vector_norm 3 keepdim": lambda x, y: torch.linalg.vector_norm(x, 3, dim=-1, keepdim=True),
    "vector_norm 0": lambda x, y: torch.linalg.vector_norm(x, 0),
    "vector_norm float64": lambda x, y: torch.linalg.vector_norm(x, dtype=torch.complex128),
    "norm": lambda x, y: x.norm(),
    "matrix_norm fro": lambda x, y: torch.linalg.matrix_norm(x),
    "vdot": lambda x, y: torch.vdot(x[0], y[0]),
    "vecdot": lambda x, y: torch.linalg.vecdot(x, y),
    "var": lambda x, y: x.var(),
    "var dim correction 0": lambda x, y: x.var(1, correction=0),
    "std keepdim": lambda x, y: x.std(0, keepdim=True),
    "var_mean": lambda x, y: torch.var_mean(x, 1),
    "std_mean": lambda x, y: torch.std_mean(x),
    "dist": lambda x, y: torch.dist(x, y),
    "dist 3": lambda x, y: torch.dist(x, y, 3),
    "pairwise_distance": lambda x, y: F.pairwise_distance(x, y),
    "normalize": lambda x, y: F.normalize(x, dim=1),
}


@pytest.mark.parametrize("op", sorted(OPS))
def test_complex_reductions_match_eager(path, op):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(4, 5, dtype=torch.complex64, generator=g)
    y = torch.randn(4, 5, dtype=torch.complex64, generator=g)
    want = OPS[op](x, y)
    got = OPS[op](dev(x), dev(y))
    assert_same(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128], ids=str)
@pytest.mark.parametrize("d", [0, 1, -1])
def test_complex_logcumsumexp_takes_eagers_branch(path, dtype, d):
    """Eager sums complex terms one at a time and never wraps the imaginary part into
    (-pi, pi]; jax's cumlogsumexp did, 2*pi away from eager in half the elements."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(4, 6, 5, dtype=dtype, generator=g) * 3
    want = torch.logcumsumexp(x, d)
    assert (want.imag.abs() > torch.pi).any()      # the case the branches differ in
    assert_same(torch.logcumsumexp(dev(x), d), want, rtol=1e-5, atol=1e-5)


def test_complex_logcumsumexp_special_values(path):
    inf, nan = float("inf"), float("nan")
    x = torch.tensor([[complex(-inf, 0), complex(-inf, 1), 1 + 2j, complex(inf, 1)],
                      [complex(inf, 0.5), complex(inf, -0.5), 0j, 1j],
                      [1 + 1j, complex(nan, 0), 2j, 3 + 0j],
                      [complex(-inf, 3), 2 - 1j, complex(-inf, 0), 1 + 1j]],
                     dtype=torch.complex64)
    assert_same(torch.logcumsumexp(dev(x), 1), torch.logcumsumexp(x, 1), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("form", ["tensor ** tensor", "number ** tensor", "tensor ** number"])
def test_complex64_power_rounds_once(path, form):
    """A complex64 power is computed in complex128 and rounded once: XLA's float32 complex
    power was up to 6x farther from the exact result than eager where the exponent is large."""
    g = torch.Generator().manual_seed(7)
    x = torch.randn(200, dtype=torch.complex64, generator=g) * 6
    y = torch.randn(200, dtype=torch.complex64, generator=g) * 6
    fn = {"tensor ** tensor": lambda a, b: a ** b,
          "number ** tensor": lambda a, b: (2.5 - 1.5j) ** b,     # (exact in float32)
          "tensor ** number": lambda a, b: a ** (3.75 + 2.25j)}[form]
    exact = fn(x.to(torch.complex128), y.to(torch.complex128))
    got = fn(dev(x), dev(y)).cpu()
    assert got.dtype == torch.complex64
    finite = exact.isfinite() & (exact.abs() < 1e30) & (exact.abs() > 1e-30)
    rel = ((got.to(torch.complex128) - exact).abs() / exact.abs())[finite]
    assert rel.max() < 2e-7               # one rounding of the complex128 result
    assert_same(got, fn(x, y), rtol=1e-5, atol=1e-5)
