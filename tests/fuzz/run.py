"""The large fuzz budget (``make fuzz``): python -m tests.fuzz.run --examples 20000 [--out FILE].

Runs the property of test_fuzz.py without stopping at the first failure: every distinct
disagreement is kept (the shortest program seen for it, then shrunk), known issues are counted,
and a summary is printed (and written to ``--out`` as Markdown when given).
"""
from __future__ import annotations

import argparse
import collections
import re
import sys
import time
import warnings

from hypothesis import HealthCheck, Phase, find, given, seed as hypothesis_seed, settings

from xla_compat.lazy import tracer

from .check import KnownIssue, check
from .programs import programs


def _kind(e: BaseException) -> str:
    return re.sub(r"\d+", "N", str(e).split("\n")[0])[:160]


def fuzz(examples: int, seed: int | None):
    stats = {"programs": 0, "statements": 0, "expected_errors": 0, "syncs": 0}
    known: collections.Counter = collections.Counter()
    failures: dict = {}

    # ``seed`` picks the programs (hypothesis.seed): the same seed draws the same programs, another
    # seed others. (``derandomize`` alone, as before, drew ONE fixed sequence whatever the seed.)
    @settings(max_examples=examples, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(program=programs())
    def prop(program):
        stats["programs"] += 1
        stats["statements"] += len(program.stmts)
        stats["expected_errors"] += sum(1 for s in program.stmts if s.error)
        stats["syncs"] += sum(1 for s in program.stmts if s.code == "xc.sync()")
        try:
            check(program)
        except KnownIssue as e:
            known[str(e)] += 1
        except Exception as e:  # noqa: BLE001 - every failure is recorded, none stops the run
            k = _kind(e)
            if k not in failures:     # printed at once: an interrupted run keeps the evidence
                print(f"  failure: {k}\n{program.to_source()}", flush=True)
            if k not in failures or len(program.stmts) < len(failures[k][1].stmts):
                failures[k] = (f"{type(e).__name__}: {e}", program)
        if stats["programs"] % 500 == 0:
            print(f"  {stats['programs']} programs, {len(failures)} distinct failures, "
                  f"{sum(known.values())} known-issue hits", flush=True)

    start = time.time()
    try:
        (hypothesis_seed(seed)(prop) if seed is not None else prop)()
    except KeyboardInterrupt:      # stopped by hand (SIGINT): report what ran
        stats["interrupted"] = True
    return stats, known, failures, time.time() - start


def shrink(kind: str, program):
    """A minimal program failing the same way (bounded effort)."""
    def same(p):
        try:
            check(p)
        except KnownIssue:
            return False
        except Exception as e:  # noqa: BLE001
            return _kind(e) == kind
        return False
    try:
        return find(programs(), same, settings=settings(
            database=None, max_examples=300, suppress_health_check=list(HealthCheck)))
    except Exception:  # noqa: BLE001 - keep the unshrunk one
        return program


def report(examples, stats, known, failures, seconds) -> str:
    stopped = " (stopped by hand)" if stats.get("interrupted") else ""
    lines = [f"- programs run: {stats['programs']} (asked for {examples}{stopped}), each on CPU "
             f"eager, legacy and functional, in {seconds:.0f} s",
             f"- statements: {stats['statements']} ({stats['expected_errors']} that eager "
             f"rejects, checked to be rejected alike; {stats['syncs']} syncs)",
             f"- new failures: {len(failures)}",
             f"- known-issue hits (open issues in tests/fuzz/check.py KNOWN): "
             f"{sum(known.values())}"]
    lines += [f"  - {n} x {label}" for label, n in known.most_common()]
    for kind, (message, program) in failures.items():
        lines += ["", f"### {kind}", "", "```", message[:2000], "```", "", "```python",
                  program.to_source(), "```"]
    return "\n".join(lines) + "\n"


tracer.CHECK_GEOMETRY = True     # a stale cached tensor geometry raises (see tracer.replay)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--examples", type=int, default=20000)
    ap.add_argument("--seed", type=int, default=None, help="derandomize (same programs each run)")
    ap.add_argument("--out", default=None, help="also write the summary (Markdown) here")
    ap.add_argument("--no-shrink", action="store_true")
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    stats, known, failures, seconds = fuzz(args.examples, args.seed)
    if not args.no_shrink:
        failures = {k: (m, shrink(k, p)) for k, (m, p) in failures.items()}
    text = report(args.examples, stats, known, failures, seconds)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
