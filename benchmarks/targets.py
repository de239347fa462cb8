"""Issue 8's "what must be shown", judged on one run's measurements: one row per target and
variant, with the measured value, the bar and whether it is met.

The absolute bars (W1's 11 us per op) hold for the full sizes only; with ``full=False`` (``--quick``)
they are listed but not judged. "Within the run-to-run spread" is judged against legacy's own
spread across the run's passes (``measure.spread``), so it needs ``--passes`` of 2 or more.
"""
from __future__ import annotations

from dataclasses import dataclass

from benchmarks.measure import CAPTURED, LABELS, LAZY, Measurement, spread

TRACED = ("legacy", "functional")
MET, NOT_MET, UNJUDGED = "met", "**not met**", "not judged"


@dataclass(frozen=True)
class Row:
    target: str
    variant: str
    value: str
    bar: str
    verdict: str


def _ratio(a: Measurement | None, b: Measurement | None) -> float | None:
    if a is None or b is None or a.error or b.error or not b.median:
        return None
    return a.median / b.median


def _at_most(target, variant, value, bar, limit, fmt="{:.2f}x", judged=True) -> Row:
    if value is None:
        return Row(target, variant, "–", fmt.format(limit), NOT_MET)
    verdict = (MET if value <= limit else NOT_MET) if judged else UNJUDGED
    return Row(target, variant, fmt.format(value), bar, verdict)


def rows(results: list[Measurement], workloads_run, full: bool = True,
         paired=()) -> list[Row]:
    by = {(m.workload, m.variant): m for m in results}
    names = {w.name for w in workloads_run}
    out: list[Row] = []

    def get(w, v):
        return by.get((w, v))

    for w in ("W2", "W3"):
        if w not in names:
            continue
        for v in (*TRACED, *CAPTURED):
            out.append(_at_most(f"{w} <= 1.3x hand-written JAX", LABELS[v],
                                _ratio(get(w, v), get(w, "jax")), "<= 1.30x", 1.3))
    if "W1" in names:
        for v in TRACED:
            m = get("W1", v)
            out.append(_at_most("W1 lazily traced <= 11 us per op", LABELS[v],
                                m.median if m and not m.error else None, "<= 11 us/op", 11.0,
                                fmt="{:.1f} us/op", judged=full))
        for v in CAPTURED:
            out.append(_at_most("W1 captured <= 2x hand-written JAX", LABELS[v],
                                _ratio(get("W1", v), get("W1", "jax")), "<= 2.00x", 2.0))
    if "W4" in names:
        wrong = [LABELS[m.variant] for m in results if m.workload == "W4" and not m.ok]
        out.append(Row("W4 correct on every variant", "all", "wrong: " + ", ".join(wrong)
                       if wrong else "all match eager", "match torch eager",
                       NOT_MET if wrong else MET))
        for v in TRACED:
            out.append(_at_most("W4 lazily traced no slower than torch eager", LABELS[v],
                                _ratio(get("W4", v), get("W4", "eager")), "<= 1.00x", 1.0))
        for v in CAPTURED:
            out.append(_at_most("W4 captured <= 2x hand-written JAX", LABELS[v],
                                _ratio(get("W4", v), get("W4", "jax")), "<= 2.00x", 2.0))
        for v in TRACED:
            m = get("W4", v)
            t = sum(m.transposes) if m and not m.error else None
            out.append(_at_most("W4's HLO holds no transpose", LABELS[v], t, "0", 0,
                                fmt="{}"))
    for w in sorted(names):
        for lv, fv in (("legacy", "functional"), ("legacy+capture", "functional+capture")):
            lg, fn = get(w, lv), get(w, fv)
            r, s = _ratio(fn, lg), spread(lg) if lg else float("nan")
            label = f"{LABELS[fv]} / {LABELS[lv]}"
            if r is None:
                out.append(Row(f"{w} functional within legacy's spread", label, "–", "–",
                               NOT_MET))
            elif s != s:
                out.append(Row(f"{w} functional within legacy's spread", label, f"{r:.2f}x",
                               "legacy's spread (needs --passes >= 2)", UNJUDGED))
            else:
                out.append(Row(f"{w} functional within legacy's spread", label, f"{r:.2f}x",
                               f"<= {max(s, 1.0):.2f}x (legacy's passes: slowest / fastest)",
                               MET if r <= max(s, 1.0) else NOT_MET))
        lg, fn = get(w, "legacy"), get(w, "functional")
        if lg and fn and not lg.error and not fn.error:
            a, b = sum(fn.hlo_ops), sum(lg.hlo_ops)
            out.append(Row(f"{w} functional HLO no larger than legacy's", "HLO ops",
                           f"{a} vs {b}", "<= legacy's", MET if a <= b else NOT_MET))
    out += _paired_rows(paired, by)
    lazy = [m for m in results if m.variant in LAZY]
    fresh = [f"{m.workload} {LABELS[m.variant]}: {m.new_compiles}" for m in lazy
             if m.error or m.new_compiles]
    out.append(Row("zero new compiles after warm-up", "every hlo variant",
                   "; ".join(fresh) or "0 everywhere", "0", NOT_MET if fresh else MET))
    undonated = [f"{m.workload} {LABELS[m.variant]}: {m.donated_per_step:g}" for m in lazy
                 if m.workload != "W1" and (m.error or m.donated_per_step < 1)]
    out.append(Row("donation counted every step (W2-W4; W1 overwrites no input)",
                   "every hlo variant", "; ".join(undonated) or "every step",
                   ">= 1 per step", NOT_MET if undonated else MET))
    return out


def _paired_rows(paired, by) -> list[Row]:
    """The ratio bars again, on the interleaved runs (``paired.py``): the median of per-round
    ratios with its 95% interval. "Within legacy's spread" keeps the sequential passes' spread
    as its bar, where they measured one."""
    out = []
    for p in paired:
        w = p.workload
        bars = []
        if w in ("W2", "W3"):
            bars += [(f"{w} <= 1.3x hand-written JAX (interleaved)", v, "jax", 1.3)
                     for v in (*TRACED, *CAPTURED)]
        if w == "W4":
            bars += [("W4 lazily traced no slower than torch eager (interleaved)", v, "eager", 1.0)
                     for v in TRACED]
        if w in ("W1", "W4"):
            bars += [(f"{w} captured <= 2x hand-written JAX (interleaved)", v, "jax", 2.0)
                     for v in CAPTURED]
        for target, v, ref, limit in bars:
            out.append(_interval_row(target, f"{LABELS[v]} / {LABELS[ref]}", p.ratio(v, ref),
                                     f"<= {limit:.2f}x", limit))
        for lv, fv in (("legacy", "functional"), ("legacy+capture", "functional+capture")):
            lg = by.get((w, lv))
            s = spread(lg) if lg is not None else float("nan")
            limit = max(s, 1.0) if s == s else 1.0
            bar = (f"<= {limit:.2f}x (legacy's passes: slowest / fastest)" if s == s
                   else "<= 1.00x (no sequential passes to take a spread from)")
            out.append(_interval_row(f"{w} functional within legacy's spread (interleaved)",
                                     f"{LABELS[fv]} / {LABELS[lv]}", p.ratio(fv, lv), bar,
                                     limit))
    return out


def _interval_row(target, variant, r, bar, limit) -> Row:
    if r is None:
        return Row(target, variant, "–", bar, NOT_MET)
    mid, lo, hi = r
    return Row(target, variant, f"{mid:.2f}x (95%: {lo:.2f}-{hi:.2f})", bar,
               MET if mid <= limit else NOT_MET)


def table(results: list[Measurement], workloads_run, full: bool = True, paired=()) -> str:
    lines = ["| target | variant | this run | bar | verdict |", "|---|---|---|---|---|"]
    lines += [f"| {r.target} | {r.variant} | {r.value} | {r.bar} | {r.verdict} |"
              for r in rows(results, workloads_run, full, paired)]
    return "\n".join(lines)


def spread_table(results: list[Measurement]) -> str:
    """Each cell's passes (their medians, in the workload's unit) and slowest / fastest."""
    lines = ["| workload | variant | passes' medians | slowest / fastest |", "|---|---|---|---|"]
    for m in results:
        if m.passes:
            s = spread(m)
            lines.append(f"| {m.workload} | {LABELS[m.variant]} | "
                         + ", ".join(f"{p:.3g}" for p in m.passes)
                         + f" {m.unit} | {'–' if s != s else f'{s:.2f}x'} |")
    return "\n".join(lines)
