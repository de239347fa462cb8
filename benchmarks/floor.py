"""The least a step can cost when every ATen op is dispatched to Python (issue 8's "lazily traced"
targets are judged against it).

A lazy tracer written in Python receives each op through ``__torch_dispatch__`` of a wrapper
subclass and returns a new wrapper tensor: that alone, with no IR at all, is the floor per op.
Measured here in the same run as the workloads, and multiplied by the number of ATen ops the
step dispatches (counted on torch eager with a dispatch mode: what any dispatch-level tracer
sees), it gives the fastest any such tracer could run the step, against torch eager's own time.
"""
from __future__ import annotations

import statistics
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


def table(workloads, eager_medians: dict) -> str:
    """Markdown: per workload, its ATen ops per step, the floor per step and eager's median."""
    floor = dispatch_floor_us()
    rows = ["| workload | ATen ops per step | dispatch floor per step | torch eager | "
            "floor / eager |", "|---|---|---|---|---|"]
    for w in workloads:
        n = aten_ops_per_step(w)
        per_step = w.per_step(n * floor * 1e-6)
        eager = eager_medians.get(w.name)
        cells = ([f"{eager:.3g} {w.unit}", f"{per_step / eager:.2f}x"] if eager else ["–", "–"])
        rows.append(f"| {w.name} | {n} | {per_step:.3g} {w.unit} | " + " | ".join(cells) + " |")
    head = (f"Python dispatch floor, measured in this run: {floor:.2f} us per op (`a + b` on a "
            f"wrapper subclass whose `__torch_dispatch__` only makes its output wrapper). Times "
            f"the ATen ops a step dispatches (counted on eager), it is the fastest any tracer "
            f"that sees ops through Python dispatch could run the step, before building any IR, "
            f"syncing or executing.")
    return head + "\n\n" + "\n".join(rows)
