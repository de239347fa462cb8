"""LDL^T with Bunch-Kaufman pivoting (``linalg.ldl_factor``/``ldl_solve``), as LAPACK sytrf/sytrs.

XLA has no sytrf, so this is LAPACK's unblocked algorithm (dsytf2 / dsytrs, lower triangle) as a
``while_loop`` whose step is one or two columns; it gives eager's pivots and compact ``LD`` layout
(D's 1x1 and 2x2 blocks on the diagonal, L's multipliers below; ``pivots`` 1-based, negative for
2x2 blocks). Complex matrices: with ``hermitian=False`` they are complex symmetric (csytrf/csytrs:
the same arithmetic, no conjugation), with ``hermitian=True`` Hermitian (chetrf/chetrs: L D L^H,
the lower triangle and the diagonal's real part read, D's diagonal real, the 2x2 step scaled by
|d21|); LAPACK picks their pivots by CABS1 = |Re| + |Im| (``_mag``).
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax

from .registry import aten, lowering

_ALPHA = (1 + math.sqrt(17)) / 8   # Bunch-Kaufman's growth bound


def _mag(z):
    """The magnitude LAPACK compares pivots by: |z|, or CABS1(z) = |Re z| + |Im z| for complex z
    (csytf2, icamax)."""
    return jnp.abs(z.real) + jnp.abs(z.imag) if jnp.iscomplexobj(z) else jnp.abs(z)


def _sym(s):
    """The symmetric matrix a lower triangle stands for."""
    return jnp.tril(s) + jnp.tril(s, -1).T


def _herm(s):
    """The Hermitian matrix a lower triangle stands for (the diagonal's real part)."""
    d = jnp.diagonal(s).real.astype(s.dtype)
    return jnp.tril(s, -1) + jnp.conj(jnp.tril(s, -1)).T + jnp.diag(d)


def _swap_trailing(s, k, i, j):
    """Swap rows and columns i and j of the trailing block s[k:, k:] (LAPACK's interchange)."""
    n = s.shape[-1]
    idx = jnp.arange(n)
    perm = jnp.where(idx == i, j, jnp.where(idx == j, i, idx))
    inside = (idx[:, None] >= k) & (idx[None, :] >= k)
    return jnp.where(inside, s[perm][:, perm], s)


def _factor_one(a, herm: bool = False):
    """sytf2 (uplo='L') on one n x n matrix: (LD, pivots, info); ``herm``: hetf2's LDL^H of a
    complex Hermitian matrix (its lower triangle and the real part of its diagonal)."""
    n = a.shape[-1]
    idx = jnp.arange(n)
    full = _herm if herm else _sym
    conj = jnp.conj if herm else (lambda x: x)

    def body(state):
        s, piv, info, k = state
        col = _mag(s[:, k])
        absakk = col[k]
        below = jnp.where(idx > k, col, -1)
        imax = jnp.argmax(below)
        colmax = jnp.where(k < n - 1, below[imax], 0)
        row = jnp.where((idx >= k) & (idx != imax), _mag(s[imax]), -1)
        rowmax = jnp.max(row)
        zero = (jnp.maximum(absakk, colmax) == 0) | jnp.isnan(absakk)
        no_swap = absakk >= _ALPHA * colmax
        keep_k = no_swap | (absakk >= _ALPHA * colmax * (colmax / rowmax))
        one_swap = _mag(s[imax, imax]) >= _ALPHA * rowmax
        kstep = jnp.where(zero | keep_k | one_swap, 1, 2)
        kp = jnp.where(zero | keep_k, k, imax)
        kk = k + kstep - 1
        s = jnp.where(zero, s, _swap_trailing(s, k, kk, kp))

        # 1x1 pivot: rank-1 update of the trailing block, column k becomes L's multipliers.
        r = 1 / s[k, k]
        x = jnp.where(idx > k, s[:, k], 0)
        trail = (idx[:, None] > k) & (idx[None, :] > k)
        s1 = jnp.where(trail, s - x[:, None] * (r * conj(x))[None, :], s)
        s1 = s1.at[:, k].set(jnp.where(idx > k, x * r, s1[:, k]))

        # 2x2 pivot on (k, k+1): LAPACK's formulas for W D^-1 and the rank-2 update.
        k1 = jnp.minimum(k + 1, n - 1)
        ck = jnp.where(idx > k1, s[:, k], 0)
        ck1 = jnp.where(idx > k1, s[:, k1], 0)
        if herm:            # hetf2: scaled by |d21|, whose phase stays in d21
            d = jnp.abs(s[k1, k])
            d11 = s[k1, k1].real / d
            d22 = s[k, k].real / d
            t = 1 / (d11 * d22 - 1)
            d21 = s[k1, k] / d
            d = t / d
            wk = d * (d11 * ck - d21 * ck1)
            wkp1 = d * (d22 * ck1 - jnp.conj(d21) * ck)
        else:
            d21 = s[k1, k]
            d11 = s[k1, k1] / d21
            d22 = s[k, k] / d21
            t = 1 / (d11 * d22 - 1)
            d21 = t / d21
            wk = d21 * (d11 * ck - ck1)
            wkp1 = d21 * (d22 * ck1 - ck)
        trail2 = (idx[:, None] > k1) & (idx[None, :] > k1)
        s2 = jnp.where(trail2, s - (ck[:, None] * conj(wk)[None, :]
                                    + ck1[:, None] * conj(wkp1)[None, :]), s)
        s2 = s2.at[:, k].set(jnp.where(idx > k1, wk, s2[:, k]))
        s2 = s2.at[:, k1].set(jnp.where(idx > k1, wkp1, s2[:, k1]))

        s = jnp.where(zero, s, jnp.where(kstep == 1, s1, s2))
        s = full(s)
        info = jnp.where(zero & (info == 0), k + 1, info)
        p1 = (kp + 1).astype(jnp.int32)
        piv = jnp.where(kstep == 1, piv.at[k].set(p1),
                        piv.at[k].set(-p1).at[k1].set(-p1))
        return s, piv, info, k + kstep

    state = (full(a), jnp.zeros((n,), jnp.int32), jnp.int32(0), jnp.int32(0))
    s, piv, info, _ = lax.while_loop(lambda st: st[3] < n, body, state)
    return jnp.tril(s), piv, info


def _batched(fn, *xs, core):
    """Apply a one-matrix ``fn`` over the (broadcast) batch dims of ``xs``."""
    batch = jnp.broadcast_shapes(*(x.shape[:x.ndim - c] for x, c in zip(xs, core)))
    flat = [jnp.broadcast_to(x, batch + x.shape[x.ndim - c:]).reshape(
        (-1,) + x.shape[x.ndim - c:]) for x, c in zip(xs, core)]
    outs = jax.vmap(fn)(*flat)
    if not isinstance(outs, tuple):
        return outs.reshape(batch + outs.shape[1:])
    return tuple(o.reshape(batch + o.shape[1:]) for o in outs)


@lowering(aten.linalg_ldl_factor_ex.default, meta=True)
def linalg_ldl_factor_ex(a, *, hermitian=False, check_errors=False, aval):
    if 0 in a.shape:
        return (jnp.zeros(aval[0].shape, a.dtype), jnp.zeros(aval[1].shape, jnp.int32),
                jnp.zeros(aval[2].shape, jnp.int32))
    herm = bool(hermitian) and jnp.iscomplexobj(a)    # (ignored for real matrices, as in eager)
    return _batched(functools.partial(_factor_one, herm=herm), a, core=(2,))


def _swap_rows(b, i, j):
    idx = jnp.arange(b.shape[0])
    perm = jnp.where(idx == i, j, jnp.where(idx == j, i, idx))
    return b[perm]


def _solve_one(ld, piv, b, herm: bool = False):
    """sytrs (uplo='L'): A x = b for A = L D L^T as ``_factor_one`` left it; ``herm``: hetrs,
    for A = L D L^H."""
    n = ld.shape[-1]
    idx = jnp.arange(n)
    conj = jnp.conj if herm else (lambda x: x)

    def forward(state):   # L D y = b
        b, k = state
        two = piv[k] < 0
        k1 = jnp.minimum(k + 1, n - 1)
        # 1x1
        kp = piv[k] - 1
        b1 = _swap_rows(b, k, kp)
        l = jnp.where(idx > k, ld[:, k], 0)
        b1 = b1 - l[:, None] * b1[k][None, :]
        b1 = b1.at[k].set(b1[k] / ld[k, k])
        # 2x2
        kp2 = -piv[k] - 1
        b2 = _swap_rows(b, k1, kp2)
        l0 = jnp.where(idx > k1, ld[:, k], 0)
        l1 = jnp.where(idx > k1, ld[:, k1], 0)
        b2 = b2 - l0[:, None] * b2[k][None, :]
        b2 = b2 - l1[:, None] * b2[k1][None, :]
        akm1k = ld[k1, k]
        # D's block is [[d11, conj(e)], [e, d22]] (e = akm1k): its first row over conj(e)
        akm1 = ld[k, k] / conj(akm1k)
        ak = ld[k1, k1] / akm1k
        denom = akm1 * ak - 1
        bkm1, bk = b2[k] / conj(akm1k), b2[k1] / akm1k
        b2 = b2.at[k].set((ak * bkm1 - bk) / denom).at[k1].set((akm1 * bk - bkm1) / denom)
        return jnp.where(two, b2, b1), k + jnp.where(two, 2, 1)

    def backward(state):  # L^T x = y
        b, k = state
        two = piv[k] < 0
        km1 = jnp.maximum(k - 1, 0)
        below = (idx > k)[:, None]

        def dot(col):   # col[k+1:] @ b[k+1:] without touching rows <= k (they may be inf)
            return jnp.sum(jnp.where(below, conj(col)[:, None] * b, 0), axis=0)
        b = b.at[k].set(b[k] - dot(ld[:, k]))
        b = jnp.where(two, b.at[km1].set(b[km1] - dot(ld[:, km1])), b)
        kp = jnp.where(two, -piv[k], piv[k]) - 1
        return _swap_rows(b, k, kp), k - jnp.where(two, 2, 1)

    y, _ = lax.while_loop(lambda st: st[1] < n, forward, (b, jnp.int32(0)))
    x, _ = lax.while_loop(lambda st: st[1] >= 0, backward, (y, jnp.int32(n - 1)))
    return x


@lowering(aten.linalg_ldl_solve.default, meta=True)
def linalg_ldl_solve(ld, pivots, b, *, hermitian=False, aval):
    if 0 in aval.shape or 0 in ld.shape:
        return jnp.zeros(aval.shape, aval.dtype)
    herm = bool(hermitian) and jnp.iscomplexobj(ld)
    out = _batched(functools.partial(_solve_one, herm=herm), ld, pivots, b, core=(2, 1, 2))
    return jnp.broadcast_to(out, aval.shape)
