"""``met``: torch_xla.debug.metrics's calls with its names and return shapes, over xla_compat.metrics."""
from __future__ import annotations

from xla_compat import metrics as _m


def metrics_report() -> str:
    return _m.report()


def short_metrics_report(counter_names: list | None = None, metric_names: list | None = None) -> str:
    """The few numbers worth a first look, in the report's format."""
    counter_names = counter_names or ["CachedCompile", "MarkStep", "DynamoSyncInputExecuteTime"]
    metric_names = metric_names or ["CompileTime", "ExecuteTime", "TransferToDeviceTime",
                                    "TransferFromDeviceTime"]
    full = _m.counters()
    lines = []
    for name in metric_names:
        m = _m.metric(name)
        if m is not None:
            lines += [f"Metric: {name}", f"  TotalSamples: {m.count}",
                      f"  Accumulator: {m.total:g}{m.unit}"]
    for name in list(counter_names) + executed_fallback_ops():
        if name in full:
            lines += [f"Counter: {name}", f"  Value: {full[name]}"]
    return "\n".join(lines) + "\n"


def counter_names() -> list:
    return sorted(_m.counters())


def counter_value(name: str):
    """The counter's value, or None if it never counted (torch_xla's behaviour)."""
    return _m.counters().get(name)


def metric_names() -> list:
    return _m.metric_names()


def metric_data(name: str):
    """(TotalSamples, Accumulator, [(timestamp, value), ...]) or None."""
    m = _m.metric(name)
    if m is None:
        return None
    return m.count, m.total, list(m.samples)


def clear_counters() -> None:
    _m.clear_counters()


def clear_metrics() -> None:
    _m.clear_metrics()


def clear_all() -> None:
    _m.reset()


def executed_fallback_ops() -> list:
    """Ops that ran on the CPU for lack of a lowering, as counter names (``aten::histc``)."""
    return _m.fallback_ops()
