"""xla_compat: run PyTorch programs on an XLA executor, on the legacy or the functional path.

    import torch, xla_compat as xc
    dev = xc.device()
    x = torch.randn(4, 4, device=dev)
    y = x.t().mul_(2)
    xc.sync()
"""
from __future__ import annotations

from . import _jax  # noqa: F401  (configures jax: x64)
from . import dynamo as _dynamo
from . import device as _device
from . import executor as _executor
from . import lowering as _lowering
from . import autocast as _autocast
from . import metrics, paths as _paths
from . import dispatch as _dispatch
from .dispatch import PathUnavailableError, explain, path, to_path, use_path
from .lazy import rng as _rng
from . import dualrun as _dualrun
from .dualrun import MismatchError, dual_run, dual_run_step, lockstep
from .lazy.tensor import LazyTensor, lock as _device_lock
from .errors import UnsupportedDtypeError, UnsupportedOpError
from .lazy.tracer import LoweringError
from .distributed.spmd import Mesh, clear_sharding, mark_sharding
from .capture import CapturedStep, compile

__version__ = "0.1.0"

_dynamo.skip(__name__)          # torch.compile calls the library's code, never traces it
_lowering.load_all()
_autocast.install()
_device.register()


def device(index: int = 0):
    """The hlo device, ``torch.device("hlo:0")``. The first call decides the path (``explain()``)."""
    dev = _device.device(index)
    _dispatch.ensure_decided()
    _dualrun.autostart()
    return dev


# Objects with ``before(tensors) -> tensors``, ``after(tensors)`` and ``engaged() -> bool``:
# dual-run lockstep syncs pair tensors as their twins and compares them after each sync.
_sync_hooks: list = []


def sync(tensors=None, wait: bool = False) -> None:
    """Cut the pending graph, compile it (cached) and run it: torch_xla's ``mark_step``."""
    for hook in _sync_hooks:
        tensors = hook.before(tensors)
    # One hold of the device lock from the paths' pre-sync work (legacy folds every storage's
    # pending writes) to the rebinding: another thread's op cannot land in between and be lost.
    with _device_lock:
        if tensors is None and _executor.quiet():      # nothing made since the last full sync
            metrics.inc("MarkStep")
        else:
            _paths.before_sync(tensors)
            inner = _paths.inner_tensors(tensors) if tensors is not None else None
            _executor.sync_tensors(inner, mark_step=tensors is None)
    if wait:
        _executor.wait_device_ops()
    for hook in _sync_hooks:
        hook.after(tensors)


mark_step = sync


def hlo_text(tensors) -> str:
    """StableHLO text of the graph that computes ``tensors`` (nothing runs)."""
    with _device_lock:
        _paths.before_sync(tensors)
        return _executor.hlo_text(_paths.inner_tensors(tensors))


storage_id = _paths.storage_id
shares_storage = _paths.shares_storage


def manual_seed(seed: int) -> None:
    """Seed the device RNG (``torch.manual_seed`` does this too)."""
    _rng.manual_seed(seed)


def wait_device_ops() -> None:
    _executor.wait_device_ops()


__all__ = ["device", "sync", "mark_step", "hlo_text", "manual_seed", "metrics", "LazyTensor",
           "LoweringError", "UnsupportedOpError", "UnsupportedDtypeError", "wait_device_ops",
           "path", "explain", "use_path", "to_path", "PathUnavailableError", "dual_run",
           "dual_run_step", "lockstep", "MismatchError", "Mesh", "mark_sharding",
           "clear_sharding", "compile", "CapturedStep", "storage_id", "shares_storage"]
