"""Connectionist temporal classification: ``_ctc_loss`` (the alpha recursion) and its backward
(the beta recursion and ATen's gradient formula), both as scans over time, batched.

Input and target lengths are int lists in the schema, so every loop bound here is static; the
``.Tensor`` overloads copy their length tensors to the host first (so does eager's kernel): a
host round trip when they live on the device.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import torch
from jax import lax

from .. import metrics
from ..lazy import tracer
from ..lazy.tensor import LazyTensor
from ._helpers import cast
from ._meta import grad_like_self
from .registry import aten, lowering


grad_like_self("_ctc_loss_backward")   # (grad, log_probs, ...) -> like log_probs


def _extended_targets(targets, target_lengths, width, blank):
    """l'(s) for s < width: blank at even s, the target's (s-1)/2-th label at odd s: [N, width]."""
    n = len(target_lengths)
    idx = (jnp.arange(width) - 1) // 2                          # label index of odd s
    if targets.ndim == 1:                                       # concatenated targets
        starts, acc = [], 0
        for length in target_lengths:
            starts.append(acc)
            acc += length
        pos = jnp.clip(jnp.asarray(starts)[:, None] + idx[None, :], 0, max(targets.shape[0] - 1, 0))
        labels = targets[pos] if targets.shape[0] else jnp.zeros((n, width), targets.dtype)
    else:
        pos = jnp.clip(idx, 0, max(targets.shape[1] - 1, 0))[None, :]
        labels = targets[:, pos[0]] if targets.shape[1] else jnp.zeros((n, width), targets.dtype)
    odd = (jnp.arange(width) % 2 == 1)[None, :]
    return jnp.where(odd, labels, blank).astype(jnp.int32)


def _lse3(a, b, c):
    """log(e^a + e^b + e^c) the way ATen writes it (max shift, 0 when all are -inf)."""
    m = jnp.maximum(jnp.maximum(a, b), c)
    m = jnp.where(m == -jnp.inf, 0, m)
    return jnp.log(jnp.exp(a - m) + jnp.exp(b - m) + jnp.exp(c - m)) + m


def _setup(log_probs, targets, target_lengths, blank):
    width = 2 * max(target_lengths, default=0) + 1
    ext = _extended_targets(targets, target_lengths, width, blank)     # [N, W]
    lp = jnp.moveaxis(log_probs, 0, 1)                                   # [N, T, C]
    lp_ext = jnp.take_along_axis(lp, jnp.broadcast_to(ext[:, None, :], lp.shape[:2] + (width,)),
                                 axis=2)                                 # [N, T, W]
    # s-2 may be skipped when l'(s) != l'(s-2) (never for blanks)
    skip = jnp.concatenate([jnp.zeros_like(ext[:, :2], bool), ext[:, 2:] != ext[:, :-2]], 1)
    return width, ext, lp, lp_ext, skip


def _alphas(lp_ext, skip, target_lengths, input_lengths):
    n, t_max, width = lp_ext.shape
    neg = jnp.full((n, 1), -jnp.inf, lp_ext.dtype)
    s = jnp.arange(width)[None, :]
    tl = jnp.asarray(target_lengths)[:, None]
    first = jnp.where((s == 0) | ((s == 1) & (tl > 0)), lp_ext[:, 0], -jnp.inf)

    def step(prev, lp_t):
        a2 = jnp.concatenate([neg, prev[:, :-1]], 1)
        a3 = jnp.where(skip, jnp.concatenate([neg, neg, prev[:, :-2]], 1)[:, :width], -jnp.inf)
        cur = _lse3(prev, a2, a3) + lp_t
        return cur, cur

    if t_max > 1:
        _, rest = lax.scan(step, first, jnp.moveaxis(lp_ext[:, 1:], 1, 0))
        alphas = jnp.concatenate([first[:, None], jnp.moveaxis(rest, 0, 1)], 1)
    else:
        alphas = first[:, None]
    return alphas                                                        # [N, T, W]


def _nll(alphas, target_lengths, input_lengths):
    n = alphas.shape[0]
    il = jnp.clip(jnp.asarray(input_lengths) - 1, 0)
    last = alphas[jnp.arange(n), il]                                     # [N, W]
    tl = jnp.asarray(target_lengths)
    l1 = jnp.take_along_axis(last, (2 * tl)[:, None], 1)[:, 0]
    l2 = jnp.take_along_axis(last, jnp.clip(2 * tl - 1, 0)[:, None], 1)[:, 0]
    m = jnp.maximum(l1, l2)
    m = jnp.where(m == -jnp.inf, 0, m)
    both = jnp.log(jnp.exp(l1 - m) + jnp.exp(l2 - m)) + m
    return -jnp.where(tl == 0, l1, both)


@lowering(aten._ctc_loss.default, meta=True)
def ctc_loss(log_probs, targets, input_lengths, target_lengths, blank=0, zero_infinity=False,
             *, aval):
    """(neg_log_likelihood [N], log_alpha [N, T, 2*max_target+1]) as ATen's CPU kernel computes
    them; zero_infinity only matters to the backward (``ctc_loss`` zeroes infinite losses)."""
    _, _, _, lp_ext, skip = _setup(log_probs, targets, target_lengths, blank)
    alphas = _alphas(lp_ext, skip, target_lengths, input_lengths)
    nll = _nll(alphas, target_lengths, input_lengths)
    return cast(nll, aval[0].dtype), cast(alphas, aval[1].dtype)


@lowering(aten._ctc_loss_backward.default, meta=True)
def ctc_loss_backward(grad, log_probs, targets, input_lengths, target_lengths,
                      neg_log_likelihood, log_alpha, blank, zero_infinity=False, *, aval):
    """ATen's gradient: (exp(lp) - exp(lcab + nll - lp)) * grad for t < input length, 0 after,
    where lcab[t, c] = logsumexp of alpha*beta over the extended positions labelled c; the whole
    sample's gradient is 0 when zero_infinity and its loss is infinite."""
    nll = neg_log_likelihood
    width, ext, lp, lp_ext, skip = _setup(log_probs, targets, target_lengths, blank)
    n, t_max, c = lp.shape
    s = jnp.arange(width)[None, :]
    tl = jnp.asarray(target_lengths)[:, None]
    il = jnp.asarray(input_lengths)[:, None]
    valid_s = s <= 2 * tl
    neg = jnp.full((n, 1), -jnp.inf, lp.dtype)
    # skip3[s]: may jump from s+2 back to s (l'(s+2) != l'(s))
    skip3 = jnp.concatenate([skip[:, 2:], jnp.zeros_like(skip[:, :2])], 1) & (s < 2 * tl - 1)

    def step(nxt, xs):
        lp_t, t = xs
        b2 = jnp.where(s < 2 * tl, jnp.concatenate([nxt[:, 1:], neg], 1), -jnp.inf)
        b3 = jnp.where(skip3, jnp.concatenate([nxt[:, 2:], neg, neg], 1), -jnp.inf)
        cur = jnp.where(valid_s, _lse3(nxt, b2, b3) + lp_t, -jnp.inf)
        last = jnp.where(((s == 2 * tl) | ((s == 2 * tl - 1) & (tl > 0))) & valid_s, lp_t, -jnp.inf)
        cur = jnp.where(t == il - 1, last, jnp.where(t < il - 1, cur, -jnp.inf))
        return cur, cur

    init = jnp.full((n, width), -jnp.inf, lp.dtype)
    ts = jnp.arange(t_max - 1, -1, -1)
    _, betas = lax.scan(step, init, (jnp.moveaxis(lp_ext, 1, 0)[::-1], ts))
    betas = jnp.moveaxis(betas[::-1], 0, 1)                                 # [N, T, W]
    ab = log_alpha.astype(lp.dtype) + betas
    ab = jnp.where(valid_s[:, None, :] & (jnp.arange(t_max)[None, :, None] < il[:, :, None]),
                   ab, -jnp.inf)
    # logsumexp of ab into classes: segment ids (n, t, l'(s))
    ids = (jnp.arange(n)[:, None, None] * t_max + jnp.arange(t_max)[None, :, None]) * c \
        + ext[:, None, :]
    ids, flat = jnp.reshape(ids, (-1,)), jnp.reshape(ab, (-1,))
    m = jax.ops.segment_max(flat, ids, num_segments=n * t_max * c)
    m_safe = jnp.where(jnp.isfinite(m), m, 0)
    tot = jax.ops.segment_sum(jnp.exp(flat - m_safe[ids]), ids, num_segments=n * t_max * c)
    lcab = jnp.reshape(jnp.log(tot) + m_safe, (n, t_max, c))
    out = (jnp.exp(lp) - jnp.exp(lcab + nll[:, None, None] - lp)) * grad[:, None, None]
    keep = jnp.arange(t_max)[None, :, None] < il[:, :, None]
    if zero_infinity:
        keep = keep & (nll != jnp.inf)[:, None, None]
    out = jnp.where(keep, out, 0)
    return cast(jnp.moveaxis(out, 0, 1), aval.dtype)


def _host_list(t) -> list[int]:
    if isinstance(t, LazyTensor):
        metrics.inc("HostRoundTrip")
        t = tracer.materialize_cpu(t)
    return [int(v) for v in t.reshape(-1).tolist()]


@tracer.special(aten._ctc_loss.Tensor, aten._ctc_loss_backward.Tensor)
def _ctc_with_length_tensors(cls, func, args, kwargs):
    """Read the length tensors on the host, then trace the int-list overload."""
    b = tracer.bind(func, args, kwargs)
    b["input_lengths"] = _host_list(b["input_lengths"])
    b["target_lengths"] = _host_list(b["target_lengths"])
    target = {aten._ctc_loss.Tensor: aten._ctc_loss.default,
              aten._ctc_loss_backward.Tensor: aten._ctc_loss_backward.default}[func]
    names = [a.name for a in target._schema.arguments]
    return tracer.trace(cls, target, (), {n: b[n] for n in names if n in b})


def _ctc_loss_for_hlo(log_probs, targets, input_lengths, target_lengths, blank=0, reduction=1,
                      zero_infinity=False):
    """``ctc_loss`` with length tensors on ``hlo`` log-probabilities. Eager's composite takes
    its tensor-subclass branch for device tensors and divides the losses by ``target_lengths``
    where they are: with the usual CPU length tensors that mixed devices and failed. Lengths on
    the CPU become int lists here (eager's branch for every other device); lengths on the
    device keep the composite."""
    if input_lengths.device.type == "cpu" and target_lengths.device.type == "cpu":
        return aten.ctc_loss.IntList(log_probs, targets, _host_list(input_lengths),
                                     _host_list(target_lengths), blank, reduction,
                                     zero_infinity)
    return aten.ctc_loss.Tensor.decompose(log_probs, targets, input_lengths, target_lengths,
                                          blank, reduction, zero_infinity)


_LIB = torch.library.Library("aten", "IMPL")
_LIB.impl("ctc_loss.Tensor", _ctc_loss_for_hlo, "AutogradPrivateUse1")
