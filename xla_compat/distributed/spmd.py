"""torch_xla's ``xs`` for the common calls: a device ``Mesh``, ``mark_sharding`` and friends.

    import xla_compat.distributed.spmd as xs
    mesh = xs.Mesh((2, 4), ("data", "model"))
    xs.mark_sharding(model.fc1.weight, mesh, ("model", None))   # rows split over "model"
    xs.mark_sharding(batch, mesh, ("data", None))               # batch split over "data"

The partitioning itself is XLA's SPMD partitioner, reached through jax's sharding API: a marked
tensor's buffer lives split over the mesh, the graphs that use it are compiled for the whole mesh,
and XLA inserts the collectives (an all-reduce of data-parallel gradients, for instance).
"""
from __future__ import annotations

import os
from typing import Optional, Sequence

import jax
import torch

from .. import paths, sharding
from ..lazy import tracer
from ..sharding import Mesh, ShardingSpec

_global_mesh: Optional[Mesh] = None


def global_runtime_device_count() -> int:
    """How many devices a mesh can span (``jax.devices()``)."""
    return len(jax.devices())


_DEVICE_COUNT_FLAG = "--xla_force_host_platform_device_count"


def simulate_host_devices(n: int) -> None:
    """Make the CPU host show ``n`` devices (XLA's ``--xla_force_host_platform_device_count``),
    to try a mesh on a machine without accelerators. The flag joins any other ``XLA_FLAGS``
    (one already naming a device count is replaced). XLA reads it when the first device is
    used, so call this before that: importing xla_compat is fine, creating a tensor on the
    device is too late (then this raises, naming the count in effect)."""
    from jax._src import xla_bridge
    if xla_bridge.backends_are_initialized():
        have = jax.local_device_count("cpu")
        if have == n:
            return
        raise RuntimeError(
            f"xla_compat: simulate_host_devices({n}): jax already started with {have} CPU "
            f"device(s); call it before the first device tensor or mesh, or start the process "
            f"with XLA_FLAGS={_DEVICE_COUNT_FLAG}={n}")
    kept = [f for f in os.environ.get("XLA_FLAGS", "").split()
            if not f.startswith(_DEVICE_COUNT_FLAG)]
    os.environ["XLA_FLAGS"] = " ".join([*kept, f"{_DEVICE_COUNT_FLAG}={int(n)}"])


def use_spmd() -> None:
    """torch_xla needs this before SPMD; here a mesh is usable at any time (kept for scripts)."""


def get_1d_mesh(axis_name: str = "data") -> Mesh:
    """A mesh over every device along one axis."""
    return Mesh(tuple(range(global_runtime_device_count())), None, (axis_name,))


def set_global_mesh(mesh: Mesh) -> None:
    global _global_mesh
    _global_mesh = mesh


def get_global_mesh() -> Optional[Mesh]:
    return _global_mesh


def _axis(mesh: Mesh, p, dim: int):
    if isinstance(p, int) and not isinstance(p, bool):
        if not 0 <= p < len(mesh.axis_names):
            raise ValueError(f"xla_compat: partition spec entry {p} for dimension {dim} is not a "
                             f"mesh axis index (the mesh has axes {mesh.axis_names})")
        return mesh.axis_names[p]
    if isinstance(p, str):
        if p not in mesh.axis_names:
            raise ValueError(f"xla_compat: partition spec entry {p!r} for dimension {dim} names no "
                             f"mesh axis (the mesh has axes {mesh.axis_names})")
        return p
    raise TypeError(f"xla_compat: partition spec entry {p!r} for dimension {dim}: use a mesh axis "
                    f"name or index, a tuple of them, or None")


def spec(mesh: Mesh, partition_spec: Sequence) -> ShardingSpec:
    """A ShardingSpec from torch_xla's partition spec (per dimension: axis name/index, tuple, None)."""
    out, used = [], []
    for d, p in enumerate(tuple(partition_spec)):
        if p is None:
            out.append(None)
            continue
        names = tuple(_axis(mesh, q, d) for q in p) if isinstance(p, (tuple, list)) \
            else (_axis(mesh, p, d),)
        used.extend(names)
        out.append(names[0] if len(names) == 1 else names)
    if len(set(used)) != len(used):
        raise ValueError(f"xla_compat: partition spec {tuple(partition_spec)} uses a mesh axis "
                         f"twice; each mesh axis can split at most one dimension")
    return ShardingSpec(mesh, tuple(out))


def _inner(t: torch.Tensor, what: str):
    if not isinstance(t, torch.Tensor) or paths.of(t) is None:
        where = getattr(t, "device", type(t).__name__)
        raise TypeError(f"xla_compat: {what} needs an hlo tensor, got one on {where}; move it "
                        f"with .to(xc.device()) (or model.to(xc.device())) first")
    if t._is_view() or getattr(t, "_chain", ()):
        raise ValueError(
            f"xla_compat: {what} of a view: a layout belongs to the whole storage. Mark the base "
            f"tensor the view was taken from, or mark a copy (view.clone())")
    return paths.inner_tensor(t)


def mark_sharding(t: torch.Tensor, mesh: Mesh, partition_spec: Sequence) -> torch.Tensor:
    """Lay ``t`` out over ``mesh``: dimension ``i`` is split over the mesh axis (or axes) named by
    ``partition_spec[i]``, or not split where it is None. Device data moves now; a pending value
    is constrained in its graph. The layout stays with the tensor through in-place ops, writes
    through its views and optimizer steps, on both paths. Returns ``t``."""
    s = spec(mesh, partition_spec)
    with tracer.lock:
        sharding.attach(_inner(t, "mark_sharding"), s)
    return t


def clear_sharding(t: torch.Tensor) -> torch.Tensor:
    """Drop ``t``'s layout: its value becomes replicated over the mesh it was split over."""
    with tracer.lock:
        sharding.attach(_inner(t, "clear_sharding"), None)
    return t


def get_sharding(t: torch.Tensor) -> Optional[ShardingSpec]:
    """The layout ``mark_sharding`` gave ``t`` (None when it has none)."""
    if paths.of(t) is None:
        return None
    return sharding.spec_of(paths.inner_tensor(t))


def device_array(t: torch.Tensor) -> jax.Array:
    """``t``'s device buffer as a jax.Array (running its pending graph first): inspect
    ``.sharding`` and ``.addressable_shards`` to see which device holds which piece."""
    return tracer.materialize(paths.inner_tensor(t))


__all__ = ["Mesh", "ShardingSpec", "mark_sharding", "clear_sharding", "get_sharding", "spec",
           "simulate_host_devices", "device_array", "get_1d_mesh", "set_global_mesh",
           "get_global_mesh", "global_runtime_device_count", "use_spmd"]
