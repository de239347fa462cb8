"""Hooks through which the paths take part in syncs and transfers without the core importing them.

A path registers ``before_sync(tensors)`` (apply pending alias updates) and ``inner(t)`` (the
LazyTensor holding a user-visible tensor's value). The dispatch layer decides which path new
tensors get; this module only fans out to whatever paths are loaded.
"""
from __future__ import annotations

from .lazy.tensor import LazyTensor

_before_sync: list = []
_inner: list = []


def register(before_sync=None, inner=None) -> None:
    if before_sync is not None:
        _before_sync.append(before_sync)
    if inner is not None:
        _inner.append(inner)


def before_sync(tensors) -> None:
    for fn in _before_sync:
        fn(tensors)


def inner_tensor(t):
    if isinstance(t, LazyTensor):
        return t
    for fn in _inner:
        got = fn(t)
        if got is not None:
            return got
    raise TypeError(f"xla_compat: {type(t).__name__} on {getattr(t, 'device', '?')} is not an "
                    f"hlo tensor")


def inner_tensors(tensors) -> list:
    return [inner_tensor(t) for t in tensors]
