"""Spectral decompositions and what is built on them: SVD, eigh, eig, pinv, lstsq, matrix_exp.

Singular and eigenvectors are unique only up to sign (phase): XLA's routines may pick other signs
than CPU eager's LAPACK; everything derived from them (pinv, lstsq, norms, ranks) is unique.
"""
from __future__ import annotations

import jax.numpy as jnp
import torch
from jax import lax

from ..lazy import tracer
from ._helpers import cast
from .host_values import to_device
from .linalg_decomp import is_vector_rhs, mH, matmul
from .registry import Rule, aten, lowering


def _eye(shape, dtype):
    return jnp.broadcast_to(jnp.eye(shape[-2], shape[-1], dtype=dtype), shape)


def svd(a, full_matrices=False, compute_uv=True):
    """(U, S, Vh) like LAPACK gesdd, empty matrices included (U/Vh become identities)."""
    m, n = a.shape[-2:]
    k = min(m, n)
    batch = a.shape[:-2]
    real = jnp.zeros((), a.dtype).real.dtype
    if 0 in a.shape:
        um, vn = (m, n) if full_matrices else (k, k)
        return (_eye(batch + (m, um), a.dtype), jnp.zeros(batch + (k,), real),
                _eye(batch + (vn, n), a.dtype))
    if not compute_uv:
        return None, lax.linalg.svd(a, full_matrices=False, compute_uv=False), None
    return tuple(lax.linalg.svd(a, full_matrices=full_matrices, compute_uv=True))


@lowering(aten._linalg_svd.default, meta=True)
def linalg_svd(a, full_matrices=False, compute_uv=True, *, driver=None, aval):
    u, s, vh = svd(a, full_matrices, compute_uv)
    if not compute_uv:
        u, vh = jnp.zeros(aval[0].shape, a.dtype), jnp.zeros(aval[2].shape, a.dtype)
    return u, s, vh


def eigh(a, lower=True):
    """(eigenvalues ascending, eigenvectors), reading one triangle like LAPACK syevd."""
    if 0 in a.shape:
        return jnp.zeros(a.shape[:-1], jnp.zeros((), a.dtype).real.dtype), a
    v, w = lax.linalg.eigh(a, lower=lower, symmetrize_input=False)
    return w, v


@lowering(aten._linalg_eigh.default, meta=True)
def linalg_eigh(a, UPLO="L", compute_v=True, *, aval):
    w, v = eigh(a, UPLO == "L")
    return w, (v if compute_v else jnp.zeros(aval[1].shape, a.dtype))


def eig(a, compute_v=True):
    cdt = jnp.result_type(a.dtype, jnp.complex64)
    if 0 in a.shape:
        return jnp.zeros(a.shape[:-1], cdt), jnp.zeros(a.shape, cdt)
    out = lax.linalg.eig(a, compute_left_eigenvectors=False, compute_right_eigenvectors=compute_v)
    return out[0], (out[1] if compute_v else None)


@lowering(aten.linalg_eig.default)
def linalg_eig(a):
    return eig(a)


@lowering(aten._linalg_eigvals.default, aten.linalg_eigvals.default)
def linalg_eigvals(a):
    return eig(a, compute_v=False)[0]


# ----------------------------------------------------------------------------------------------
# Pseudo-inverse: eager's formula (LinearAlgebra.cpp linalg_pinv) on XLA's SVD / eigh.

def _eps(dtype):
    return float(jnp.finfo(jnp.zeros((), dtype).real.dtype).eps)


def pinv(a, atol=None, rtol=None, hermitian=False):
    """``atol``/``rtol``: arrays, Python floats or None (eager's defaults: atol 0, rtol
    eps * max(m, n) unless a positive atol is given)."""
    m, n = a.shape[-2:]
    if 0 in a.shape:
        return jnp.zeros(a.shape[:-2] + (n, m), a.dtype)
    default_rtol = _eps(a.dtype) * max(m, n)
    if rtol is None:
        rtol = default_rtol if atol is None else jnp.where(jnp.asarray(atol) > 0, 0.0,
                                                           default_rtol)
    atol = 0.0 if atol is None else atol
    real = jnp.zeros((), a.dtype).real.dtype
    atol = jnp.asarray(atol)[..., None]
    rtol = jnp.asarray(rtol)[..., None]
    if hermitian:
        w, v = eigh(a)
        mag = jnp.abs(w)
        tol = jnp.maximum(atol, rtol * jnp.max(mag, axis=-1, keepdims=True))
        inv = jnp.where(mag > tol, 1 / w, 0).astype(a.dtype)
        return matmul(v * inv[..., None, :], mH(v))
    u, s, vh = svd(a)
    tol = jnp.maximum(atol, rtol * s[..., :1])
    inv = jnp.where(s > tol, 1 / s, 0).astype(real).astype(a.dtype)
    return matmul(mH(vh) * inv[..., None, :], mH(u))


@lowering(aten.linalg_pinv.atol_rtol_tensor, aten.linalg_pinv.atol_rtol_float, static=True)
def linalg_pinv(a, *, atol=None, rtol=None, hermitian=False):
    return pinv(a, atol, rtol, hermitian)


@lowering(aten.linalg_pinv.default, aten.linalg_pinv.rcond_tensor, static=True)
def linalg_pinv_rcond(a, rcond, hermitian=False):
    return pinv(a, 0.0, rcond, hermitian)


# ----------------------------------------------------------------------------------------------
# matrix_exp: eager's algorithm (Bader, Blanes, Casas 2019: optimised Taylor polynomials of degree
# 1, 2, 4, 8, 12 or 18 picked per matrix by its 1-norm, scaling and squaring above), so results
# agree with eager to rounding even where the exponential is ill-conditioned.

_THETAS = {4: (1.192092800768788e-07, 5.978858893805233e-04, 5.116619363445086e-02,
               5.800524627688768e-01, 1.461661507209034e+00, 3.010066362817634e+00),
           8: (2.220446049250313e-16, 2.580956802971767e-08, 3.397168839976962e-04,
               4.991228871115323e-02, 2.996158913811580e-01, 1.090863719290036e+00)}
_SQRT_177 = 0.1330413469565007072504e+2
_T12_B = ((9.0198e-16, 0.46932117595418237389, -0.20099424927047284052, -0.04623946134063071740),
          (5.31597895759871264183, 1.19926790417132231573, 0.01179296240992997031,
           0.01108844528519167989),
          (0.18188869982170434744, 0.05502798439925399070, 0.09351590770535414968,
           0.00610700528898058230),
          (-2.0861320e-13, -0.13181061013830184015, -0.02027855540589259079,
           -0.00675951846863086359))
_T18_B = ((0., -1.00365581030144618291e-01, -8.02924648241156932449e-03,
           -8.92138498045729985177e-04, 0.),
          (0., 3.97849749499645077844e-01, 1.36783778460411720168e+00,
           4.98289622525382669416e-01, -6.37898194594723280150e-04),
          (-1.09676396052962061844e+01, 1.68015813878906206114e+00, 5.71779846478865511061e-02,
           -6.98210122488052056106e-03, 3.34975017086070470649e-05),
          (-9.04316832390810593223e-02, -6.76404519071381882256e-02, 6.75961301770459654925e-02,
           2.95552570429315521194e-02, -1.39180257516060693404e-05),
          (0., 0., -9.23364619367118555360e-02, -1.69364939002081722752e-02,
           -1.40086798182036094347e-05))


def _combine(coeffs, mats):
    out = mats[0] * coeffs[0]
    for c, m in zip(coeffs[1:], mats[1:]):
        out = out + m * c
    return out


def _taylor(a):
    """T1, T2, T4, T8, T12, T18 of ``a``: eager's polynomial evaluations (compute_T*)."""
    eye = jnp.broadcast_to(jnp.eye(a.shape[-1], dtype=a.dtype), a.shape)
    a2 = matmul(a, a)
    a3 = matmul(a, a2)
    t1 = eye + a
    t2 = eye + a + a2 / 2
    t4 = eye + a + matmul(a2, _combine((1 / 2.0, 1 / 6.0, 1 / 24.0), (eye, a, a2)))
    x3 = 2.0 / 3.0
    x1, x2 = x3 * ((1 + _SQRT_177) / 88.0), x3 * ((1 + _SQRT_177) / 352.0)
    x4 = (-271.0 + 29.0 * _SQRT_177) / (315.0 * x3)
    x5 = (-11.0 + 11.0 * _SQRT_177) / (1260.0 * x3)
    x6 = (-99.0 + 11.0 * _SQRT_177) / (5040.0 * x3)
    x7 = (89.0 - _SQRT_177) / (5040.0 * x3)
    y2 = (857.0 - 58.0 * _SQRT_177) / 630.0
    a4 = matmul(a2, x1 * a + x2 * a2)
    a8 = matmul(x3 * a2 + a4, _combine((x4, x5, x6, x7), (eye, a, a2, a4)))
    t8 = eye + a + y2 * a2 + a8
    b = [_combine(row, (eye, a, a2, a3)) for row in _T12_B]
    b2 = b[2] + matmul(b[3], b[3])
    t12 = b[0] + matmul(b[1] + b2, b2)
    return t1, t2, t4, t8, t12


def _t18(a):
    eye = jnp.broadcast_to(jnp.eye(a.shape[-1], dtype=a.dtype), a.shape)
    a2 = matmul(a, a)
    a3 = matmul(a, a2)
    a6 = matmul(a3, a3)
    b = [_combine(row, (eye, a, a2, a3, a6)) for row in _T18_B]
    b3 = b[3] + matmul(b[0], b[4])
    return b[1] + matmul(b[2] + b3, b3)


def matrix_exp(a):
    # eager uses the float thresholds for float32 only (double ones for every other dtype)
    thetas = _THETAS[4 if jnp.zeros((), a.dtype).real.dtype == jnp.float32 else 8]
    norm = jnp.max(jnp.sum(jnp.abs(a), axis=-2), axis=-1)[..., None, None]
    t1, t2, t4, t8, t12 = _taylor(a)
    s = jnp.maximum(0, jnp.ceil(jnp.log2(norm / thetas[5]))).astype(jnp.int32)
    scaled = a / jnp.power(2.0, s).astype(a.dtype)
    sq = _t18(scaled)

    def square(carry):
        p, m = carry
        return p + 1, jnp.where(s > p, matmul(m, m), m)

    _, big = lax.while_loop(lambda c: c[0] < jnp.max(s), square, (jnp.int32(0), sq))
    bounds = (-1.0,) + thetas[:5]
    out = big
    for t, lo, hi in zip((t1, t2, t4, t8, t12), bounds[:5], bounds[1:]):
        out = jnp.where((lo < norm) & (norm <= hi), t, out)
    return out


@lowering(aten.linalg_matrix_exp.default)
def linalg_matrix_exp(a):
    if 0 in a.shape:
        return a
    if a.shape[-1] == 1:
        return jnp.exp(a)
    return matrix_exp(a)


# ----------------------------------------------------------------------------------------------
# lstsq: the residuals' shape depends on the computed rank (gelsd/gelss), so this is a special
# handler that may read the rank on the host, like eager does.

_DRIVERS = ("gels", "gelsy", "gelsd", "gelss")


def _lstsq(a, b, rcond, driver, vector, want_residuals):
    """(solution, residuals, rank, singular values) by SVD; ``rcond`` None -> eps * max(m, n)."""
    m, n = a.shape[-2:]
    if vector:
        b = b[..., None]
    a, b = _broadcast_batch(a, b)
    batch, k = a.shape[:-2], b.shape[-1]
    real = jnp.zeros((), a.dtype).real.dtype
    if rcond is None or rcond < 0:
        rcond = _eps(a.dtype) * max(m, n)
    if 0 in a.shape:
        x = jnp.zeros(batch + (n, k), a.dtype)
        s = jnp.zeros(batch + (min(m, n),), real)
        rank = jnp.zeros(batch, jnp.int64)
    else:
        u, s, vh = svd(a)
        keep = s > rcond * s[..., :1]
        inv = jnp.where(keep, 1 / jnp.where(keep, s, 1), 0).astype(a.dtype)
        x = matmul(mH(vh) * inv[..., None, :], matmul(mH(u), b))
        rank = jnp.sum(keep, axis=-1).astype(jnp.int64)
    res = jnp.sum(jnp.abs(matmul(a, x) - b) ** 2, axis=-2).astype(real) if want_residuals \
        else jnp.zeros((0,), real)
    return (x[..., 0] if vector else x, res,
            rank if driver != "gels" else jnp.zeros((0,), jnp.int64),
            s if driver in ("gelsd", "gelss") else jnp.zeros((0,), real))


def _broadcast_batch(a, b):
    batch = jnp.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    return jnp.broadcast_to(a, batch + a.shape[-2:]), jnp.broadcast_to(b, batch + b.shape[-2:])


_LSTSQ_RULE = Rule(_lstsq, "linalg_spectral.lstsq", static=True)


def _meta(shape, dtype):
    return torch.empty(tuple(shape), dtype=dtype, device="meta")


@tracer.special(aten.linalg_lstsq.default)
def _lstsq_special(cls, func, args, kwargs):
    bound = tracer.bind(func, args, kwargs)
    a, b = bound["self"], bound["b"]
    rcond, driver = bound.get("rcond"), bound.get("driver") or "gelsy"
    _check_lstsq(a, b, driver)
    vector = is_vector_rhs(a.shape, b.shape)
    m, n = a.shape[-2:]
    bm = b.unsqueeze(-1) if vector else b
    batch = torch.broadcast_shapes(a.shape[:-2], bm.shape[:-2])
    k = bm.shape[-1]
    real = a.dtype.to_real()
    residuals = m > n and driver != "gelsy"
    metas = [_meta(batch + ((n,) if vector else (n, k)), a.dtype),
             _meta(batch + (k,) if residuals else (0,), real),
             _meta(batch if driver != "gels" else (0,), torch.int64),
             _meta(batch + (min(m, n),) if driver in ("gelsd", "gelss") else (0,), real)]
    node = tracer.make_node(func, _LSTSQ_RULE, (a, b, rcond, driver, vector, residuals), {},
                            metas)
    out = list(tracer.wrap_outputs(cls, metas, node))
    if residuals and driver in ("gelsd", "gelss") and not bool(
            (tracer.materialize_cpu(out[2]) == n).all()):
        # eager returns residuals only when every matrix has full column rank
        out[1] = to_device(cls, torch.empty((0,), dtype=real))
    return tuple(out)


def _check_lstsq(a, b, driver):
    if a.dtype != b.dtype:
        name = tracer.type_name
        raise RuntimeError(f"torch.linalg.lstsq: Expected input and other to have the same dtype, "
                           f"but got input's dtype {name(a.dtype)} and other's dtype "
                           f"{name(b.dtype)}")
    if a.dim() < 2:
        raise RuntimeError(f"torch.linalg.lstsq: input must have at least 2 dimensions.")
    if b.dim() < 1:
        raise RuntimeError(f"torch.linalg.lstsq: other must have at least 1 dimension.")
    if driver not in _DRIVERS:
        raise RuntimeError("torch.linalg.lstsq: parameter `driver` should be one of "
                           "(gels, gelsy, gelsd, gelss)")
    vector = is_vector_rhs(a.shape, b.shape)
    rows = b.shape[-1] if vector else b.shape[-2]
    if rows != a.shape[-2]:
        raise RuntimeError(
            f"torch.linalg.lstsq: input.size(-2) should match other.size({-1 if vector else -2})")
    if a.dtype not in _LAPACK_DTYPES:         # (eager's LAPACK kernel, after its size checks)
        raise RuntimeError("This function doesn't handle types other than float and double")


_LAPACK_DTYPES = (torch.float32, torch.float64, torch.complex64, torch.complex128)
