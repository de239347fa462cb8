"""The inference fast paths of ``nn.MultiheadAttention`` and ``nn.TransformerEncoderLayer``, and
weight norm's fused backward.

In eval mode without autograd, both modules call one fused op (``_native_multi_head_attention``,
``_transformer_encoder_layer_fwd``) on any CPU, CUDA or PrivateUse1 tensor; neither had an hlo
lowering, so every such call ran on the CPU. Here each is spelled out in aten ops on the device
tensors, step by step as eager's CPU kernel composes them (qkv projection, bias and
``1/sqrt(head_dim)`` scaling of q, masked softmax, projection; residuals and layer norms around
it), so each step takes the rounding its own lowering gives it.

``_masked_softmax`` (what the fused attention uses) counts ``True`` as masked out and gives a row
whose every position is masked zeros, not NaN. ``mask_type`` 0 is an (L, S) attention mask, 1 an
(B, S) key padding mask, 2 a mask of the scores' shape.
"""
from __future__ import annotations

import math

import jax.numpy as jnp
import torch

from xla_compat.lazy import tracer

from ._helpers import acc_dtype, cast
from .registry import aten, lowering


def _masked(scores, mask, mask_type):
    """The mask as a boolean tensor broadcastable to ``scores`` (B, H, L, S)."""
    if mask.dtype != torch.bool:
        mask = mask.to(torch.bool)
    if mask.dim() == 2 and scores.dim() == 4 and mask_type == 1:
        return mask[:, None, None, :]
    if mask.dim() == 2 and scores.dim() == 4 and mask_type == 0:
        return mask
    if tuple(mask.shape) != tuple(scores.shape):
        raise RuntimeError(f"_masked_softmax: for mask_type == 2 the mask shape "
                           f"{tuple(mask.shape)} should match the input shape "
                           f"{tuple(scores.shape)}")
    return mask


def masked_softmax(scores, mask, mask_type):
    """Softmax over the last dim with masked positions left out; an all-masked row is zeros."""
    if mask is None:
        return torch.softmax(scores, -1)
    mask = _masked(scores, mask, mask_type)
    filled = scores.masked_fill(mask, float("-inf"))
    out = torch.softmax(filled, -1)
    return out.masked_fill(mask.all(-1, keepdim=True), 0.0)


def _projected(query, key, value, embed_dim, qkv_weight):
    """(B, T, 3D): eager's ``qkv_projection`` (one matmul for self-attention)."""
    if key is value and query is key:
        return torch.matmul(query, qkv_weight.t())
    if key is value:
        wq, wkv = qkv_weight.split([embed_dim, 2 * embed_dim])
        return torch.cat([torch.matmul(query, wq.t()), torch.matmul(key, wkv.t())], 2)
    wq, wk, wv = qkv_weight.chunk(3)
    return torch.cat([torch.matmul(query, wq.t()), torch.matmul(key, wk.t()),
                      torch.matmul(value, wv.t())], 2)


def _check_mha(query, key, value, embed_dim, num_head, qkv_weight, qkv_bias):
    if query.dim() != 3:
        raise RuntimeError(f"expected 3-D `query`, got {query.dim()}-D tensor")
    if query.shape[2] != embed_dim:
        raise RuntimeError(f"passed-in embed_dim {embed_dim} didn't match last dim of query "
                           f"{query.shape[2]}")
    if key.dim() != 3 or value.dim() != 3:
        raise RuntimeError(f"expected 3-D `key` and `value`, got {key.dim()}-D and "
                           f"{value.dim()}-D tensors")
    if not (query.shape == key.shape == value.shape):
        raise RuntimeError("expected `query`/`key`/`value` shapes to match")
    if tuple(qkv_weight.shape) != (3 * embed_dim, embed_dim):
        raise RuntimeError(f"expected `qkv_weight` of shape (3 x embed_dim, embed_dim) = "
                           f"({3 * embed_dim}, {embed_dim}), got {tuple(qkv_weight.shape)}")
    if tuple(qkv_bias.shape) != (3 * embed_dim,):
        raise RuntimeError(f"expected `qkv_bias` of shape ({3 * embed_dim},), got "
                           f"{tuple(qkv_bias.shape)}")
    if embed_dim % num_head:
        raise RuntimeError("`embed_dim` must divide evenly by `num_heads`")


def multi_head_attention(query, key, value, embed_dim, num_head, qkv_weight, qkv_bias,
                         proj_weight, proj_bias, mask=None, need_weights=True,
                         average_attn_weights=True, mask_type=None):
    _check_mha(query, key, value, embed_dim, num_head, qkv_weight, qkv_bias)
    b, t, d = query.shape
    qkv = _projected(query, key, value, embed_dim, qkv_weight)
    if qkv.numel() == 0:
        return torch.empty_like(query), None
    head = d // num_head
    # (3, B, H, T, head): bias added, q scaled by 1/sqrt(head) rounded to the tensor's dtype
    q, k, v = (qkv + qkv_bias).view(b, t, 3, num_head, head).permute(2, 0, 3, 1, 4).unbind(0)
    # (eager: 1.0 / std::sqrt(scalar_t(head)), a float sqrt for every type but double)
    root = (math.sqrt(head) if q.dtype == torch.float64
            else torch.tensor(float(head), dtype=torch.float32).sqrt().item())
    scale = torch.tensor(1.0 / root, dtype=q.dtype).item()
    q = q * scale
    scores = torch.matmul(q, k.transpose(-1, -2))
    weights = masked_softmax(scores, mask, mask_type)
    context = torch.matmul(weights, v)                         # (B, H, T, head)
    proj = torch.nn.functional.linear(context.transpose(1, 2).reshape(b, t, d), proj_weight,
                                      proj_bias)
    if not need_weights:
        return proj, None
    if average_attn_weights:
        weights = weights.sum(1) / num_head
    return proj, weights


@tracer.special(aten._native_multi_head_attention.default)
def _native_multi_head_attention(cls, func, args, kwargs):
    return multi_head_attention(**tracer.bind(func, args, kwargs))


def encoder_layer(src, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias,
                  use_gelu, norm_first, eps, norm_weight_1, norm_bias_1, norm_weight_2,
                  norm_bias_2, ffn_weight_1, ffn_bias_1, ffn_weight_2, ffn_bias_2, mask=None,
                  mask_type=None):
    """Eager's ``transformer_encoder_layer_forward``: attention and feed-forward blocks, each
    with its residual, layer norms before (``norm_first``) or after them."""
    F = torch.nn.functional

    def norm(x, w, b):
        return F.layer_norm(x, (embed_dim,), w, b, eps)

    x = norm(src, norm_weight_1, norm_bias_1) if norm_first else src
    x = multi_head_attention(x, x, x, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight,
                             proj_bias, mask, False, True, mask_type)[0]
    x = x + src
    if not norm_first:
        x = norm(x, norm_weight_1, norm_bias_1)
    residual = x
    if norm_first:
        x = norm(x, norm_weight_2, norm_bias_2)
    h = F.linear(x, ffn_weight_1, ffn_bias_1)
    h = F.gelu(h) if use_gelu else F.relu(h)
    x = F.linear(h, ffn_weight_2, ffn_bias_2) + residual
    if not norm_first:
        x = norm(x, norm_weight_2, norm_bias_2)
    return x


@tracer.special(aten._transformer_encoder_layer_fwd.default)
def _transformer_encoder_layer_fwd(cls, func, args, kwargs):
    return encoder_layer(**tracer.bind(func, args, kwargs))


@lowering(aten._weight_norm_interface_backward.default, static=True, meta=True)
def weight_norm_interface_backward(grad_w, saved_v, saved_g, saved_norms, dim, *, aval):
    """w = g * v / ||v|| (norm over every dim but ``dim``): grad_g = sum(grad_w * v) / ||v||,
    grad_v = g / ||v|| * (grad_w - v * grad_g / ||v||); in float32 for reduced types."""
    work = acc_dtype(saved_v.dtype)
    gw, v, g, n = (cast(x, work) for x in (grad_w, saved_v, saved_g, saved_norms))
    axes = tuple(a for a in range(v.ndim) if a != dim % max(v.ndim, 1))
    grad_g = jnp.sum(gw * v, axis=axes, keepdims=True) / n
    grad_v = (g / n) * (gw - v * (grad_g / n))
    return cast(grad_v, aval[0].dtype), cast(grad_g.reshape(aval[1].shape), aval[1].dtype)


@tracer.special(aten._nested_tensor_from_mask_left_aligned.default)
def _never_left_aligned(cls, func, args, kwargs):
    """``nn.TransformerEncoder`` in eval mode with a key padding mask turns its input into a
    nested tensor where this says the mask is left-aligned; hlo has no nested tensors, so the
    answer here is no: the layers then run on the padded batch with the mask (eager's path with
    ``enable_nested_tensor=False``). Valid positions get eager's values; padded positions hold
    what that path computes there, where the nested path would give zeros."""
    return False
