"""Eager strides for functional views: what PyTorch does for XLA/Lazy, done here for ``hlo``.

Functionalization turns ``x.t()`` into ``t_copy`` on the inner tensor and gives the wrapper the
inner result's strides. A ``*_copy`` meta kernel returns contiguous strides, so ``x.t()`` would
report itself contiguous and ``x.t().contiguous()`` would return an alias. PyTorch avoids this
only for the XLA and Lazy keys, by running the view on a meta tensor with the base's strides.
We do the same: the inner tensor of a view carries the strides and storage offset eager would give.
"""
from __future__ import annotations

import functools
from typing import Optional

import torch

from xla_compat.lazy.tracer import call_key, keep

aten = torch.ops.aten


@functools.lru_cache(maxsize=None)
def view_op_of(func) -> Optional[torch._ops.OpOverload]:
    """The aliasing view overload whose copy ``func`` is (``t_copy.default`` -> ``t.default``)."""
    name = func._schema.name.split("::", 1)[1]
    if name == "_unsafe_view":
        return aten.view.default
    if not name.endswith("_copy") or name in ("narrow_copy", "_to_copy"):
        return None
    packet = getattr(aten, name[: -len("_copy")], None)
    if packet is None or func._overloadname not in packet.overloads():
        return None
    op = getattr(packet, func._overloadname)
    returns = op._schema.returns
    return op if returns and returns[0].alias_info is not None else None


# Which storage a functional wrapper is on (the address of its storage), for telling storages
# apart. Never ``t.untyped_storage()`` on a wrapper: that Python storage object outlives the call,
# and upstream's ``resize_`` counts it as one more view of the storage and refuses to grow it.
storage_id = torch._C._storage_id


def storage_extent(size, stride, offset: int) -> int:
    """Elements of storage a tensor of this geometry needs (0 when it has no elements)."""
    if any(s == 0 for s in size):
        return offset
    return offset + 1 + sum((n - 1) * abs(s) for n, s in zip(size, stride))


def meta_like(t: torch.Tensor) -> torch.Tensor:
    """A meta tensor with ``t``'s sizes, strides and storage offset."""
    size, stride, offset = tuple(t.shape), t.stride(), t.storage_offset()
    n = max(storage_extent(size, stride, offset), 1)
    return torch.empty((n,), dtype=t.dtype, device="meta").as_strided(size, stride, offset)


def _to_meta(x):
    if isinstance(x, torch.Tensor):
        return meta_like(x)
    if isinstance(x, (list, tuple)):
        return type(x)(_to_meta(e) for e in x)
    return x


_GEOMETRY: dict = {}
_GEOMETRY_LIMIT = 65536


def eager_geometry(func, args, kwargs) -> Optional[list]:
    """[(strides, storage_offset)] of each output of the view ``func`` copies, as eager has them.

    None when ``func`` is not a view copy or the view cannot be taken with these strides (eager
    would have copied, e.g. ``reshape`` of a transposed tensor): the contiguous result stands.
    Cached on the op and its arguments' geometry and static values (the tracer's meta-cache key),
    so a traced loop takes each distinct view on meta tensors once.
    """
    view = view_op_of(func)
    if view is None:
        return None
    key = call_key([func], args, kwargs)
    if key is not None:
        hit = _GEOMETRY.get(key, _GEOMETRY)
        if hit is not _GEOMETRY:
            return hit
    try:
        out = view(*_to_meta(args), **_to_meta(kwargs))
    except Exception:
        out = None
    if out is None:
        geometry = None
    else:
        outs = list(out) if isinstance(out, (list, tuple)) else [out]
        geometry = [(tuple(o.stride()), o.storage_offset()) for o in outs]
    if key is not None:
        keep(_GEOMETRY, key, geometry, _GEOMETRY_LIMIT)
    return geometry
