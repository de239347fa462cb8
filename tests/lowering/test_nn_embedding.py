"""Embedding (with max_norm renormalisation) and bilinear layers on hlo match CPU eager."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from xla_compat.lowering import registry
from xla_compat.lowering.registry import aten

from ._nn_check import check

torch.manual_seed(0)


def test_embedding_ops_have_rules():
    for op in (aten.embedding.default, aten.embedding_dense_backward.default,
               aten.embedding_renorm.default, aten._trilinear.default):
        assert registry.lookup(op) is not None, op


@pytest.mark.parametrize("kw", [{}, {"padding_idx": 2}, {"scale_grad_by_freq": True}])
def test_embedding(kw):
    check(lambda w, i: F.embedding(i, w, **kw), torch.randn(6, 4), torch.tensor([[0, 2, 5], [2, 2, 1]]))


@pytest.mark.parametrize("norm_type", [2.0, 1.0, 3.0, float("inf")])
def test_embedding_renorm_shrinks_looked_up_rows_in_place(norm_type):
    # F.embedding(max_norm=...) renorms weight.detach(), an alias: on the core path (no aliasing)
    # that write does not reach the weight, so the op itself is checked here; the paths carry it.
    def fn(w, i):
        with torch.no_grad():
            torch.embedding_renorm_(w, i, 1.5, norm_type)
        return F.embedding(i, w), w

    check(fn, torch.randn(6, 4) * 2, torch.tensor([[0, 2, 5], [2, 2, 1]]), grad=False)


def test_bilinear():
    x1, x2 = torch.randn(3, 4), torch.randn(3, 5)
    check(F.bilinear, x1, x2, torch.randn(6, 4, 5), torch.randn(6))
    check(F.bilinear, torch.randn(2, 3, 4), torch.randn(2, 3, 5), torch.randn(6, 4, 5))


@pytest.mark.parametrize("p", [2.0, 1.0, 0.5, 3.0, 0.0, float("inf")])
def test_pdist(p):
    x = torch.randn(5, 3)
    x[3] = x[1]                       # a zero distance: its gradient is zero, not nan
    check(lambda x: F.pdist(x, p), x)
