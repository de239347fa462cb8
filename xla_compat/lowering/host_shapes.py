"""More ops whose output shape depends on the data: ``repeat_interleave`` (repeats tensor),
``unique_dim``, ``unique_consecutive`` along a dim, ``unique_dim_consecutive``.

The size is read on the host (a host round trip, counted as ``HostRoundTrip``, as in
``host_values``), then the result is built on the device by a node with that size fixed. An
explicit ``output_size`` skips the round trip. Invalid inputs raise eager's own error, because
the size is counted by eager's own op on the host copy.
"""
from __future__ import annotations

import jax.numpy as jnp
import torch

from ..lazy import tracer
from . import host_values
from .host_values import _host_values, _meta, _node
from .registry import aten


def _repeat_indices(repeats, n):
    if n == 0:
        return jnp.zeros((0,), jnp.int64)
    return jnp.repeat(jnp.arange(repeats.shape[0], dtype=jnp.int64), repeats,
                      total_repeat_length=n)


@tracer.special(aten.repeat_interleave.Tensor)
def _repeat_interleave(cls, func, args, kwargs):
    """The index of each repeat: [0]*r0 + [1]*r1 + ...; length sum(repeats), read on the host
    unless ``output_size`` gives it."""
    b = tracer.bind(func, args, kwargs)
    repeats, n = b["repeats"], b.get("output_size")
    if n is None:
        n = int(torch.ops.aten.repeat_interleave.Tensor(_host_values(repeats)).numel())
    return _node(func, _repeat_indices, (repeats, int(n)), [_meta((int(n),))], cls)[0]


def _unique_slices(x, dim, n, consecutive):
    """(values, inverse, counts) of the distinct slices of ``x`` along ``dim``: sorted
    lexicographically (elementwise, like eager) unless ``consecutive``, which merges only runs."""
    moved = jnp.moveaxis(x, dim, 0)
    length = moved.shape[0]
    if length == 0:
        return x, jnp.zeros((0,), jnp.int64), jnp.zeros((0,), jnp.int64)
    rows = jnp.reshape(moved, (length, -1))
    if consecutive:
        perm = jnp.arange(length)
    else:
        perm = jnp.lexsort(tuple(rows[:, k] for k in reversed(range(rows.shape[1]))))
    srt = rows[perm]
    new = jnp.concatenate([jnp.ones((min(length, 1),), bool),
                           jnp.any(srt[1:] != srt[:-1], axis=1)])
    group = jnp.cumsum(new.astype(jnp.int64)) - 1
    values = jnp.zeros((n,) + moved.shape[1:], x.dtype).at[group].set(
        jnp.reshape(srt, (length,) + moved.shape[1:]))
    inverse = jnp.zeros((length,), jnp.int64).at[perm].set(group)
    counts = jnp.zeros((n,), jnp.int64).at[group].add(1)
    return jnp.moveaxis(values, 0, dim), inverse, counts


def _unique_along(cls, func, x, dim, consecutive, host_op):
    dim = dim % max(x.dim(), 1)
    n = int(host_op(_host_values(x)).shape[dim])
    shape = list(x.shape)
    shape[dim] = n
    metas = [_meta(shape, x.dtype), _meta((x.shape[dim],)), _meta((n,))]
    return tuple(_node(func, _unique_slices, (x, dim, n, consecutive), metas, cls))


@tracer.special(aten.unique_dim.default, aten.unique_dim_consecutive.default)
def _unique_dim(cls, func, args, kwargs):
    # unique_dim sorts whatever `sorted` says (eager does too); the consecutive form does not
    b = tracer.bind(func, args, kwargs)
    x, d = b["self"], b["dim"]
    return _unique_along(cls, func, x, d, func is aten.unique_dim_consecutive.default,
                         lambda h: func(h, d)[0])


@tracer.special(aten.unique_consecutive.default)
def _unique_consecutive(cls, func, args, kwargs):
    """Along a dim: consecutive distinct slices; without one: host_values' flat version."""
    b = tracer.bind(func, args, kwargs)
    d = b.get("dim")
    if d is None:
        return host_values.unique_consecutive_flat(cls, func, args, kwargs)
    x = b["self"]
    return _unique_along(cls, func, x, d, True,
                         lambda h: torch.ops.aten.unique_consecutive(h, dim=d)[0])
