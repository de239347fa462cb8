"""Segmented reductions: ``segment_reduce`` over runs given by lengths or offsets, and its
backward. Segment sizes are data on the device; the output shape is not (one row per segment)."""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from ._helpers import cast
from .registry import aten, lowering

_SEGMENT_OPS = {"sum": jax.ops.segment_sum, "mean": jax.ops.segment_sum,
                "max": jax.ops.segment_max, "min": jax.ops.segment_min,
                "prod": jax.ops.segment_prod}


def _bounds(lengths, offsets):
    """(start, end) of every segment, shaped like lengths: [outer..., S]."""
    if offsets is not None:
        return offsets[..., :-1], offsets[..., 1:]
    ends = jnp.cumsum(lengths, -1)
    return ends - lengths, ends


def _layout(data, axis, starts, ends):
    """data as [outer, L, inner] and each position's flat segment id (outer*S if in none)."""
    outer = data.shape[:axis]
    n_out = math.prod(outer)
    length = data.shape[axis]
    x = jnp.reshape(data, (n_out, length, -1))
    s = starts.shape[-1]
    st, en = jnp.reshape(starts, (n_out, 1, s)), jnp.reshape(ends, (n_out, 1, s))
    pos = jnp.arange(length)[None, :, None]
    inside = (pos >= st) & (pos < en)                             # [outer, L, S]
    seg = jnp.argmax(inside, -1)
    seg = jnp.where(jnp.any(inside, -1), seg + jnp.arange(n_out)[:, None] * s, n_out * s)
    return x, seg, n_out, s, inside


@lowering(aten.segment_reduce.default, meta=True, static=True)
def segment_reduce(data, reduce, *, lengths=None, indices=None, offsets=None, axis=0,
                   unsafe=False, initial=None, aval):
    """ATen's CPU kernel, vectorised: each segment folds its rows from ``initial`` (default: the
    reduction's identity); max/min propagate NaN; an empty segment's mean is NaN unless
    ``initial`` is given; a non-empty mean divides (initial + sum) by the length."""
    axis = axis % data.ndim
    starts, ends = _bounds(lengths, offsets)
    x, seg, n_out, s, _ = _layout(data, axis, starts, ends)
    flat = jnp.reshape(x, (-1, x.shape[-1]))
    out = _SEGMENT_OPS[reduce](flat, jnp.reshape(seg, (-1,)), num_segments=n_out * s)
    if reduce in ("max", "min"):   # scatter max/min need not propagate NaN: do it explicitly
        nan = jax.ops.segment_max(jnp.isnan(flat).astype(jnp.int32), jnp.reshape(seg, (-1,)),
                                  num_segments=n_out * s) > 0
        out = jnp.where(nan, jnp.nan, out)
    count = jnp.reshape(ends - starts, (n_out * s, 1)).astype(out.dtype)
    if initial is not None:
        init = jnp.asarray(initial, out.dtype)
        out = {"sum": lambda: out + init, "mean": lambda: out + init, "prod": lambda: out * init,
               "max": lambda: jnp.where(jnp.isnan(out), out, jnp.maximum(out, init)),
               "min": lambda: jnp.where(jnp.isnan(out), out, jnp.minimum(out, init))}[reduce]()
    if reduce == "mean":
        empty = jnp.asarray(initial if initial is not None else jnp.nan, out.dtype)
        out = jnp.where(count > 0, out / jnp.where(count > 0, count, 1), empty)
    return cast(jnp.reshape(out, aval.shape), aval.dtype)


@lowering(aten._segment_reduce_backward.default, meta=True, static=True)
def segment_reduce_backward(grad, output, data, reduce, lengths=None, offsets=None, axis=0,
                            initial=None, *, aval):
    """ATen's CPU backward: sum copies the segment's gradient, mean divides it by the length,
    max/min give it to every maximising (or NaN) element, divided by their count where the
    gradient is positive (ATen's own quirk), prod gives grad*out/x, or grad times the explicit
    product of the others (times initial) where x is 0 or NaN."""
    axis = axis % data.ndim
    starts, ends = _bounds(lengths, offsets)
    x, seg, n_out, s, inside = _layout(data, axis, starts, ends)
    valid = seg < n_out * s
    sid = jnp.where(valid, seg, 0)
    g = jnp.reshape(grad, (n_out * s, -1))[sid]                  # [outer, L, inner]
    o = jnp.reshape(output, (n_out * s, -1))[sid]
    count = jnp.reshape(ends - starts, (-1,))[sid][..., None].astype(x.dtype)
    if reduce == "sum":
        gi = g
    elif reduce == "mean":
        gi = g / jnp.where(count > 0, count, 1)
    elif reduce in ("max", "min"):
        hit = jnp.isnan(x) | (x == o)
        gi = jnp.where(hit, g, 0)
        ties = jax.ops.segment_sum(jnp.reshape(hit, (-1, x.shape[-1])).astype(x.dtype),
                                   jnp.reshape(seg, (-1,)), num_segments=n_out * s)
        c = jnp.reshape(ties, (n_out * s, -1))[sid]
        gi = jnp.where((c >= 2) & (gi > 0), gi / jnp.where(c >= 2, c, 1), gi)
    else:  # prod
        same = (seg[:, :, None] == seg[:, None, :]) & ~jnp.eye(x.shape[1], dtype=bool)
        others = jnp.where(same[..., None], x[:, None, :, :], 1)   # [outer, L, L, inner]
        init = 1 if initial is None else initial
        exclusive = jnp.prod(others, 2) * jnp.asarray(init, x.dtype)
        special = jnp.isnan(x) | (x == 0)
        gi = jnp.where(special, g * exclusive, g * o / jnp.where(special, 1, x))
    gi = jnp.where(valid[..., None], gi, 0)
    return cast(jnp.reshape(gi, aval.shape), aval.dtype)
