"""Matrix/vector products match CPU eager bit for bit where eager's rounding is defined by its
kernels (bfloat16: one rounding for addmm-like ops, op-by-op for addr and cross)."""
from __future__ import annotations

import pytest
import torch

import xla_compat as xc
from xla_compat import paths, settings
from tests.conftest import assert_same
from tests.lowering._core import core_no_fallback, dev  # noqa: F401 (autouse fixture)


@pytest.mark.parametrize("beta,alpha", [(1, 1), (0.2, 0.6), (0, 1)])
def test_baddbmm_addmm_round_once_in_bfloat16(beta, alpha):
    torch.manual_seed(0)
    bf = torch.bfloat16
    x, b1, b2 = torch.randn(5, 5, 10, dtype=bf), torch.randn(5, 5, 5, dtype=bf), \
        torch.randn(5, 5, 10, dtype=bf)
    assert_same(torch.baddbmm(dev(x), dev(b1), dev(b2), beta=beta, alpha=alpha),
                torch.baddbmm(x, b1, b2, beta=beta, alpha=alpha), 0, 0)
    assert_same(torch.addmm(dev(x[0]), dev(b1[0]), dev(b2[0]), beta=beta, alpha=alpha),
                torch.addmm(x[0], b1[0], b2[0], beta=beta, alpha=alpha), 0, 0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.int64])
def test_addr_follows_eagers_operation_order(dtype):
    torch.manual_seed(0)
    x, a, b = (torch.randn(5, 10) * 3).to(dtype), (torch.randn(5) * 3).to(dtype), \
        (torch.randn(10) * 3).to(dtype)
    beta, alpha = (2, 3) if dtype == torch.int64 else (0.6, 0.2)
    assert_same(torch.addr(dev(x), dev(a), dev(b), beta=beta, alpha=alpha),
                torch.addr(x, a, b, beta=beta, alpha=alpha), 0 if dtype == torch.bfloat16 else 1e-6,
                0 if dtype == torch.bfloat16 else 1e-5)
    x[0, 0] = float("nan") if dtype != torch.int64 else 0
    assert_same(torch.addr(dev(x), dev(a), dev(b), beta=0), torch.addr(x, a, b, beta=0))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.int64])
def test_cross_broadcasts_and_rounds_like_eager(dtype):
    torch.manual_seed(0)
    x, y = (torch.randn(5, 3, 5) * 4).to(dtype), (torch.randn(1, 3, 5) * 4).to(dtype)
    tol = (0, 0) if dtype == torch.bfloat16 else (1.3e-6, 1e-5)
    assert_same(torch.linalg.cross(dev(x), dev(y), dim=1), torch.linalg.cross(x, y, dim=1), *tol)
    assert_same(torch.cross(dev(x.mT), dev(y.mT), dim=-1), torch.cross(x.mT, y.mT, dim=-1), *tol)


def test_addbmm_inplace_resizes_a_broadcastable_input_like_eager():
    torch.manual_seed(0)
    x, b1, b2 = torch.randn(1), torch.randn(5, 5, 5), torch.randn(5, 5, 10)
    expected = x.clone().addbmm_(b1, b2, beta=0.5)
    d = dev(x)
    out = d.addbmm_(dev(b1), dev(b2), beta=0.5)
    assert out is d and d.shape == (5, 10)
    assert_same(d, expected, 1e-5, 1e-5)


# (Not [5, 1]: eager's resize makes the expanded input read storage its own copy has already
# overwritten, so every row takes row 0's value; that aliasing artefact is not reproduced.)
@pytest.mark.parametrize("shape", [(1,), (10,)])
def test_addbmm_inplace_resizes_a_broadcastable_input_on_both_paths(path, shape):
    # Upstream functionalization runs addbmm_'s meta kernel first, which refuses the resize.
    torch.manual_seed(0)
    x, b1, b2 = torch.randn(shape), torch.randn(5, 5, 5), torch.randn(5, 5, 10)
    expected = x.clone().addbmm_(b1, b2, beta=0.5, alpha=2)
    d = x.to(xc.device())
    assert paths.of(d) == path
    out = d.addbmm_(dev(b1), dev(b2), beta=0.5, alpha=2)
    assert out is d and d.shape == expected.shape == (5, 10)
    assert_same(d, expected, 1e-5, 1e-5)
    assert_same(d + 1, expected + 1, 1e-5, 1e-5)      # later ops see the new shape


def test_addbmm_inplace_meta_kernel_still_refuses_a_resize_outside_functionalization(path):
    m = torch.empty(1, device="meta")
    with pytest.raises(RuntimeError, match="doesn't match the broadcast shape"):
        m.addbmm_(torch.empty(5, 5, 5, device="meta"), torch.empty(5, 5, 10, device="meta"))
