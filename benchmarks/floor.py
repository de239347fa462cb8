"""The least a step can cost when every ATen op is dispatched to Python (issue 8's "lazily traced"
targets are judged against it).

A lazy tracer written in Python receives each op through ``__torch_dispatch__`` of a wrapper
subclass and returns a new wrapper tensor: that alone, with no IR at all, is the floor per op.
Measured here in the same run as the workloads, and multiplied by the number of ATen ops the
step dispatches (counted on torch eager with a dispatch mode: what any dispatch-level tracer
sees), it gives the fastest any such tracer could run the step, against torch eager's own time.
"""
from __future__ import annotations

import gc
import statistics
import sys
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode


class _Bare(torch.Tensor):
    """A wrapper subclass whose every op only makes its output wrapper: no tracing at all."""

    @staticmethod
    def __new__(cls, shape):
        return torch.Tensor._make_wrapper_subclass(cls, shape, dtype=torch.float32)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return cls(args[0].shape)

    __torch_function__ = torch._C._disabled_torch_function_impl


def dispatch_floor_us(ops: int = 20_000, rounds: int = 5) -> float:
    """Median over ``rounds`` of the per-op cost of ``a + b`` on bare wrappers, in us."""
    a, b = _Bare((64, 64)), _Bare((64, 64))
    per_op = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(ops):
            a + b
        per_op.append((time.perf_counter() - start) / ops * 1e6)
    return statistics.median(per_op)


class _Count(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += 1
        return func(*args, **(kwargs or {}))


def aten_ops_per_step(workload) -> int:
    """ATen ops one eager step of ``workload`` dispatches (after a warm-up step)."""
    program = workload.torch_program("cpu")
    program.step()
    counter = _Count()
    with counter:
        program.step()
    return counter.n


def python_dispatches_per_step(workload, path: str) -> int:
    """``__torch_dispatch__`` calls one lazily traced step of ``workload`` makes on ``path``
    (after a warm-up step): the ops that cross into Python. Functionalization dispatches more
    than eager's ATen ops (it regenerates views and writes them back), legacy about as many.
    Counted on the calling thread (``sys.setprofile``), where backward runs too since session
    13 (``xla_compat.autograd_thread``); before, its ops ran on autograd's worker thread and
    the W2/W3 counts left them out."""
    import xla_compat as xc
    from benchmarks.measure import _wait_lazy
    calls = [0]

    def count(frame, event, arg):
        if event == "call" and frame.f_code.co_name == "__torch_dispatch__":
            calls[0] += 1
    with xc.use_path(path):
        program = workload.torch_program(xc.device())
        program.step()
        _wait_lazy()
        sys.setprofile(count)
        try:
            program.step()
        finally:
            sys.setprofile(None)
        _wait_lazy()
    return calls[0]


def traced_parts(workload, path: str, steps: int = 30, warmup: int = 5) -> tuple:
    """Medians, in the workload's unit, of a lazily traced step's three parts on ``path``:
    tracing the step, ``xc.sync()`` (collecting the graph, the cache lookup, dispatching the
    executable) and ``xc.wait_device_ops()`` (the rest of the execution)."""
    import xla_compat as xc
    from benchmarks.measure import _wait_lazy
    parts: list = [[], [], []]
    gc.collect()          # (as run_variant and profile: no earlier variant's tensors linger)
    with xc.use_path(path):
        program = workload.torch_program(xc.device())
        _wait_lazy()
        for i in range(warmup + steps):
            t0 = time.perf_counter()
            program.step()
            t1 = time.perf_counter()
            xc.sync()
            t2 = time.perf_counter()
            xc.wait_device_ops()
            t3 = time.perf_counter()
            if i >= warmup:
                for part, seconds in zip(parts, (t1 - t0, t2 - t1, t3 - t2)):
                    part.append(seconds)
    return tuple(workload.per_step(statistics.median(p)) for p in parts)


PATHS = ("legacy", "functional")


def table(workloads, eager_medians: dict) -> str:
    """Markdown: per workload, its ATen ops per step (eager), the Python dispatches a traced
    step makes on each path, the floor per step for each and eager's median; then where a traced
    step's time goes on each path."""
    floor = dispatch_floor_us()
    rows = ["| workload | ATen ops per step (eager) | Python dispatches, legacy | functional | "
            "dispatch floor per step: eager's ops | legacy's | functional's | torch eager | "
            "floor (eager's ops) / eager |", "|---|---|---|---|---|---|---|---|---|"]
    split = ["| workload | path | tracing | `sync()` | `wait_device_ops()` | total | "
             "dispatch floor of its dispatches |", "|---|---|---|---|---|---|---|"]
    for w in workloads:
        n = aten_ops_per_step(w)
        counts = {p: python_dispatches_per_step(w, p) for p in PATHS}
        floors = [w.per_step(k * floor * 1e-6) for k in (n, *counts.values())]
        eager = eager_medians.get(w.name)
        cells = ([f"{eager:.3g} {w.unit}", f"{floors[0] / eager:.2f}x"] if eager else ["–", "–"])
        rows.append(f"| {w.name} | {n} | {counts['legacy']} | {counts['functional']} | "
                    + " | ".join(f"{f:.3g} {w.unit}" for f in floors) + " | "
                    + " | ".join(cells) + " |")
        for p in PATHS:
            trace, sync, wait = traced_parts(w, p)
            split.append(f"| {w.name} | {p} | {trace:.3g} | {sync:.3g} | {wait:.3g} | "
                         f"{trace + sync + wait:.3g} {w.unit} | "
                         f"{w.per_step(counts[p] * floor * 1e-6):.3g} {w.unit} |")
    head = (f"Python dispatch floor, measured in this run: {floor:.2f} us per op (`a + b` on a "
            f"wrapper subclass whose `__torch_dispatch__` only makes its output wrapper). Times "
            f"the ops a step dispatches to Python, it is the fastest any tracer that sees ops "
            f"through Python dispatch could run the step, before building any IR, syncing or "
            f"executing. Eager's ATen ops are counted with a dispatch mode on CPU; each path's "
            f"Python dispatches by counting `__torch_dispatch__` calls in one traced step "
            f"(functionalization regenerates views and writes them back through more ops).")
    tail = ("Where a lazily traced step's time goes (medians of 30 steps after 5, measured "
            "after the main table, in each workload's unit): tracing the step's ops, `sync()` "
            "(graph collection, cache lookup, dispatching the executable; on the CPU client part "
            "of the execution runs inside the call) and `wait_device_ops()` (the rest of the "
            "execution).")
    return head + "\n\n" + "\n".join(rows) + "\n\n" + tail + "\n\n" + "\n".join(split)
