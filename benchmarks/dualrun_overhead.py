"""Dual-run overhead on the MLP training step: single path vs full dual run vs 1% sampling.

    .venv/bin/python benchmarks/dualrun_overhead.py [--steps 200] [--warmup 5] [--dual-steps N]

Each step ends with a sync, so times include tracing, compilation-cache lookup and execution.
Prints a table of median step times and ratios to the single-path run.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import xla_compat as xc  # noqa: E402
from tests.models import MLP  # noqa: E402


def _setup(dev):
    torch.manual_seed(0)
    model = MLP().to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    x, y = torch.randn(64, 16).to(dev), torch.randint(0, 4, (64,)).to(dev)
    return model, opt, x, y


def step(model, opt, x, y):
    opt.zero_grad()
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    xc.sync()
    return loss.detach()


def _time(run, steps: int, out: list) -> list[float]:
    for _ in range(steps):
        start = time.perf_counter()
        run()
        out.append(time.perf_counter() - start)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=5,
                    help="interleave the modes in this many blocks (load on a shared machine "
                         "then hits every mode alike)")
    ap.add_argument("--dual-steps", type=int, default=None,
                    help="timed full dual runs (default: a quarter of --steps, at least 10)")
    args = ap.parse_args(argv)
    dual_steps = args.dual_steps if args.dual_steps is not None else max(args.steps // 4, 10)
    dev = xc.device()
    single, dual, sampled_ = _setup(dev), _setup(dev), _setup(dev)
    sampled = xc.dual_run_step(step, mode="sample", rate=0.01, name="bench-1pct")
    modes = [("single path (" + xc.path() + ")", lambda: step(*single), args.steps),
             ("full dual run", lambda: xc.dual_run(step, *dual), dual_steps),
             ("1% sampling", lambda: sampled(*sampled_), args.steps)]
    for _, run, _ in modes:                    # compile every graph before timing
        _time(run, args.warmup, [])
    rows = [(name, []) for name, _, _ in modes]
    for _ in range(args.rounds):
        for (name, run, steps), (_, times) in zip(modes, rows):
            _time(run, max(steps // args.rounds, 1), times)

    base = statistics.median(rows[0][1])
    print(f"MLP training step, {len(rows[0][1])} steps (full dual run: {len(rows[1][1])}), "
          f"torch {torch.__version__}")
    print(f"{'mode':<28}{'median ms':>12}{'mean ms':>12}{'ratio':>9}")
    for name, times in rows:
        med = statistics.median(times)
        print(f"{name:<28}{med * 1e3:>12.3f}{statistics.mean(times) * 1e3:>12.3f}"
              f"{med / base:>8.2f}x")
    print(f"dual runs counted: {xc.metrics.counter('DualRunMatch')} matched, "
          f"{xc.metrics.counter('DualRunMismatch')} mismatched, "
          f"{xc.metrics.counter('DualRunSkipped')} sampled out")
    return 0


if __name__ == "__main__":
    sys.exit(main())
