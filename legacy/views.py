"""View steps: one frozen dataclass per view kind, each a pure jax map ``base -> view`` and back.

A member of an alias reaches its value through a chain of steps from the alias base. ``read``
applies the chain; ``write`` puts a new view value back into the base. Chains of injective steps
write back step by step (slices stay ``dynamic_update_slice``); a chain with an overlapping step
(expand, overlapping unfold or as_strided) composes into one index map on the base and scatters,
which is also the shape issue 8's "one update of the base buffer" optimisation needs.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from xla_compat.lazy.tracer import keep
from xla_compat.lowering import boxes
from xla_compat.lowering.views import _bitcast, diag_index, write_positions


class ViewStep:
    """One view op: ``apply(base) -> view`` and ``write_back(base, value) -> new base``."""

    injective = True        # distinct view elements are distinct base elements
    keeps_elements = True   # each view element is one base element (no dtype reinterpretation)

    def apply(self, base):
        raise NotImplementedError

    def write_back(self, base, value):
        raise NotImplementedError


@dataclass(frozen=True)
class Reshape(ViewStep):
    """view/reshape/_reshape_alias/flatten/unflatten/squeeze/unsqueeze: same elements, new shape."""

    shape: tuple

    def apply(self, base):
        return jnp.reshape(base, self.shape)

    def write_back(self, base, value):
        return jnp.reshape(value, base.shape)


@dataclass(frozen=True)
class Permute(boxes.Permute, ViewStep):
    """permute/t/transpose/movedim/mT: ``dims[i]`` of the base is dim i of the view."""

    def apply(self, base):
        return jnp.transpose(base, self.dims)

    def write_back(self, base, value):
        return jnp.transpose(value, tuple(int(i) for i in np.argsort(self.dims)))


@dataclass(frozen=True)
class Slice(boxes.Slice, ViewStep):
    """slice/narrow/split/chunk pieces: ``start:end:step`` along ``dim`` (bounds normalised)."""

    def apply(self, base):
        return lax.slice_in_dim(base, self.start, self.end, self.step, axis=self.dim)

    def write_back(self, base, value):
        if self.step == 1:
            return lax.dynamic_update_slice_in_dim(base, value.astype(base.dtype), self.start,
                                                   axis=self.dim)
        index = [slice(None)] * base.ndim
        index[self.dim] = slice(self.start, self.end, self.step)
        return base.at[tuple(index)].set(value.astype(base.dtype))


@dataclass(frozen=True)
class Select(boxes.Select, ViewStep):
    """select/unbind pieces/integer indexing: drops ``dim`` at ``index`` (non-negative)."""

    def apply(self, base):
        return lax.index_in_dim(base, self.index, self.dim, keepdims=False)

    def write_back(self, base, value):
        return lax.dynamic_update_index_in_dim(base, value.astype(base.dtype), self.index,
                                               self.dim)


@dataclass(frozen=True)
class Diagonal(ViewStep):
    """diagonal(offset, dim1, dim2): the two dims go, the diagonal becomes the last dim."""

    offset: int
    dim1: int
    dim2: int

    def apply(self, base):
        i1, i2 = diag_index(base.shape, self.offset, self.dim1, self.dim2)
        return jnp.moveaxis(base, (self.dim1, self.dim2), (-2, -1))[..., i1, i2]

    def write_back(self, base, value):
        i1, i2 = diag_index(base.shape, self.offset, self.dim1, self.dim2)
        moved = jnp.moveaxis(base, (self.dim1, self.dim2), (-2, -1))
        moved = moved.at[..., i1, i2].set(value.astype(base.dtype))
        return jnp.moveaxis(moved, (-2, -1), (self.dim1, self.dim2))


@dataclass(frozen=True)
class Expand(ViewStep):
    """expand/expand_as: broadcasts to ``shape``; several view elements share one base element."""

    shape: tuple
    injective = False

    def apply(self, base):
        return jnp.broadcast_to(base, self.shape)

    def write_back(self, base, value):
        return scatter_through(base, (self,), value)


def _unfold_index(n: int, size: int, step: int) -> np.ndarray:
    return np.arange(n)[:, None] * step + np.arange(size)[None, :]


@dataclass(frozen=True)
class Unfold(ViewStep):
    """unfold(dim, size, step): windows along ``dim`` become a dim, the window a new last dim."""

    dim: int
    size: int
    step: int

    @property
    def injective(self):
        return self.step >= self.size

    def _windows(self, length):
        return (length - self.size) // self.step + 1 if length >= self.size else 0

    def apply(self, base):
        d, n = self.dim, self._windows(base.shape[self.dim])
        idx = _unfold_index(n, self.size, self.step).reshape(-1)
        taken = jnp.take(base, idx, axis=d) if idx.size else jnp.zeros(
            base.shape[:d] + (0,) + base.shape[d + 1:], base.dtype)
        taken = taken.reshape(base.shape[:d] + (n, self.size) + base.shape[d + 1:])
        return jnp.moveaxis(taken, d + 1, -1)

    def write_back(self, base, value):
        d, n = self.dim, self._windows(base.shape[self.dim])
        idx = _unfold_index(n, self.size, self.step).reshape(-1)
        v = jnp.moveaxis(value, -1, d + 1).reshape(base.shape[:d] + (n * self.size,)
                                                   + base.shape[d + 1:])
        index = (slice(None),) * d + (idx,)
        return base.at[index].set(v.astype(base.dtype))


class Layout(NamedTuple):
    """Sizes, strides and storage offset of a tensor over its storage (in elements); a named
    tuple because every traced op's result makes one."""

    shape: tuple
    stride: tuple
    offset: int

    @property
    def storage_size(self) -> int:
        if any(n == 0 for n in self.shape):
            return self.offset
        return self.offset + 1 + sum((n - 1) * s for n, s in zip(self.shape, self.stride))

    @property
    def is_plain(self) -> bool:
        """Contiguous from offset 0: the storage is the flattened value."""
        expect, ok = 1, self.offset == 0
        for n, s in reversed(list(zip(self.shape, self.stride))):
            ok = ok and (n == 1 or s == expect)
            expect *= n
        return ok

    def positions(self) -> np.ndarray:
        """Storage position of each element, in the layout's shape."""
        idx = np.full(tuple(self.shape), self.offset, dtype=np.int64)
        for d, (n, s) in enumerate(zip(self.shape, self.stride)):
            shape = [1] * len(self.shape)
            shape[d] = n
            idx = idx + (np.arange(n, dtype=np.int64) * s).reshape(shape)
        return idx

    @property
    def overlaps(self) -> bool:
        """May two elements share a storage position? (False is exact; True may be cautious.)"""
        extent = 1
        dims = sorted(((abs(s), n) for n, s in zip(self.shape, self.stride) if n > 1))
        for s, n in dims:
            if s < extent:
                return True
            extent += (n - 1) * s
        return False


def to_storage(base, root: Layout):
    """The root tensor's storage as a flat array (positions no element covers read as zero)."""
    if root.is_plain:
        return jnp.reshape(base, (-1,))
    pos = root.positions().reshape(-1)
    flat = jnp.zeros((root.storage_size,), base.dtype)
    return flat.at[pos].set(jnp.reshape(base, (-1,))) if pos.size else flat


def from_storage(storage, root: Layout):
    if root.is_plain:
        return jnp.reshape(storage[:int(np.prod(root.shape, dtype=np.int64))], root.shape)
    return storage[root.positions()]


@dataclass(frozen=True)
class AsStrided(ViewStep):
    """as_strided(size, stride, offset): elements of the root's storage, whatever the chain was."""

    view: Layout
    root: Layout

    @property
    def injective(self):
        return not self.view.overlaps

    def apply(self, base):
        storage = to_storage(base, self.root)
        idx = self.view.positions()
        return storage[idx] if idx.size else jnp.zeros(self.view.shape, base.dtype)

    def write_back(self, base, value):
        storage = to_storage(base, self.root)
        idx = self.view.positions().reshape(-1)
        if idx.size:
            storage = storage.at[idx].set(jnp.reshape(value, (-1,)).astype(base.dtype))
        return from_storage(storage, self.root)


@dataclass(frozen=True)
class GrowStorage:
    """IR rule: the storage ``root`` lays a value over, flat and extended to ``elements`` (eager's
    ``resize_`` past the storage; eager leaves the new elements uninitialised, here they are 0)."""

    root: Layout
    elements: int

    def __call__(self, base):
        flat = to_storage(base, self.root)
        return jnp.pad(flat, (0, self.elements - flat.shape[0]))


def in_flat(view: Layout, flat: Layout) -> tuple:
    """The steps from a flat storage (``flat``: 1-d from offset 0) to a tensor laid out as
    ``view`` over it: a slice and a reshape where ``view`` is contiguous, else ``as_strided``."""
    if not Layout(view.shape, view.stride, 0).is_plain:
        return (AsStrided(view, flat),)
    numel = int(np.prod(view.shape, dtype=np.int64))
    whole = view.offset == 0 and numel == flat.shape[0]
    steps = () if whole else (Slice(0, view.offset, view.offset + numel, 1),)
    return steps if tuple(view.shape) == (numel,) else steps + (Reshape(tuple(view.shape)),)


def rebase(chain: tuple, prefix: tuple, flat: Layout) -> tuple:
    """``chain`` from an old root, as steps from the flat storage the root lies in (``prefix``
    reaches the old root: ``in_flat``). An ``as_strided`` step names storage positions: it
    stays, over ``flat``."""
    if chain and type(chain[0]) is AsStrided:
        return (AsStrided(chain[0].view, flat),) + chain[1:]
    return prefix + chain


@dataclass(frozen=True)
class ViewAsReal(ViewStep):
    """view_as_real: complex (...) -> real (..., 2)."""

    keeps_elements = False

    def apply(self, base):
        return jnp.stack([jnp.real(base), jnp.imag(base)], axis=-1)

    def write_back(self, base, value):
        return lax.complex(value[..., 0], value[..., 1]).astype(base.dtype)


@dataclass(frozen=True)
class ViewAsComplex(ViewStep):
    """view_as_complex: real (..., 2) -> complex (...)."""

    keeps_elements = False

    def apply(self, base):
        return lax.complex(base[..., 0], base[..., 1])

    def write_back(self, base, value):
        return jnp.stack([jnp.real(value), jnp.imag(value)], axis=-1).astype(base.dtype)


@dataclass(frozen=True)
class Bitcast(ViewStep):
    """view(dtype): the same bytes read as another dtype (``shape`` is the view's shape)."""

    dtype: object
    shape: tuple
    keeps_elements = False

    def apply(self, base):
        return _bitcast(base, jax.ShapeDtypeStruct(self.shape, self.dtype))

    def write_back(self, base, value):
        return _bitcast(value, jax.ShapeDtypeStruct(base.shape, base.dtype))


# ----------------------------------------------------------------------------------------------
# Chains.

def _box(chain: tuple, shape: tuple):
    """The one box of the base a chain of two or more permutes, selects and slices views (so a
    read or write is one slice or update of the base, no whole-base transposes), else None."""
    return box_of(chain, shape) if len(chain) >= 2 else None


def box_of(chain: tuple, shape: tuple):
    """The box of a base of ``shape`` that a non-empty chain of permutes, selects and slices
    views, else None."""
    if not chain or not all(isinstance(s, (Permute, Select, Slice)) for s in chain):
        return None
    return boxes.compose(tuple(shape), chain)


def same_elements(shape: tuple, a: tuple, b: tuple):
    """``(box of a, box of b)`` where chains ``a`` and ``b`` view exactly the same (non-empty)
    set of elements of a base of ``shape``, else None. Each element then sits at one place in
    each view: a value written through ``a`` is, rearranged, what ``b`` reads (``Rebox``), and a
    write through ``b`` overwrites all of it.

    Asked on reads and writes of a storage whose last write went through another chain (a
    decode loop: every position); remembered by the identity of the steps (a replayed view
    reuses its plan's step objects), which the memo keeps alive so no id is reused while it
    holds it. Hashing the steps themselves (Python-level dataclass hashes) cost more than the
    answer."""
    key = (shape, tuple(map(id, a)), tuple(map(id, b)))
    hit = _SAME.get(key)
    if hit is not None:
        return hit[2]
    return keep(_SAME, key, (a, b, _same_elements(shape, a, b)), 4096)[2]


_SAME: dict = {}


def _same_elements(shape: tuple, a: tuple, b: tuple):
    if a == b:
        return None              # callers handle the same chain themselves
    box_a = box_of(a, shape)
    if box_a is None or not box_a.positions:
        return None
    box_b = box_of(b, shape)
    if box_b is None or box_b.positions != box_a.positions:
        return None
    return box_a, box_b


@dataclass(frozen=True)
class Rebox:
    """IR rule: a value written through box ``src``, as box ``dst`` of the same elements reads
    it (a reshape and a transpose of the view-sized value; the base is not read)."""

    src: boxes.Box
    dst: boxes.Box

    def __call__(self, value):
        return self.dst.from_box_layout(self.src.to_box_layout(value))


def fold(chain: tuple, root_shape: tuple) -> tuple:
    """``chain`` (whose steps but the last are folded already) with its tail folded: a reshape of
    a reshape is one reshape, a permute of a permute one permute (none when it is the identity),
    and a lone reshape to the root's own shape is no step. A view that is its base then reads
    the base's value itself: autograd's weight gradient ``mm(..).t().t()`` is one value, not a
    base and a copy of it (a sync that keeps both outputs them twice, and XLA copies)."""
    while len(chain) >= 2:
        a, b = chain[-2], chain[-1]
        if type(a) is Reshape and type(b) is Reshape:
            chain = chain[:-2] + (b,)
        elif type(a) is Permute and type(b) is Permute:
            dims = tuple(a.dims[i] for i in b.dims)
            chain = chain[:-2] + (() if dims == tuple(range(len(dims))) else (Permute(dims),))
        else:
            break
    if len(chain) == 1 and type(chain[0]) is Reshape and chain[0].shape == tuple(root_shape):
        return ()
    return chain


def read(base, chain: tuple):
    box = _box(chain, base.shape)
    if box is not None:
        return box.read(base)
    for step in chain:
        base = step.apply(base)
    return base


def injective(chain: tuple) -> bool:
    return all(step.injective for step in chain)


def write(base, chain: tuple, value):
    """``base`` with ``value`` written where ``chain`` views it."""
    if not chain:
        return value.astype(base.dtype)
    if not injective(chain):
        return scatter_through(base, chain, value)
    box = _box(chain, base.shape)
    if box is not None:
        return box.write(base, value)
    inner = [base]
    for step in chain[:-1]:
        inner.append(step.apply(inner[-1]))
    for step, b in zip(reversed(chain), reversed(inner)):
        value = step.write_back(b, value)
    return value


def scatter_through(base, chain: tuple, value):
    """Compose ``chain`` into one index map over ``base`` and scatter ``value`` through it.

    Where view elements share a base element, only the elements the write CHANGED count (eager
    writes just the elements an op touches: ``x.expand(3, 2)[1] = 5`` leaves the other rows'
    copies alone), and of several changed ones the last in the view's element order wins (what a
    sequential eager loop over the view leaves behind).
    """
    if not all(step.keeps_elements for step in chain):
        raise NotImplementedError(
            "xla_compat: writing through a chain of views that both reinterprets the dtype "
            "(view_as_real/view_as_complex/view(dtype)) and overlaps itself (expand, overlapping "
            "unfold or as_strided) is not supported on the legacy path; clone() the view first")
    flat, idx, vals = _flat_through(base, chain, value)
    flat = write_positions(flat, idx, vals, overlapping=True)
    return jnp.reshape(flat, base.shape)


def add_through(base, chain: tuple, delta):
    """``base`` with ``delta`` (in the view's shape) ADDED at the storage element each view
    element is: where view elements share one (an expanded view), all their deltas add up, as
    eager's accumulating writes into overlapping memory do."""
    flat, idx, vals = _flat_through(base, chain, delta)
    return jnp.reshape(flat.at[idx].add(vals), base.shape)


def _flat_through(base, chain: tuple, value):
    """(``base`` flattened, the flat base position of each view element, ``value`` broadcast
    to the view and flattened in the same order): the one index map a chain composes into."""
    size = int(np.prod(base.shape, dtype=np.int64))
    kind = jnp.int32 if size < 2 ** 31 else jnp.int64
    idx = read(jnp.reshape(lax.iota(kind, size), base.shape), chain)
    vals = jnp.reshape(jnp.broadcast_to(value, idx.shape), (-1,)).astype(base.dtype)
    return jnp.reshape(base, (-1,)), jnp.reshape(idx, (-1,)), vals


@dataclass(frozen=True)
class AddChain:
    """IR rule: the alias base after ``delta`` was added through ``chain`` (see add_through)."""

    chain: tuple

    def __call__(self, base, delta):
        return add_through(base, self.chain, delta)


@dataclass(frozen=True)
class ReadChain:
    """IR rule: the value of a member, read from its alias base through ``chain``."""

    chain: tuple

    def __call__(self, base):
        return read(base, self.chain)


@dataclass(frozen=True)
class WriteChain:
    """IR rule: the alias base after a member reached through ``chain`` took a new value."""

    chain: tuple

    def __call__(self, base, value):
        return write(base, self.chain, value)
