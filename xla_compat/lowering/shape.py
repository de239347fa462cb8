"""Shape and joining ops: cat, stack, flip, roll, repeat, tril/triu, padding, tiling."""
from __future__ import annotations

import jax.numpy as jnp

from ._helpers import cast, dim
from .registry import aten, lowering


@lowering(aten.cat.default, meta=True)
def cat(tensors, d=0, *, aval):
    # torch skips legacy empty 1-d inputs of shape (0,) when concatenating higher-rank tensors.
    parts = [cast(t, aval.dtype) for t in tensors if not (t.ndim == 1 and t.shape[0] == 0
                                                           and len(aval.shape) != 1)]
    if not parts:
        return jnp.zeros(aval.shape, aval.dtype)
    return jnp.concatenate(parts, axis=dim(d, parts[0].ndim))


@lowering(aten.stack.default, meta=True)
def stack(tensors, d=0, *, aval):
    return jnp.stack([cast(t, aval.dtype) for t in tensors], axis=dim(d, tensors[0].ndim + 1))


@lowering(aten.flip.default)
def flip(x, dims_):
    return jnp.flip(x, axis=tuple(dim(d, x.ndim) for d in dims_)) if x.ndim else x


@lowering(aten.roll.default)
def roll(x, shifts, dims_=()):
    if not dims_:
        return jnp.roll(x.reshape(-1), shifts[0]).reshape(x.shape)
    return jnp.roll(x, shifts, axis=tuple(dim(d, x.ndim) for d in dims_))


@lowering(aten.repeat.default)
def repeat(x, repeats):
    extra = len(repeats) - x.ndim
    x = x.reshape((1,) * extra + x.shape)
    return jnp.tile(x, repeats)


@lowering(aten.tril.default)
def tril(x, diagonal=0):
    return jnp.tril(x, diagonal)


@lowering(aten.triu.default)
def triu(x, diagonal=0):
    return jnp.triu(x, diagonal)


@lowering(aten.constant_pad_nd.default, meta=True)
def constant_pad_nd(x, pad, value=0, *, aval):
    pairs = [(0, 0, 0)] * x.ndim
    for i in range(len(pad) // 2):
        d = x.ndim - 1 - i
        pairs[d] = (pad[2 * i], pad[2 * i + 1], 0)
    from jax import lax
    return lax.pad(x, cast(value, x.dtype), pairs)
