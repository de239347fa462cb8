"""The persistent compile cache: a second process loads the first one's executables and computes
the same numbers; read-only loads and stores nothing; one directory per process."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import xla_compat.runtime as xr
from xla_compat import persistent_cache

# One training step and a dropout on each path, then the numbers and the cache counters as JSON.
PROGRAM = r"""
import json, sys, torch, xla_compat as xc
out = {}
for path in ("legacy", "functional"):
    with xc.use_path(path):
        dev = xc.device()
        torch.manual_seed(0)
        lin = torch.nn.Linear(6, 3).to(dev)
        x = torch.randn(4, 6).to(dev)
        loss = torch.nn.functional.dropout(lin(x), 0.3).relu().square().sum()
        loss.backward()
        with torch.no_grad():
            lin.weight.sub_(lin.weight.grad * 0.1)
        xc.sync()
        out[path] = [loss.item(), lin.weight.cpu().tolist()]
c = xc.metrics.counters()
out["hit"], out["miss"] = c.get("PersistentCacheHit", 0), c.get("PersistentCacheMiss", 0)
out["compiles"] = c.get("CompileTime", 0)
print(json.dumps(out))
"""


def _run(cache, *, readonly=False, api=False):
    env = {k: v for k, v in os.environ.items() if not k.startswith("XLA_")}
    code = PROGRAM
    if api:
        code = f"import xla_compat.runtime as xr; xr.initialize_cache({str(cache)!r}, " \
               f"readonly={readonly})\n" + PROGRAM
    else:
        env["XLA_PERSISTENT_CACHE_PATH"] = str(cache)
        if readonly:
            env["XLA_PERSISTENT_CACHE_READ_ONLY"] = "1"
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_later_process_loads_every_graph_from_disk_and_read_only_stores_nothing(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    cold = _run(empty, readonly=True)               # read-only and empty: every compile misses
    assert cold["compiles"] >= 2 and cold["hit"] == 0 and cold["miss"] == cold["compiles"]
    assert os.listdir(empty) == []
    cache = tmp_path / "cache"                      # made by the first process that writes
    first = _run(cache)
    assert first["compiles"] == cold["compiles"] and first["miss"] >= 1
    assert first["hit"] + first["miss"] == first["compiles"]
    stored = sorted(os.listdir(cache))
    assert len(stored) == first["miss"]       # a path's graph equal to the other's hits it
    warm = _run(cache, readonly=True, api=True)     # the runtime call reaches the same cache
    assert warm["miss"] == 0 and warm["hit"] == warm["compiles"] == first["compiles"]
    assert sorted(os.listdir(cache)) == stored
    for path in ("legacy", "functional"):           # loaded executables compute the same
        assert warm[path] == first[path] == cold[path]


def test_the_cache_cannot_move_once_open_and_a_bad_directory_says_what_to_do(tmp_path,
                                                                              monkeypatch):
    monkeypatch.setattr(persistent_cache, "_path", str(tmp_path / "open"))
    xr.initialize_cache(str(tmp_path / "open"), readonly=False)   # the same directory: fine
    with pytest.raises(RuntimeError, match="cannot move to .*XLA_PERSISTENT_CACHE_PATH"):
        xr.initialize_cache(str(tmp_path / "elsewhere"))
    assert persistent_cache.path() == str(tmp_path / "open")
    monkeypatch.setattr(persistent_cache, "_path", None)
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    with pytest.raises(RuntimeError, match="cannot create .*writable directory"):
        xr.initialize_cache(str(blocker / "cache"))
    assert not xr.is_cache_initialized()
