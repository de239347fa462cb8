"""Meta kernels for the few aten ops PyTorch ships without one (backward ops, samplers).

The tracer takes every output's shape from the op's meta kernel. These ops return a gradient
shaped like their ``self`` argument; the kernel is registered only where none exists, so a
torch release that adds its own wins.
"""
from __future__ import annotations

import torch

_LIB = torch.library.Library("aten", "IMPL")


def _like_self(grad, x, *args):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def grad_like_self(*names: str) -> None:
    """Give each ``aten::<name>`` (args: grad, self, ...) a meta kernel returning self's shape."""
    for name in names:
        if not torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{name}", "Meta"):
            _LIB.impl(name, _like_self, "Meta")


def _like_first(x, *args, **kwargs):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def like_first(*names: str) -> None:
    """Give each ``aten::<name>`` a meta kernel returning its first argument's shape and dtype
    (samplers: ``binomial(count, prob)``, ``_sample_dirichlet(alpha)``)."""
    for name in names:
        if not torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{name}", "Meta"):
            _LIB.impl(name, _like_first, "Meta")


def where_missing(kernels: dict) -> None:
    """Register each ``{"name.overload": kernel}`` as a meta kernel where the op has none."""
    for name, kernel in kernels.items():
        if not torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{name}", "Meta"):
            _LIB.impl(name, kernel, "Meta")
