"""Vector products along one dim: ``linalg.cross`` (also ``torch.cross``).

Eager's kernel forms each component as ``x_i * y_j - x_j * y_i`` in the tensor's dtype, so for
bfloat16/half both products and the difference are rounded; XLA may keep float32 between
operations, so the roundings are spelled out with ``reduce_precision``.
"""
from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from ._helpers import cast
from ._helpers import dim as wrap_dim
from .registry import aten, lowering


@lowering(aten.linalg_cross.default, meta=True)
def linalg_cross(x, y, *, dim=-1, aval):
    dt = aval.dtype
    d = wrap_dim(dim, len(aval.shape))
    low = dt in (jnp.bfloat16, jnp.float16)
    work = jnp.float32 if low else dt
    x = cast(jnp.broadcast_to(x, aval.shape), work)
    y = cast(jnp.broadcast_to(y, aval.shape), work)
    if low:
        info = jnp.finfo(dt)

        def rnd(v):
            return lax.reduce_precision(v, info.nexp, info.nmant)
    else:
        def rnd(v):
            return v
    xs = [lax.index_in_dim(x, i, d, keepdims=True) for i in range(3)]
    ys = [lax.index_in_dim(y, i, d, keepdims=True) for i in range(3)]
    comps = [rnd(rnd(xs[(i + 1) % 3] * ys[(i + 2) % 3]) - rnd(xs[(i + 2) % 3] * ys[(i + 1) % 3]))
             for i in range(3)]
    return cast(jnp.concatenate(comps, axis=d), dt)

