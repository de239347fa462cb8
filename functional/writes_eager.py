"""Eager's errors for writes (in-place and out= ops) that functionalization does not raise on hlo.

A Functionalize kernel runs the *functional* op on the inner tensors and then swaps the written
wrapper's inner tensor, so the inner tensor never sees the original op. Where it can still tell:

* ``replace_`` casts the functional result to the written tensor's dtype with exactly
  ``_to_copy(result, dtype=, layout=)`` (a user's ``.to()`` passes no layout). A pointwise result
  that eager could not cast (``int_t.mul_(0.5)``) raises eager's error here, and the result takes
  back the written tensor's old value (the op's ``self``), so the wrapper keeps its value.
* ``copy(dst, src)`` is the functional half of ``copy_``: a source that partially overlaps the
  destination in one storage (``x.t().copy_(x)``) raises as eager does. Two inner tensors share a
  storage when their values come from one value through view copies only.
* ``polygamma_`` has no functionalization kernel upstream (its functional op takes ``n`` first):
  one is registered here, as ``self.copy_(polygamma(n, self))``.
"""
from __future__ import annotations

import functools

import torch

from xla_compat.lazy import tracer
from xla_compat.lazy.ir import Slot
from xla_compat.lazy.tensor import LazyTensor

from .inner import _HANDLERS, handles
from .strides import view_op_of

aten = torch.ops.aten


@functools.lru_cache(maxsize=None)
def _overload(name: str):
    """The OpOverload an IR node's op name ("aten.mul.Tensor") names, or None."""
    parts = name.split(".")
    if len(parts) != 3 or parts[0] != "aten":
        return None
    packet = getattr(aten, parts[1], None)
    return getattr(packet, parts[2], None) if packet is not None else None


def _is_pointwise(name: str) -> bool:
    op = _overload(name)
    return op is not None and torch.Tag.pointwise in op.tags


def _self_value(x: LazyTensor, dtype):
    """The value of the op's first tensor argument, if it can be what ``x`` was written over."""
    node = x._value.node
    first = node.args[0] if node.args else None
    if type(first) is not Slot:
        return None
    v = node.inputs[first.k]
    from xla_compat import _jax
    if tuple(v.aval.shape) != tuple(x.shape) or v.aval.dtype != _jax.to_jax_dtype(dtype):
        return None
    return v


def _written_cast(cls, func, args, kwargs):
    dtype = kwargs.get("dtype")
    x = args[0] if args else None
    if (len(kwargs) != 2 or "layout" not in kwargs or dtype is None
            or not isinstance(x, LazyTensor) or torch.can_cast(x.dtype, dtype)
            or not _is_pointwise(x._value.node.op)):
        return NotImplemented
    op, result = x._value.node.op, x.dtype
    old = _self_value(x, dtype)
    if old is not None:   # the written wrapper already holds ``x``: give it back its old value
        probe = cls(old, tuple(x.shape), dtype, x.stride(), x.storage_offset())
        torch._C.TensorBase.data.__set__(x, probe)
        x._value = old
    raise RuntimeError(
        f"result type {tracer._type_name(result)} can't be cast to the desired output type "
        f"{tracer._type_name(dtype)}\n  (xla_compat: raised by the in-place/out= form of {op} "
        f"on the functional path)")


def _root(value):
    """The value ``value`` views (through view copies only): its storage."""
    for _ in range(64):
        node = value.node
        op = _overload(node.op) if isinstance(getattr(node, "op", None), str) else None
        if op is None or view_op_of(op) is None or not node.inputs:
            return value
        value = node.inputs[0]
    return value


def _geometry(t):
    return tuple(t.shape), tuple(t.stride()), t.storage_offset()


_copy_next = _HANDLERS.get(aten.copy.default)


def _copy(cls, func, args, kwargs):
    dst, src = args[0], args[1]
    if (isinstance(dst, LazyTensor) and isinstance(src, LazyTensor) and dst is not src
            and dst.element_size() == src.element_size()
            and tracer.partial_overlap(_geometry(dst), _geometry(src))
            and _root(dst._value) is _root(src._value)):
        raise RuntimeError(f"{tracer.PARTIAL_OVERLAP}\n  (xla_compat: raised by aten.copy_ with "
                           f"inputs {tracer.describe(args)})")
    return _copy_next(cls, func, args, kwargs) if _copy_next is not None else NotImplemented


def _polygamma_(self, n):
    return self.copy_(torch.polygamma(n, self))


_lib = None


def install() -> None:
    """Register the handlers on the inner tensor and polygamma_'s Functionalize kernel (once)."""
    global _lib
    if _lib is not None:
        return
    handles(aten._to_copy.default)(_written_cast)
    handles(aten.copy.default)(_copy)
    _lib = torch.library.Library("aten", "IMPL")
    _lib.impl("polygamma_", _polygamma_, "Functionalize")
