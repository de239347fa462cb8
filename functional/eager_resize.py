"""In-place ops that CPU eager lets resize the written tensor, where functionalization raises.

For an in-place op the Functionalize kernel first runs the op's meta kernel on meta twins of the
wrappers (its "meta reference"). ``addbmm_``'s meta kernel refuses a ``self`` merely
broadcastable to the product ([1] for a [5, 10] product); CPU eager's kernel resizes ``self`` to
the product's shape instead. Inside a meta reference the twin is resized first, as eager would;
the functional ``addbmm`` then broadcasts and ``replace_`` gives the wrapper the new sizes.

An out= view of another shape (``torch.mul(x, 2, out=base[3:9])`` with a [2, 2] result) is
resized by eager within its storage: same offset, contiguous strides. Functionalization gives the
wrapper the result's sizes and writes it back through the view's own steps, a ``slice_scatter``
of a source whose shape is not the slice's; that write-back puts the source, flattened, on the
storage elements from the slice's first one (``lowering/views.py: slice_scatter``).
"""
from __future__ import annotations


import torch
from torch._decomp import global_decomposition_table

from xla_compat.lazy import tracer
from xla_compat.lazy.tensor import LazyTensor

from .inner import forget_plans, handles
from .overrides import override
from .writes_eager import _in_meta_reference

aten = torch.ops.aten


def _addbmm_meta(original):
    def meta_reference(self, batch1, batch2, *, beta=1, alpha=1):
        if _in_meta_reference() and batch1.dim() == 3 and batch2.dim() == 3:
            shape = (batch1.shape[1], batch2.shape[2])
            if tuple(self.shape) != shape:
                torch.broadcast_shapes(tuple(self.shape), shape)   # eager's expand must succeed
                self.resize_(shape)
        return original(self, batch1, batch2, beta=beta, alpha=alpha)
    return meta_reference


def _resized_slice_write_back(cls, func, args, kwargs):
    """``slice_scatter(base, src, ...)`` whose ``src`` is not the slice's shape: the write-back of
    a resized out= view, traced as such (the view-chain composition expects the slice's shape)."""
    base, src = args[0], args[1]
    if not (isinstance(base, LazyTensor) and isinstance(src, LazyTensor)):
        return NotImplemented
    key = (base.shape, src.shape, *args[2:], *kwargs.items())
    resized = _RESIZED.get(key)
    if resized is None:
        d, start, end, step = (list(args[2:]) + [0, None, None, 1][len(args) - 2:])[:4]
        d = d % max(base.dim(), 1)
        n = len(range(*slice(start, end, step).indices(base.shape[d])))
        resized = tracer.keep(_RESIZED, key, tuple(src.shape) != tuple(base.shape[:d]) + (n,)
                              + tuple(base.shape[d + 1:]), 4096)
    return tracer.trace(cls, func, args, kwargs) if resized else NotImplemented


# (base shape, src shape, arguments) -> is it a resized write-back? (every slice_scatter asks)
_RESIZED: dict = {}
# It declines on shapes and arguments alone, which a plan key holds: viewchain may replay a
# slice_scatter it traced before this handler runs (inner.FunctionalInner.__torch_dispatch__).
_resized_slice_write_back.plan_safe = True


_lib = None


def install() -> None:
    """Wrap ``addbmm_``'s meta kernel and handle resized slice write-backs (once)."""
    global _lib
    if _lib is not None:
        return
    handles(aten.slice_scatter.default)(_resized_slice_write_back)
    forget_plans()
    # torch._meta_registrations serves addbmm_ on Meta with its post-autograd decomposition.
    original = (global_decomposition_table["meta"].get(aten.addbmm_.default)
                or global_decomposition_table["post_autograd"].get(aten.addbmm_.default))
    if original is None:
        return
    _lib = torch.library.Library("aten", "IMPL")
    override(_lib, aten.addbmm_.default, _addbmm_meta(original), "Meta")
