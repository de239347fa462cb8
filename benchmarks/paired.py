"""Interleaved runs: the variants of one workload take turns, a short block of steps each per
round, so every round's blocks meet the same moment of a shared, noisy machine.

The sequential passes (``measure.py``) put minutes between two variants' steps, and on the 2-core
hosts these benchmarks run on a pass moved by up to 1.7x: more than most differences issue 8
asks about (functional against legacy, traced against the JAX twin). Here a ratio between two
variants is the median of their per-round ratios, and its 95% interval is bootstrapped over the
rounds. The first variant to step rotates from round to round, so no variant always follows
the same one.

A round's time of a variant is the median of its block's steps after the first. Taking turns
step by step (blocks of one) was measured and rejected: a step that follows another variant's
step finds the CPU's caches full of that variant's work, and the Python-heavy variants paid
for it (W1 traced 17 -> 28 us/op, eager 4.3 -> 7.5) while the JAX twin did not, so the ratios
measured the interleaving. The first step of a block pays that price and is not timed; the
rest are the steady state a job that runs one variant sees.

Each variant keeps its own program for the whole run (every program is built and warmed up
before the first timed round); at the end each result is checked against torch eager's
program, which took part in the rotation and ran the same number of steps.
"""
from __future__ import annotations

import contextlib
import gc
import random
import statistics
import time
from dataclasses import dataclass, field

import xla_compat as xc
from benchmarks.measure import LABELS, LAZY, _compare, _error_line, program

BOOTSTRAP = 2000


@dataclass
class Paired:
    """Per-round step times (in the workload's unit) of the variants that ran to the end."""

    workload: str
    unit: str
    rounds: int
    times: dict = field(default_factory=dict)     # variant -> [time of round 0, 1, ...]
    checks: dict = field(default_factory=dict)    # variant -> "ok" or how it differs from eager
    errors: dict = field(default_factory=dict)    # variant -> the failure's first line

    def median(self, variant: str) -> float:
        t = self.times.get(variant)
        return statistics.median(t) if t else float("nan")

    def ratio(self, a: str, b: str, seed: int = 0):
        """(median of a's time / b's time per round, 2.5th and 97.5th percentiles of that
        median over bootstrap resamples of the rounds), or None when either did not run."""
        ta, tb = self.times.get(a), self.times.get(b)
        if not ta or not tb:
            return None
        per_round = [x / y for x, y in zip(ta, tb)]
        rng = random.Random(seed)
        n = len(per_round)
        boot = sorted(statistics.median(rng.choices(per_round, k=n)) for _ in range(BOOTSTRAP))
        return (statistics.median(per_round), boot[int(0.025 * BOOTSTRAP)],
                boot[int(0.975 * BOOTSTRAP) - 1])


class _Runner:
    """One variant's program, its step, its wait and the context its steps run in."""

    def __init__(self, workload, variant: str):
        self.variant = variant
        self.path = variant.split("+")[0] if variant in LAZY else None
        with self.context():
            self.prog, self.block = program(workload, variant,
                                            xc.device() if self.path is not None else None)

    def context(self):
        return xc.use_path(self.path) if self.path is not None else contextlib.nullcontext()

    def timed_steps(self, n: int) -> list:
        """Times of ``n`` steps in a row."""
        out = []
        with self.context():
            for _ in range(n):
                t0 = time.perf_counter()
                self.prog.step()
                self.block()
                out.append(time.perf_counter() - t0)
        return out

    def result(self):
        with self.context():
            return self.prog.result()


def run(workload, variants, warmup: int, rounds: int, block: int = 4, log=print) -> Paired:
    """Torch eager and ``variants`` of ``workload`` in turns: ``warmup`` untimed steps of each,
    then ``rounds`` rounds of ``block`` steps of each (the first untimed). A variant that fails
    is recorded and leaves the rotation."""
    if block < 2:
        raise ValueError("a block needs 2 steps or more: its first step is not timed")
    gc.collect()
    order = ["eager"] + [v for v in variants if v != "eager"]
    out = Paired(workload.name, workload.unit, rounds)
    runners = []
    for v in order:
        try:
            runners.append(_Runner(workload, v))
        except Exception as e:   # a path bug or a missing lowering: record it, keep going
            out.errors[v] = _error_line(e)
    if not runners or runners[0].variant != "eager":
        raise RuntimeError(f"{workload.name} failed on torch eager: {out.errors.get('eager')}")
    times = {r.variant: [] for r in runners}
    for k in range(-1, rounds):          # round -1: every variant's warm-up, untimed
        start = k % len(runners)
        for r in runners[start:] + runners[:start]:
            if r.variant in out.errors:
                continue
            try:
                steps = r.timed_steps(warmup if k < 0 else block)
            except Exception as e:
                out.errors[r.variant] = _error_line(e)
                continue
            if k >= 0:
                times[r.variant].append(workload.per_step(statistics.median(steps[1:])))
    reference = runners[0].result()
    for r in runners:
        if r.variant in out.errors:
            continue
        out.times[r.variant] = times[r.variant]
        if r.variant == "eager":
            out.checks[r.variant] = "ok"
            continue
        try:
            out.checks[r.variant] = _compare(r.result(), reference, workload.rtol,
                                             workload.atol)[1]
        except Exception as e:
            out.errors[r.variant] = _error_line(e)
    log(progress(out))
    return out


def _interval(r) -> str:
    if r is None:
        return "–"
    mid, lo, hi = r
    return f"{mid:.2f}x ({lo:.2f}-{hi:.2f})"


def progress(p: Paired) -> str:
    cells = [f"{LABELS[v]} {p.median(v):.3g}" for v in p.times]
    cells += [f"{LABELS[v]} FAILED" for v in p.errors]
    return f"  {p.workload} interleaved ({p.unit}): " + ", ".join(cells)


# The ratios the bars compare: (numerator, denominator).
PAIRS = (("legacy", "eager"), ("functional", "eager"), ("legacy", "jax"), ("functional", "jax"),
         ("functional", "legacy"), ("legacy+capture", "jax"), ("functional+capture", "jax"),
         ("functional+capture", "legacy+capture"))


def table(results: list[Paired]) -> str:
    """One row per workload: each variant's median and the ratios with their 95% intervals."""
    variants = [v for v in LABELS if any(v in p.times or v in p.errors for p in results)]
    pairs = [(a, b) for a, b in PAIRS
             if any(a in p.times and b in p.times for p in results)]
    lines = ["| workload | unit | " + " | ".join(LABELS[v] for v in variants) + " | "
             + " | ".join(f"{LABELS[a]} / {LABELS[b]}" for a, b in pairs) + " |",
             "|---|---|" + "---|" * (len(variants) + len(pairs))]
    for p in results:
        cells = []
        for v in variants:
            if v in p.errors:
                cells.append("FAILED")
            elif v in p.times:
                check = p.checks.get(v, "ok")
                cells.append(f"{p.median(v):.3g}" + ("" if check == "ok" else " (WRONG)"))
            else:
                cells.append("not run")
        cells += [_interval(p.ratio(a, b)) for a, b in pairs]
        lines.append(f"| {p.workload} | {p.unit} | " + " | ".join(cells) + " |")
    problems = [f"{p.workload} {LABELS[v]}: {e}" for p in results for v, e in p.errors.items()]
    problems += [f"{p.workload} {LABELS[v]}: {c}" for p in results for v, c in p.checks.items()
                 if c != "ok"]
    if problems:
        lines += ["", "Failures and mismatches: " + "; ".join(problems)]
    return "\n".join(lines)
