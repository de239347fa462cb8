"""Activation functions beyond the elementwise basics, and their backward ops.

Each backward follows the closed form of PyTorch's CPU kernel (same branches at the same
boundaries), so gradients at the kinks (x == 0, x == ±3, x == ±lambd) match eager exactly.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from ._helpers import cast, dim, to
from .registry import aten, lowering
from .random import uniform


def _zero(dtype):
    return jnp.zeros((), dtype)


@lowering(aten.elu_backward.default, meta=True, static=True)
def elu_backward(grad, alpha, scale, input_scale, is_result, self_or_result, *, aval):
    a, s, i = to(aval.dtype, alpha, scale, input_scale)
    v = cast(self_or_result, aval.dtype)
    if is_result:
        neg = grad * i * (v + a * s)
    else:
        neg = grad * i * a * s * jnp.exp(v * i)
    return jnp.where(v <= 0, neg, grad * s)


@lowering(aten.celu.default, meta=True)
def celu(x, alpha=1.0, *, aval):
    (a,) = to(aval.dtype, alpha)
    x = cast(x, aval.dtype)
    return jnp.where(x <= 0, a * jnp.expm1(x * (1 / a)), x)


@lowering(aten.softplus_backward.default, meta=True)
def softplus_backward(grad, x, beta, threshold, *, aval):
    (b,) = to(aval.dtype, beta)
    z = jnp.exp(x * b)
    return jnp.where(x * b > threshold, grad, grad * z / (z + 1))


@lowering(aten.hardswish.default)
def hardswish(x):
    return x * jnp.minimum(jnp.maximum(x + 3, _zero(x.dtype)), 6) / 6


@lowering(aten.hardswish_backward.default)
def hardswish_backward(grad, x):
    return jnp.where(x <= -3, _zero(grad.dtype), jnp.where(x < 3, grad * (x / 3 + 0.5), grad))


@lowering(aten.hardsigmoid.default)
def hardsigmoid(x):
    return jnp.minimum(jnp.maximum(x + 3, _zero(x.dtype)), 6) / 6


@lowering(aten.hardsigmoid_backward.default)
def hardsigmoid_backward(grad, x):
    return jnp.where((x > -3) & (x < 3), grad / 6, _zero(grad.dtype))


@lowering(aten.mish.default)
def mish(x):
    return x * jnp.tanh(jax.nn.softplus(x))


@lowering(aten.log_sigmoid_forward.default, meta=True)
def log_sigmoid_forward(x, *, aval):
    out = jnp.minimum(x, _zero(x.dtype)) - jnp.log1p(jnp.exp(-jnp.abs(x)))
    return out, jnp.zeros(aval[1].shape, aval[1].dtype)   # CPU eager leaves the buffer empty


@lowering(aten.log_sigmoid_backward.default)
def log_sigmoid_backward(grad, x, buffer):
    neg = x < 0
    z = jnp.exp(-jnp.abs(x))
    return grad * (jnp.where(neg, 1, 0).astype(x.dtype) - jnp.where(neg, 1, -1).astype(x.dtype)
                   * (z / (1 + z)))


def _halves(x, d):
    d = dim(d, x.ndim)
    a, b = jnp.split(x, 2, axis=d)
    return a, b, d


@lowering(aten.glu.default, static=True)
def glu(x, d=-1):
    a, b, _ = _halves(x, d)
    return a * jax.nn.sigmoid(b)


@lowering(aten.glu_backward.default, static=True)
def glu_backward(grad, x, d):
    a, b, d = _halves(x, d)
    s = jax.nn.sigmoid(b)
    return jnp.concatenate([grad * s, grad * a * s * (1 - s)], axis=d)


@lowering(aten._prelu_kernel.default)
def prelu_kernel(x, weight):
    return jnp.where(x > 0, x, weight * x)


@lowering(aten._prelu_kernel_backward.default, meta=True)
def prelu_kernel_backward(grad, x, weight, *, aval):
    gx = jnp.where(x > 0, grad, weight * grad)
    gw = jnp.where(x > 0, _zero(grad.dtype), x * grad)
    return gx, _sum_to(gw, aval[1].shape)


def _sum_to(x, shape):
    """Sum a broadcast result back to ``shape`` (autograd's sum_to)."""
    lead = x.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(lead + i for i, s in enumerate(shape)
                                      if s == 1 and x.shape[lead + i] != 1)
    return jnp.sum(x, axis=axes, keepdims=True).reshape(shape) if axes else x.reshape(shape)


# rrelu_with_noise writes `noise`, rrelu_with_noise_ writes `self` and `noise`: neither has a
# functional variant the tracer can find by name, so the rule serves all three; its outputs
# (out or new self, new noise) are what each overload's fresh returns + mutated args need.
@lowering(aten.rrelu_with_noise_functional.default, aten.rrelu_with_noise.default,
          aten.rrelu_with_noise_.default, random=True, static=True, meta=True)
def rrelu_with_noise(x, noise, lower=1 / 8, upper=1 / 3, training=False, generator=None, *, key,
                     aval):
    """(out, new noise): a random slope in [lower, upper) for each non-positive element."""
    if not training:
        slope = jnp.asarray((lower + upper) / 2, x.dtype)
        return jnp.where(x > 0, x, x * slope), noise
    r = uniform(key, x.shape, x.dtype, minval=lower, maxval=upper)
    neg = x <= 0
    return jnp.where(neg, x * r, x), jnp.where(neg, r, jnp.ones((), noise.dtype)).astype(noise.dtype)


@lowering(aten.rrelu_with_noise_backward.default, static=True)
def rrelu_with_noise_backward(grad, x, noise, lower, upper, training, self_is_result):
    if training and upper - lower > 1e-6:
        return grad * noise
    slope = jnp.asarray((lower + upper) / 2, grad.dtype)
    return jnp.where(x > 0, grad, grad * slope)


@lowering(aten.hardshrink.default, meta=True)
def hardshrink(x, lambd=0.5, *, aval):
    (l,) = to(aval.dtype, lambd)
    return jnp.where((x >= -l) & (x <= l), _zero(aval.dtype), x)


@lowering(aten.hardshrink_backward.default, meta=True)
def hardshrink_backward(grad, x, lambd, *, aval):
    (l,) = to(aval.dtype, lambd)
    return jnp.where((x >= -l) & (x <= l), _zero(aval.dtype), grad)


@lowering(aten.softshrink.default, meta=True)
def softshrink(x, lambd=0.5, *, aval):
    (l,) = to(aval.dtype, lambd)
    # eager's kernel: x > l ? x - l : (x < -l ? x + l : x * 0), so NaN stays NaN and -0.0 -0.0
    return jnp.where(x > l, x - l, jnp.where(x < -l, x + l, x * _zero(aval.dtype)))


@lowering(aten.softshrink_backward.default, meta=True)
def softshrink_backward(grad, x, lambd, *, aval):
    (l,) = to(aval.dtype, lambd)
    return jnp.where((x >= -l) & (x <= l), _zero(aval.dtype), grad)
