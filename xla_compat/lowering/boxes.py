"""A chain of permute, select and slice view steps as ONE box of the tensor they start from.

Both paths write through such chains (``cache.transpose(3, 4)[..., t] += 0.5``). Step by step
that is a whole-tensor transpose there and back per write; composed, the chain names a box of
the root (per root dim a start, size and stride, some dims selected away) and the order the view
lists its dims in, so a read is one slice of the root and a write one ``dynamic_update_slice``
(one scatter for strided slices), with only the view-sized value transposed. The step classes
are plain data here; a path may subclass them (legacy adds ``apply``/``write_back``).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import jax.numpy as jnp
from jax import lax


@dataclass(frozen=True)
class Permute:
    """View dim i is dim ``dims[i]`` of the tensor the step applies to."""

    dims: tuple


@dataclass(frozen=True)
class Select:
    """Drops ``dim`` at ``index`` (non-negative)."""

    dim: int
    index: int


@dataclass(frozen=True)
class Slice:
    """``start:end:step`` along ``dim`` (bounds normalised as torch does)."""

    dim: int
    start: int
    end: int
    step: int


@dataclass(frozen=True)
class Box:
    """Where a chain of steps puts a view in its root: per root dim ``(start, size, step, kept)``
    (``kept`` False: selected away), and ``order``, the root dim of each view dim."""

    dims: tuple
    order: tuple

    @property
    def shape(self) -> tuple:
        return tuple(self.dims[b][1] for b in self.order)

    @functools.cached_property
    def positions(self) -> tuple:
        """The set of root elements covered (equal tuples, equal sets)."""
        if any(d[1] == 0 for d in self.dims):
            return ()
        return tuple((s, n, st if n > 1 else 1) for s, n, st, _ in self.dims)

    def _kept(self) -> list:
        return [b for b, d in enumerate(self.dims) if d[3]]

    def to_box_layout(self, value):
        """A view-shaped value in root-dim order with size-1 dims where dims were selected."""
        kept = self._kept()
        value = jnp.transpose(value, [self.order.index(b) for b in kept])
        return jnp.reshape(value, tuple(d[1] for d in self.dims))

    def from_box_layout(self, value):
        kept = self._kept()
        value = jnp.reshape(value, tuple(self.dims[b][1] for b in kept))
        return jnp.transpose(value, [kept.index(b) for b in self.order])

    def read(self, root):
        if not self.positions:
            return jnp.zeros(self.shape, root.dtype)
        starts = [s for s, _, _, _ in self.dims]
        limits = [s + (n - 1) * st + 1 for s, n, st, _ in self.dims]
        strides = [st for _, _, st, _ in self.dims]
        return self.from_box_layout(lax.slice(root, starts, limits, strides))

    def write(self, root, src):
        if not self.positions:
            return root
        value = self.to_box_layout(src).astype(root.dtype)
        if all(n <= 1 or st == 1 for _, n, st, _ in self.dims):
            return lax.dynamic_update_slice(root, value, [s for s, _, _, _ in self.dims])
        index = tuple(slice(s, s + (n - 1) * st + 1, st) for s, n, st, _ in self.dims)
        return root.at[index].set(value)


@functools.lru_cache(maxsize=4096)
def compose(shape: tuple, chain: tuple) -> Box:
    dims = [[0, n, 1, True] for n in shape]
    order = list(range(len(shape)))
    for step in chain:
        if isinstance(step, Permute):
            order = [order[d] for d in step.dims]
        elif isinstance(step, Select):
            b = order.pop(step.dim)
            s, _, st, _ = dims[b]
            dims[b] = [s + step.index * st, 1, 1, False]
        else:
            b = order[step.dim]
            s, _, st, _ = dims[b]
            n = len(range(step.start, step.end, step.step))
            dims[b] = [s + step.start * st, n, st * step.step, True]
    return Box(tuple(tuple(d) for d in dims), tuple(order))
