"""Normalisation: batch norm (training, eval, running-stat updates), group norm, layer norm.

Statistics are computed in float32 for half inputs, as CPU eager does. ``native_batch_norm``
itself has no rule on purpose: its schema hides the running-stat writes, so PyTorch's own
decomposition routes it to ``_native_batch_norm_legit*``, whose functional variant returns the
new running stats for the tracer to rebind.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional

import jax.numpy as jnp
import numpy as np
from jax import lax

import torch

from ..lazy import tracer
from . import eager_checks, opmath
from ._helpers import acc_dtype
from .registry import aten, lowering


def _channel(v, ndim: int):
    """A per-channel [C] vector shaped to broadcast against [N, C, *spatial]."""
    return v.reshape((1, -1) + (1,) * (ndim - 2))


def _affine(y, weight, bias):
    if weight is not None:
        y = y * _channel(weight, y.ndim).astype(y.dtype)
    if bias is not None:
        y = y + _channel(bias, y.ndim).astype(y.dtype)
    return y


def _empty(aval):
    return jnp.zeros(aval.shape, aval.dtype)


# -- batch norm -----------------------------------------------------------------------------------

def _evaluating_by_flag(bound) -> bool:
    """Eval mode (``training`` False) with running stats given."""
    return not bound.get("training") and bound.get("running_mean") is not None


@dataclass(frozen=True)
class _Norm:
    """What CPU eager does that the meta kernels do not, for one normalisation op.

    ``parameters``: the names of its parameters in the order eager's mixed-type rule reads them
    (eager_checks.mixed_statistics_dtype). ``statistics``: where its statistics sit among its
    outputs (save_mean and save_invstd or rstd, and the new running stats of the functional
    variants), whose dtype eager gives as the input's, or float32 in a call with float32
    parameters for a half input (the meta kernels follow CUDA: float32 for every half input).
    ``evaluating``: for batch norms, whether a call (its bound arguments) runs in eval mode with
    running stats, where eager's saves are empty."""

    parameters: tuple
    statistics: tuple = (1, 2)
    evaluating: Optional[Callable] = None


_AFFINE, _RUNNING = ("weight", "bias"), ("weight", "bias", "running_mean", "running_var")
_NORMS = {
    aten.native_layer_norm.default: _Norm(_AFFINE),
    aten.native_group_norm.default: _Norm(_AFFINE),
    aten.native_batch_norm.default: _Norm(_RUNNING, evaluating=_evaluating_by_flag),
    aten._native_batch_norm_legit.default: _Norm(_RUNNING, evaluating=_evaluating_by_flag),
    aten._native_batch_norm_legit.no_stats: _Norm(_AFFINE),
    aten._native_batch_norm_legit_functional.default:
        _Norm(_RUNNING, (1, 2, 3, 4), evaluating=_evaluating_by_flag),
    aten._native_batch_norm_legit_no_training.default:
        _Norm(_RUNNING, evaluating=lambda bound: True),
    aten._batch_norm_with_update_functional.default: _Norm(_RUNNING, (1, 2, 4, 5)),
    aten._batch_norm_with_update.default: _Norm(_RUNNING),   # (legacy traces it in place)
    aten._batch_norm_no_update.default:
        _Norm(_RUNNING, evaluating=lambda bound: bound.get("running_mean") is not None),
}


@tracer.eager_check_first(*_NORMS)
def _norm_parameters(func, bound):
    """Eager's refusals of parameters of another dtype, before the meta kernel runs."""
    if isinstance(bound.get("input"), torch.Tensor):
        eager_checks.mixed_statistics_dtype(func, bound, _NORMS[func].parameters)


@tracer.eager_output(*_NORMS)
def _eager_statistics(func, bound, out):
    """The statistics' shapes and dtypes as CPU eager returns them."""
    norm = _NORMS[func]
    if norm.evaluating is not None and norm.evaluating(bound):
        # CPU eager returns save_mean and save_invstd of shape (0,) in eval mode with running
        # stats (CUDA and the meta kernels: [C]); the backward then reads the running stats.
        out = (out[0], *(torch.empty((0,), dtype=t.dtype, device="meta") for t in out[1:3]),
               *out[3:])
    dtype = eager_checks.mixed_statistics_dtype(func, bound, norm.parameters)
    out = list(out)
    for i in norm.statistics:
        t = out[i]
        if t.dtype != dtype:
            out[i] = torch.empty_strided(t.shape, t.stride(), dtype=dtype, device="meta")
    return tuple(out)


@tracer.meta_arguments(aten._batch_norm_with_update_functional.default,
                       aten._batch_norm_with_update.default, aten._batch_norm_no_update.default)
def _meta_parameters(func, args, kwargs):
    """torch's meta decompositions of these ops hand weight and bias to
    ``_select_batch_norm_backend``, which refuses None (eager's CPU kernel takes it): the meta
    kernel runs on stand-ins of shape [C] (no output's shape depends on them; the statistics'
    dtypes come from the real arguments, ``_eager_statistics``)."""
    bound = tracer.bind(func, args, kwargs)
    x = bound.get("input")
    if not isinstance(x, torch.Tensor) or x.ndim < 2:
        return args, kwargs
    stand_in = torch.empty((x.shape[1],), dtype=x.dtype, device="meta")
    args = list(args)
    for position, name in ((1, "weight"), (2, "bias")):
        if bound.get(name) is None:
            if name in kwargs:
                kwargs = {**kwargs, name: stand_in}
            elif position < len(args):
                args[position] = stand_in
    return tuple(args), kwargs


def _batch_stats(x):
    """(mean [C], sum of squared deviations [C], count per channel) over every dim but 1."""
    axes = (0,) + tuple(range(2, x.ndim))
    xf = x.astype(acc_dtype(x.dtype))
    mean = jnp.mean(xf, axis=axes)
    var_sum = jnp.sum(jnp.square(xf - _channel(mean, x.ndim)), axis=axes)
    return mean, var_sum, math.prod(x.shape[a] for a in axes)


def _normalize(x, mean, invstd, weight, bias):
    """Eager's form: y = x * alpha + beta per channel, alpha = invstd * w, beta = b - mean * alpha,
    in float32 for half inputs (see _half_normalize)."""
    if x.dtype in opmath.LOW:
        return _half_normalize(x, mean, invstd, weight, bias)
    dt = acc_dtype(x.dtype)
    mean, invstd = mean.astype(dt), invstd.astype(dt)
    alpha = invstd if weight is None else invstd * weight.astype(dt)
    beta = -mean * alpha if bias is None else bias.astype(dt) - mean * alpha
    y = x.astype(dt) * _channel(alpha, x.ndim) + _channel(beta, x.ndim)
    return y.astype(x.dtype)


def _half_normalize(x, mean, invstd, weight, bias):
    """A half input normalised as eager's kernel does it: alpha = invstd * w and beta = b - mean
    * alpha per channel in float32, then ``x * alpha + beta`` per element, both the way the
    kernel's compiled code computes them (fused multiply-adds), rounded to x's dtype. A separate
    multiply and add differ where ``x`` is near the mean: x == mean gives 0, eager the product's
    rounding error (7e-9 in one bfloat16 eval sample)."""
    f32 = jnp.float32
    mean, invstd = mean.astype(f32), invstd.astype(f32)
    alpha = invstd if weight is None else invstd * weight.astype(f32)
    beta = opmath.fma(-mean, alpha, jnp.zeros((), f32) if bias is None else bias.astype(f32))
    y = opmath.fma(x.astype(f32), _channel(alpha, x.ndim), _channel(beta, x.ndim))
    return opmath.round_to(y, x.dtype)


def _train(x, weight, bias, eps, stats_dtype):
    """(out, save_mean, save_invstd, var_sum, n); for a float16/bfloat16 input see _HalfStats."""
    if x.dtype in opmath.LOW:
        h = _HalfStats(x, stats_dtype, eps)
        return h.normalize(x, weight, bias), h.mean, h.invstd, h.var_sum, h.n
    mean, var_sum, n = _batch_stats(x)
    invstd = lax.rsqrt(var_sum / n + eps)
    return _normalize(x, mean, invstd, weight, bias), mean, invstd, var_sum, n


class _HalfStats:
    """A float16/bfloat16 input's batch statistics as CPU eager's kernels compute them (these ops'
    opmath rule leaves every rounding here); ``stats_dtype`` is the statistics' dtype (the
    input's, or float32 in a mixed call: eager_checks.mixed_statistics_dtype).

    A bfloat16 input with bfloat16 parameters takes eager's reduced-precision kernel, which
    stores what it computes in bfloat16 as it goes: the mean and the sum of squared deviations
    (from the float32 mean), the variance as ``var_sum / n`` in bfloat16 arithmetic, and
    ``1 / sqrt(var + eps)`` computed in double; normalising reads them back as stored, and the
    running stats are ``m * stat + (1 - m) * running`` with the momentum made a bfloat16 and
    each product rounded (the unbiased variance's product with it excepted: float32); other
    calls update them in float32 arithmetic with the momentum made a float32. Every
    other half call (float16, or float32 parameters) computes the statistics in float32 and
    stores them in their dtype at the end; a float16 call normalises with them as stored.
    Against eager over 50 random samples per dtype, parameter dtype, affine or not and three
    shapes: outputs, statistics and running stats equal (one float16 running-mean element in
    300 excepted; a mixed call's float32 statistics differ in the last bit where float32 sums
    in another order do). Before, float32 statistics rounded once had ~16% of bfloat16
    channels' invstd and a quarter of the half outputs off by a rounding."""

    def __init__(self, x, stats_dtype, eps):
        self.dtype = np.dtype(stats_dtype)
        self.rounded = self.dtype == np.dtype(jnp.bfloat16)
        axes = (0,) + tuple(range(2, x.ndim))
        self.n = math.prod(x.shape[a] for a in axes)
        xf = x.astype(jnp.float32)
        mean = jnp.sum(xf, axis=axes) / jnp.float32(self.n)
        var_sum = jnp.sum(jnp.square(xf - _channel(mean, x.ndim)), axis=axes)
        self.mean, self.var_sum = self._store(mean), self._store(var_sum)
        var = self.divided(self.n)
        self.invstd = self._store(
            (1.0 / jnp.sqrt(var.astype(jnp.float64) + eps)).astype(jnp.float32))

    def _store(self, v):
        """``v`` (float32) as the kernel keeps it, as float32."""
        return opmath.round_to(v, self.dtype).astype(jnp.float32) if self.rounded else v

    def _half(self, k):
        """The number ``k`` as the kernel's arithmetic takes it."""
        return self._store(jnp.asarray(k, jnp.float32))

    def divided(self, k: int):
        """``var_sum / k`` (a bfloat16 var_sum divides by ``k`` made a bfloat16)."""
        return self._store(self.var_sum / self._half(k))

    def normalize(self, x, weight, bias):
        inv, mean = self.invstd, self.mean
        if self.dtype in opmath.LOW:          # (read back as stored)
            inv, mean = (opmath.round_to(v, self.dtype).astype(jnp.float32) for v in (inv, mean))
        return _half_normalize(x, mean, inv, weight, bias)

    def running(self, momentum, running_mean, running_var):
        """The new running mean and variance (the variance's is the unbiased one)."""
        unbiased = self.divided(self.n - 1)
        if not self.rounded:                  # float32 arithmetic, the momentum a float32
            m = jnp.float32(momentum)

            def update(stat, run):
                v = m * stat + (jnp.float32(1) - m) * run.astype(jnp.float32)
                return v if run.dtype not in opmath.LOW else opmath.round_to(v, run.dtype)
            return update(self.mean, running_mean), update(unbiased, running_var)
        m = self._half(momentum)
        rest = self._store(1.0 - m)
        s = self._store
        rm = s(s(m * self.mean) + s(rest * running_mean.astype(jnp.float32)))
        rv = s(m * unbiased + s(rest * running_var.astype(jnp.float32)))
        return rm.astype(running_mean.dtype), rv.astype(running_var.dtype)


@lowering(aten._native_batch_norm_legit_functional.default, static=True, meta=True)
def batch_norm_functional(x, weight, bias, running_mean, running_var, training, momentum, eps,
                          *, aval):
    """(out, save_mean, save_invstd, new running_mean, new running_var)."""
    if not training:
        out, m, s = batch_norm_no_training(x, weight, bias, running_mean, running_var, momentum,
                                           eps, aval=aval[:3])
        return out, m, s, running_mean, running_var
    if x.dtype in opmath.LOW:
        h = _HalfStats(x, aval[1].dtype, eps)
        new_mean, new_var = h.running(momentum, running_mean, running_var)
        return (h.normalize(x, weight, bias), h.mean.astype(h.dtype), h.invstd.astype(h.dtype),
                new_mean, new_var)
    out, mean, invstd, var_sum, n = _train(x, weight, bias, eps, aval[1].dtype)
    unbiased = var_sum / (n - 1)   # running_var tracks the unbiased variance, as in eager
    new_mean = momentum * mean.astype(running_mean.dtype) + (1 - momentum) * running_mean
    new_var = momentum * unbiased.astype(running_var.dtype) + (1 - momentum) * running_var
    return out, mean, invstd, new_mean, new_var


@lowering(aten._native_batch_norm_legit.no_stats, static=True, meta=True)
def batch_norm_no_stats(x, weight, bias, training, momentum, eps, *, aval):
    out, mean, invstd, _, _ = _train(x, weight, bias, eps, aval[1].dtype)
    return out, mean.astype(aval[1].dtype), invstd.astype(aval[2].dtype)


@lowering(aten._native_batch_norm_legit_no_training.default, static=True, meta=True)
def batch_norm_no_training(x, weight, bias, running_mean, running_var, momentum, eps, *, aval):
    if x.dtype in opmath.LOW:
        # eager: invstd = 1 / sqrt(running_var + float(eps)), each step rounded to float32
        # (spelled in float64 and rounded: XLA would turn 1 / sqrt into an rsqrt)
        v = (running_var.astype(jnp.float32) + jnp.float32(eps)).astype(jnp.float64)
        root = jnp.sqrt(v).astype(jnp.float32).astype(jnp.float64)
        invstd = (1.0 / root).astype(jnp.float32)
        return (_half_normalize(x, running_mean, invstd, weight, bias), _empty(aval[1]),
                _empty(aval[2]))
    invstd = lax.rsqrt(running_var.astype(acc_dtype(x.dtype)) + eps)
    out = _normalize(x, running_mean, invstd, weight, bias)
    return out, _empty(aval[1]), _empty(aval[2])


@lowering(aten.native_batch_norm_backward.default, static=True)
def native_batch_norm_backward(grad, x, weight, running_mean, running_var, save_mean, save_invstd,
                               train, eps, output_mask):
    dt = acc_dtype(x.dtype)
    if train:
        mean, invstd = save_mean.astype(dt), save_invstd.astype(dt)
    else:
        mean, invstd = running_mean.astype(dt), lax.rsqrt(running_var.astype(dt) + eps)
    # Eager's form: dot = sum((x - mean) * dy), proj = (x - mean) * dot * invstd^2 / n,
    # dx = (dy - mean(dy) - proj) * invstd * w; the same grouping keeps the rounding close.
    axes = (0,) + tuple(range(2, x.ndim))
    g = grad.astype(dt)
    centered = x.astype(dt) - _channel(mean, x.ndim)
    gsum = jnp.sum(g, axis=axes)
    dot = jnp.sum(centered * g, axis=axes)
    w = jnp.ones_like(invstd) if weight is None else weight.astype(dt)
    gi = None
    if output_mask[0]:
        scale = _channel(invstd * w, x.ndim)
        if train:
            n = math.prod(x.shape[a] for a in axes)
            proj = centered * _channel(dot * invstd * invstd / n, x.ndim)
            gi = (g - _channel(gsum / n, x.ndim) - proj) * scale
        else:
            gi = g * scale
        gi = gi.astype(x.dtype)
    return (gi,
            dot * invstd if output_mask[1] else None,
            gsum if output_mask[2] else None)



# The newer batch-norm ops (what nn.BatchNorm calls since torch 2.4): the same math, plus a
# `reserve` output that is empty on the CPU (cuDNN's workspace elsewhere).
@lowering(aten._batch_norm_with_update_functional.default, static=True, meta=True)
def batch_norm_with_update(x, weight, bias, running_mean, running_var, momentum, eps, *, aval):
    """(out, save_mean, save_invstd, reserve, new running_mean, new running_var); the in-place
    ``_batch_norm_with_update`` is traced through this functional variant."""
    out, mean, invstd, new_mean, new_var = batch_norm_functional(
        x, weight, bias, running_mean, running_var, True, momentum, eps,
        aval=aval[:3] + aval[4:])
    return out, mean, invstd, _empty(aval[3]), new_mean, new_var


@lowering(aten._batch_norm_no_update.default, static=True, meta=True)
def batch_norm_no_update(x, weight, bias, running_mean, running_var, momentum, eps, *, aval):
    """Eval mode with running stats, or batch statistics when there are none."""
    if running_mean is None:
        out, mean, invstd = batch_norm_no_stats(x, weight, bias, True, momentum, eps,
                                                aval=aval[:3])
    else:
        out, mean, invstd = batch_norm_no_training(x, weight, bias, running_mean, running_var,
                                                   momentum, eps, aval=aval[:3])
    return out, mean, invstd, _empty(aval[3])


@lowering(aten.batch_norm_backward.default, static=True)
def batch_norm_backward(grad, x, weight, running_mean, running_var, save_mean, save_var, update,
                        eps, output_mask, reserve):
    """``save_var`` holds the saved inverse std (the CPU kernel passes it on as such)."""
    train = update or running_mean is None
    return native_batch_norm_backward(grad, x, weight, running_mean, running_var, save_mean,
                                      save_var, train, eps, output_mask)

# -- group norm -----------------------------------------------------------------------------------

def _grouped(x, n, c, hxw, group):
    # Sizes spelled out: with an empty batch a -1 could not be inferred.
    return x.astype(acc_dtype(x.dtype)).reshape(n, group, (c // group) * hxw)


@lowering(aten.native_group_norm.default, static=True)
def native_group_norm(x, weight, bias, n, c, hxw, group, eps):
    xg = _grouped(x, n, c, hxw, group)
    mean = jnp.mean(xg, axis=-1)
    var = jnp.mean(jnp.square(xg - mean[..., None]), axis=-1)
    rstd = lax.rsqrt(var + eps)
    y = ((xg - mean[..., None]) * rstd[..., None]).reshape(x.shape)
    return _affine(y, weight, bias).astype(x.dtype), mean, rstd


@lowering(aten.native_group_norm_backward.default, static=True)
def native_group_norm_backward(grad, x, mean, rstd, weight, n, c, hxw, group, output_mask):
    """Eager's form: dx = rstd * w * dy + c2 * x + c3, with per-group c2, c3 from the sums
    ds = sum(dy * x * w) and db = sum(dy * w)."""
    dt = acc_dtype(x.dtype)
    d = c // group
    xc = x.astype(dt).reshape(n, c, hxw)
    g = grad.astype(dt).reshape(n, c, hxw)
    mean, rstd = mean.astype(dt), rstd.astype(dt)
    ds_c, db_c = jnp.sum(g * xc, axis=2), jnp.sum(g, axis=2)     # [n, c]
    w = jnp.ones((c,), dt) if weight is None else weight.astype(dt)
    gi = None
    if output_mask[0]:
        ds = jnp.sum((ds_c * w).reshape(n, group, d), axis=2)
        db = jnp.sum((db_c * w).reshape(n, group, d), axis=2)
        s = 1.0 / (d * hxw)
        c2 = (db * mean - ds) * rstd * rstd * rstd * s
        c3 = -c2 * mean - db * rstd * s
        c1 = (rstd[:, :, None] * w.reshape(group, d)[None]).reshape(n, c)
        gi = (c1[..., None] * g + jnp.repeat(c2, d, axis=1)[..., None] * xc
              + jnp.repeat(c3, d, axis=1)[..., None])
        gi = gi.reshape(x.shape).astype(x.dtype)
    dw = db_b = None
    if output_mask[1]:
        m, r = jnp.repeat(mean, d, axis=1), jnp.repeat(rstd, d, axis=1)
        dw = jnp.sum((ds_c - db_c * m) * r, axis=0)
    if output_mask[2]:
        db_b = jnp.sum(db_c, axis=0)
    return gi, dw, db_b


# -- layer norm -----------------------------------------------------------------------------------

def _layer_norm(x, normalized_shape, weight, bias, eps):
    axes = tuple(range(x.ndim - len(normalized_shape), x.ndim))
    xf = x.astype(acc_dtype(x.dtype))
    mean = jnp.mean(xf, axis=axes, keepdims=True)
    var = jnp.mean(jnp.square(xf - mean), axis=axes, keepdims=True)
    rstd = lax.rsqrt(var + eps)
    y = (xf - mean) * rstd
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y.astype(x.dtype), mean, rstd


@lowering(aten.native_layer_norm.default, static=True)
def native_layer_norm(x, normalized_shape, weight, bias, eps):
    return _layer_norm(x, normalized_shape, weight, bias, eps)


@lowering(aten.native_layer_norm_backward.default, static=True)
def native_layer_norm_backward(grad, x, normalized_shape, mean, rstd, weight, bias, output_mask):
    """Eager's form: dx = rstd * w * dy + b * x + c, with b, c from ds = sum(dy * w * x) and
    db = sum(dy * w) over the normalised dims."""
    dt = acc_dtype(x.dtype)
    axes = tuple(range(x.ndim - len(normalized_shape), x.ndim))
    n = math.prod(x.shape[a] for a in axes)
    xf, g = x.astype(dt), grad.astype(dt)
    mean, rstd = mean.astype(dt), rstd.astype(dt)
    gw = g if weight is None else g * weight.astype(dt)
    gi = None
    if output_mask[0]:
        ds = jnp.sum(gw * xf, axis=axes, keepdims=True)
        db = jnp.sum(gw, axis=axes, keepdims=True)
        b = (db * mean - ds) * rstd * rstd * rstd / n
        c = -b * mean - db * rstd / n
        gi = (rstd * gw + b * xf + c).astype(x.dtype)
    lead = tuple(range(x.ndim - len(normalized_shape)))
    dw = jnp.sum(g * (xf - mean) * rstd, axis=lead) if weight is not None else None
    db_ = jnp.sum(g, axis=lead) if bias is not None else None
    # Outputs not asked for are undefined tensors (None) in PyTorch.
    return (gi,
            dw.astype(weight.dtype) if output_mask[1] and dw is not None else None,
            db_.astype(bias.dtype) if output_mask[2] and db_ is not None else None)
