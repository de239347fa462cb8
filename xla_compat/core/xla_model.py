"""``xm``: torch_xla.core.xla_model's common calls, with its names and return shapes.

Existing scripts move over by changing ``import torch_xla.core.xla_model as xm`` to
``import xla_compat.core.xla_model as xm``. One process drives one device (hlo:0), so the
collective and ordinal helpers answer for a world of one.
"""
from __future__ import annotations

import torch

import xla_compat as _xc
from xla_compat import paths as _paths


def xla_device(n: int | None = None, devkind: str | None = None) -> torch.device:
    """The hlo device (torch_xla: the n-th XLA device)."""
    return _xc.device(0 if n is None else n)


def get_xla_supported_devices(devkind: str | None = None, max_devices: int | None = None) -> list:
    devices = [str(_xc.device())]
    return devices if max_devices is None else devices[:max_devices]


def xla_device_hw(device) -> str:
    """The hardware kind behind the device: the jax backend's platform name, upper case."""
    import jax
    return jax.devices()[0].platform.upper()


def is_xla_tensor(tensor) -> bool:
    return isinstance(tensor, torch.Tensor) and tensor.device.type == _xc.device().type


def mark_step(wait: bool = False, reset_scope: bool = True) -> None:
    """Cut the pending graph, compile (cached) and run it."""
    _xc.sync(wait=wait)


def wait_device_ops(devices=()) -> None:
    _xc.wait_device_ops()


def _reduce_gradients(optimizer, groups=None, pin_layout=True) -> None:
    """torch_xla all-reduces gradients across replicas here; a world of one has nothing to do."""


def reduce_gradients(optimizer, groups=None, pin_layout=True) -> None:
    _reduce_gradients(optimizer, groups, pin_layout)


def optimizer_step(optimizer, barrier: bool = False, optimizer_args=None, groups=None,
                   pin_layout: bool = True):
    """Reduce gradients (no-op for one device), run ``optimizer.step``, ``mark_step`` if asked."""
    reduce_gradients(optimizer, groups=groups, pin_layout=pin_layout)
    loss = optimizer.step(**(optimizer_args or {}))
    if barrier:
        mark_step()
    return loss


def _to_cpu(data):
    if isinstance(data, torch.Tensor):
        return data.detach().cpu() if is_xla_tensor(data) else data
    if isinstance(data, dict):
        return type(data)((k, _to_cpu(v)) for k, v in data.items())
    if isinstance(data, (list, tuple)):
        return type(data)(_to_cpu(v) for v in data)
    return data


def save(data, file_or_path, master_only: bool = True, global_master: bool = False) -> None:
    """``torch.save`` with every device tensor moved to the CPU first (as torch_xla does)."""
    if master_only and not is_master_ordinal(local=not global_master):
        return
    torch.save(_to_cpu(data), file_or_path)


def get_ordinal(defval: int = 0) -> int:
    return 0


def get_local_ordinal(defval: int = 0) -> int:
    return 0


def xrt_world_size(defval: int = 1) -> int:
    return 1


def world_size() -> int:
    return 1


def is_master_ordinal(local: bool = True) -> bool:
    return True


def master_print(*args, fd=None, finalize: bool = False, **kwargs) -> None:
    if is_master_ordinal():
        print(*args, file=fd, **kwargs)


def rendezvous(tag: str, payload: bytes = b"", replicas=()) -> list:
    return [payload]


def all_reduce(reduce_type, inputs, scale: float = 1.0, groups=None, pin_layout: bool = True):
    """A world of one: the result is the input times ``scale`` (in place for a list)."""
    if isinstance(inputs, torch.Tensor):
        return inputs * scale if scale != 1.0 else inputs
    if scale != 1.0:
        with torch.no_grad():
            for t in inputs:
                t.mul_(scale)
    return inputs


def set_rng_state(seed: int, device=None) -> None:
    _xc.manual_seed(seed)


def check_view_sharing(obj) -> None:
    """torch_xla raised if two device tensors in ``obj`` shared a view; both of our paths
    keep PyTorch's aliasing, so there is nothing to forbid (kept so scripts keep running)."""


def get_path(tensor) -> str | None:
    """Which xla_compat path a device tensor lives on (not in torch_xla; handy in migrations)."""
    return _paths.of(tensor)
