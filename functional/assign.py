"""Whole-tensor writes without tracing: what step capture (xla_compat/capture.py) replays.

A replayed step gives each state tensor a pending output of one replay node. On this path that
is what an in-place op does under functionalization: the wrapper's inner tensor is replaced by a
new one and the update is committed to its storage, so views of the tensor regenerate from it.
"""
from __future__ import annotations

import torch

from .inner import FunctionalInner


def assign(w: torch.Tensor, value) -> None:
    """The functional wrapper ``w`` now holds ``value`` (same shape and dtype), with its strides."""
    torch._sync(w)
    fresh = FunctionalInner(value, tuple(w.shape), w.dtype, tuple(w.stride()), w.storage_offset())
    torch._functionalize_replace(w, fresh)
    torch._functionalize_commit_update(w)
