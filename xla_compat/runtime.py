"""``torch_xla.runtime`` (``xr``): the calls torch_xla scripts make, on the hlo device.

    import xla_compat.runtime as xr                # was: import torch_xla.runtime as xr
    xr.initialize_cache("~/.cache/my_job")         # compiled graphs survive a restart
    print(xr.device_type(), xr.world_size(), xr.global_runtime_device_count())

One process drives every device here (SPMD through ``xs.mark_sharding``), so the process-group
calls answer for a single process: world size 1, ordinal 0.
"""
from __future__ import annotations

from . import persistent_cache
from .core import xla_model as _xm
from .distributed import spmd as _xs


def initialize_cache(path: str, readonly: bool = False) -> None:
    """Keep compiled graphs in ``path`` and load them from there in later processes; with
    ``readonly`` load only (workers sharing a directory that one of them fills). Call it once,
    before the first sync; ``XLA_PERSISTENT_CACHE_PATH`` / ``XLA_PERSISTENT_CACHE_READ_ONLY`` do
    the same from the environment."""
    persistent_cache.initialize(path, readonly=readonly)


def is_cache_initialized() -> bool:
    return persistent_cache.path() is not None


def device_type() -> str:
    """The backing hardware as torch_xla names it ("CPU" here: XLA's CPU client)."""
    return _xm.xla_device_hw(None)


def world_size() -> int:
    return _xm.world_size()


def global_ordinal() -> int:
    return _xm.get_ordinal()


def local_ordinal() -> int:
    return _xm.get_local_ordinal()


def process_index() -> int:
    return 0


def process_count() -> int:
    return 1


def global_runtime_device_count() -> int:
    """Devices a mesh can span (``xs.global_runtime_device_count``)."""
    return _xs.global_runtime_device_count()


def addressable_runtime_device_count() -> int:
    return _xs.global_runtime_device_count()


def use_spmd(auto: bool = False) -> None:
    """Not needed here: a mesh is usable at any time (kept for scripts)."""
    _xs.use_spmd()


def is_spmd() -> bool:
    """True: every mesh is partitioned by XLA's SPMD partitioner."""
    return True


__all__ = ["initialize_cache", "is_cache_initialized", "device_type", "world_size",
           "global_ordinal", "local_ordinal", "process_index", "process_count",
           "global_runtime_device_count", "addressable_runtime_device_count", "use_spmd",
           "is_spmd"]
