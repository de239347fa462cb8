"""A chain of permute, select and slice steps as ONE box of the alias base.

Written step by step, a write through ``cache.transpose(3, 4)[..., t]`` transposes the whole
base, updates it and transposes it back (two whole-cache transposes per write). Composed, the
chain names a box of the base (a start, size and stride per base dim, some dims fixed at one
index) and the order the view lists the box's remaining dims in; the write transposes only the
written value into the base's order and updates the box: one ``dynamic_update_slice`` when
every stride is 1, one strided scatter otherwise. A read slices the box and transposes only it.
"""
from __future__ import annotations

from dataclasses import dataclass

import jax.numpy as jnp
from jax import lax

from .views import Permute, Select, Slice


@dataclass(frozen=True)
class Box:
    """Where a view sits in its base: per base dim a start, size and step (``fixed`` dims have
    size 1 and are dropped from the view), and ``order``: the base dim of each view dim."""

    start: tuple
    size: tuple
    step: tuple
    fixed: frozenset
    order: tuple

    @property
    def dense(self) -> bool:
        return all(s == 1 for s in self.step)


_COMPOSABLE = (Permute, Select, Slice)


def box_of(chain: tuple, shape: tuple) -> Box | None:
    """The box ``chain`` views in a base of ``shape``, or None when a step is not a permute,
    select or slice (or the chain is a single step, which writes back directly already)."""
    if len(chain) < 2 or not all(type(s) in _COMPOSABLE for s in chain):
        return None
    start = [0] * len(shape)
    size = list(shape)
    step = [1] * len(shape)
    fixed = set()
    order = list(range(len(shape)))
    for s in chain:
        if type(s) is Permute:
            order = [order[d] for d in s.dims]
        elif type(s) is Select:
            b = order.pop(s.dim)
            start[b] += s.index * step[b]
            size[b] = 1
            fixed.add(b)
        else:
            b = order[s.dim]
            start[b] += s.start * step[b]
            size[b] = len(range(s.start, s.end, s.step))
            step[b] *= s.step
    return Box(tuple(start), tuple(size), tuple(step), frozenset(fixed), tuple(order))


def read(base, box: Box):
    """The view's value: the box, its fixed dims dropped, its dims in the view's order."""
    end = tuple(st + (n - 1) * k + 1 if n else st for st, n, k in zip(box.start, box.size,
                                                                         box.step))
    piece = lax.slice(base, box.start, end, box.step)
    kept = [d for d in range(base.ndim) if d not in box.fixed]
    piece = jnp.reshape(piece, tuple(box.size[d] for d in kept))
    return jnp.transpose(piece, [kept.index(b) for b in box.order])


def write(base, box: Box, value):
    """``base`` with ``value`` (in the view's shape) written into the box."""
    kept = sorted(box.order)
    value = jnp.transpose(value.astype(base.dtype), [box.order.index(b) for b in kept])
    value = jnp.reshape(value, box.size)
    if box.dense:
        return lax.dynamic_update_slice(base, value, box.start)
    index = tuple(slice(st, st + (n - 1) * k + 1, k) if n else slice(st, st)
                  for st, n, k in zip(box.start, box.size, box.step))
    return base.at[index].set(value)

