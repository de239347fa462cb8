"""The dual-run report: one JSON line per dual run, appended crash-safely; and its summary table.

Crash safety: each record is one ``os.write`` of a whole line on an ``O_APPEND`` descriptor,
then ``fsync``, under an exclusive ``flock`` (several processes may share one file). A job
killed inside a write can leave at most a partial last line; the next append cuts it off
before writing, and readers skip it, so every line a reader returns is whole JSON.
"""
from __future__ import annotations

import collections
import fcntl
import json
import os
import statistics
from typing import Iterable

from .. import settings


def _cut_partial_tail(fd: int) -> None:
    """Truncate a trailing line that has no newline (left by a killed writer)."""
    size = os.fstat(fd).st_size
    if size == 0 or os.pread(fd, 1, size - 1) == b"\n":
        return
    pos, chunk = size, 4096
    while pos > 0:
        start = max(0, pos - chunk)
        data = os.pread(fd, pos - start, start)
        nl = data.rfind(b"\n")
        if nl >= 0:
            os.ftruncate(fd, start + nl + 1)
            return
        pos = start
    os.ftruncate(fd, 0)


def append(record: dict, path: str | None = None) -> str | None:
    """Append ``record`` as one JSON line to ``path`` (default XLA_DUAL_RUN_REPORT); the path."""
    path = path or settings.get().dual_run_report
    if not path:
        return None
    line = (json.dumps(record, default=str, separators=(",", ":")) + "\n").encode()
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        _cut_partial_tail(fd)
        view = memoryview(line)
        while view:                      # a regular file takes it in one write; loop if not
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)                     # closing releases the lock
    return path


def read(path: str) -> tuple[list[dict], int]:
    """(records, lines skipped): whole JSON lines only; a partial or corrupt line is skipped."""
    records, skipped = [], 0
    with open(path, "rb") as f:
        data = f.read()
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    elif lines:                          # no final newline: a write was cut short
        lines.pop()
        skipped += 1
    for raw in lines:
        if not raw.strip():
            continue
        try:
            records.append(json.loads(raw))
        except ValueError:
            skipped += 1
    return records, skipped


def _median(values: Iterable[float]) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def summarize(records: list[dict], skipped: int = 0) -> str:
    """A text table: runs, matches, mismatches by first op, ignored, shadow errors, path times."""
    total = len(records)
    matches = sum(1 for r in records if r.get("match"))
    mismatches = total - matches
    ignored = sum(len(r.get("ignored", [])) for r in records)
    shadow_errors = sum(1 for r in records if r.get("shadow_exception"))
    lines = ["xla_compat dual-run report",
             f"{'runs':<28}{total:>8}",
             f"{'matches':<28}{matches:>8}",
             f"{'mismatches':<28}{mismatches:>8}",
             f"{'ignored differences':<28}{ignored:>8}",
             f"{'shadow exceptions':<28}{shadow_errors:>8}"]
    if skipped:
        lines.append(f"{'unreadable lines skipped':<28}{skipped:>8}")
    by_first: collections.Counter = collections.Counter()
    for r in records:
        if not r.get("match"):
            by_first[_first_op(r)] += 1
    if by_first:
        lines += ["", "mismatches by first divergence", f"  {'count':>6}  first op (where)"]
        for where, n in by_first.most_common():
            lines.append(f"  {n:>6}  {where}")
    times: dict = collections.defaultdict(list)
    nodes: dict = collections.defaultdict(list)
    for r in records:
        for p, t in (r.get("wall_s") or {}).items():
            times[p].append(t)
        for p, n in (r.get("graph_nodes") or {}).items():
            nodes[p].append(n)
    if times:
        lines += ["", f"  {'path':<12}{'runs':>6}{'median wall s':>16}{'median IR nodes':>18}"]
        medians = {}
        for p in sorted(times):
            medians[p] = _median(times[p])
            n = _median(nodes.get(p, []))
            lines.append(f"  {p:<12}{len(times[p]):>6}{medians[p]:>16.4f}"
                         f"{(f'{n:.0f}' if n is not None else '-'):>18}")
        slow = max(medians, key=lambda p: medians[p])
        fast = min(medians, key=lambda p: medians[p])
        ratio = medians[slow] / medians[fast] if medians[fast] else float("inf")
        lines.append(f"slowest path: {slow} ({ratio:.2f}x the median wall time of {fast})"
                     if slow != fast else f"slowest path: {slow}")
    return "\n".join(lines) + "\n"


def _first_op(r: dict) -> str:
    """The row a mismatching record counts under: the op (and line) lockstep found first, else
    the first compared value (name and kind) of a step-level run."""
    fd = r.get("first_divergence") or {}
    culprit = fd.get("culprit") or {}
    op = culprit.get("op") or fd.get("op")
    if op:
        where = culprit.get("source") or fd.get("source") or "line not recorded"
        return f"{op} ({where})"
    first = fd if fd.get("name") else next(iter(r.get("mismatches") or []), None)
    if first:
        level = fd.get("level") or "function"
        return f"{first.get('name', '?')} [{first.get('kind', '?')}] ({level} level)"
    return "? (no detail recorded)"


# -- python -m xla_compat report FILE ---------------------------------------------------------------

def _configure(parser) -> None:
    parser.add_argument("file", help="a JSONL dual-run report (XLA_DUAL_RUN_REPORT)")
    parser.add_argument("--json", action="store_true", help="print the counts as JSON")


def _run(args) -> int:
    if not os.path.exists(args.file):
        print(f"xla_compat report: {args.file}: no such file (set XLA_DUAL_RUN_REPORT to write "
              f"one)")
        return 2
    records, skipped = read(args.file)
    if args.json:
        print(json.dumps({"runs": len(records), "skipped": skipped,
                          "matches": sum(1 for r in records if r.get("match")),
                          "mismatches": sum(1 for r in records if not r.get("match"))}))
    else:
        print(summarize(records, skipped), end="")
    return 1 if any(not r.get("match") for r in records) else 0


def register_cli() -> None:
    from ..__main__ import command
    command("report", "summarise a dual-run report: matches, mismatches by first op, slowest "
            "path, ignored", _configure)(_run)
