"""Side-by-side benchmarks (issue 8): W1-W4 on torch eager CPU, hlo legacy, hlo functional and a
hand-written JAX twin, in one process, with compile, graph, HLO, donation and memory counts.

    python benchmarks/run.py --out benchmarks/RESULTS.md     # what `make bench` runs
    python benchmarks/run.py --quick                         # smaller sizes, fewer iterations
    python benchmarks/run.py --profile W1                    # cProfile of tracing W1 steps
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
# OpenMP's wait policy is left at libgomp's default (spin a while, then sleep). Forcing PASSIVE
# (as the first version did, against a loaded machine's 70 ms outliers) made every small eager op
# wake a sleeping thread: W1 eager 3.1 -> 30 us/op and W4 0.22 -> 0.33 ms, which flattered every
# ratio against eager. Set OMP_WAIT_POLICY yourself to measure another policy; the report says
# which one ran.

from benchmarks import floor, paired, report as rep, targets, workloads  # noqa: E402
from benchmarks.measure import VARIANTS, combine, profile, run_workload  # noqa: E402


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", help="write the Markdown report here")
    p.add_argument("--quick", action="store_true", help="smaller sizes, 2 warm-up + 5 timed")
    p.add_argument("--only", help="comma-separated workloads, e.g. W1,W4")
    p.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated, of "
                   + ", ".join(VARIANTS) + " (torch eager always runs: it is the reference)")
    p.add_argument("--passes", type=int, default=1,
                   help="run every variant this many times, a pass at a time; each cell is the "
                        "median of its passes' medians and the report shows their spread")
    p.add_argument("--rounds", type=int,
                   help="rounds of the interleaved run after the passes (paired.py; default 12, "
                        "quick 3; 0 skips it)")
    p.add_argument("--block", type=int, default=4,
                   help="steps of each variant per interleaved round (the first is not timed)")
    p.add_argument("--warmup", type=int)
    p.add_argument("--iters", type=int)
    p.add_argument("--profile", metavar="W", help="only print the cProfile of one step of W")
    p.add_argument("--profile-path", default="legacy,functional")
    p.add_argument("--note", default="", help="a line for the report (e.g. the machine's load)")
    p.add_argument("--strict", action="store_true",
                   help="exit 1 when a variant fails or differs from torch eager")
    p.add_argument("--profile-iters", type=int, default=10,
                   help="steps under the profiler (per-op cost = percall of the hot entries)")
    args = p.parse_args(argv)
    args.argv = argv
    if args.passes < 1:
        p.error("--passes must be at least 1")
    args.warmup = args.warmup if args.warmup is not None else (2 if args.quick else 5)
    args.iters = args.iters if args.iters is not None else (5 if args.quick else 30)
    args.rounds = args.rounds if args.rounds is not None else (3 if args.quick else 12)
    sizes = workloads.QUICK if args.quick else workloads.FULL
    by_name = {w.name: w for w in sizes}

    def profiles(name):
        return "\n".join(profile(by_name[name], path, iters=args.profile_iters)
                         for path in args.profile_path.split(","))

    if args.profile:
        print(profiles(args.profile.upper()))
        return 0

    chosen = [by_name[n.strip().upper()] for n in args.only.split(",")] if args.only else sizes
    variants = [v.strip() for v in args.variants.split(",")]
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        p.error(f"unknown variants {sorted(unknown)}; choose from {', '.join(VARIANTS)}")
    machine_start = rep.machine()
    print(f"load average {machine_start['load']}; {args.warmup} warm-up + {args.iters} timed; "
          f"{args.passes} pass(es)")
    passes = []
    for k in range(args.passes):
        results = []
        for w in chosen:
            print(f"{w.name}: {w.describe()}" + (f" (pass {k + 1} of {args.passes})"
                                                 if args.passes > 1 else ""))
            results += run_workload(w, variants, args.warmup, args.iters)
        passes.append(results)
    results = combine(passes) if len(passes) > 1 else passes[0]
    interleaved = []
    if args.rounds > 0:
        print(f"interleaved: {args.rounds} rounds of {args.block} steps per variant")
        interleaved = [paired.run(w, variants, args.warmup, args.rounds, args.block)
                       for w in chosen]
    prof = profiles("W1")
    eager = {m.workload: m.median for m in results if m.variant == "eager" and m.ok}
    twin = {m.workload: m.median for m in results if m.variant == "jax" and m.ok}
    floors = floor.table(chosen, eager, twin)
    machine_end = rep.machine()
    print()
    print(rep.summary_table(results, chosen))
    print()
    print(floors)
    print()
    if interleaved:
        print(paired.table(interleaved))
        print()
    print(targets.table(results, chosen, full=not args.quick, paired=interleaved))
    if args.out:
        out = Path(args.out)
        previous = out.read_text() if out.exists() else ""
        out.write_text(rep.report(results, chosen, args, machine_start, machine_end, prof, previous,
                                  floors, interleaved))
        print(f"wrote {out}")
    bad = [m for m in results if not m.ok]
    for m in bad:
        print(f"NOT OK: {m.workload} {m.variant}: {m.error or m.check}")
    for p_ in interleaved:
        for v, why in [*p_.errors.items(), *((v, c) for v, c in p_.checks.items() if c != "ok")]:
            bad.append(v)
            print(f"NOT OK (interleaved): {p_.workload} {v}: {why}")
    return 1 if bad and args.strict else 0


if __name__ == "__main__":
    sys.exit(main())
