"""LU, triangular, Cholesky and QR factorisations and solvers match CPU eager, with no CPU fallback."""
from __future__ import annotations

import pytest
import torch

import xla_compat as xc
from xla_compat import paths, settings
from tests.conftest import assert_same
from tests.lowering._core import core_no_fallback, dev  # noqa: F401 (autouse fixture)

RTOL, ATOL = 1e-5, 1e-5


def well_conditioned(*shape, seed=0):
    torch.manual_seed(seed)
    a = torch.randn(*shape)
    n = shape[-1]
    return a + n * torch.eye(n) if shape[-2] == n else a


def spd(*shape, seed=0):
    a = well_conditioned(*shape, seed=seed)
    return a @ a.mT + torch.eye(shape[-1])


# -- LU -------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(4, 4), (5, 3), (3, 5), (2, 4, 4), (0, 0), (0, 3, 3)])
def test_lu_factor_gives_eager_lu_pivots_and_info(shape):
    a = torch.randn(*shape)
    assert_same(tuple(torch.linalg.lu_factor_ex(dev(a))), tuple(torch.linalg.lu_factor_ex(a)),
                RTOL, ATOL)


def test_lu_factor_info_names_the_first_zero_pivot():
    a = torch.tensor([[1., 2., 3.], [2., 4., 6.], [1., 1., 1.]])   # rank 2
    lu, piv, info = torch.linalg.lu_factor_ex(a)
    assert_same(torch.linalg.lu_factor_ex(dev(a)).info, info)
    assert int(info) == 3


@pytest.mark.parametrize("shape", [(4, 4), (5, 3), (3, 5), (2, 3, 4)])
def test_linalg_lu_and_lu_unpack_give_p_l_u(shape):
    a = torch.randn(*shape)
    assert_same(tuple(torch.linalg.lu(dev(a))), tuple(torch.linalg.lu(a)), RTOL, ATOL)
    lu, piv = torch.linalg.lu_factor(a)
    assert_same(tuple(torch.lu_unpack(dev(lu), dev(piv))), tuple(torch.lu_unpack(lu, piv)))


@pytest.mark.parametrize("left", [True, False])
@pytest.mark.parametrize("adjoint", [True, False])
def test_lu_solve_every_side_and_adjoint_with_batch_broadcast(left, adjoint):
    a = well_conditioned(2, 4, 4)
    b = torch.randn(4, 3) if left else torch.randn(3, 4)
    lu, piv = torch.linalg.lu_factor(a)
    expected = torch.linalg.lu_solve(lu, piv, b, left=left, adjoint=adjoint)
    actual = torch.linalg.lu_solve(dev(lu), dev(piv), dev(b), left=left, adjoint=adjoint)
    assert_same(actual, expected, 1e-4, 1e-5)


def test_det_slogdet_logdet_including_singular_and_negative():
    a = well_conditioned(3, 4, 4)
    a[1] = -a[1]
    a[2, :, 1] = 0                                      # exactly singular
    assert_same(torch.linalg.det(dev(a)), torch.linalg.det(a), 1e-5, 1e-4)
    assert_same(tuple(torch.linalg.slogdet(dev(a))), tuple(torch.linalg.slogdet(a)), 1e-5, 1e-4)
    assert_same(torch.logdet(dev(a)), torch.logdet(a), 1e-5, 1e-4)   # nan for det < 0
    assert_same(torch.linalg.det(dev(torch.empty(0, 0))), torch.tensor(1.0))


def test_inv_and_solve_vector_and_matrix_right_hand_sides():
    a = well_conditioned(2, 4, 4)
    assert_same(torch.linalg.inv(dev(a)), torch.linalg.inv(a), 1e-5, 1e-5)
    for b in (torch.randn(4), torch.randn(2, 4), torch.randn(4, 3), torch.randn(1, 4, 3)):
        assert_same(torch.linalg.solve(dev(a), dev(b)), torch.linalg.solve(a, b), 1e-5, 1e-5)
    b = torch.randn(2, 3, 4)
    assert_same(torch.linalg.solve(dev(a), dev(b), left=False),
                torch.linalg.solve(a, b, left=False), 1e-5, 1e-5)


def test_solve_backward_matches_eager():
    a, b = well_conditioned(4, 4), torch.randn(4, 2)
    a.requires_grad_(True)
    torch.linalg.solve(a, b).sum().backward()
    da = dev(a.detach()).requires_grad_(True)
    torch.linalg.solve(da, dev(b)).sum().backward()
    assert_same(da.grad, a.grad, 1e-4, 1e-5)


def test_singular_inverse_error_is_deferred_not_a_fallback():
    """A pending info is not read back (that would cost a graph run per call): like torch_xla,
    inv of a singular matrix gives inf/nan instead of LinAlgError; the _ex variant reports it."""
    a = torch.zeros(3, 3)
    with pytest.raises(torch.linalg.LinAlgError):
        torch.linalg.inv(a)
    inv, info = torch.linalg.inv_ex(dev(a))
    assert int(info.cpu()) == 1
    assert not torch.isfinite(torch.linalg.inv(dev(a)).cpu()).all()


def test_check_errors_on_materialised_info_raises_eagers_error():
    info = dev(torch.tensor(2, dtype=torch.int32))
    xc.sync()
    with pytest.raises(torch.linalg.LinAlgError, match="singular"):
        torch.ops.aten._linalg_check_errors(info, "linalg.inv", is_matrix=True)


# -- triangular ---------------------------------------------------------------------------------

@pytest.mark.parametrize("upper", [True, False])
@pytest.mark.parametrize("left", [True, False])
@pytest.mark.parametrize("unit", [True, False])
def test_solve_triangular_reads_only_its_triangle(upper, left, unit):
    a = well_conditioned(2, 4, 4)          # both triangles populated: the other must be ignored
    b = torch.randn(4, 3) if left else torch.randn(3, 4)
    expected = torch.linalg.solve_triangular(a, b, upper=upper, left=left, unitriangular=unit)
    actual = torch.linalg.solve_triangular(dev(a), dev(b), upper=upper, left=left,
                                           unitriangular=unit)
    assert_same(actual, expected, 1e-5, 1e-5)


@pytest.mark.parametrize("transpose", [True, False])
def test_triangular_solve_returns_solution_and_cloned_coefficient(transpose):
    a, b = well_conditioned(4, 4), torch.randn(2, 4, 3)
    expected = torch.triangular_solve(b, a, upper=False, transpose=transpose)
    actual = torch.triangular_solve(dev(b), dev(a), upper=False, transpose=transpose)
    assert_same(tuple(actual), tuple(expected), 1e-5, 1e-5)


# -- Cholesky -----------------------------------------------------------------------------------

@pytest.mark.parametrize("upper", [True, False])
def test_cholesky_family(upper):
    a = spd(2, 4, 4)
    a_lower_only = a.tril() + 7 * torch.ones(4, 4).triu(1)   # garbage above: eager ignores it
    src = a.triu() + 7 * torch.ones(4, 4).tril(-1) if upper else a_lower_only
    assert_same(torch.linalg.cholesky(dev(src), upper=upper),
                torch.linalg.cholesky(src, upper=upper), 1e-5, 1e-5)
    f = torch.linalg.cholesky(a, upper=upper)
    b = torch.randn(4, 2)
    assert_same(torch.cholesky_solve(dev(b), dev(f), upper=upper),
                torch.cholesky_solve(b, f, upper=upper), 1e-4, 1e-5)
    assert_same(torch.cholesky_inverse(dev(f[0]), upper=upper),
                torch.cholesky_inverse(f[0], upper=upper), 1e-4, 1e-5)
    assert_same(torch.cholesky(dev(a), upper=upper), torch.cholesky(a, upper=upper), 1e-5, 1e-5)


def test_cholesky_ex_info_is_the_first_non_positive_minor():
    a = spd(4, 4)
    a[2, 2] = -50.0
    assert int(torch.linalg.cholesky_ex(dev(a)).info.cpu()) == \
        int(torch.linalg.cholesky_ex(a).info) == 3


# -- QR and Householder -------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["reduced", "complete", "r"])
@pytest.mark.parametrize("shape", [(5, 3), (3, 5), (2, 4, 4)])
def test_qr_modes(mode, shape):
    a = torch.randn(*shape)
    assert_same(tuple(torch.linalg.qr(dev(a), mode=mode)), tuple(torch.linalg.qr(a, mode=mode)),
                1e-5, 1e-5)


def test_geqrf_householder_product_and_ormqr():
    a = torch.randn(2, 5, 3)
    g, tau = torch.geqrf(a)
    assert_same(tuple(torch.geqrf(dev(a))), (g, tau), 1e-5, 1e-5)
    assert_same(torch.linalg.householder_product(dev(g), dev(tau)),
                torch.linalg.householder_product(g, tau), 1e-5, 1e-5)
    assert_same(torch.linalg.householder_product(dev(g), dev(tau[..., :2])),
                torch.linalg.householder_product(g, tau[..., :2]), 1e-5, 1e-5)
    c = torch.randn(2, 5, 2)
    for left, transpose in [(True, False), (True, True)]:
        assert_same(torch.ormqr(dev(g), dev(tau), dev(c), left=left, transpose=transpose),
                    torch.ormqr(g, tau, c, left=left, transpose=transpose), 1e-5, 1e-5)
    c = torch.randn(2, 3, 5)
    assert_same(torch.ormqr(dev(g), dev(tau), dev(c), left=False, transpose=True),
                torch.ormqr(g, tau, c, left=False, transpose=True), 1e-5, 1e-5)


def test_factorisations_run_as_one_graph_without_fallback():
    a = well_conditioned(4, 4)
    x = dev(a)
    out = [torch.linalg.inv(x), torch.linalg.det(x), torch.linalg.qr(x).R,
           torch.linalg.cholesky(x @ x.mT)]
    xc.sync(out)
    assert not [k for k in xc.metrics.counters() if k.startswith("aten::")]
