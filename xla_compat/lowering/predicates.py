"""Ops that answer a Python bool (``torch.equal``, ``torch.allclose``): the comparison runs on
the device and one host round trip reads the answer, as ``.item()`` would."""
from __future__ import annotations

import torch

from ..lazy import tracer
from .registry import aten


@tracer.special(aten.equal.default)
def _equal(cls, func, args, kwargs):
    """Same sizes and equal elements (after type promotion, like eager); NaN is never equal."""
    a, b = args
    if tuple(a.shape) != tuple(b.shape):
        return False
    if a.numel() == 0:
        return True
    return bool(torch.eq(a, b).all().item())


@tracer.special(aten.allclose.default)
def _allclose(cls, func, args, kwargs):
    """``isclose(...).all()`` over broadcast inputs; dtypes must match, as eager requires."""
    bound = tracer._bind(func, args, kwargs)
    a, b = bound["self"], bound["other"]
    if a.dtype != b.dtype:
        raise RuntimeError(f"{tracer._type_name(a.dtype)} did not match "
                           f"{tracer._type_name(b.dtype)}")
    close = torch.isclose(a, b, rtol=bound.get("rtol", 1e-05), atol=bound.get("atol", 1e-08),
                          equal_nan=bound.get("equal_nan", False))
    return bool(close.all().item())

