"""Neural-network ops: softmax family, nll_loss, embedding.

Backward ops are lowered as the vjp of their forward rule where PyTorch's closed form adds
nothing; XLA fuses the result.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from ._helpers import acc_dtype, cast, dim
from .registry import aten, lowering


@lowering(aten._softmax.default, aten.softmax.int, meta=True)
def softmax(x, d, half_to_float=False, *, aval=None, dtype=None):
    y = jax.nn.softmax(cast(x, acc_dtype(x.dtype)), axis=dim(d, x.ndim)) if x.ndim else jnp.ones_like(x)
    return cast(y, aval.dtype)


@lowering(aten._log_softmax.default, aten.log_softmax.int, meta=True)
def log_softmax(x, d, half_to_float=False, *, aval=None, dtype=None):
    y = jax.nn.log_softmax(cast(x, acc_dtype(x.dtype)), axis=dim(d, x.ndim)) if x.ndim else jnp.zeros_like(x)
    return cast(y, aval.dtype)


@lowering(aten._softmax_backward_data.default, meta=True)
def softmax_backward(grad, y, d, input_dtype, *, aval):
    d = dim(d, y.ndim)
    g = grad * y
    return cast(g - y * jnp.sum(g, axis=d, keepdims=True), aval.dtype)


@lowering(aten._log_softmax_backward_data.default, meta=True)
def log_softmax_backward(grad, y, d, input_dtype, *, aval):
    d = dim(d, y.ndim)
    return cast(grad - jnp.exp(y) * jnp.sum(grad, axis=d, keepdims=True), aval.dtype)


def _nll(x, target, weight, reduction, ignore_index):
    """(loss, total_weight) of nll_loss for x [N, C] or [C] and target [N] or []."""
    batched = x.ndim == 2
    if not batched:
        x, target = x[None], target[None]
    c = x.shape[1]
    valid = target != ignore_index
    safe = jnp.where(valid, target, 0)
    picked = jnp.take_along_axis(x, safe[:, None], axis=1)[:, 0]
    w = jnp.ones((c,), x.dtype) if weight is None else weight.astype(x.dtype)
    wt = jnp.where(valid, w[safe], jnp.zeros((), x.dtype))
    losses = -picked * wt
    total = jnp.sum(wt)
    if reduction == 0:
        return (losses if batched else losses[0]), total
    if reduction == 1:
        return jnp.sum(losses) / total, total
    return jnp.sum(losses), total


@lowering(aten.nll_loss_forward.default, static=True)
def nll_loss_forward(x, target, weight, reduction, ignore_index):
    return _nll(x, target, weight, reduction, ignore_index)


@lowering(aten.nll_loss_backward.default, static=True)
def nll_loss_backward(grad, x, target, weight, reduction, ignore_index, total_weight):
    _, vjp = jax.vjp(lambda v: _nll(v, target, weight, reduction, ignore_index)[0], x)
    return vjp(grad.astype(x.dtype))[0]


def _nll2d(x, target, weight, reduction, ignore_index):
    n, c = x.shape[0], x.shape[1]
    flat = jnp.moveaxis(x, 1, -1).reshape(-1, c)
    loss, total = _nll(flat, target.reshape(-1), weight, reduction, ignore_index)
    if reduction == 0:
        loss = loss.reshape(target.shape)
    return loss, total


@lowering(aten.nll_loss2d_forward.default, static=True)
def nll_loss2d_forward(x, target, weight, reduction, ignore_index):
    return _nll2d(x, target, weight, reduction, ignore_index)


@lowering(aten.nll_loss2d_backward.default, static=True)
def nll_loss2d_backward(grad, x, target, weight, reduction, ignore_index, total_weight):
    _, vjp = jax.vjp(lambda v: _nll2d(v, target, weight, reduction, ignore_index)[0], x)
    return vjp(grad.astype(x.dtype))[0]


@lowering(aten.embedding.default, static=True)
def embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    return jnp.take(weight, indices, axis=0)


@lowering(aten.embedding_dense_backward.default, static=True, meta=True)
def embedding_dense_backward(grad, indices, num_weights, padding_idx, scale_grad_by_freq, *, aval):
    flat_idx = indices.reshape(-1)
    g = grad.reshape(-1, grad.shape[-1])
    if padding_idx >= 0:
        g = jnp.where((flat_idx == padding_idx)[:, None], jnp.zeros((), g.dtype), g)
    if scale_grad_by_freq:
        counts = jnp.zeros((num_weights,), g.dtype).at[flat_idx].add(1)
        g = g / counts[flat_idx][:, None]
    return jnp.zeros(aval.shape, aval.dtype).at[flat_idx].add(g.astype(aval.dtype))
