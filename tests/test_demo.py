"""`make demo` (python -m xla_compat.demo): it runs to completion, its loss falls, and it repeats."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

ARGS = ["--steps", "10", "--batch", "8", "--seq", "32", "--dual-run", "strict",
        "--dual-run-steps", "1"]


@pytest.fixture(scope="module")
def compile_cache(tmp_path_factory):
    """One persistent compile cache for this worker's demo runs: a later run of the same
    configuration loads its executables (and must train to the same numbers)."""
    return tmp_path_factory.mktemp("xla_compile_cache")


def _run(path: str, tmp, *extra, args=ARGS, cache=None) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("XLA_")}
    if cache is not None:
        env["XLA_PERSISTENT_CACHE_PATH"] = str(cache)
    proc = subprocess.run([sys.executable, "-m", "xla_compat.demo", *args, "--path", path,
                           "--checkpoint-dir", str(tmp), *extra], env=env, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


# (the legacy run dual-runs every sampled step on functional too; the functional-authoritative
# run, the repeat with the same seed and the --capture run are in make test-slow: make test's
# persistent-cache, capture and dual-run tests cover what they add, on both paths). The demo's
# runs keep XLA's default flags (conftest's are dropped with the other XLA_ variables): the job
# as users run it.
@pytest.mark.parametrize("path", ["legacy", pytest.param("functional", marks=pytest.mark.slow)],
                         indirect=True)
def test_demo_trains_dual_runs_and_checkpoints(path, tmp_path, compile_cache):
    first = _run(path, tmp_path, cache=compile_cache)
    assert f"training a GPT on the {path} path" in first
    assert "reason:" in first                                 # the dispatch decision
    assert "sampled step 0: match" in first                   # the dual-run check
    assert "reloaded: identical" in first                     # checkpoint round trip
    assert "CompileTime=" in first                            # the metrics summary
    start, end = map(float, re.search(r"loss ([\d.]+) -> ([\d.]+)", first).groups())
    assert end < start


@pytest.mark.slow
def test_demo_repeats_exactly_with_the_same_seed(tmp_path):
    """Two short runs without dual-run (the full run above checks what dual-run adds); the
    checkpoint folder does not exist yet: the demo makes it. The second run loads the first
    one's executables from a persistent compile cache."""
    final = re.compile(r"final loss: ([\d.]+)")
    short = ["--steps", "2", "--batch", "8", "--seq", "32", "--dual-run", "off"]
    cache = tmp_path / "compile_cache"
    outs = [_run("functional", tmp_path / f"run{i}" / "ckpt", args=short, cache=cache)
            for i in range(2)]
    runs = [final.search(out).group(1) for out in outs]
    assert runs[0] == runs[1]
    assert "PersistentCacheMiss" in outs[0] and "PersistentCacheMiss" not in outs[1]
    assert re.search(r"PersistentCacheHit=\d+", outs[1])


@pytest.mark.slow
def test_demo_with_step_capture_replays_and_trains(tmp_path, compile_cache):
    """The demo's --capture flag, on the functional path (captured training on both paths is
    tests/test_capture.py's, in make test)."""
    out = _run("functional", tmp_path, "--capture", cache=compile_cache)
    stats = re.search(r"step capture: \{'replays': (\d+), 'recorded': (\d+)", out)
    assert stats, out[-2000:]
    assert int(stats.group(1)) == 8 and int(stats.group(2)) == 2   # 10 steps: 2 recorded
    start, end = map(float, re.search(r"loss ([\d.]+) -> ([\d.]+)", out).groups())
    assert end < start
    assert "sampled step 0: match" in out and "reloaded: identical" in out
