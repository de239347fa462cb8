"""Matrix products: mm, bmm, addmm, baddbmm, addbmm, matmul, dot, outer, einsum-shaped helpers.

Products run at full float32 precision (``Precision.HIGHEST``) so results match CPU eager.
"""
from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from ..lazy import tracer
from ._helpers import acc_dtype, cast, is_float, to
from .registry import aten, lowering

HIGHEST = lax.Precision.HIGHEST


def _acc(out_dtype):
    return acc_dtype(out_dtype) if is_float(out_dtype) else out_dtype


def _mm(a, b, out_dtype, keep_acc=False):
    prod = jnp.matmul(a, b, precision=HIGHEST, preferred_element_type=_acc(out_dtype))
    return prod if keep_acc else cast(prod, out_dtype)


@lowering(aten.mm.default, aten.bmm.default, aten.matmul.default, aten.dot.default,
          aten.mv.default, meta=True)
def mm(a, b, *, aval):
    return _mm(a, b, aval.dtype)


@lowering(aten.vdot.default, meta=True)
def vdot(a, b, *, aval):
    """``sum(conj(a) * b)``: the first operand conjugated (a no-op for real ones)."""
    return _mm(jnp.conj(a), b, aval.dtype)


def _scaled(inp, prod, beta, alpha, dtype):
    """beta * inp + alpha * prod computed in the accumulation dtype, rounded once to ``dtype``:
    eager's CPU kernels for bfloat16/half do the same (float opmath, one store)."""
    acc = _acc(dtype)
    prod = cast(prod, acc) * cast(alpha, acc)
    # beta == 0 ignores inp entirely (NaNs in it do not propagate), as in eager.
    scaled = jnp.where(beta == 0, jnp.zeros_like(prod), cast(inp, acc) * cast(beta, acc))
    return cast(scaled + prod, dtype)


@lowering(aten.addmm.default, aten.addmv.default, aten.baddbmm.default, meta=True)
def addmm(inp, a, b, *, beta=1, alpha=1, aval):
    prod = _mm(a, b, aval.dtype, keep_acc=True)
    return _scaled(jnp.broadcast_to(inp, aval.shape), prod, beta, alpha, aval.dtype)


@lowering(aten.addbmm.default, meta=True)
def addbmm(inp, a, b, *, beta=1, alpha=1, aval):
    prod = jnp.sum(_mm(a, b, aval.dtype), axis=0)
    return _scaled(jnp.broadcast_to(inp, aval.shape), prod, beta, alpha, aval.dtype)


@tracer.special(aten.addbmm_.default)
def addbmm_inplace(cls, func, args, kwargs):
    """``x.addbmm_(b1, b2)`` with ``x`` merely broadcastable to the product: CPU eager resizes
    ``x`` to the product's shape (its meta kernel raises instead)."""
    x, b1, b2 = args[:3]
    if b1.dim() != 3 or b2.dim() != 3 or tuple(x.shape) == (b1.shape[1], b2.shape[2]):
        return tracer.trace_mutation(cls, func, args, kwargs)
    out = aten.addbmm.default(x, b1, b2, *args[3:], **kwargs)
    tracer.rebind(x, out._value)
    return x


@lowering(aten.addr.default, meta=True)
def addr(inp, a, b, *, beta=1, alpha=1, aval):
    """Eager's kernel: beta * inp + (alpha * a_i) * b_j in the output dtype, op by op (bfloat16
    and half round after every operation, beta and alpha included)."""
    dt = aval.dtype
    if dt == jnp.bool_:
        a, b = to(dt, a, b)
        return (cast(inp, bool) & (beta != 0)) | (jnp.outer(a, b) & (alpha != 0))
    low = dt in (jnp.bfloat16, jnp.float16)
    work = jnp.float32 if low else dt
    info = jnp.finfo(dt) if low else None

    def rnd(x):
        return lax.reduce_precision(x, info.nexp, info.nmant) if low else x

    a, b, inp = to(work, a, b, jnp.broadcast_to(inp, aval.shape))
    beta_, alpha_ = rnd(cast(beta, work)), rnd(cast(alpha, work))
    prod = rnd(rnd(alpha_ * a)[:, None] * b[None, :])
    # beta == 0 ignores inp entirely (NaNs in it do not propagate), as in eager.
    return cast(jnp.where(beta == 0, prod, rnd(beta_ * inp) + prod), dt)


@lowering(aten.outer.default, aten.ger.default, meta=True)
def outer(a, b, *, aval):
    a, b = to(aval.dtype, a, b)
    return jnp.outer(a, b)
