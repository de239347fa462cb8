"""2-D sharding over a (data=2) x (model=4) mesh: the batch is split on ``data``, the MLP's hidden
layer is split on ``model`` (fc1 by rows, fc2 by columns: Megatron-style), so each device holds a
quarter of each weight matrix and XLA inserts the collectives both splits need.

    python examples/spmd_2d.py                     # simulates 8 devices on the CPU host
"""
from __future__ import annotations

import copy

import torch
import torch.nn as nn

import xla_compat as xc
import xla_compat.distributed.spmd as xs

if __name__ == "__main__":   # before the first device is used: 8 simulated devices on a CPU host
    xs.simulate_host_devices(8)

STEPS, BATCH, FEATURES, HIDDEN, CLASSES = 10, 32, 16, 64, 8

# How each parameter is laid out: one entry per dimension, a mesh axis or None (not split).
LAYOUT = {
    "fc1.weight": ("model", None),     # [HIDDEN, FEATURES]: rows (hidden units) split
    "fc1.bias": ("model",),
    "fc2.weight": (None, "model"),     # [CLASSES, HIDDEN]: columns (hidden units) split
    "fc2.bias": (None,),
}


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(FEATURES, HIDDEN)
        self.fc2 = nn.Linear(HIDDEN, CLASSES)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def make_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return MLP()


def make_batches(steps: int = STEPS, seed: int = 2) -> list:
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
        for name, p in model.named_parameters():
            xs.mark_sharding(p, mesh, LAYOUT[name])
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
    losses = []
    for x, y in batches:
        x, y = x.to(dev), y.to(dev)
        if mesh is not None:
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
    mesh = xc.Mesh((2, 4), ("data", "model"))
    model, batches = make_model(), make_batches()
    single, w1, _ = train(copy.deepcopy(model), batches)
    sharded, w8, m8 = train(copy.deepcopy(model), batches, mesh)
    print(f"path {xc.path()}, mesh {mesh.shape()}")
    print("step  1 device   2-D sharded")
    for i, (a, b) in enumerate(zip(single, sharded)):
        print(f"{i:4d}  {a:.6f}  {b:.6f}")
    print("max weight difference:", max((a - b).abs().max().item() for a, b in zip(w1, w8)))
    shards = xs.device_array(m8.fc1.weight).addressable_shards
    print("fc1.weight", tuple(m8.fc1.weight.shape), "-> per device",
          sorted({tuple(s.data.shape) for s in shards}), f"on {len(shards)} devices")


if __name__ == "__main__":
    main()
