"""``torch.nn.functional.linear_cross_entropy``'s chunked custom ops (``torch_nn::``): the
projection and the cross entropy in one rule, its gradients by jax.vjp.

Eager chunks the batch to bound the [N, C] logits' memory; XLA fuses the whole computation, so
the rule computes it at once (``batch_chunk_size`` and the accumulation policy only change
float32 rounding there).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import torch

from .registry import lowering

try:   # defines the torch_nn:: ops (torch >= 2.12); torch.ops namespaces fill in on import
    import torch.nn.modules.linear_cross_entropy  # noqa: F401
    _OPS = torch.ops.torch_nn
except ImportError:
    _OPS = None


def _loss(x, w, b, target, weight, reduction, ignore_index, smoothing):
    """cross_entropy(x @ w.T + b, target) with class weights, ignore_index, label smoothing."""
    logits = jnp.matmul(x, w.T, precision=jax.lax.Precision.HIGHEST)
    if b is not None:
        logits = logits + b
    logp = jax.nn.log_softmax(logits, axis=-1)
    c = logits.shape[-1]
    valid = target != ignore_index
    t = jnp.where(valid, target, 0)
    cw = jnp.ones((c,), logp.dtype) if weight is None else weight.astype(logp.dtype)
    wt = cw[t] * valid
    nll = -jnp.take_along_axis(logp, t[:, None], axis=1)[:, 0] * wt
    if reduction == "none":
        return nll
    smooth = -jnp.sum(logp * cw, axis=-1) * valid
    if reduction == "sum":
        nll_r, smooth_r = jnp.sum(nll), jnp.sum(smooth)
    else:
        nll_r = jnp.sum(nll) / jnp.sum(wt)
        den = jnp.sum(wt) if weight is not None else jnp.sum(valid).astype(logp.dtype)
        smooth_r = jnp.sum(smooth) / den
    if smoothing > 0:
        return (1 - smoothing) * nll_r + smoothing / c * smooth_r
    return nll_r


def _f32(x):
    return None if x is None else x.astype(jnp.promote_types(x.dtype, jnp.float32))


if _OPS is not None and hasattr(_OPS, "_linear_cross_entropy_batch_chunked"):

    @lowering(_OPS._linear_cross_entropy_batch_chunked.default, meta=True, static=True)
    def linear_cross_entropy_chunked(x, w, target, b, weight, reduction, ignore_index,
                                     label_smoothing, batch_chunk_size, acc_policy, acc_dtype,
                                     allow_retain_graph, compute_input_grad,
                                     compute_linear_weight_grad, compute_linear_bias_grad, *,
                                     aval):
        """(loss, grad_input, grad_linear_weight, grad_linear_bias): the gradients of a mean or
        sum loss, precomputed in forward as eager does (empty where not asked for)."""
        def f(xx, ww, bb):
            return _loss(xx, ww, bb, target, _f32(weight), reduction, ignore_index,
                         label_smoothing)
        loss, vjp = jax.vjp(f, _f32(x), _f32(w), _f32(b))
        gx, gw, gb = vjp(jnp.ones_like(loss))
        outs = [loss,
                gx if compute_input_grad else None,
                gw if compute_linear_weight_grad else None,
                gb if compute_linear_bias_grad and gb is not None else None]
        return tuple(jnp.zeros(a.shape, a.dtype) if o is None else o.astype(a.dtype)
                     for o, a in zip(outs, aval))

    @lowering(_OPS._linear_cross_entropy_batch_chunked_no_reduction.default, meta=True,
              static=True)
    def linear_cross_entropy_chunked_none(x, w, target, b, weight, ignore_index,
                                          batch_chunk_size, acc_policy, acc_dtype, *, aval):
        """The per-sample loss [N] (reduction='none', no smoothing)."""
        out = _loss(_f32(x), _f32(w), _f32(b), target, _f32(weight), "none", ignore_index, 0.0)
        return out.astype(aval.dtype)
