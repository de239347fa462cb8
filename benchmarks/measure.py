"""Measuring one workload on one variant: step times, compiles, graph and HLO sizes, donation,
host transfers, peak memory, and the result checked against torch eager; and the W1 profile.

A variant that fails (a path bug, a missing lowering) is recorded with its error line, never
raised, so one broken cell does not lose the rest of the run.
"""
from __future__ import annotations

import contextlib
import cProfile
import gc
import os
import pstats
import re
import resource
import statistics
import tempfile
import time
import traceback
from dataclasses import dataclass, replace
from pathlib import Path

import jax
import torch

import xla_compat as xc
from xla_compat import executor, metrics, settings
from benchmarks import jax_twins

VARIANTS = ("eager", "legacy", "functional", "jax", "legacy+capture", "functional+capture")
LAZY = ("legacy", "functional", "legacy+capture", "functional+capture")
CAPTURED = ("legacy+capture", "functional+capture")     # the step replayed by xc.compile
LABELS = {"eager": "torch eager CPU", "legacy": "hlo legacy", "functional": "hlo functional",
          "jax": "JAX twin (jit)", "legacy+capture": "legacy, captured",
          "functional+capture": "functional, captured"}


# ----------------------------------------------------------------------------------------------
# What one variant of one workload measured.

@dataclass(frozen=True)
class Measurement:
    """Medians and counts of one (workload, variant) run; ``error`` set when the variant failed."""

    workload: str
    variant: str
    unit: str = ""
    median: float = float("nan")          # per step, in the workload's unit
    iqr_pct: float = float("nan")         # (p75 - p25) / median, in percent
    trace_median: float = float("nan")    # hlo: the tracing part of a step (before sync)
    compile_s: float = 0.0                # total compile time of the variant
    compiles: int = 0                     # compiles during warm-up
    new_compiles: int = 0                 # compiles during the timed iterations (must be 0)
    graph_nodes: tuple = ()               # IR nodes of each graph a timed step executes
    hlo_ops: tuple = ()                   # StableHLO ops of each of those graphs
    transposes: tuple = ()                # of which stablehlo.transpose
    donated_per_step: float = 0.0         # InputOutputAliasCount per timed step
    uploads_per_step: float = 0.0         # TransferToDevice per timed step
    transfers_per_step: float = 0.0       # TransferFromDevice per timed step (host round trips)
    fallbacks: tuple = ()                 # aten::<op> CPU fallbacks seen
    peak_rss_mb: float = 0.0              # peak resident memory during the variant
    rss_start_mb: float = 0.0             # resident memory when the variant started
    max_err: float = float("nan")         # max |result - torch eager| over all result tensors
    check: str = ""                       # "ok", or which result differs from eager and how
    error: str = ""                       # the failure's first line when the variant failed
    passes: tuple = ()                    # each pass's median when several passes ran (combine)

    @property
    def ok(self) -> bool:
        return not self.error and self.check == "ok"


# ----------------------------------------------------------------------------------------------
# Counters: jax compile events (every variant) and xla_compat metrics (hlo variants).

class _CompileEvents:
    """Counts jax backend compiles and sums jax's compile-phase durations, process-wide."""

    PHASES = ("/jax/core/compile/jaxpr_trace_duration",
              "/jax/core/compile/jaxpr_to_mlir_module_duration",
              "/jax/core/compile/backend_compile_duration")

    def __init__(self):
        self.count = 0
        self.seconds = 0.0
        jax.monitoring.register_event_duration_secs_listener(self._on_event)

    def _on_event(self, event, duration, **kwargs):
        if event in self.PHASES:
            self.seconds += duration
            if event == self.PHASES[-1]:
                self.count += 1


_events = _CompileEvents()


def _compile_ns() -> float:
    m = metrics.metric("CompileTime")
    return m.total if m else 0.0


def _graph_sizes_since(count_before: int) -> tuple:
    m = metrics.metric("IrGraphSize")
    if m is None:
        return ()
    new = m.count - count_before
    return tuple(int(v) for _, v in list(m.samples)[-new:]) if new > 0 else ()


_OP = re.compile(r'=\s*"?((?:stablehlo|chlo|mhlo)\.[\w.]+|call)\b')


def count_ops(hlo: str) -> dict[str, int]:
    """StableHLO ops by name (``stablehlo.add``: 3, ...); constants and calls count, returns don't."""
    out: dict[str, int] = {}
    for m in _OP.finditer(hlo):
        out[m.group(1)] = out.get(m.group(1), 0) + 1
    return out


def _dumped_hlo(path: str) -> dict[int, str]:
    """The StableHLO of the last graph compiled per node count, from an ``XLA_HLO_DUMP`` file."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return {}
    out = {}
    for section in text.split("## graph with ")[1:]:
        nodes = int(section.split(" ", 1)[0])
        out[nodes] = section.split("## StableHLO\n", 1)[-1]
    return out


# ----------------------------------------------------------------------------------------------
# Memory: Linux lets a process reset its peak RSS (VmHWM), so each variant gets its own peak.

def _status_mb(field_name: str) -> float:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field_name + ":"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _reset_peak_rss() -> None:
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")


# ----------------------------------------------------------------------------------------------
# Running one variant.

def _compare(actual: dict, expected: dict, rtol: float, atol: float) -> tuple[float, str]:
    worst, problems = 0.0, []
    for name, e in expected.items():
        a = actual.get(name)
        if a is None or a.shape != e.shape or a.dtype != e.dtype:
            problems.append(f"{name}: got {None if a is None else (a.dtype, tuple(a.shape))}, "
                            f"eager has {(e.dtype, tuple(e.shape))}")
            continue
        diff = (a.double() - e.double()).abs()
        err = float(diff.max()) if diff.numel() else 0.0
        worst = max(worst, err if err == err else float("inf"))
        if not torch.allclose(a, e, rtol=rtol, atol=atol, equal_nan=True):
            problems.append(f"{name}: max abs err {err:.3g} > atol {atol:g} + rtol {rtol:g}")
    return worst, ("ok" if not problems else "; ".join(problems[:3]))


def _error_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:300]


def _wait_lazy() -> None:
    xc.sync()
    xc.wait_device_ops()


def run_variant(workload, variant: str, warmup: int, iters: int, reference: dict | None = None):
    """Run ``warmup`` + ``iters`` steps of ``workload`` on ``variant``; returns
    (Measurement, result dict). A failing variant is recorded, never raised."""
    gc.collect()
    _reset_peak_rss()
    rss0 = _status_mb("VmRSS")
    base = dict(workload=workload.name, variant=variant, unit=workload.unit, rss_start_mb=rss0)
    try:
        with _variant_context(variant) as ctx:
            m, result = _measure(workload, variant, warmup, iters, ctx)
    except Exception as e:  # a path bug or a missing lowering: record it, keep going
        if os.environ.get("BENCH_TRACEBACK"):
            traceback.print_exc()
        return Measurement(**base, error=_error_line(e),
                           peak_rss_mb=_status_mb("VmHWM")), None
    m.update(base, peak_rss_mb=_status_mb("VmHWM"))
    if reference is not None:
        m["max_err"], m["check"] = _compare(result, reference, workload.rtol, workload.atol)
    else:
        m["max_err"], m["check"] = 0.0, "ok"   # torch eager is the reference
    return Measurement(**m), result


@contextlib.contextmanager
def _variant_context(variant: str):
    if variant not in LAZY:
        yield {}
        return
    executor.clear_cache()   # each path compiles its own graphs: compile time is per variant
    with tempfile.TemporaryDirectory() as tmp:
        dump = os.path.join(tmp, "hlo.txt")
        with settings.override(dump_path=dump), xc.use_path(variant.split("+")[0]):
            yield {"dump": dump, "device": xc.device()}


def program(workload, variant: str, device=None):
    """(program, block) of ``variant``: the JAX twin, or ``workload``'s torch program on
    ``device`` (the CPU for eager; step-captured for the +capture variants), its initial
    transfers done; ``block()`` waits for a step's work. Lazy variants call it with their path
    active."""
    if variant == "jax":
        prog = jax_twins.twin(workload)
        return prog, prog.block
    if variant in CAPTURED:         # xc.compile records the step, then replays it
        prog = workload.torch_program(device, capture=True)
        prog.step = xc.compile(prog.step)
    else:
        prog = workload.torch_program(device if variant in LAZY else "cpu")
    if variant not in LAZY:
        return prog, _nothing
    _wait_lazy()       # the initial transfers are not part of any step
    return prog, _wait_lazy


def _nothing() -> None:
    pass


def _measure(workload, variant, warmup, iters, ctx):
    lazy = variant in LAZY
    prog, block = program(workload, variant, ctx.get("device"))

    ev0, ns0 = (_events.count, _events.seconds), _compile_ns()
    xc0 = metrics.counter("CompileTime")
    for _ in range(warmup):
        prog.step()
        block()
    ev1, xc1 = _events.count, metrics.counter("CompileTime")
    c1 = metrics.counters()
    times, traces, last_graphs = [], [], ()
    for _ in range(iters):
        graphs_before = metrics.counter("IrGraphSize")
        t0 = time.perf_counter()
        prog.step()
        t1 = time.perf_counter()
        block()
        t2 = time.perf_counter()
        times.append(t2 - t0)
        traces.append(t1 - t0)
        last_graphs = _graph_sizes_since(graphs_before)
    c2 = metrics.counters()

    def per_step(name):
        return (c2.get(name, 0) - c1.get(name, 0)) / max(iters, 1)

    out = dict(
        median=workload.per_step(statistics.median(times)),
        iqr_pct=_iqr_pct(times),
        compiles=(xc1 - xc0) if lazy else (ev1 - ev0[0]),
        new_compiles=max(metrics.counter("CompileTime") - xc1, _events.count - ev1),
    )
    if lazy:
        dumped = _dumped_hlo(ctx["dump"])
        hlo = [count_ops(dumped.get(n, "")) for n in last_graphs]
        out.update(
            trace_median=workload.per_step(statistics.median(traces)),
            compile_s=(_compile_ns() - ns0) / 1e9,
            graph_nodes=last_graphs,
            hlo_ops=tuple(sum(h.values()) for h in hlo),
            transposes=tuple(h.get("stablehlo.transpose", 0) for h in hlo),
            donated_per_step=per_step("InputOutputAliasCount"),
            uploads_per_step=per_step("TransferToDevice"),
            transfers_per_step=per_step("TransferFromDevice"),
            fallbacks=tuple(sorted(k for k in c2 if k.startswith("aten::") and c2[k])),
        )
    elif variant == "jax":
        h = count_ops(prog.hlo_text())
        out.update(compile_s=_events.seconds - ev0[1], hlo_ops=(sum(h.values()),),
                   transposes=(h.get("stablehlo.transpose", 0),))
    return out, prog.result()


def _iqr_pct(times) -> float:
    if len(times) < 4:
        return float("nan")
    q = statistics.quantiles(times, n=4)
    return 100 * (q[2] - q[0]) / statistics.median(times)


def run_workload(workload, variants, warmup, iters, log=print) -> list[Measurement]:
    """Every variant of one workload; torch eager always runs first and is the reference."""
    ref_m, reference = run_variant(workload, "eager", warmup, iters)
    if reference is None:
        raise RuntimeError(f"{workload.name} failed on torch eager: {ref_m.error}")
    out = [ref_m]
    log(_progress(ref_m))
    for v in variants:
        if v == "eager":
            continue
        m, _ = run_variant(workload, v, warmup, iters, reference)
        log(_progress(m))
        out.append(m)
    return out


def combine(passes: list[list[Measurement]]) -> list[Measurement]:
    """One Measurement per (workload, variant) from several passes over the same variants, in
    the first pass's order: the median of the passes' medians (the issue's reference numbers are
    the middle of 4 passes: one slow spell of the shared machine moves one pass, not the cell),
    each pass's median kept in ``passes``. The counts come from the pass whose median is the
    lower middle; ``new_compiles``, peak memory and the error vs eager are the worst pass's; a
    failure or a mismatch in any pass is the cell's."""
    by: dict = {}
    for results in passes:
        for m in results:
            by.setdefault((m.workload, m.variant), []).append(m)
    out = []
    for ms in by.values():
        medians = tuple(m.median for m in ms)
        failed = next((m for m in ms if m.error), None)
        if failed is not None:
            out.append(replace(failed, passes=medians))
            continue
        middle = sorted(ms, key=lambda m: m.median)[(len(ms) - 1) // 2]
        wrong = next((m for m in ms if m.check != "ok"), None)
        out.append(replace(
            middle, median=statistics.median(medians), passes=medians,
            trace_median=statistics.median(m.trace_median for m in ms),
            new_compiles=max(m.new_compiles for m in ms),
            peak_rss_mb=max(m.peak_rss_mb for m in ms),
            max_err=max(m.max_err for m in ms),
            check=wrong.check if wrong is not None else "ok"))
    return out


def spread(m: Measurement) -> float:
    """The slowest pass over the fastest (NaN with fewer than two passes): how far the same cell
    moved between passes of one run."""
    if len(m.passes) < 2 or m.error or min(m.passes) <= 0:
        return float("nan")
    return max(m.passes) / min(m.passes)


def _progress(m: Measurement) -> str:
    if m.error:
        return f"  {m.workload} {LABELS[m.variant]:<16} FAILED  {m.error}"
    return (f"  {m.workload} {LABELS[m.variant]:<16} {m.median:10.3f} {m.unit:<6} "
            f"compile {m.compile_s:6.2f}s  new compiles {m.new_compiles}  check {m.check}")


# ----------------------------------------------------------------------------------------------
# Profile mode.

def profile(workload, path: str, iters: int = 10, top: int = 25, warmup: int = 3) -> str:
    """cProfile of ``iters`` steps of ``workload`` on ``path`` after warm-up (cache hits only):
    tracing, then sync and wait. Returns the printed statistics."""
    # The last variant's garbage goes first: an uncollected functional tensor would keep the
    # legacy tensor's path-mix guard (a Python call per torch function) on through the profile.
    gc.collect()
    with _variant_context(path) as ctx:
        prog = workload.torch_program(ctx["device"])
        _wait_lazy()
        for _ in range(warmup):
            prog.step()
            _wait_lazy()
        prof = cProfile.Profile()
        t0 = time.perf_counter()
        prof.enable()
        for _ in range(iters):
            prog.step()
            _wait_lazy()
        prof.disable()
        wall = time.perf_counter() - t0
    stats = pstats.Stats(prof).strip_dirs().stats
    ops = iters * getattr(workload, "ops", 1)
    lines = [f"{workload.name} on {path}: {iters} steps ({workload.describe()}), "
             f"{wall * 1e3:.1f} ms under the profiler, {wall * 1e6 / ops:.1f} us per op"]
    for title, col, n in (("by own time", 2, top), ("by cumulative time", 3, 12)):
        lines += ["", f"top {n} {title}:",
                  f"{'calls':>11} {'own ms':>8} {'own us/call':>11} {'cum ms':>8} "
                  f"{'cum us/call':>11}  function"]
        for (file, line, name), st in sorted(stats.items(), key=lambda kv: -kv[1][col])[:n]:
            cc, nc, tt, ct = st[:4]
            calls = f"{nc}/{cc}" if nc != cc else str(nc)
            where = name if file == "~" else f"{file}:{line}({name})"
            lines.append(f"{calls:>11} {tt * 1e3:8.2f} {tt * 1e6 / nc:11.2f} {ct * 1e3:8.2f} "
                         f"{ct * 1e6 / nc:11.2f}  {where}")
    return "\n".join(lines) + "\n"


