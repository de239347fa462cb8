"""Views upstream functionalization gets wrong for a non-XLA backend, handled by storage position.

Two cases (see DESIGN.md, "Checked facts"):

* ``as_strided`` indexes *storage*. The inner tensor of a view (or of a result with permuted
  strides) holds its elements in logical order, so ``as_strided_copy`` on it must first map
  storage positions to logical elements through the tensor's eager strides. Positions outside
  the tensor belong to a base we cannot see from here: a clear error, never a wrong read.
* A write through ``unfold`` windows that do not cover the base (gaps between windows, or a tail)
  is written back by upstream as ``unfold_backward``, which zeroes the uncovered elements. We find
  the base the view was read from in the written value's graph and keep its uncovered elements.
"""
from __future__ import annotations

import contextlib
import threading

from dataclasses import dataclass

import numpy as np
import torch

from xla_compat.lazy.ir import Aval, DeviceData, Node, Slot, Value
from xla_compat.lowering.views import strided_index, write_positions

aten = torch.ops.aten


class FunctionalizationLimit(RuntimeError):
    """A view write or read the functional path cannot express with eager semantics."""


positions = strided_index  # storage position of every element of a geometry


def is_plain(t: torch.Tensor) -> bool:
    """Logical order equals storage order from offset 0 (the core's as_strided rules hold)."""
    return t.storage_offset() == 0 and t.is_contiguous()


def storage_to_logical(t: torch.Tensor, wanted: np.ndarray, what: str) -> np.ndarray:
    """Flat logical indices of ``t`` for storage positions ``wanted``, or a clear error."""
    pos = positions(tuple(t.shape), t.stride(), t.storage_offset()).reshape(-1)
    order = np.argsort(pos, kind="stable")
    sorted_pos = pos[order]
    flat = wanted.reshape(-1)
    at = np.searchsorted(sorted_pos, flat)
    ok = (at < len(sorted_pos)) & (sorted_pos[np.minimum(at, len(sorted_pos) - 1)] == flat) \
        if len(sorted_pos) else np.zeros(flat.shape, bool)
    if not ok.all():
        bad = int(flat[~ok][0])
        raise FunctionalizationLimit(
            f"xla_compat: {what} reaches storage element {bad}, which lies outside the tensor it "
            f"was called on (size {list(t.shape)}, stride {list(t.stride())}, offset "
            f"{t.storage_offset()}). On the functional path a view holds only its own elements; "
            f"call as_strided on the base tensor instead, or .clone() the view first.")
    return order[at].reshape(wanted.shape)


@dataclass(frozen=True, eq=False)
class Gather:
    """``x.reshape(-1)[index]``: a read at static positions (kept in the graph key by value)."""

    index: bytes
    shape: tuple

    def __call__(self, x):
        idx = np.frombuffer(self.index, dtype=np.int64).reshape(self.shape)
        return x.reshape(-1)[idx] if idx.size else x.reshape(-1)[:0].reshape(self.shape)

    def __eq__(self, other):
        return type(other) is Gather and other.shape == self.shape and other.index == self.index

    def __hash__(self):
        return hash(("gather", self.shape, self.index))


@dataclass(frozen=True, eq=False)
class Scatter:
    """``x.reshape(-1).at[index].set(src)``: a write at static positions."""

    index: bytes
    shape: tuple

    def __call__(self, x, src):
        idx = np.frombuffer(self.index, dtype=np.int64)
        if not idx.size:
            return x
        vals = src.reshape(-1).astype(x.dtype)
        return write_positions(x.reshape(-1), idx, vals).reshape(x.shape)

    def __eq__(self, other):
        return type(other) is Scatter and other.shape == self.shape and other.index == self.index

    def __hash__(self):
        return hash(("scatter", self.shape, self.index))


def _node(op: str, rule, inputs, shape, dtype_of) -> Value:
    args = tuple(Slot(i) for i in range(len(inputs)))
    node = Node(op, rule, args, (), tuple(inputs), (Aval(tuple(shape), dtype_of),))
    return Value(node, 0)


def as_strided_read(cls, x, size, stride, offset):
    """``as_strided_copy`` on a tensor whose logical order is not its storage order."""
    offset = x.storage_offset() if offset is None else offset
    want = positions(size, stride, offset)
    idx = storage_to_logical(x, want, "as_strided")
    rule = Gather(np.ascontiguousarray(idx, dtype=np.int64).tobytes(), tuple(size))
    value = _node("functional.as_strided_gather", rule, [x._value], size, x._value.aval.dtype)
    return cls(value, tuple(size), x.dtype)


def as_strided_write(cls, base, src, size, stride, offset):
    """``as_strided_scatter`` into a base whose logical order is not its storage order."""
    offset = base.storage_offset() if offset is None else offset
    want = positions(size, stride, offset)
    idx = storage_to_logical(base, want, "as_strided_scatter")
    rule = Scatter(np.ascontiguousarray(idx, dtype=np.int64).tobytes(), tuple(base.shape))
    value = _node("functional.as_strided_scatter", rule, [base._value, src._value], base.shape,
                  base._value.aval.dtype)
    return cls(value, tuple(base.shape), base.dtype, base.stride(), base.storage_offset())


# ----------------------------------------------------------------------------------------------
# unfold write-back

def unfold_positions(sizes, dim, size, step) -> np.ndarray:
    """Index along ``dim`` of every (window, element) pair: shape (n_windows, size)."""
    n = (sizes[dim] - size) // step + 1 if sizes else 1
    return np.arange(max(n, 0))[:, None] * step + np.arange(size)[None, :]


def leaves_gaps(sizes, dim, size, step) -> bool:
    if not sizes:
        return False
    covered = np.zeros(sizes[dim], bool)
    covered[unfold_positions(sizes, dim, size, step).reshape(-1)] = True
    return not covered.all()


def find_node(value: Value, wanted, limit: int = 2000):
    """The first node of ``value``'s graph (searched from ``value`` back) that ``wanted(node)``
    accepts, or None."""
    seen, stack = set(), [value.node]
    while stack and len(seen) < limit:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if wanted(node):
            return node
        stack.extend(v.node for v in node.inputs)
    return None


def find_unfold_read(value: Value, sizes, dim, size, step, limit: int = 2000):
    """The ``unfold_copy`` node the written view was read from, searched in its graph."""
    def reads(node) -> bool:
        if node.op != "aten.unfold_copy.default" or len(node.inputs) != 1:
            return False
        d, s, st = node.args[1:4]
        base = node.inputs[0]
        nd = max(len(base.aval.shape), 1)
        return (d % nd, s, st) == (dim, size, step) and tuple(base.aval.shape) == tuple(sizes)
    return find_node(value, reads, limit)


def _synced_view_value(new: Value):
    """The device data an in-place op on a synced view read as the view's value (the first
    input of the op that computed ``new``, of ``new``'s shape and dtype), or None: ``new``
    was written whole (a copy: walked already; an out= result arrives as one)."""
    node = new.node
    if node.rule is None or not node.inputs or node.op.startswith("overlap."):
        return None
    first = node.args[0] if node.args else None
    if type(first) is not Slot:
        return None
    v = node.inputs[first.k]
    return v if (type(v.node) is DeviceData and v.aval == new.aval) else None


@dataclass(frozen=True)
class UnfoldWriteBack:
    """Put unfold windows back into ``base`` along ``dim``; uncovered elements keep base's values."""

    dim: int
    size: int
    step: int

    def __call__(self, base, windows):
        import jax.numpy as jnp
        if base.ndim == 0:
            return windows.reshape(())
        idx = unfold_positions(base.shape, self.dim, self.size, self.step)
        # windows: base.shape with dim -> n_windows, plus a trailing window axis of `size`.
        w = jnp.moveaxis(windows, -1, self.dim + 1)
        w = w.reshape(base.shape[:self.dim] + (idx.size,) + base.shape[self.dim + 1:])
        index = [slice(None)] * base.ndim
        index[self.dim] = idx.reshape(-1)
        return base.at[tuple(index)].set(w.astype(base.dtype))


@dataclass(frozen=True)
class UnfoldCover:
    """Unfold windows that cover every element of a base of ``sizes``, put back into it."""

    sizes: tuple
    dim: int
    size: int
    step: int

    def __call__(self, windows):
        import jax.numpy as jnp
        base = jnp.zeros(self.sizes, windows.dtype)
        return UnfoldWriteBack(self.dim, self.size, self.step)(base, windows)


def overlaps(sizes, dim, size, step) -> bool:
    """Do two windows share an element?"""
    return bool(sizes) and step < size and (sizes[dim] - size) // step >= 1


_op_state = threading.local()


@contextlib.contextmanager
def as_op():
    """Inside: an ``unfold_backward`` is the program's own op, not a view's write-back."""
    _op_state.depth = getattr(_op_state, "depth", 0) + 1
    try:
        yield
    finally:
        _op_state.depth -= 1


def unfold_write_back(cls, grad, sizes, dim, size, step):
    """The functional inverse of ``unfold`` that keeps the elements between windows and, where
    windows overlap, writes each shared element as eager's walk does (``overlap.py``); or None
    (upstream's ``unfold_backward``, the sum of the windows, is right)."""
    sizes = tuple(int(s) for s in sizes)
    dim = dim % max(len(sizes), 1)
    shared = overlaps(sizes, dim, size, step)
    if not shared and not leaves_gaps(sizes, dim, size, step):
        return None
    node = torch._C._current_autograd_node()
    if node is not None and type(node).__name__ == "UnfoldBackward0":
        return None  # autograd's gradient of unfold: zeros between windows are right there
    if getattr(_op_state, "depth", 0):
        return None  # the program's own unfold_backward (istft's overlap-add): the sum
    read = find_unfold_read(grad._value, sizes, dim, size, step)
    if read is None and shared and not leaves_gaps(sizes, dim, size, step):
        # The windows cover the base, so it needs no read of its own: a write of every element
        # not computed from the windows (an out= result or a copy, walked by ``copy_walk``):
        # the last write of each element wins. Or an op on the windows' value as a sync left
        # it (device data of the view's own, not re-read from the base: ``v.mul_(2)`` after
        # ``v.clamp_(..)`` and a sync), which walks as any op on the windows does.
        from .overlap import unfold_walk
        new = grad._value
        synced = _synced_view_value(new)
        value = (unfold_walk(synced, new, sizes, dim, size, step) if synced is not None else
                 unfold_walk(new, new, sizes, dim, size, step, grad.stride()))
        value = _node("functional.unfold_cover", UnfoldCover(sizes, dim, size, step), [value],
                      sizes, value.aval.dtype)
        return cls(value, sizes, grad.dtype)
    if read is None:
        what = ("write each element the windows share as eager does"
                if shared else "keep the elements between the windows")
        raise FunctionalizationLimit(
            f"xla_compat: a write through x.unfold({dim}, {size}, {step}) of a tensor of size "
            f"{list(sizes)} must {what}, but the functional path cannot find the values the "
            f"view had (the write did not read the view, e.g. an out= result, or the view was "
            f"synced away from its base). Write into the base directly, or clone the unfolded "
            f"view before writing it.")
    base, value = read.inputs[0], grad._value
    if shared:
        from .overlap import unfold_walk
        value = unfold_walk(Value(read, 0), value, sizes, dim, size, step)
    value = _node("functional.unfold_write_back", UnfoldWriteBack(dim, size, step),
                  [base, value], sizes, base.aval.dtype)
    return cls(value, sizes, grad.dtype)
