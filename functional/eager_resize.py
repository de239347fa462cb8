"""In-place ops that CPU eager lets resize the written tensor, where functionalization raises.

For an in-place op the Functionalize kernel first runs the op's meta kernel on meta twins of the
wrappers (its "meta reference"). ``addbmm_``'s meta kernel refuses a ``self`` merely
broadcastable to the product ([1] for a [5, 10] product); CPU eager's kernel resizes ``self`` to
the product's shape instead. Inside a meta reference the twin is resized first, as eager would;
the functional ``addbmm`` then broadcasts and ``replace_`` gives the wrapper the new sizes.
"""
from __future__ import annotations

import warnings

import torch
from torch._decomp import global_decomposition_table

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


_lib = None


def install() -> None:
    """Wrap ``addbmm_``'s meta kernel (once)."""
    global _lib
    if _lib is not None:
        return
    # torch._meta_registrations serves addbmm_ on Meta with its post-autograd decomposition.
    original = (global_decomposition_table["meta"].get(aten.addbmm_.default)
                or global_decomposition_table["post_autograd"].get(aten.addbmm_.default))
    if original is None:
        return
    _lib = torch.library.Library("aten", "IMPL")
    with warnings.catch_warnings():   # "overriding a previously registered kernel": meant
        warnings.simplefilter("ignore")
        _lib.impl(aten.addbmm_.default, _addbmm_meta(original), "Meta")
