"""SVD, eigh, eig, pinv, lstsq, matrix_exp and LDL^T match CPU eager, with no CPU fallback.

Singular and eigenvectors are unique only up to sign (phase): they are compared through what is
unique (values, reconstructions, projectors) and, where the sign is free, after alignment.
"""
from __future__ import annotations

import pytest
import torch

import xla_compat as xc
from xla_compat import paths, settings
from tests.conftest import assert_same
from tests.lowering._core import core_no_fallback, dev  # noqa: F401 (autouse fixture)


def aligned(actual_cols, expected_cols):
    """``actual_cols`` with each column's sign flipped onto ``expected_cols``'s."""
    sign = torch.sign((actual_cols * expected_cols).sum(-2, keepdim=True))
    return actual_cols * torch.where(sign == 0, 1, sign)


# -- SVD ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(5, 3), (3, 5), (2, 4, 4)])
@pytest.mark.parametrize("full", [False, True])
def test_svd_singular_values_vectors_and_reconstruction(shape, full):
    torch.manual_seed(0)
    a = torch.randn(*shape)
    u, s, vh = torch.linalg.svd(a, full_matrices=full)
    du, ds, dvh = (t.cpu() for t in torch.linalg.svd(dev(a), full_matrices=full))
    assert_same(ds, s, 1e-5, 1e-5)
    k = s.shape[-1]
    # u_j and v_j flip together: align by u, check v with the same signs
    sign = torch.sign((du[..., :k] * u[..., :k]).sum(-2, keepdim=True))
    assert_same(du[..., :k] * sign, u[..., :k], 1e-4, 1e-5)
    assert_same(dvh[..., :k, :] * sign.mT, vh[..., :k, :], 1e-4, 1e-5)
    assert_same(du @ du.mT, u @ u.mT, 1e-5, 1e-5)       # complements: same projectors
    assert_same(dvh.mT @ dvh, vh.mT @ vh, 1e-5, 1e-5)


def test_svdvals_and_empty_matrices():
    a = torch.randn(2, 3, 4)
    assert_same(torch.linalg.svdvals(dev(a)), torch.linalg.svdvals(a), 1e-5, 1e-5)
    for shape in [(3, 0), (0, 2), (0, 3, 3)]:
        e = torch.empty(shape)
        assert_same(tuple(torch.linalg.svd(dev(e))), tuple(torch.linalg.svd(e)))


def test_norms_rank_and_cond_built_on_svd():
    torch.manual_seed(0)
    a = torch.randn(3, 4, 5)
    a[1] = a[1, :1].expand(4, 5)                     # rank 1
    for ord in ("nuc", 2, -2):
        assert_same(torch.linalg.matrix_norm(dev(a), ord=ord),
                    torch.linalg.matrix_norm(a, ord=ord), 1e-5, 1e-5)
    assert_same(torch.linalg.matrix_rank(dev(a)), torch.linalg.matrix_rank(a))
    sq = torch.randn(2, 4, 4)
    assert_same(torch.linalg.cond(dev(sq)), torch.linalg.cond(sq), 1e-4, 1e-5)


# -- eigh / eig ---------------------------------------------------------------------------------

@pytest.mark.parametrize("uplo", ["L", "U"])
def test_eigh_reads_one_triangle(uplo):
    torch.manual_seed(0)
    a = torch.randn(2, 5, 5)        # not symmetric: only the UPLO triangle counts
    w, v = torch.linalg.eigh(a, UPLO=uplo)
    dw, dv = (t.cpu() for t in torch.linalg.eigh(dev(a), UPLO=uplo))
    assert_same(dw, w, 1e-5, 1e-5)
    assert_same(aligned(dv, v), v, 1e-4, 1e-5)
    assert_same(torch.linalg.eigvalsh(dev(a), UPLO=uplo), w, 1e-5, 1e-5)


def test_eig_and_eigvals_are_complex_and_satisfy_av_equals_vw():
    torch.manual_seed(0)
    a = torch.randn(2, 4, 4)
    w, v = torch.linalg.eig(a)
    dw, dv = (t.cpu() for t in torch.linalg.eig(dev(a)))
    assert dw.dtype == torch.complex64 and dv.dtype == torch.complex64
    assert_same(dw, w, 1e-5, 1e-5)
    assert_same(a.to(dv.dtype) @ dv, dv * dw.unsqueeze(-2), 1e-4, 1e-4)
    assert_same(torch.linalg.eigvals(dev(a)), w, 1e-5, 1e-5)


# -- pinv, lstsq --------------------------------------------------------------------------------

@pytest.mark.parametrize("hermitian", [False, True])
def test_pinv_including_singular_and_tolerances(hermitian):
    torch.manual_seed(0)
    a = torch.randn(2, 4, 4)
    if hermitian:
        a = a + a.mT
    a[1] = a[1, :, :1] @ a[1, :1, :]                    # rank 1 (symmetric if a[1] is)
    assert_same(torch.linalg.pinv(dev(a), hermitian=hermitian),
                torch.linalg.pinv(a, hermitian=hermitian), 1e-4, 1e-4)
    assert_same(torch.linalg.pinv(dev(a), atol=0.5, hermitian=hermitian),
                torch.linalg.pinv(a, atol=0.5, hermitian=hermitian), 1e-4, 1e-4)
    rtol = torch.tensor([0.1, 0.9])
    assert_same(torch.linalg.pinv(dev(a), rtol=dev(rtol), hermitian=hermitian),
                torch.linalg.pinv(a, rtol=rtol, hermitian=hermitian), 1e-4, 1e-4)
    assert_same(torch.pinverse(dev(a[0])), torch.pinverse(a[0]), 1e-4, 1e-4)


@pytest.mark.parametrize("driver", [None, "gels", "gelsd", "gelss", "gelsy"])
def test_lstsq_outputs_per_driver(driver):
    torch.manual_seed(0)
    a, b = torch.randn(2, 6, 3), torch.randn(2, 6, 2)
    expected = torch.linalg.lstsq(a, b, driver=driver)
    assert_same(tuple(torch.linalg.lstsq(dev(a), dev(b), driver=driver)), tuple(expected),
                1e-4, 1e-4)
    wide, vec = torch.randn(3, 5), torch.randn(3)     # underdetermined, vector right side
    assert_same(tuple(torch.linalg.lstsq(dev(wide), dev(vec), driver=driver)),
                tuple(torch.linalg.lstsq(wide, vec, driver=driver)), 1e-4, 1e-4)


def test_lstsq_residuals_are_empty_for_rank_deficient_gelsd_like_eager():
    """gelsd/gelss give residuals only when every matrix has full column rank: the rank is
    read back from the device to decide the output's shape."""
    torch.manual_seed(0)
    a, b = torch.randn(6, 3), torch.randn(6, 2)
    a[:, 2] = a[:, 1]
    expected = torch.linalg.lstsq(a, b, driver="gelsd")
    actual = torch.linalg.lstsq(dev(a), dev(b), driver="gelsd")
    assert expected.residuals.shape == (0,)
    assert_same(tuple(actual), tuple(expected), 1e-4, 1e-4)
    assert xc.metrics.counters().get("TransferFromDevice", 0) >= 1


# -- matrix_exp ---------------------------------------------------------------------------------

def test_matrix_exp_per_norm_degree_and_scaling_squaring():
    torch.manual_seed(0)
    # 1-norms spanning every degree eager picks (1, 2, 4, 8, 12, 18 and 18 with squaring)
    scales = torch.tensor([1e-9, 1e-4, 1e-2, 0.1, 0.3, 0.7, 2.0, 9.0])
    a = torch.randn(8, 3, 3) * scales[:, None, None]
    assert_same(torch.linalg.matrix_exp(dev(a)), torch.linalg.matrix_exp(a), 1e-5, 1e-5)
    assert_same(torch.linalg.matrix_exp(dev(a.double())), torch.linalg.matrix_exp(a.double()),
                1e-12, 1e-12)
    one = torch.randn(2, 1, 1)
    assert_same(torch.linalg.matrix_exp(dev(one)), torch.linalg.matrix_exp(one))


# -- LDL^T ------------------------------------------------------------------------------------

def test_ldl_factor_gives_eagers_bunch_kaufman_pivots_and_ldl_solve_solves():
    torch.manual_seed(0)
    a = torch.randn(3, 6, 6)
    a = a + a.mT
    a[0, 0, 0] = 1e-3          # forces a 2x2 pivot
    a[2, 1, 1] = 0.0
    ld, piv, info = torch.linalg.ldl_factor_ex(a)
    assert (piv < 0).any()
    assert_same(tuple(torch.linalg.ldl_factor_ex(dev(a))), (ld, piv, info), 1e-5, 1e-5)
    b = torch.randn(6, 2)
    assert_same(torch.linalg.ldl_solve(dev(ld), dev(piv), dev(b)),
                torch.linalg.ldl_solve(ld, piv, b), 1e-4, 1e-4)


@pytest.mark.parametrize("hermitian", [False, True], ids=["symmetric", "hermitian"])
@pytest.mark.parametrize("dtype", [torch.complex64,
                                   pytest.param(torch.complex128, marks=pytest.mark.slow)])
def test_complex_ldl_factor_and_solve_match_eager(hermitian, dtype):
    """Complex matrices: complex symmetric (LAPACK sytrf, pivots by |Re| + |Im|) or Hermitian
    (hetrf: L D L^H). Each batch forces 2x2 pivots one way or another, and the parts LAPACK
    does not read (the upper triangle, a Hermitian diagonal's imaginary part) hold junk."""
    torch.manual_seed(1)
    a = torch.randn(4, 6, 6, dtype=dtype)
    a = a + (a.mH if hermitian else a.mT)
    a[0].diagonal().zero_()              # every pivot of an all-zero diagonal is 2x2
    a[1, 0, 0] = 1e-3                    # a tiny first pivot
    a[2, 2, 2] = 0
    a[3] = torch.tril(a[3]) + 50j * torch.triu(torch.ones(6, 6), 1)   # junk above
    a[3].diagonal().add_(7j if hermitian else 0)                        # (ignored if Hermitian)
    ld, piv, info = torch.linalg.ldl_factor_ex(a, hermitian=hermitian)
    assert (piv < 0).any() and (piv > 0).any()
    tol = 1e-4 if dtype == torch.complex64 else 1e-10
    got = torch.linalg.ldl_factor_ex(dev(a), hermitian=hermitian)
    assert_same(tuple(got), (ld, piv, info), tol, tol)
    b = torch.randn(4, 6, 3, dtype=dtype)
    want = torch.linalg.ldl_solve(ld, piv, b, hermitian=hermitian)
    assert_same(torch.linalg.ldl_solve(dev(ld), dev(piv), dev(b), hermitian=hermitian), want,
                10 * tol, 10 * tol)
