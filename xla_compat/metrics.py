"""Counters and timed metrics, and the text report torch_xla users know.

Counters are integers (``MarkStep``, ``CachedCompile``, ``aten::<op>`` CPU fallbacks, ...).
Metrics are samples (``CompileTime``, ``ExecuteTime`` in nanoseconds): count, total, recent.
"""
from __future__ import annotations

import atexit
import collections
import contextlib
import threading
import time

_lock = threading.Lock()
_counters: dict[str, int] = collections.Counter()
_metrics: dict[str, "Metric"] = {}
_MAX_SAMPLES = 1024


class Metric:
    """Samples of one metric: count, running total and the most recent values with timestamps."""

    __slots__ = ("count", "total", "samples", "unit")

    def __init__(self, unit: str):
        self.count = 0
        self.total = 0.0
        self.unit = unit
        self.samples: collections.deque = collections.deque(maxlen=_MAX_SAMPLES)

    def add(self, value: float) -> None:
        self.count += 1
        self.total += value
        self.samples.append((time.time(), value))


def inc(name: str, by: int = 1) -> None:
    with _lock:
        _counters[name] += by


def bump(name: str) -> None:
    """``inc(name)`` without taking the metrics lock: for the tracer's per-op counters, whose
    callers hold the tracer lock (every increment of such a counter does)."""
    _counters[name] += 1


def sample(name: str, value: float, unit: str = "ns") -> None:
    with _lock:
        m = _metrics.get(name)
        if m is None:
            m = _metrics[name] = Metric(unit)
        m.add(value)


@contextlib.contextmanager
def timed(name: str):
    start = time.perf_counter_ns()
    try:
        yield
    finally:
        sample(name, time.perf_counter_ns() - start)


def counters() -> dict[str, int]:
    """Every counter, including each metric's sample count under its own name."""
    with _lock:
        out = dict(_counters)
        for name, m in _metrics.items():
            out.setdefault(name, m.count)
        return out


def counter(name: str) -> int:
    with _lock:
        if name in _counters:
            return _counters[name]
        m = _metrics.get(name)
        return m.count if m else 0


def metric(name: str) -> Metric | None:
    with _lock:
        return _metrics.get(name)


def metric_names() -> list[str]:
    with _lock:
        return sorted(_metrics)


def fallback_ops() -> list[str]:
    """Ops that ran on the CPU because no lowering existed, as ``aten::<name>``."""
    with _lock:
        return sorted(k for k, v in _counters.items() if "::" in k and v)


def reset() -> None:
    with _lock:
        _counters.clear()
        _metrics.clear()


def clear_counters() -> None:
    with _lock:
        _counters.clear()


def clear_metrics() -> None:
    with _lock:
        _metrics.clear()


_report_sections: list = []


def add_report_section(fn) -> None:
    """Register a callable returning extra report text (the dispatch decision adds itself)."""
    _report_sections.append(fn)


def _fmt_ns(ns: float) -> str:
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("us", 1e3)):
        if ns >= scale:
            return f"{ns / scale:.3f}{unit}"
    return f"{ns:.0f}ns"


def report() -> str:
    """A text report in the shape of torch_xla's ``metrics_report()``."""
    lines = []
    with _lock:
        for name in sorted(_metrics):
            m = _metrics[name]
            lines.append(f"Metric: {name}")
            lines.append(f"  TotalSamples: {m.count}")
            if m.unit == "ns":
                lines.append(f"  Accumulator: {_fmt_ns(m.total)}")
                if m.count:
                    lines.append(f"  Mean: {_fmt_ns(m.total / m.count)}")
            else:
                lines.append(f"  Accumulator: {m.total:g}{m.unit}")
        for name in sorted(_counters):
            lines.append(f"Counter: {name}")
            lines.append(f"  Value: {_counters[name]}")
    for section in _report_sections:
        text = section()
        if text:
            lines.append(text)
    return "\n".join(lines) + "\n"


def short_report() -> str:
    keys = ("CompileTime", "ExecuteTime", "CachedCompile", "MarkStep", "TransferToDevice",
            "TransferFromDevice", "InputOutputAliasCount")
    c = counters()
    parts = [f"{k}={c.get(k, 0)}" for k in keys]
    parts += [f"{k}={c[k]}" for k in ("PersistentCacheHit", "PersistentCacheMiss") if k in c]
    parts += [f"{k}={v}" for k, v in sorted(c.items()) if k.startswith("aten::")]
    return " ".join(parts)


def write_report(path: str) -> None:
    """Write ``report()`` to ``path`` (XLA_METRICS_FILE does this at exit)."""
    with open(path, "w") as f:
        f.write(report())


def _write_at_exit() -> None:
    from . import settings
    path = settings.get().metrics_file
    if path:
        try:
            write_report(path)
        except OSError as e:  # never turn a finished job into a failed one
            import sys
            print(f"xla_compat: could not write XLA_METRICS_FILE={path}: {e}", file=sys.stderr)


atexit.register(_write_at_exit)
