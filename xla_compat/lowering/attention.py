"""Scaled dot-product attention in float16/bfloat16 as CPU eager computes it.

For a 4-d float16/bfloat16 ``scaled_dot_product_attention`` without dropout, CPU eager runs its
flash-attention kernel (``_scaled_dot_product_flash_attention_for_cpu``), whose roundings
differ from the float32 "math" composition an ``hlo`` tensor would otherwise get (torch's
backend choice knows no kernel for a PrivateUse1 device and falls back to math). Two parts:

- ``_sdpa_for_hlo``, registered for ``scaled_dot_product_attention`` at AutogradPrivateUse1
  (and as the tracer's handler of the op, which it reaches whole in inference mode):
  where CPU eager would take the flash kernel for these arguments (asked of torch itself,
  ``_eager_takes_flash``), it calls the same flash op eager calls, whose derivative is that
  op's own backward op. Every other call, float32 included, runs the composite exactly as
  before.
- the lowerings of the flash op and of its backward, which spell out the kernels' arithmetic
  (``_flash``, ``_flash_backward``). What they do not copy: the summation order of the
  kernels' float32 GEMMs, which depends on the matrix sizes (the BLAS path taken); a result
  near a rounding boundary can then differ in its last bit (float16 more often than bfloat16).
"""
from __future__ import annotations

import functools
import math

import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from ..lazy import tracer
from . import opmath
from .registry import aten, lowering

_F32 = jnp.float32
_LOW_TORCH = (torch.float16, torch.bfloat16)
_KV_SPLIT = 512     # the kernel's key/value block (its query block does not change the result)


# -- which kernel eager runs ----------------------------------------------------------------------

def _cpu_like(t):
    """A CPU tensor with ``t``'s sizes, strides and dtype, and no data worth reading."""
    if t is None:
        return None
    return torch.empty_strided(tuple(t.shape), tuple(t.stride()), dtype=t.dtype)


def _eager_takes_flash(query, key, value, attn_mask, dropout_p, is_causal, scale,
                       enable_gqa) -> bool:
    """Whether CPU eager's backend choice picks its flash kernel for these arguments (4-d
    inputs, no dropout, a supported mask, ...): torch's own ``_fused_sdp_choice`` asked about
    CPU tensors of the same geometry, so the choice follows the installed torch."""
    try:
        choice = torch._fused_sdp_choice(
            _cpu_like(query), _cpu_like(key), _cpu_like(value), _cpu_like(attn_mask),
            dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)
    except RuntimeError:         # invalid arguments: the composite raises eager's error
        return False
    return choice == torch.nn.attention.SDPBackend.FLASH_ATTENTION.value


def _sdpa_for_hlo(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *,
                  scale=None, enable_gqa=False):
    """``scaled_dot_product_attention`` of ``hlo`` tensors: eager's CPU flash op where eager
    would run it for a float16/bfloat16 query, the composite (math) otherwise.

    Eager turns a boolean mask into an additive one of the query's dtype (0 where True, -inf
    where False) before calling the flash op; so does this."""
    if query.dtype in _LOW_TORCH and _eager_takes_flash(
            query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa):
        mask = attn_mask
        if mask is not None and mask.dtype == torch.bool:
            mask = torch.zeros(mask.shape, dtype=query.dtype, device=mask.device).masked_fill(
                mask.logical_not(), float("-inf"))
        return aten._scaled_dot_product_flash_attention_for_cpu(
            query, key, value, dropout_p, is_causal, attn_mask=mask, scale=scale)[0]
    return aten.scaled_dot_product_attention.default.decompose(
        query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)


_LIB = torch.library.Library("aten", "IMPL")
_LIB.impl("scaled_dot_product_attention", _sdpa_for_hlo, "AutogradPrivateUse1")


@tracer.special(aten.scaled_dot_product_attention.default)
def _sdpa_reaching_the_tracer(cls, func, args, kwargs):
    """Where autograd is off (inference mode) the op skips the kernel above and reaches the
    device's dispatch whole: the same choice here."""
    return _sdpa_for_hlo(*args, **kwargs)


# -- the flash kernel's arithmetic ----------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _vector_unit() -> tuple[int, bool]:
    """(float lanes of eager's vector type, whether its fast exp is the polynomial one): the
    kernel's row sums run in that many lanes, and its vector exp is ``fexp_u20`` on x86."""
    cap = torch.backends.cpu.get_cpu_capability()
    if cap == "AVX2":
        return 8, True
    if cap.startswith("AVX512"):
        return 16, True
    return 8, False


def _bits_f32(u: int):
    return np.array([u], np.uint32).view(np.float32)[0]


_LOG2E = _bits_f32(0x3fb8aa3b)
_LN_FLT_MIN, _LN_FLT_MAX = _bits_f32(0xc2aeac50), _bits_f32(0x42b17218)
# fexp_u20's cubic c(f), highest degree first: the float whose bits are 2**23 * (y - c(f) + 127)
# is 2**floor(y) * (1 + f - c(f)), about 2**y
_FEXP_POLY = tuple(np.float32(c) for c in (-0.079204240219773236, -0.22433836478672356,
                                            0.30354260500649682, 0.00010703434948458272))


def _fexp_u20(x):
    """ATen's ``Vectorized<float>::fexp_u20`` (x86): 2**(x*log2 e) built in the float's bits.

    y = x*log2(e) (rounded); f = y - floor(y); c = cubic(f) by fused multiply-adds; the result
    is the float whose bits are trunc(2**23 * (y - c) + 127 * 2**23) (one fused multiply-add);
    0 below ln(FLT_MIN), inf above ln(FLT_MAX)."""
    y = x * _LOG2E
    f = y - jnp.floor(y)
    c = jnp.full_like(f, _FEXP_POLY[0])
    for coef in _FEXP_POLY[1:]:
        c = opmath.fma(f, c, jnp.full_like(f, coef))
    t = opmath.fma(jnp.full_like(y, 2.0 ** 23), y - c, jnp.full_like(y, 127.0 * 2.0 ** 23))
    t = jnp.where(jnp.isfinite(t), t, 0.0)
    out = lax.bitcast_convert_type(jnp.trunc(t).astype(jnp.int32), _F32)
    out = jnp.where(x < _LN_FLT_MIN, 0.0, out)
    return jnp.where(x > _LN_FLT_MAX, jnp.inf, out).astype(_F32)


def _exp_f32(x):
    """expf, correctly rounded (the kernel's scalar exp for a row's tail and rescales)."""
    return jnp.exp(x.astype(jnp.float64)).astype(_F32)


def _lane_sum(e, lanes: int):
    """The kernel's row sum of ``e`` (last axis): whole vectors accumulated lane-wise in order,
    the lanes then added pairwise (lane i with lane i + half, halving), then the tail elements
    one by one. Spelled out so XLA cannot reorder the adds."""
    n = e.shape[-1]
    full = n // lanes * lanes
    chunks = jnp.moveaxis(e[..., :full].reshape(e.shape[:-1] + (full // lanes, lanes)), -2, 0)
    acc, _ = lax.scan(lambda a, c: (a + c, None), jnp.zeros(e.shape[:-1] + (lanes,), _F32),
                      chunks)
    while acc.shape[-1] > 1:
        half = acc.shape[-1] // 2
        acc = acc[..., :half] + acc[..., half:]
    total = acc[..., 0]
    for i in range(full, n):
        total = total + e[..., i]
    return total


def _block_exp(d, lanes: int, poly: bool):
    """exp of a block's shifted scores: whole vectors by the vector exp, the tail by expf."""
    full = d.shape[-1] // lanes * lanes
    vec = _fexp_u20 if poly else _exp_f32
    return jnp.concatenate([vec(d[..., :full]), _exp_f32(d[..., full:])], axis=-1)


def _scores(q, k, mask, is_causal, scale, n):
    """One key block's scores: q @ k.T accumulated in float32, the causal part filled with
    -inf, then ``scores * scale + mask`` (one fused multiply-add) or ``scores * scale``."""
    s = jnp.einsum("bhld,bhsd->bhls", q, k, precision=lax.Precision.HIGHEST,
                   preferred_element_type=_F32)
    if is_causal:
        rows = jnp.arange(q.shape[2])[:, None]
        cols = n + jnp.arange(k.shape[2])[None, :]
        s = jnp.where(cols > rows, -jnp.inf, s)
    if mask is not None:
        return opmath.fma(s, jnp.full_like(s, scale), mask)
    return s * scale


def _flash(q, k, v, mask, is_causal, scale, low):
    """CPU eager's ``cpu_flash_attention`` for float16/bfloat16 ``low`` (float32 arrays in).

    Per block of 512 keys, per query row: scores (``_scores``); the running max; the block's
    probabilities exp(score - max) by the kernel's vector exp, summed in float32 lanes
    (``_lane_sum``) and stored in ``low``; the running sum = block sum + exp(old max - max) *
    old sum (fused); the accumulated output rescaled by that factor, then plus the stored
    probabilities @ v in float32. A row whose max is still -inf gets zero probabilities and
    keeps its sum. At the end: output * (1 / sum) rounded to ``low`` (a row with no key: 0),
    and logsumexp = max + log(sum) in float32."""
    lanes, poly = _vector_unit()
    B, H, L, _ = q.shape
    S = k.shape[2]
    run_max = jnp.full((B, H, L), -jnp.inf, _F32)
    run_sum = jnp.zeros((B, H, L), _F32)
    acc = None
    for n in range(0, S, _KV_SPLIT):
        kb, vb = k[:, :, n:n + _KV_SPLIT], v[:, :, n:n + _KV_SPLIT]
        mb = None if mask is None else mask[..., n:n + _KV_SPLIT]
        s = _scores(q, kb, mb, is_causal, scale, n)
        new_max = jnp.maximum(run_max, jnp.max(s, axis=-1))
        live = new_max != -jnp.inf
        safe_max = jnp.where(live, new_max, 0.0)
        e = _block_exp(s - safe_max[..., None], lanes, poly)
        p = jnp.where(live[..., None], opmath.round_to(e, low).astype(_F32), 0.0)
        factor = _exp_f32(run_max - safe_max)
        run_sum = jnp.where(live, opmath.fma(factor, run_sum, _lane_sum(e, lanes)), run_sum)
        pv = jnp.einsum("bhls,bhsd->bhld", p, vb, precision=lax.Precision.HIGHEST,
                        preferred_element_type=_F32)
        if acc is None:
            acc = pv
        else:
            acc = jnp.where(live[..., None], acc * factor[..., None], acc) + pv
        run_max = jnp.where(live, new_max, run_max)
    total = jnp.where(run_sum == 0, 1.0, run_sum).astype(_F32)
    out = opmath.round_to(acc * (1.0 / total)[..., None], low)
    top = jnp.where(run_max == -jnp.inf, 0.0, run_max)
    lse = top + jnp.log(total.astype(jnp.float64)).astype(_F32)
    return out, lse


def _additive_mask(mask, shape):
    """The kernel's mask in float32, broadcast to [batch, heads, queries, keys]."""
    if mask is None:
        return None
    if mask.dtype == jnp.bool_:
        mask = jnp.where(mask, 0.0, -jnp.inf)
    return jnp.broadcast_to(mask.astype(_F32), shape)


def _plain(q, k, v, mask, is_causal, scale):
    """Attention in the inputs' own dtype with the flash op's conventions (a row with no key
    gives 0 and logsumexp 0): for float32/float64, which reach the op only when called
    directly, without eager's float kernel's own summation orders."""
    s = jnp.einsum("bhld,bhsd->bhls", q, k, precision=lax.Precision.HIGHEST) * scale
    if is_causal:
        s = jnp.where(jnp.arange(k.shape[2])[None, :] > jnp.arange(q.shape[2])[:, None],
                      -jnp.inf, s)
    if mask is not None:
        s = s + mask.astype(s.dtype)
    top = jnp.max(s, axis=-1, keepdims=True)
    top = jnp.where(top == -jnp.inf, 0.0, top)
    e = jnp.exp(s - top)
    total = jnp.sum(e, axis=-1, keepdims=True)
    total = jnp.where(total == 0, 1.0, total)
    out = jnp.einsum("bhls,bhsd->bhld", e, v, precision=lax.Precision.HIGHEST) / total
    return out, (top + jnp.log(total))[..., 0]


@lowering(aten._scaled_dot_product_flash_attention_for_cpu.default, static=True, meta=True)
def _scaled_dot_product_flash_attention_for_cpu(query, key, value, dropout_p=0.0,
                                                is_causal=False, *, attn_mask=None,
                                                scale=None, aval):
    """(output, logsumexp): float16/bfloat16 as eager's kernel computes them (``_flash``),
    float32/float64 by ``_plain``."""
    if dropout_p:
        raise NotImplementedError("xla_compat: _scaled_dot_product_flash_attention_for_cpu "
                                  "with dropout")
    B, H, L, E = query.shape
    if key.shape[1] != H:                       # grouped-query: kv head h // (H // Hk)
        key = jnp.repeat(key, H // key.shape[1], axis=1)
        value = jnp.repeat(value, H // value.shape[1], axis=1)
    scale = scale if scale is not None else 1.0 / math.sqrt(E)
    mask = _additive_mask(attn_mask, (B, H, L, key.shape[2]))
    if query.dtype in opmath.LOW:
        q, k, v = (t.astype(_F32) for t in (query, key, value))
        out, lse = _flash(q, k, v, mask, is_causal, np.float32(scale), query.dtype)
    else:
        out, lse = _plain(query, key, value, mask, is_causal, scale)
    out_aval, lse_aval = aval
    return out.astype(out_aval.dtype), lse.astype(lse_aval.dtype).reshape(lse_aval.shape)


def _q_split(L: int) -> int:
    """The kernels' query block (the backward accumulates gradients block by block)."""
    return 256 if L >= 768 else 64 if L >= 192 else 32


def _accumulate(total, part, low):
    """``total + part`` stored in the half dtype ``low`` (the kernel's GEMM into a half
    output with beta = 1), as float32 values."""
    summed = part if total is None else total + part
    return opmath.round_to(summed, low).astype(_F32)


def _flash_backward(do, q, k, v, o, lse, mask, is_causal, scale, low, group):
    """CPU eager's ``cpu_flash_attention_backward`` for float16/bfloat16 ``low`` (``k``/``v``
    already repeated to the query heads; ``group`` query heads share one key/value head).

    Per query block and key block: probabilities p = exp(scale * q @ k.T + mask - logsumexp)
    (zero where causal), stored in ``low`` for dv += p.T @ dout; ds = p * (dout @ v.T -
    rowsum(dout * out)) in float32, stored in ``low`` for dq += scale * ds @ k and
    dk += scale * ds.T @ q. Each gradient is a half-precision buffer the blocks add into, so
    every block's contribution is rounded into it: dq over key blocks; dk and dv over query
    blocks, and over the query heads of a group (head after head)."""
    hi = lax.Precision.HIGHEST
    L, S = q.shape[2], k.shape[2]
    dsum = jnp.sum(do * o, axis=-1)
    qs = _q_split(L)
    dq_blocks, dk_parts, dv_parts = [], [], []
    for m in range(0, L, qs):
        qb, dob = q[:, :, m:m + qs], do[:, :, m:m + qs]
        dq, dk_row, dv_row = None, [], []
        for n in range(0, S, _KV_SPLIT):
            kb, vb = k[:, :, n:n + _KV_SPLIT], v[:, :, n:n + _KV_SPLIT]
            s = jnp.einsum("bhld,bhsd->bhls", qb, kb, precision=hi) * scale
            if mask is not None:
                s = s + mask[:, :, m:m + qs, n:n + _KV_SPLIT]
            p = _exp_f32(s - lse[:, :, m:m + qs, None])
            if is_causal:
                rows = m + jnp.arange(qb.shape[2])[:, None]
                p = jnp.where(n + jnp.arange(kb.shape[2])[None, :] > rows, 0.0, p)
            p_low = opmath.round_to(p, low).astype(_F32)
            dv_row.append(jnp.einsum("bhls,bhld->bhsd", p_low, dob, precision=hi))
            grad_p = jnp.einsum("bhld,bhsd->bhls", dob, vb, precision=hi)
            ds = opmath.round_to(p * (grad_p - dsum[:, :, m:m + qs, None]), low).astype(_F32)
            dq = _accumulate(dq, jnp.einsum("bhls,bhsd->bhld", ds, kb, precision=hi) * scale,
                             low)
            dk_row.append(jnp.einsum("bhls,bhld->bhsd", ds, qb, precision=hi) * scale)
        dq_blocks.append(dq)
        dk_parts.append(jnp.concatenate(dk_row, axis=2))
        dv_parts.append(jnp.concatenate(dv_row, axis=2))
    return (jnp.concatenate(dq_blocks, axis=2), _accumulate_heads(dk_parts, group, low),
            _accumulate_heads(dv_parts, group, low))


def _accumulate_heads(parts, group, low):
    """A key/value gradient from per-query-block contributions [B, H, S, E]: added into the
    half-precision buffer of each key/value head in the kernel's order (query head, then
    query block), rounding after each addition."""
    B, H = parts[0].shape[:2]
    total = None
    for g in range(group):
        for part in parts:
            part = part.reshape(B, H // group, group, *part.shape[2:])[:, :, g]
            total = _accumulate(total, part, low)
    return total


@lowering(aten._scaled_dot_product_flash_attention_for_cpu_backward.default, static=True,
          meta=True)
def _scaled_dot_product_flash_attention_for_cpu_backward(grad_out, query, key, value, out,
                                                         logsumexp, dropout_p, is_causal, *,
                                                         attn_mask=None, scale=None, aval):
    """(grad_query, grad_key, grad_value) of the flash op: float16/bfloat16 by
    ``_flash_backward``; float32/float64 (a direct call of the private op) as plain float
    arithmetic."""
    if dropout_p:
        raise NotImplementedError("xla_compat: flash attention backward with dropout")
    B, H, L, E = query.shape
    group = H // key.shape[1]
    if group > 1:
        key, value = (jnp.repeat(t, group, axis=1) for t in (key, value))
    scale = np.float32(scale if scale is not None else 1.0 / math.sqrt(E))
    mask = _additive_mask(attn_mask, (B, H, L, key.shape[2]))
    low = query.dtype
    f = lambda t: t.astype(_F32)
    lse = f(logsumexp).reshape(B, H, L)
    if low in opmath.LOW:
        dq, dk, dv = _flash_backward(f(grad_out), f(query), f(key), f(value), f(out), lse,
                                     mask, is_causal, scale, low, group)
        return tuple(g.astype(a.dtype) for g, a in zip((dq, dk, dv), aval))
    dq, dk, dv = _flash_backward_plain(grad_out, query, key, value, out, lse, mask, is_causal,
                                       scale)
    if group > 1:
        dk, dv = (t.reshape(B, H // group, group, *t.shape[2:]).sum(axis=2) for t in (dk, dv))
    return tuple(g.astype(a.dtype) for g, a in zip((dq, dk, dv), aval))


def _flash_backward_plain(do, q, k, v, o, lse, mask, is_causal, scale):
    """Attention gradients in the inputs' own dtype, from the forward's logsumexp."""
    hi = lax.Precision.HIGHEST
    s = jnp.einsum("bhld,bhsd->bhls", q, k, precision=hi) * scale
    if mask is not None:
        s = s + mask.astype(s.dtype)
    p = jnp.exp(s - lse.astype(s.dtype)[..., None])
    if is_causal:
        p = jnp.where(jnp.arange(k.shape[2])[None, :] > jnp.arange(q.shape[2])[:, None], 0, p)
    dv = jnp.einsum("bhls,bhld->bhsd", p, do, precision=hi)
    ds = p * (jnp.einsum("bhld,bhsd->bhls", do, v, precision=hi)
              - jnp.sum(do * o, axis=-1, keepdims=True))
    dq = jnp.einsum("bhls,bhsd->bhld", ds, k, precision=hi) * scale
    dk = jnp.einsum("bhls,bhld->bhsd", ds, q, precision=hi) * scale
    return dq, dk, dv
