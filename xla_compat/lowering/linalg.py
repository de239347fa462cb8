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


def _mm(a, b, out_dtype):
    acc = acc_dtype(out_dtype) if is_float(out_dtype) else out_dtype
    return cast(jnp.matmul(a, b, precision=HIGHEST, preferred_element_type=acc), out_dtype)


@lowering(aten.mm.default, aten.bmm.default, aten.matmul.default, aten.dot.default,
          aten.vdot.default, aten.mv.default, meta=True)
def mm(a, b, *, aval):
    return _mm(a, b, aval.dtype)


def _scaled(inp, prod, beta, alpha, dtype):
    prod = prod * cast(alpha, dtype)
    # beta == 0 ignores inp entirely (NaNs in it do not propagate), as in eager.
    scaled = jnp.where(beta == 0, jnp.zeros_like(prod), cast(inp, dtype) * cast(beta, dtype))
    return scaled + prod


@lowering(aten.addmm.default, aten.addmv.default, aten.baddbmm.default, meta=True)
def addmm(inp, a, b, *, beta=1, alpha=1, aval):
    return _scaled(jnp.broadcast_to(inp, aval.shape), _mm(a, b, aval.dtype), beta, alpha, aval.dtype)


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
    a, b = to(aval.dtype, a, b)
    prod = jnp.outer(a, b)
    if aval.dtype == jnp.bool_:
        return (cast(inp, bool) & (beta != 0)) | (prod & (alpha != 0))
    return _scaled(jnp.broadcast_to(inp, aval.shape), prod, beta, alpha, aval.dtype)


@lowering(aten.outer.default, aten.ger.default, meta=True)
def outer(a, b, *, aval):
    a, b = to(aval.dtype, a, b)
    return jnp.outer(a, b)
