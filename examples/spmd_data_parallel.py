"""Data-parallel training over 8 devices: the batch is split on a ``data`` mesh axis, the
parameters are replicated, and XLA inserts the all-reduce of the gradients.

    python examples/spmd_data_parallel.py          # simulates 8 devices on the CPU host

It trains the same model twice from the same initial weights, once on one device and once
sharded, and prints both loss curves and the largest weight difference.
"""
from __future__ import annotations

import copy

import torch
import torch.nn as nn

import xla_compat as xc
import xla_compat.distributed.spmd as xs

if __name__ == "__main__":   # before the first device is used: 8 simulated devices on a CPU host
    xs.simulate_host_devices(8)

STEPS, BATCH, FEATURES, CLASSES = 10, 64, 16, 4


def make_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(FEATURES, 32), nn.ReLU(), nn.Linear(32, CLASSES))


def make_batches(steps: int = STEPS, seed: int = 1) -> list:
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(BATCH, FEATURES, generator=g), torch.randint(0, CLASSES, (BATCH,),
                                                                      generator=g))
            for _ in range(steps)]


def train(model: nn.Module, batches, mesh=None, device=None, on_step=None):
    """Train on ``device`` (hlo when None; "cpu" for eager); shard over ``mesh`` when given;
    ``on_step(i)`` runs after each step's sync. Returns (losses, final parameters, model)."""
    dev = device or xc.device()
    model = model.to(dev)
    if mesh is not None:
        for p in model.parameters():                     # replicated: every device has all of it
            xs.mark_sharding(p, mesh, (None,) * p.dim())
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    losses = []
    for x, y in batches:
        x, y = x.to(dev), y.to(dev)
        if mesh is not None:                             # each device gets BATCH / 8 rows
            xs.mark_sharding(x, mesh, ("data", None))
            xs.mark_sharding(y, mesh, ("data",))
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        if dev != "cpu":
            xc.sync()
        if on_step is not None:
            on_step(len(losses))
        losses.append(loss.item())
    return losses, [p.detach().cpu() for p in model.parameters()], model


def main() -> None:
    n = xs.global_runtime_device_count()
    mesh = xc.Mesh((n,), ("data",))
    model, batches = make_model(), make_batches()
    single, w1, _ = train(copy.deepcopy(model), batches)
    sharded, w8, _ = train(copy.deepcopy(model), batches, mesh)
    print(f"path {xc.path()}, {n} devices, mesh {mesh.shape()}")
    print("step  1 device   sharded")
    for i, (a, b) in enumerate(zip(single, sharded)):
        print(f"{i:4d}  {a:.6f}  {b:.6f}")
    print("max weight difference:", max((a - b).abs().max().item() for a, b in zip(w1, w8)))


if __name__ == "__main__":
    main()
