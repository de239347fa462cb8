"""Factories reached with a device tensor or an out= tensor: arange, linspace, full, eye, *_like."""
from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from ._helpers import cast, is_float
from .registry import aten, lowering


@lowering(aten.arange.start_step, aten.arange.start, aten.arange.default, aten.arange.start_out,
          aten.arange.out, meta=True)
def arange(start, end=None, step=1, *, aval, **_):
    if end is None:
        start, end = 0, start
    n = aval.shape[0]
    # torch computes start + i * step in double for floating results, then rounds once.
    acc = jnp.float64 if is_float(aval.dtype) else jnp.int64
    i = lax.iota(acc, n)
    return cast(cast(start, acc) + i * cast(step, acc), aval.dtype)


@lowering(aten.linspace.default, aten.linspace.out, static=True, meta=True)
def linspace(start, end, steps, *, aval, **_):
    if steps == 1:
        return jnp.full((1,), start, aval.dtype)
    # Eager's kernel steps in the output type (double for integer outputs), from both ends.
    acc = aval.dtype if is_float(aval.dtype) else jnp.float64
    s, e = cast(start, acc), cast(end, acc)
    step = (e - s) / cast(steps - 1, acc)
    i = lax.iota(acc, steps)
    out = jnp.where(i < steps // 2, s + step * i, e - step * (cast(steps - 1, acc) - i))
    return cast(out, aval.dtype)


@lowering(aten.full.default, aten.full_like.default, aten.new_full.default, meta=True)
def full(*args, aval, **_):
    value = args[1]
    return jnp.full(aval.shape, cast(value, aval.dtype), aval.dtype)


@lowering(aten.zeros_like.default, aten.empty_like.default, aten.new_zeros.default,
          aten.new_empty.default, aten.new_empty_strided.default, aten.zeros.default,
          aten.empty.memory_format, aten.empty_strided.default, aten.empty_permuted.default,
          meta=True)
def zeros(*args, aval, **_):
    return jnp.zeros(aval.shape, aval.dtype)


@lowering(aten.ones_like.default, aten.new_ones.default, aten.ones.default, meta=True)
def ones(*args, aval, **_):
    return jnp.ones(aval.shape, aval.dtype)


@lowering(aten.eye.default, aten.eye.m, aten.eye.out, aten.eye.m_out, meta=True)
def eye(*args, aval, **_):
    n, m = aval.shape
    return jnp.eye(n, m, dtype=aval.dtype)


@lowering(aten.scalar_tensor.default, meta=True)
def scalar_tensor(s, *, aval, **_):
    return cast(s, aval.dtype)
