"""SPMD overhead: one data-parallel training step over 8 devices vs the same step on 1 device,
same model, same total batch, on both paths.

    python benchmarks/spmd_overhead.py [--steps 30] [--batch 256] [--warmup 3]

On a CPU host the 8 "devices" are simulated (`xs.simulate_host_devices(8)`)
and share the machine's cores, so this measures what SPMD costs (partitioned executable, 8 buffers
per tensor, the all-reduce, host threads), not a speed-up. Times are medians of steady-state steps
(after 3 warm-up steps by default), each step ending with a sync and a wait for the device.
"""
from __future__ import annotations

import argparse
import copy
import os
import statistics
import time

import torch
import torch.nn as nn

import xla_compat as xc
import xla_compat.distributed.spmd as xs
import xla_compat.functional  # noqa: F401
import xla_compat.legacy  # noqa: F401
from xla_compat import metrics, paths

xs.simulate_host_devices(8)       # before the first device is used

WARMUP = 3


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                         nn.Linear(512, 10))


def run(path: str, mesh, steps: int, batch: int, warmup: int = WARMUP) -> dict:
    with paths.activated(path):
        dev = xc.device()
        model = copy.deepcopy(make_model()).to(dev)
        if mesh is not None:
            for p in model.parameters():
                xs.mark_sharding(p, mesh, (None,) * p.dim())
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        g = torch.Generator().manual_seed(1)
        x_cpu = torch.randn(batch, 256, generator=g)
        y_cpu = torch.randint(0, 10, (batch,), generator=g)
        times, before = [], metrics.counter("UncachedCompile")
        for i in range(warmup + steps):
            start = time.perf_counter()
            x, y = x_cpu.to(dev), y_cpu.to(dev)
            if mesh is not None:
                xs.mark_sharding(x, mesh, ("data", None))
                xs.mark_sharding(y, mesh, ("data",))
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            xc.sync(wait=True)
            if i >= warmup:
                times.append(time.perf_counter() - start)
        return {"median_ms": 1e3 * statistics.median(times), "loss": loss.item(),
                "compiles": metrics.counter("UncachedCompile") - before}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--warmup", type=int, default=WARMUP)
    args = ap.parse_args()
    n = xs.global_runtime_device_count()
    mesh = xc.Mesh((n,), ("data",))
    print(f"MLP 256-512-512-10, SGD momentum, total batch {args.batch}, {args.steps} steps "
          f"after {args.warmup} warm-up; {n} devices, {os.cpu_count()} host cores")
    print(f"| path | 1 device (ms/step) | {n}-device data parallel (ms/step) | ratio | "
          f"loss 1 / {n} | compiles 1 / {n} |")
    print("|---|---|---|---|---|---|")
    for path in ("legacy", "functional"):
        one = run(path, None, args.steps, args.batch, args.warmup)
        dp = run(path, mesh, args.steps, args.batch, args.warmup)
        print(f"| {path} | {one['median_ms']:.2f} | {dp['median_ms']:.2f} | "
              f"{dp['median_ms'] / one['median_ms']:.2f}x | {one['loss']:.5f} / {dp['loss']:.5f} | "
              f"{one['compiles']} / {dp['compiles']} |")


if __name__ == "__main__":
    main()
