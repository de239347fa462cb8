"""Loss functions and their backward ops (reduction: 0 none, 1 mean, 2 sum).

Formulas follow PyTorch's CPU kernels term by term (BCE's log clamp at -100, its backward's
1e-12 floor), so edge inputs such as probabilities of exactly 0 or 1 give eager's numbers.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from ._helpers import cast
from ._meta import grad_like_self
from .registry import aten, lowering

NONE, MEAN, SUM = 0, 1, 2


def _reduce(loss, reduction):
    if reduction == MEAN:
        return jnp.mean(loss)
    if reduction == SUM:
        return jnp.sum(loss)
    return loss


def _norm(x, reduction, scale=1.0):
    return scale / x.size if reduction == MEAN else scale


@lowering(aten.mse_loss.default, static=True)
def mse_loss(x, target, reduction=MEAN):
    return _reduce(jnp.square(x - target), reduction)


@lowering(aten.mse_loss_backward.default, static=True)
def mse_loss_backward(grad, x, target, reduction):
    return _norm(x, reduction, 2.0) * (x - target) * grad


@lowering(aten.binary_cross_entropy.default, static=True)
def binary_cross_entropy(x, target, weight=None, reduction=MEAN):
    floor = jnp.asarray(-100, x.dtype)
    loss = ((target - 1) * jnp.maximum(jnp.log1p(-x), floor)
            - target * jnp.maximum(jnp.log(x), floor))
    if weight is not None:
        loss = loss * weight
    return _reduce(loss, reduction)


@lowering(aten.binary_cross_entropy_backward.default, static=True)
def binary_cross_entropy_backward(grad, x, target, weight=None, reduction=MEAN):
    g = grad * (x - target) / jnp.maximum(x * (1 - x), jnp.asarray(1e-12, x.dtype))
    if weight is not None:
        g = g * weight
    return g / x.size if reduction == MEAN else g


@lowering(aten.binary_cross_entropy_with_logits.default, static=True)
def binary_cross_entropy_with_logits(x, target, weight=None, pos_weight=None, reduction=MEAN):
    log_sig = jax.nn.log_sigmoid(x)
    if pos_weight is not None:
        log_sig = log_sig * ((pos_weight - 1) * target + 1)
    loss = (1 - target) * x - log_sig
    if weight is not None:
        loss = loss * weight
    return _reduce(loss, reduction)


@lowering(aten.smooth_l1_loss.default, static=True)
def smooth_l1_loss(x, target, reduction=MEAN, beta=1.0):
    z = jnp.abs(x - target)
    return _reduce(jnp.where(z < beta, 0.5 * z * z / beta, z - 0.5 * beta), reduction)


@lowering(aten.smooth_l1_loss_backward.default, static=True)
def smooth_l1_loss_backward(grad, x, target, reduction, beta):
    d = x - target
    g = _norm(x, reduction) * grad
    return jnp.where(d < -beta, -g, jnp.where(d > beta, g, g * d / beta))


@lowering(aten.huber_loss.default, static=True)
def huber_loss(x, target, reduction=MEAN, delta=1.0):
    z = jnp.abs(x - target)
    return _reduce(jnp.where(z < delta, 0.5 * z * z, delta * (z - 0.5 * delta)), reduction)


@lowering(aten.huber_loss_backward.default, static=True)
def huber_loss_backward(grad, x, target, reduction, delta):
    d = x - target
    g = _norm(x, reduction) * grad
    return jnp.where(d < -delta, -g * delta, jnp.where(d > delta, g * delta, d * g))


@lowering(aten.soft_margin_loss.default, static=True)
def soft_margin_loss(x, target, reduction=MEAN):
    return _reduce(jnp.log1p(jnp.exp(-target * x)), reduction)


@lowering(aten.soft_margin_loss_backward.default, static=True)
def soft_margin_loss_backward(grad, x, target, reduction):
    z = jnp.exp(-target * x)
    return -_norm(x, reduction) * target * z / (1 + z) * grad


# -- margin losses with integer targets (backward: vjp of the forward) ----------------------------

grad_like_self("multi_margin_loss_backward", "multilabel_margin_loss_backward")


def _multilabel_margin(x, target, reduction):
    """(loss, is_target) of multilabel_margin_loss; labels end at the first -1 in a row."""
    batched = x.ndim == 2
    xb, tb = (x, target) if batched else (x.reshape(1, -1), target.reshape(1, -1))
    n, c = xb.shape
    valid = jnp.cumprod(tb != -1, axis=1).astype(bool)
    safe = jnp.where(valid, tb, 0)
    rows = jnp.arange(n)[:, None]
    is_target = jnp.zeros((n, c), bool).at[rows, safe].max(valid)
    xt = jnp.take_along_axis(xb, safe, axis=1)
    hinge = jnp.maximum(1 - (xt[:, :, None] - xb[:, None, :]), 0)
    hinge = jnp.where(valid[:, :, None] & ~is_target[:, None, :], hinge, 0)
    loss = jnp.sum(hinge, axis=(1, 2)) / c
    is_target = is_target.astype(x.dtype)
    if not batched:
        return _reduce(loss[0], reduction), is_target.reshape(x.shape)
    return _reduce(loss, reduction), is_target


@lowering(aten.multilabel_margin_loss_forward.default, static=True, meta=True)
def multilabel_margin_loss_forward(x, target, reduction, *, aval):
    # For a 1-d input and reduction none, torch 2.13's meta kernel says [1] where eager gives [];
    # the tensor's shape comes from the meta kernel, so follow it.
    loss, is_target = _multilabel_margin(x, target, reduction)
    return loss.reshape(aval[0].shape), is_target


@lowering(aten.multilabel_margin_loss_backward.default, static=True)
def multilabel_margin_loss_backward(grad, x, target, reduction, is_target):
    loss, vjp = jax.vjp(lambda v: _multilabel_margin(v, target, reduction)[0], x)
    return vjp(cast(grad, x.dtype).reshape(loss.shape))[0]


def _multi_margin(x, target, p, margin, weight, reduction):
    batched = x.ndim == 2
    xb = x if batched else x.reshape(1, -1)
    tb = target.reshape(-1)
    n, c = xb.shape
    xy = jnp.take_along_axis(xb, tb[:, None], axis=1)
    z = jnp.maximum(margin - xy + xb, 0)
    if p == 2:
        z = z * z
    if weight is not None:
        z = z * weight[tb][:, None]
    z = jnp.where(jnp.arange(c)[None, :] == tb[:, None], 0, z)
    loss = jnp.sum(z, axis=1) / c
    return _reduce(loss if batched else loss.reshape(target.shape if target.ndim else ()),
                   reduction)


@lowering(aten.multi_margin_loss.default, static=True, meta=True)
def multi_margin_loss(x, target, p=1, margin=1, weight=None, reduction=MEAN, *, aval):
    return _multi_margin(x, target, p, margin, weight, reduction).reshape(aval.shape)


@lowering(aten.multi_margin_loss_backward.default, static=True)
def multi_margin_loss_backward(grad, x, target, p, margin, weight=None, reduction=MEAN):
    loss, vjp = jax.vjp(lambda v: _multi_margin(v, target, p, margin, weight, reduction), x)
    return vjp(cast(grad, x.dtype).reshape(loss.shape))[0]
