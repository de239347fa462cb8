"""Matrix factorisations and the solvers built on them: LU, triangular, Cholesky, QR/Householder.

Outputs follow LAPACK's conventions as CPU eager returns them: LU pivots are 1-based int32 row
swaps, ``info`` is LAPACK's (0 = success, i = first zero pivot / non-positive leading minor).
``_linalg_check_errors`` raises eager's error only where ``info`` is already known on the host:
checking a pending ``info`` would cost a graph run per call, so (as on torch_xla) it is skipped,
and a singular or non-positive-definite matrix gives inf/NaN instead of LinAlgError.
"""
from __future__ import annotations

import jax.numpy as jnp
import torch
from jax import lax
from jax._src.lax import linalg as _lax_linalg

from ..lazy import tracer
from ..lazy.ir import DeviceData
from ..lazy.tensor import LazyTensor
from ._helpers import cast
from .registry import aten, lowering

HIGHEST = lax.Precision.HIGHEST


# ----------------------------------------------------------------------------------------------
# Shared pieces.

def mT(x):
    return jnp.swapaxes(x, -1, -2)


def mH(x):
    return jnp.conj(mT(x)) if jnp.iscomplexobj(x) else mT(x)


def matmul(a, b):
    return jnp.matmul(a, b, precision=HIGHEST)


def batch_broadcast(*xs_and_core):
    """Broadcast the batch dims of ``(array, core_ndim)`` pairs against each other."""
    batch = jnp.broadcast_shapes(*(x.shape[:x.ndim - k] for x, k in xs_and_core))
    return [jnp.broadcast_to(x, batch + x.shape[x.ndim - k:]) for x, k in xs_and_core]


def empty_or(aval, fn):
    """``fn()`` unless the output is empty in eager (then zeros of its shape: no work done)."""
    if 0 in aval.shape:
        return jnp.zeros(aval.shape, aval.dtype)
    return fn()


def tri_solve(a, b, *, lower, left=True, transpose=False, unit=False):
    """op(a) x = b (left) or x op(a) = b, reading only one triangle of ``a``; batch-broadcast."""
    a, b = batch_broadcast((a, 2), (b, 2))
    if 0 in a.shape or 0 in b.shape:
        return jnp.zeros(b.shape, jnp.result_type(a, b))
    return lax.linalg.triangular_solve(a, b, left_side=left, lower=lower, transpose_a=transpose,
                                       conjugate_a=transpose and jnp.iscomplexobj(a),
                                       unit_diagonal=unit)


# ----------------------------------------------------------------------------------------------
# LU.

def lu_factor(a):
    """(LU, 0-based pivots, permutation) with ``a[perm] == L @ U``; empty matrices included."""
    m, n = a.shape[-2:]
    if 0 in a.shape:
        batch = a.shape[:-2]
        return (a, jnp.zeros(batch + (min(m, n),), jnp.int32),
                jnp.broadcast_to(jnp.arange(m, dtype=jnp.int32), batch + (m,)))
    return lax.linalg.lu(a)


def lu_info(lu):
    """LAPACK getrf's info: 1 + the index of the first exactly-zero diagonal entry of U, else 0."""
    d = jnp.diagonal(lu, axis1=-2, axis2=-1)
    if d.shape[-1] == 0:
        return jnp.zeros(d.shape[:-1], jnp.int32)
    zero = d == 0
    first = jnp.argmax(zero, axis=-1).astype(jnp.int32) + 1
    return jnp.where(jnp.any(zero, axis=-1), first, 0).astype(jnp.int32)


def permute_rows(x, perm):
    return jnp.take_along_axis(x, perm[..., :, None], axis=-2)


def lu_solve(lu, perm, b, *, adjoint=False):
    """Solve A x = b (or A^H x = b) where A[perm] = L U; batch dims broadcast."""
    lu, perm_b, b = batch_broadcast((lu, 2), (perm, 1), (b, 2))
    if 0 in b.shape or 0 in lu.shape:
        return jnp.zeros(b.shape, jnp.result_type(lu, b))
    if not adjoint:
        y = tri_solve(lu, permute_rows(b, perm_b), lower=True, unit=True)
        return tri_solve(lu, y, lower=False)
    z = tri_solve(lu, b, lower=False, transpose=True)
    w = tri_solve(lu, z, lower=True, unit=True, transpose=True)
    return permute_rows(w, jnp.argsort(perm_b, axis=-1))


def pivots_to_perm(pivots, m):
    """LAPACK's 1-based sequential row swaps -> the permutation ``perm`` (``A[perm] = L U``)."""
    if pivots.shape[-1] == 0 or m == 0:
        return jnp.broadcast_to(jnp.arange(m, dtype=jnp.int32), pivots.shape[:-1] + (m,))
    return lax.linalg.lu_pivots_to_permutation(cast(pivots, jnp.int32) - 1, m)


def perm_matrix(perm, dtype):
    """P with ``A = P @ L @ U`` for ``A[perm] = L @ U``: column j of P is e_{perm[j]}."""
    m = perm.shape[-1]
    return mT(jnp.asarray(perm[..., :, None] == jnp.arange(m), dtype))


@lowering(aten.linalg_lu_factor_ex.default, meta=True)
def linalg_lu_factor_ex(a, *, pivot=True, check_errors=False, aval):
    lu, piv, _ = lu_factor(a)
    return lu, piv + 1, lu_info(lu)


@lowering(aten.linalg_lu.default, meta=True)
def linalg_lu(a, *, pivot=True, aval):
    p_aval, l_aval, u_aval = aval
    m, n = a.shape[-2:]
    k = min(m, n)
    lu, _, perm = lu_factor(a)
    lower = jnp.tril(lu[..., :, :k], -1) + jnp.eye(m, k, dtype=lu.dtype)
    upper = jnp.triu(lu[..., :k, :])
    return perm_matrix(perm, p_aval.dtype), lower, upper


@lowering(aten.lu_unpack.default, meta=True)
def lu_unpack(lu, pivots, unpack_data=True, unpack_pivots=True, *, aval):
    p_aval, l_aval, u_aval = aval
    m, n = lu.shape[-2:]
    k = min(m, n)
    if unpack_data:
        lower = jnp.tril(lu[..., :, :k], -1) + jnp.eye(m, k, dtype=lu.dtype)
        upper = jnp.triu(lu[..., :k, :])
    else:
        lower, upper = jnp.zeros(l_aval.shape, lu.dtype), jnp.zeros(u_aval.shape, lu.dtype)
    if unpack_pivots:
        perm = pivots_to_perm(pivots, m)
        p = jnp.broadcast_to(perm_matrix(perm, lu.dtype), p_aval.shape)
    else:
        p = jnp.zeros(p_aval.shape, lu.dtype)
    return p, lower, upper


@lowering(aten.linalg_lu_solve.default, meta=True)
def linalg_lu_solve(lu, pivots, b, *, left=True, adjoint=False, aval):
    def solve():
        perm = pivots_to_perm(pivots, lu.shape[-1])
        if left:
            return lu_solve(lu, perm, b, adjoint=adjoint)
        # x A = b  <=>  A^H x^H = b^H;  x A^H = b  <=>  A x^H = b^H
        return mH(lu_solve(lu, perm, mH(b), adjoint=not adjoint))
    return empty_or(aval, solve)


def _det_from_lu(lu, piv0):
    d = jnp.diagonal(lu, axis1=-2, axis2=-1)
    swaps = jnp.sum(piv0 != jnp.arange(piv0.shape[-1], dtype=piv0.dtype), axis=-1)
    parity = jnp.where(swaps % 2 == 0, 1, -1).astype(lu.dtype)
    return d, parity


@lowering(aten._linalg_det.default, meta=True)
def linalg_det(a, *, aval):
    lu, piv, _ = lu_factor(a)
    d, parity = _det_from_lu(lu, piv)
    return parity * jnp.prod(d, axis=-1), lu, piv + 1


@lowering(aten._linalg_slogdet.default, meta=True)
def linalg_slogdet(a, *, aval):
    lu, piv, _ = lu_factor(a)
    d, parity = _det_from_lu(lu, piv)
    absd = jnp.abs(d)
    sign = parity * jnp.prod(jnp.where(absd == 0, 0, d / jnp.where(absd == 0, 1, absd)), axis=-1)
    return sign, jnp.sum(jnp.log(absd), axis=-1), lu, piv + 1


@lowering(aten.linalg_inv_ex.default, meta=True)
def linalg_inv_ex(a, *, check_errors=False, aval):
    lu, _, perm = lu_factor(a)
    eye = jnp.broadcast_to(jnp.eye(a.shape[-1], dtype=a.dtype), a.shape)
    return lu_solve(lu, perm, eye), lu_info(lu)


def is_vector_rhs(a_shape, b_shape) -> bool:
    """torch's linalg_solve_is_vector_rhs: b is (n,) or a batch of vectors shaped A.shape[:-1]."""
    return len(b_shape) == 1 or (len(b_shape) == len(a_shape) - 1 and
                                 tuple(b_shape) == tuple(a_shape[:-1]))


@lowering(aten._linalg_solve_ex.default, meta=True)
def linalg_solve_ex(a, b, *, left=True, check_errors=False, aval):
    """The LU and pivots outputs (which autograd reuses) are those of A itself, as in eager."""
    vector = is_vector_rhs(a.shape, b.shape)
    lu, piv, perm = lu_factor(a)
    rhs = b[..., None] if vector else b
    x = lu_solve(lu, perm, rhs) if left else mH(lu_solve(lu, perm, mH(rhs), adjoint=True))
    x = x[..., 0] if vector else x
    return (jnp.broadcast_to(x, aval[0].shape), jnp.broadcast_to(lu, aval[1].shape),
            jnp.broadcast_to(piv + 1, aval[2].shape), jnp.broadcast_to(lu_info(lu), aval[3].shape))


@tracer.special(aten._linalg_check_errors.default)
def _check_errors(cls, func, args, kwargs):
    """Eager's LinAlgError where ``info`` is already on the host; skipped while it is pending."""
    info = args[0]
    if isinstance(info, LazyTensor):
        if type(info._value.node) is not DeviceData:
            return None
        info = tracer.materialize_cpu(info)
    return func(info, *args[1:], **kwargs)


# ----------------------------------------------------------------------------------------------
# Triangular solves.

@lowering(aten.linalg_solve_triangular.default, meta=True)
def linalg_solve_triangular(a, b, *, upper, left=True, unitriangular=False, aval):
    return empty_or(aval, lambda: tri_solve(a, b, lower=not upper, left=left, unit=unitriangular))


@lowering(aten.triangular_solve.default, meta=True)
def triangular_solve(b, a, upper=True, transpose=False, unitriangular=False, *, aval):
    x_aval, a_aval = aval
    x = empty_or(x_aval, lambda: tri_solve(a, b, lower=not upper, transpose=transpose,
                                           unit=unitriangular))
    return x, jnp.broadcast_to(a, a_aval.shape)


# ----------------------------------------------------------------------------------------------
# Cholesky.

def _cholesky_info(a):
    """potrf's info for a lower-triangle input: 1 + first step whose pivot is not positive."""
    n = a.shape[-1]
    a = jnp.tril(a) + mH(jnp.tril(a, -1))

    def step(k, carry):
        l, info = carry
        col = l[..., :, k]
        piv = jnp.real(col[..., k])
        bad = ~(piv > 0) & (info == 0)
        info = jnp.where(bad, k + 1, info)
        safe = jnp.where(piv > 0, jnp.sqrt(jnp.where(piv > 0, piv, 1)), 1)
        below = jnp.where(jnp.arange(n) > k, col, 0) / safe[..., None]
        upd = below[..., :, None] * jnp.conj(below[..., None, :])
        return l - upd, info

    info0 = jnp.zeros(a.shape[:-2], jnp.int32)
    return lax.fori_loop(0, n, step, (a, info0))[1]


def cholesky(a, upper=False):
    """(factor, info): reads only the lower (upper) triangle, like LAPACK potrf."""
    if 0 in a.shape:
        return a, jnp.zeros(a.shape[:-2], jnp.int32)
    src = mH(a) if upper else a   # the lower triangle of A^H is the conjugated upper of A
    low = lax.linalg.cholesky(src, symmetrize_input=False)
    ok = jnp.all(jnp.isfinite(low))
    info = lax.cond(ok, lambda s: jnp.zeros(s.shape[:-2], jnp.int32), _cholesky_info, src)
    low = jnp.tril(low)
    return (mH(low) if upper else low), info


@lowering(aten.linalg_cholesky_ex.default, meta=True)
def linalg_cholesky_ex(a, *, upper=False, check_errors=False, aval):
    return cholesky(a, upper)


@lowering(aten.cholesky.default)
def cholesky_(a, upper=False):
    return cholesky(a, upper)[0]


def _chol_solve(factor, b, upper):
    """A x = b for A = L L^H (or U^H U)."""
    if upper:
        y = tri_solve(factor, b, lower=False, transpose=True)
        return tri_solve(factor, y, lower=False)
    y = tri_solve(factor, b, lower=True)
    return tri_solve(factor, y, lower=True, transpose=True)


@lowering(aten.cholesky_solve.default, meta=True)
def cholesky_solve(b, factor, upper=False, *, aval):
    return empty_or(aval, lambda: _chol_solve(factor, b, upper))


@lowering(aten.cholesky_inverse.default, meta=True)
def cholesky_inverse(factor, upper=False, *, aval):
    eye = jnp.broadcast_to(jnp.eye(factor.shape[-1], dtype=factor.dtype), factor.shape)
    return empty_or(aval, lambda: _chol_solve(factor, eye, upper))


# ----------------------------------------------------------------------------------------------
# QR and Householder reflectors.

@lowering(aten.linalg_qr.default, meta=True)
def linalg_qr(a, mode="reduced", *, aval):
    q_aval, r_aval = aval
    if 0 in a.shape:
        m, n = a.shape[-2:]
        q = jnp.broadcast_to(jnp.eye(*q_aval.shape[-2:], dtype=a.dtype), q_aval.shape) \
            if mode == "complete" else jnp.zeros(q_aval.shape, a.dtype)
        return q, jnp.zeros(r_aval.shape, a.dtype)
    q, r = lax.linalg.qr(a, full_matrices=(mode == "complete"))
    if mode == "r":
        q = jnp.zeros(q_aval.shape, a.dtype)
    return q, r


def _geqrf_meta(a):
    """geqrf has no meta kernel in torch 2.13: (a, tau) shaped like LAPACK's."""
    m, n = a.shape[-2:]
    out = torch.empty_strided(a.shape, _column_major(a.shape), dtype=a.dtype, device="meta")
    return out, a.new_empty(a.shape[:-2] + (min(m, n),))


def _column_major(shape):
    strides = [1] * len(shape)
    if len(shape) >= 2:
        strides[-1] = max(shape[-2], 1)
        acc = max(shape[-2], 1) * max(shape[-1], 1)
        for i in range(len(shape) - 3, -1, -1):
            strides[i] = acc
            acc *= max(shape[i], 1)
    return tuple(strides)


if not torch._C._dispatch_has_kernel_for_dispatch_key("aten::geqrf", "Meta"):
    _META_LIB = torch.library.Library("aten", "IMPL")
    _META_LIB.impl("geqrf", _geqrf_meta, "Meta")


def geqrf(a):
    if 0 in a.shape:
        return a, jnp.zeros(a.shape[:-2] + (min(a.shape[-2:]),), a.dtype)
    return _lax_linalg.geqrf(a)


@lowering(aten.geqrf.default)
def geqrf_(a):
    return geqrf(a)


def householder_product(a, tau):
    """Q = H_1 ... H_k (first n columns), H_i = I - tau_i v_i v_i^H, as LAPACK orgqr."""
    if 0 in a.shape:
        return jnp.zeros(a.shape, a.dtype)
    if tau.shape[-1] == 0:
        return jnp.broadcast_to(jnp.eye(*a.shape[-2:], dtype=a.dtype), a.shape)
    return lax.linalg.householder_product(a, tau)


@lowering(aten.linalg_householder_product.default)
def linalg_householder_product(a, tau):
    return householder_product(a, tau)


@lowering(aten.ormqr.default, meta=True)
def ormqr(a, tau, c, left=True, transpose=False, *, aval):
    """op(Q) c or c op(Q), Q = H_1 ... H_k from geqrf's (a, tau), Q of order rows/cols of c."""
    def run():
        mn = c.shape[-2] if left else c.shape[-1]
        k = tau.shape[-1]
        # Q as a full mn x mn matrix: pad the reflectors with identity ones.
        refl = jnp.zeros(a.shape[:-2] + (mn, mn), a.dtype).at[..., :, :k].set(a[..., :mn, :k])
        taus = jnp.zeros(tau.shape[:-1] + (mn,), tau.dtype).at[..., :k].set(tau)
        q = householder_product(refl, taus)
        q = mH(q) if transpose else q
        return matmul(q, c) if left else matmul(c, q)
    return empty_or(aval, run)
