"""The Markdown report: the table of medians and ratios, the per-variant counts, failures, the
machine's load, and the W1 tracing profile (the first one recorded is kept as the baseline)."""
from __future__ import annotations

import os
import platform
import subprocess
import time
from pathlib import Path

import jax
import torch

import xla_compat as xc
from benchmarks import paired as _paired, targets
from benchmarks.measure import LABELS, LAZY, VARIANTS, Measurement

ROOT = Path(__file__).resolve().parent.parent


def _fmt(x: float, digits: int = 3) -> str:
    if x != x:
        return "–"
    return f"{x:.{digits}g}" if abs(x) < 1000 else f"{x:.0f}"


def _ratio(a: Measurement | None, b: Measurement | None) -> str:
    if a is None or b is None or a.error or b.error or not b.median:
        return "–"
    return f"{a.median / b.median:.2f}x"


def _cell(m: Measurement | None) -> str:
    if m is None:
        return "not run"
    if m.error:
        return "FAILED"
    return _fmt(m.median) + ("" if m.ok else " (WRONG)")


def _pct(x: float) -> str:
    return "–" if x != x else f"{x:.0f}%"


def _transfers(m: Measurement) -> str:
    return f"{_fmt(m.uploads_per_step)}, {_fmt(m.transfers_per_step)}"


def _joined(values, fmt=str) -> str:
    return "+".join(fmt(v) for v in values) if values else "–"


def summary_table(results: list[Measurement], workloads_run) -> str:
    by = {(m.workload, m.variant): m for m in results}
    lines = ["| workload | unit | torch eager CPU | hlo legacy | hlo functional | JAX twin | "
             "legacy / eager | functional / eager | legacy / JAX | functional / JAX | "
             "functional / legacy | legacy captured | functional captured | "
             "captured legacy / JAX | captured functional / JAX |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for w in workloads_run:
        e, lg, fn, jx, clg, cfn = (by.get((w.name, v)) for v in VARIANTS)
        lines.append(f"| {w.name}: {w.describe()} | {w.unit} | {_cell(e)} | {_cell(lg)} | "
                     f"{_cell(fn)} | {_cell(jx)} | {_ratio(lg, e)} | {_ratio(fn, e)} | "
                     f"{_ratio(lg, jx)} | {_ratio(fn, jx)} | {_ratio(fn, lg)} | {_cell(clg)} | "
                     f"{_cell(cfn)} | {_ratio(clg, jx)} | {_ratio(cfn, jx)} |")
    return "\n".join(lines)


def detail_table(results: list[Measurement]) -> str:
    lines = ["| workload | variant | median | IQR | trace part | compile s | compiles in warm-up | "
             "new compiles after warm-up | IR nodes / graph | HLO ops | transposes | "
             "donated / step | host transfers / step (to, from) | CPU fallbacks | peak RSS MiB (start) | "
             "max abs err vs eager | check |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for m in results:
        if m.error:
            lines.append(f"| {m.workload} | {LABELS[m.variant]} | FAILED | | | | | | | | | | | | "
                         f"{m.peak_rss_mb:.0f} ({m.rss_start_mb:.0f}) | | `{m.error}` |")
            continue
        lazy = m.variant in LAZY
        na = "–"
        lines.append(
            f"| {m.workload} | {LABELS[m.variant]} | {_fmt(m.median)} {m.unit} | "
            f"{_pct(m.iqr_pct)} | {_fmt(m.trace_median) if lazy else na} | "
            f"{m.compile_s:.2f} | {m.compiles} | {m.new_compiles} | {_joined(m.graph_nodes)} | "
            f"{_joined(m.hlo_ops)} | {_joined(m.transposes)} | "
            f"{_fmt(m.donated_per_step) if lazy else na} | "
            f"{_transfers(m) if lazy else na} | "
            f"{', '.join(m.fallbacks) or ('none' if lazy else na)} | "
            f"{m.peak_rss_mb:.0f} ({m.rss_start_mb:.0f}) | {_fmt(m.max_err, 2)} | {m.check} |")
    return "\n".join(lines)


def machine() -> dict:
    def git(*args):
        try:
            return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True,
                                  timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return "?"
    dirty = git("status", "--porcelain", "--untracked-files=no")
    return {
        "load": "%.2f %.2f %.2f" % os.getloadavg(),
        "cpus": os.cpu_count(),
        "versions": f"Python {platform.python_version()}, torch {torch.__version__}, "
                    f"jax {jax.__version__}, xla_compat {xc.__version__}",
        "torch_threads": torch.get_num_threads(),
        "omp_wait": os.environ.get("OMP_WAIT_POLICY", "default"),
        "commit": git("rev-parse", "--short", "HEAD") + (" + uncommitted changes" if dirty else ""),
        "when": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }


BASELINE_START, BASELINE_END = "<!-- baseline-profile:start -->", "<!-- baseline-profile:end -->"
# Hand-written notes (before/after comparisons of a change) kept verbatim across reruns.
NOTES_START, NOTES_END = "<!-- notes:start -->", "<!-- notes:end -->"


def _notes(previous: str) -> list:
    if NOTES_START in previous and NOTES_END in previous:
        body = previous.split(NOTES_START, 1)[1].split(NOTES_END, 1)[0].strip("\n")
        return [NOTES_START, body, NOTES_END, ""]
    return []


def _baseline(previous: str, current_profile: str, machine: dict) -> str:
    """The "before" profile: kept from the previous results file, else this run's profile."""
    if BASELINE_START in previous and BASELINE_END in previous:
        return previous.split(BASELINE_START, 1)[1].split(BASELINE_END, 1)[0].strip("\n")
    return (f"Recorded {machine['when']} at commit {machine['commit']} "
            f"(load average {machine['load']}).\n\n```\n{current_profile.rstrip()}\n```")


def report(results, workloads_run, args, machine_start, machine_end, profiles: str,
           previous: str = "", floors: str = "", interleaved=()) -> str:
    failures = [m for m in results if m.error or not m.ok]
    passes = getattr(args, "passes", 1)
    full = not getattr(args, "quick", False)
    out = [
        "# Benchmarks: torch eager CPU vs hlo (legacy, functional) vs hand-written JAX",
        "",
        f"Written by `{' '.join(['python benchmarks/run.py'] + args.argv)}` on "
        f"{machine_start['when']}; commit {machine_start['commit']}; {machine_start['versions']}.",
        "",
        f"Machine: {machine_start['cpus']} CPUs, torch threads {machine_start['torch_threads']}, "
        f"OMP_WAIT_POLICY={machine_start['omp_wait']}; "
        f"load average (1/5/15 min) {machine_start['load']} at the start and "
        f"{machine_end['load']} at the end. The machine is shared, so absolute numbers are "
        "noisy: compare ratios within this run only." + (f" Note: {args.note}" if args.note else ""),
        "",
        f"Each cell: median of {args.iters} timed iterations after {args.warmup} warm-up "
        "iterations, in the workload's unit (W1: µs per op; others: ms per step)"
        + (f"; every variant ran in {passes} passes, one pass over all workloads after another, "
           "and a cell is the median of its passes' medians (the issue's reference numbers are "
           "the middle of 4 passes)" if passes > 1 else "") + ". On hlo a "
        "step includes tracing, `xla_compat.sync()` and `xla_compat.wait_device_ops()`; the JAX "
        "twin's includes `block_until_ready`. Ratios > 1 mean slower than the reference column.",
        "",
        "## Medians and ratios",
        "",
        summary_table(results, workloads_run),
        "",
        *(["## Interleaved runs", "",
            f"After the passes, every variant of a workload again, taking turns: {args.rounds} "
            f"rounds, each a block of {getattr(args, 'block', 4)} steps of every variant (the "
            "first step of a block not timed), the first variant rotating (`paired.py`). A cell "
            "is the median of the rounds' medians; a ratio is the median of the per-round "
            "ratios, with its bootstrapped 95% interval: both sides of a ratio met the same "
            "moments of the machine, so these ratios carry less of its drift than the table "
            "above (all programs stay alive together, which the sequential passes do not do).",
            "", _paired.table(interleaved), ""] if interleaved else []),
        "## Issue 8's targets in this run",
        "",
        "Each bar of issue 8's \"what must be shown\", judged on the table above"
        + (" and, marked (interleaved), on the interleaved runs" if interleaved else "")
        + ("" if full else " (quick sizes: absolute bars are not judged)") + ".",
        "",
        targets.table(results, workloads_run, full, interleaved),
        "",
        *([f"## Spread across the {passes} passes", "",
           "How far each cell moved between passes of this run: the noise any ratio above "
           "carries, and the bar of \"functional within legacy's spread\".", "",
           targets.spread_table(results), ""] if passes > 1 else []),
        "## The floor of Python dispatch",
        "",
        floors,
        "",
        *_notes(previous),
        "## Per variant",
        "",
        "`trace part`: the median time spent before the sync (Python tracing), same unit. "
        "`compile s`: xla_compat's CompileTime total (JAX twin: jax's trace + lowering + "
        "compile durations). `new compiles after warm-up` must be 0. `IR nodes / graph`, `HLO "
        "ops` (StableHLO ops, constants included) and `transposes`: for each graph a timed step "
        "executes. `donated / step`: InputOutputAliasCount per step. `host transfers / step`: "
        "TransferToDevice and TransferFromDevice counts per step (a host round trip inside a "
        "step shows here). JAX twin compiles are counted from jax's compile events. `peak RSS`: the process's "
        "resident-memory peak during the variant (reset before each), with the RSS it started "
        "from. `max abs err`: over the result tensors (final loss and every parameter; W4: the "
        "sum and the whole cache) after the same number of steps as torch eager.",
        "",
        detail_table(results),
        "",
    ]
    if failures:
        out += ["## Failures and mismatches", ""]
        out += [f"- {m.workload} {LABELS[m.variant]}: {m.error or m.check}" for m in failures]
        out += [""]
    else:
        out += ["All variants ran and matched torch eager.", ""]
    out += ["## Tracing profile", "",
            f"cProfile of {args.profile_iters} W1 steps on each path after 3 warm-up steps "
            "(tracing, sync, wait; cached executable), by own time, then by cumulative time. "
            "For entries called once per op, `percall` is the per-op cost (inflated by the "
            "profiler).", "",
            "### Before (baseline, kept across reruns)", "",
            BASELINE_START, _baseline(previous, profiles, machine_start), BASELINE_END, "",
            "### This run", "", "```", profiles.rstrip(), "```", ""]
    return "\n".join(out)


# ----------------------------------------------------------------------------------------------