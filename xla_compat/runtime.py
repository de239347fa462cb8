"""``torch_xla.runtime`` (``xr``) calls that mean something on the hlo device.

    import xla_compat.runtime as xr
    xr.initialize_cache("~/.cache/my_job")     # compiled graphs survive a restart
"""
from __future__ import annotations

from . import persistent_cache


def initialize_cache(path: str, readonly: bool = False) -> None:
    """Keep compiled graphs in ``path`` and load them from there in later processes; with
    ``readonly`` load only (workers sharing a directory that one of them fills). Call it once,
    before the first sync; ``XLA_PERSISTENT_CACHE_PATH`` / ``XLA_PERSISTENT_CACHE_READ_ONLY`` do
    the same from the environment."""
    persistent_cache.initialize(path, readonly=readonly)


def is_cache_initialized() -> bool:
    return persistent_cache.path() is not None


__all__ = ["initialize_cache", "is_cache_initialized"]
