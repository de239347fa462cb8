"""Run PyTorch's OpInfo database on hlo, per path, and write REPORT.md and report.json.

    python -m tests.conformance.run --full                 # every op, every registered path
    python -m tests.conformance.run --ops add,sum --paths core --jobs 1

Each path runs in its own spawned worker processes (ops split into shards, one process per shard,
``--jobs`` at a time); a watchdog kills a worker stuck on one op, records the op as failed and
restarts the worker on the remaining ops.
"""
from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing as mp
import os
import queue
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_PATHS = ("core", "legacy", "functional")


# -- the worker -----------------------------------------------------------------------------------
def worker(path: str, indices: list[int], cfg: dict, results) -> None:
    """Run ops ``indices`` of op_db on ``path``; report each op's tallies on ``results``."""
    import warnings
    warnings.simplefilter("ignore")
    import torch
    torch.set_num_threads(1)
    from torch.testing._internal.common_methods_invocations import op_db

    from . import harness
    missing = harness.load_paths([path])[path]
    if missing:
        results.put(("unavailable", path, None, missing))
        return
    dtypes = cfg.get("dtypes")
    dtypes = [getattr(torch, d) for d in dtypes] if dtypes else None
    variants = ("",) if cfg.get("no_inplace") else ("", "inplace")
    for i in indices:
        results.put(("start", path, i, time.time()))
        try:
            tallies = harness.run_op(op_db[i], path, cap=cfg["cap"], dtypes=dtypes,
                                     variants=variants)
            rows = [t.as_dict() for t in tallies]
        except BaseException as e:  # never lose the worker to one op
            rows = [harness.Tally(harness.full_name(op_db[i]), "", "-", path, failed=1,
                                  first_error=f"harness error: {harness.first_line(e)}").as_dict()]
        results.put(("op", path, i, rows))
    results.put(("done", path, None, None))


# -- the parent -----------------------------------------------------------------------------------
def _select_ops(op_db, names: list[str] | None) -> list[int]:
    from .harness import full_name
    if not names:
        return list(range(len(op_db)))
    wanted = set(names)
    picked = [i for i, op in enumerate(op_db) if full_name(op) in wanted or op.name in wanted]
    unknown = wanted - {full_name(op_db[i]) for i in picked} - {op_db[i].name for i in picked}
    if unknown:
        sys.exit(f"unknown OpInfo name(s): {', '.join(sorted(unknown))}")
    return picked


class _Shard:
    """One worker's share of one path's ops; restarted past an op that hangs or crashes it."""

    def __init__(self, path, indices):
        self.path, self.todo, self.proc, self.current, self.started = path, list(indices), None, None, None


def run_all(paths: list[str], indices: list[int], names: list[str], cfg: dict, jobs: int,
            op_timeout: float, log=sys.stderr) -> tuple[list[dict], dict]:
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    # Split each path into `jobs` shards unless the paths alone fill the workers evenly.
    shards_per_path = 1 if len(paths) % jobs == 0 else jobs
    pending = []
    for p in paths:
        for k in range(shards_per_path):
            part = indices[k::shards_per_path]
            if part:
                pending.append(_Shard(p, part))
    running: list[_Shard] = []
    rows: list[dict] = []
    unavailable: dict[str, str] = {}
    done_ops = {p: 0 for p in paths}
    total = len(indices)

    def launch(shard):
        shard.proc = ctx.Process(target=worker, args=(shard.path, shard.todo, cfg, results),
                                 daemon=True)
        shard.proc.start()
        shard.current, shard.started = None, time.time()
        running.append(shard)

    def fail_current(shard, why):
        i = shard.current
        rows.append({"op": names[i], "variant": "", "dtype": "-", "path": shard.path, "passed": 0,
                     "failed": 1, "fallback": 0, "skipped": 0, "samples_total": 0,
                     "first_error": why, "skip_reason": "", "fallback_ops": {},
                     "seconds": round(time.time() - shard.started, 1)})
        shard.todo = shard.todo[shard.todo.index(i) + 1:]
        done_ops[shard.path] += 1

    while pending or running:
        while pending and len(running) < jobs:
            launch(pending.pop(0))
        try:
            kind, path, i, payload = results.get(timeout=2.0)
        except queue.Empty:
            kind = None
        if kind is not None:
            shard = next((s for s in running if s.path == path and
                          (i is None or i in s.todo)), None)
            if kind == "start" and shard:
                shard.current, shard.started = i, payload
            elif kind == "op" and shard:
                rows.extend(payload)
                shard.todo = [j for j in shard.todo if j != i]
                shard.current = None
                done_ops[path] += 1
                if done_ops[path] % 25 == 0 or done_ops[path] == total:
                    print(f"[{path}] {done_ops[path]}/{total} ops", file=log, flush=True)
            elif kind == "unavailable":
                unavailable[path] = payload
                for s in [s for s in running if s.path == path]:
                    s.todo = []
                pending = [s for s in pending if s.path != path]
        for shard in list(running):
            stuck = shard.current is not None and time.time() - shard.started > op_timeout
            dead = not shard.proc.is_alive()
            if stuck:
                shard.proc.kill()
                shard.proc.join()
                fail_current(shard, f"timed out after {op_timeout:.0f}s (worker killed)")
                print(f"[{shard.path}] {names[shard.current]} timed out", file=log, flush=True)
            elif dead:
                _drain(results, rows, running, done_ops)
                if shard.current is not None and shard.current in shard.todo:
                    fail_current(shard, f"worker crashed (exit code {shard.proc.exitcode})")
                elif shard.todo and shard.proc.exitcode != 0 and shard.path not in unavailable:
                    shard.current = shard.todo[0]
                    fail_current(shard, f"worker crashed (exit code {shard.proc.exitcode})")
            if stuck or dead:
                running.remove(shard)
                if shard.todo and shard.path not in unavailable:
                    pending.insert(0, shard)
    return rows, unavailable


def _drain(results, rows, running, done_ops) -> None:
    """Messages a worker sent just before it exited."""
    while True:
        try:
            kind, path, i, payload = results.get_nowait()
        except queue.Empty:
            return
        shard = next((s for s in running if s.path == path and (i is None or i in s.todo)), None)
        if kind == "op" and shard:
            rows.extend(payload)
            shard.todo = [j for j in shard.todo if j != i]
            shard.current = None
            done_ops[path] += 1
        elif kind == "start" and shard:
            shard.current, shard.started = i, payload


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--full", action="store_true", help="every OpInfo; writes REPORT.md/report.json")
    ap.add_argument("--ops", help="comma-separated OpInfo names (name or name.variant)")
    ap.add_argument("--paths", default=",".join(DEFAULT_PATHS))
    ap.add_argument("--jobs", type=int, default=int(os.environ.get("JOBS", 2)))
    ap.add_argument("--cap", type=int, default=24,
                    help="samples per op and dtype (bfloat16: half); 0 = every sample")
    ap.add_argument("--dtypes", help="comma-separated dtypes (default: harness.DTYPES, and "
                         "float64 for ops that support none of them); any torch dtype, e.g. "
                         "float16, to probe")
    ap.add_argument("--no-inplace", action="store_true")
    ap.add_argument("--op-timeout", type=float, default=600.0)
    ap.add_argument("--out", help="directory for REPORT.md and report.json "
                                  "(default: tests/conformance with --full, none otherwise)")
    args = ap.parse_args(argv)
    if not args.full and not args.ops:
        ap.error("give --full or --ops")

    import warnings
    warnings.simplefilter("ignore")
    from torch.testing._internal.common_methods_invocations import op_db

    from . import harness, report
    names = [harness.full_name(op) for op in op_db]
    indices = _select_ops(op_db, None if args.full else args.ops.split(","))
    paths = [p for p in args.paths.split(",") if p]
    cfg = {"cap": args.cap, "no_inplace": args.no_inplace,
           "dtypes": args.dtypes.split(",") if args.dtypes else None}
    start = time.time()
    rows, unavailable = run_all(paths, indices, names, cfg, max(1, args.jobs), args.op_timeout)
    wall = time.time() - start
    meta = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "commit": _git_commit(),
        "wall_seconds": round(wall, 1),
        "jobs": args.jobs,
        "cap": args.cap,
        "dtypes": cfg["dtypes"] or [harness.dtype_name(d) for d in harness.DTYPES],
        "paths": paths,
        "unavailable_paths": unavailable,
        "ops_selected": len(indices),
        "full": bool(args.full),
        "torch": __import__("torch").__version__,
        "jax": __import__("jax").__version__,
    }
    data = report.build(rows, meta, op_db, indices)
    out = args.out or (HERE if args.full else None)
    print(report.summary(data))
    if out:
        report.write(data, out)
        print(f"wrote {os.path.join(out, 'REPORT.md')} and report.json")
    return 0


def _git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE,
                              capture_output=True, text=True, check=True).stdout.strip()
    except Exception:
        return "?"


if __name__ == "__main__":
    sys.exit(main())
