"""Norms, variances and dot products of complex tensors match CPU eager on both paths.

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
