"""Pairwise distances: cdist's forward (both of ATen's algorithms, chosen as ATen chooses) and
backward, and the matmul form ``_euclidean_dist``."""
from __future__ import annotations

import math

import jax.numpy as jnp

from ._helpers import cast
from .registry import aten, lowering


def _expanded(x1, x2):
    """Both inputs with their batch dims broadcast against each other (ATen's cdist_impl)."""
    batch = jnp.broadcast_shapes(x1.shape[:-2], x2.shape[:-2])
    return (jnp.broadcast_to(x1, batch + x1.shape[-2:]),
            jnp.broadcast_to(x2, batch + x2.shape[-2:]))


@lowering(aten._euclidean_dist.default)
def euclidean_dist(x1, x2):
    """||a - b|| as sqrt(|a|^2 - 2 a.b + |b|^2) in one matmul, clamped at 0 (ATen's formula)."""
    n1 = jnp.sum(x1 * x1, -1, keepdims=True)
    n2 = jnp.sum(x2 * x2, -1, keepdims=True)
    a = jnp.concatenate([x1 * -2, n1, jnp.ones_like(n1)], -1)
    b = jnp.concatenate([x2, jnp.ones_like(n2), n2], -1)
    return jnp.sqrt(jnp.maximum(jnp.matmul(a, jnp.swapaxes(b, -1, -2)), 0))


def _pairwise(x1, x2, p):
    """The direct p-norm of every row difference (ATen's cdist kernel)."""
    d = jnp.abs(x1[..., :, None, :] - x2[..., None, :, :])
    if p == 0:
        return jnp.sum((d != 0).astype(x1.dtype), -1)
    if p == 1:
        return jnp.sum(d, -1)
    if p == 2:
        return jnp.sqrt(jnp.sum(d * d, -1))
    if math.isinf(p):
        return jnp.max(d, -1)
    return jnp.sum(d ** p, -1) ** (1 / p)


@lowering(aten._cdist_forward.default, meta=True, static=True)
def cdist_forward(x1, x2, p, compute_mode=None, *, aval):
    """[..., r1, c] x [..., r2, c] -> [..., r1, r2]. For p == 2 ATen uses the matmul form when
    compute_mode is 1, or when it is unset/0 and either side has more than 25 rows; so here."""
    x1, x2 = _expanded(x1, x2)
    r1, r2 = x1.shape[-2], x2.shape[-2]
    if 0 in aval.shape:
        return jnp.zeros(aval.shape, aval.dtype)
    if x1.shape[-1] == 0:
        return jnp.zeros(aval.shape, aval.dtype)
    mode = compute_mode or 0
    if p == 2 and (mode == 1 or (mode == 0 and (r1 > 25 or r2 > 25))):
        return cast(euclidean_dist(x1, x2), aval.dtype)
    return cast(_pairwise(x1, x2, p), aval.dtype)


@lowering(aten._cdist_backward.default, meta=True, static=True)
def cdist_backward(grad, x1, x2, p, dist, *, aval):
    """d cdist / d x1 with ATen's conventions at the kinks: 0 where the distance is 0 (and, for
    p < 1, where a coordinate difference is 0); for p = inf only the maximising coordinates."""
    x1, x2 = _expanded(x1, x2)
    if 0 in x1.shape or 0 in x2.shape[-2:]:
        return jnp.zeros(aval.shape, aval.dtype)
    diff = x1[..., :, None, :] - x2[..., None, :, :]
    g = grad[..., None]
    dd = dist[..., None]
    zero = jnp.zeros((), diff.dtype)
    if p == 0:
        out = jnp.zeros_like(diff)
    elif p == 1:
        out = g * jnp.sign(diff)
    elif p == 2:
        out = jnp.where(dd == 0, zero, g * diff / jnp.where(dd == 0, 1, dd))
    elif math.isinf(p):
        out = g * jnp.sign(diff) * (jnp.abs(diff) == dd)
    elif p < 2:
        bad = (dd == 0) | ((diff == 0) & (p < 1))
        safe_d = jnp.where(bad, 1, dd)
        out = jnp.where(bad, zero, jnp.sign(diff) * jnp.abs(diff) ** (p - 1) * g / safe_d ** (p - 1))
    else:
        safe_d = jnp.where(dd == 0, 1, dd)
        out = jnp.where(dd == 0, zero, diff * jnp.abs(diff) ** (p - 2) * g / safe_d ** (p - 1))
    return cast(jnp.sum(out, -2), aval.dtype)
