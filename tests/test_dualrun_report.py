"""Comparators and the JSONL report: tolerances, NaNs, ignores, crash safety, the CLI summary."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import torch

from xla_compat import settings
from xla_compat.__main__ import main as cli_main
from xla_compat.dualrun import IgnoreRules, compare, report


def test_integers_and_bools_compare_exactly():
    a = torch.tensor([1, 2, 3])
    assert compare.compare_tensors("x", a, a.clone()) is None
    m = compare.compare_tensors("x", a, torch.tensor([1, 2, 4]))
    assert m.kind == "values" and m.worst_index == (2,) and m.max_abs_err == 1.0
    assert compare.compare_tensors("b", torch.tensor([True]), torch.tensor([False])).kind == "values"


def test_float_tolerance_is_per_dtype_and_configurable():
    a = torch.tensor([1.0, 100.0])
    b = a + torch.tensor([0.0, 5e-4])            # relative error 5e-6 at index 1
    assert compare.compare_tensors("x", a, b) is None
    m = compare.compare_tensors("x", a.double(), b.double())   # float64 is much stricter
    assert m is not None and m.worst_index == (1,)
    assert m.max_abs_err == pytest.approx(5e-4, rel=0.01) and m.max_rel_err == pytest.approx(5e-6, rel=0.01)
    with settings.override(dual_run_tolerances=(("float32", 1e-7, 0.0),)):
        assert compare.compare_tensors("x", a, b) is not None
    assert compare.tolerance(torch.bfloat16) == compare.DEFAULT_TOLERANCES["bfloat16"]
    assert compare.tolerance(torch.int32) == (0.0, 0.0)


def test_nan_positions_must_agree_and_equal_infinities_match():
    a = torch.tensor([float("nan"), 1.0, float("inf")])
    assert compare.compare_tensors("x", a, a.clone()) is None
    m = compare.compare_tensors("x", a, torch.tensor([0.0, 1.0, float("inf")]))
    assert m.kind == "nan" and m.worst_index == (0,)
    assert compare.compare_tensors("x", a, torch.tensor([float("nan"), 1.0, -float("inf")]))


def test_shape_dtype_and_structure_mismatches_are_named():
    assert compare.compare_tensors("x", torch.zeros(2), torch.zeros(3)).kind == "shape"
    assert compare.compare_tensors("x", torch.zeros(2), torch.zeros(2).double()).kind == "dtype"
    found = compare.compare_values("out", (torch.zeros(2), 3), (torch.zeros(2), 4))
    assert [m.name for m in found] == ["out[1]"]


def test_exceptions_match_on_class_and_message_with_path_names_normalised():
    pair = ("legacy", "functional")
    assert compare.compare_exceptions(ValueError("bad on the legacy path"),
                                      ValueError("bad on the functional path"), pair) is None
    assert compare.compare_exceptions(ValueError("x"), TypeError("x"), pair).kind == "exception"
    assert compare.compare_exceptions(None, ValueError("x"), pair) is not None


def test_ignore_rules_parse_and_match():
    rules = IgnoreRules.parse(["op:aten.native_batch_norm*", "name:*.running_var"])
    assert rules.ignores_op("aten.native_batch_norm.default")
    assert rules.ignores_name("input args[0].bn.running_var")
    assert not rules.ignores_name("output")
    with pytest.raises(ValueError, match="op:<glob>"):
        IgnoreRules.parse(["bogus"])


def test_settings_parse_dual_run_variables():
    s = settings.Settings.from_env({"XLA_DUAL_RUN": "sample", "XLA_DUAL_RUN_RATE": "0.1",
                                    "XLA_DUAL_RUN_REPORT": "/tmp/r.jsonl",
                                    "XLA_DUAL_RUN_TOLERANCES": "float32=1e-4:1e-5",
                                    "XLA_DUAL_RUN_IGNORE": "name:a*,op:b"})
    assert (s.dual_run, s.dual_run_rate, s.dual_run_report) == ("sample", 0.1, "/tmp/r.jsonl")
    assert s.dual_run_tolerances == (("float32", 1e-4, 1e-5),)
    assert s.dual_run_ignore == ("name:a*", "op:b")
    for bad in ({"XLA_DUAL_RUN": "sometimes"}, {"XLA_DUAL_RUN_RATE": "10"},
                {"XLA_DUAL_RUN_TOLERANCES": "float32"}):
        with pytest.raises(settings.SettingError, match=next(iter(bad))):
            settings.Settings.from_env(bad)


WRITER = textwrap.dedent("""
    import sys
    from xla_compat.dualrun import report
    path, start = sys.argv[1], int(sys.argv[2])
    i = start
    while True:
        # Records of several pages, so a kill can land inside one write.
        report.append({"match": i % 3 != 0, "step": i, "pad": "x" * (3000 + 997 * (i % 7)),
                       "wall_s": {"legacy": 0.01, "functional": 0.02}}, path)
        i += 1
""")


def test_report_survives_sigkill_mid_write_with_every_line_parseable(tmp_path):
    path = tmp_path / "dual.jsonl"
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(__file__)))
    for round_ in range(2):                     # killed, restarted, killed again
        start = path.stat().st_size if path.exists() else 0
        proc = subprocess.Popen([sys.executable, str(script), str(path), str(1000 * round_)],
                                env=env)
        # Kill only once this writer has written (the first writer may have run far past any
        # fixed size before its kill landed).
        deadline = time.time() + 60
        while time.time() < deadline and (not path.exists()
                                          or path.stat().st_size < start + 100_000):
            time.sleep(0.02)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        assert proc.returncode == -signal.SIGKILL
        records, skipped = report.read(str(path))
        assert skipped <= 1                      # at most the cut-off last line
        assert records and all("step" in r for r in records)
    # The next append cuts off any partial tail: then every line in the file is whole JSON.
    report.append({"match": True, "step": -1}, str(path))
    data = path.read_bytes()
    assert data.endswith(b"\n")
    lines = data.decode().splitlines()
    assert all(json.loads(line)["step"] is not None for line in lines)
    steps = [json.loads(line)["step"] for line in lines]
    assert steps[-1] == -1 and {0, 1000} <= set(steps)


def test_cli_report_summarises_matches_mismatches_by_first_op_and_slowest_path(tmp_path, capsys):
    path = str(tmp_path / "dual.jsonl")
    fd = {"level": "op", "op": "aten.add_.Tensor", "source": "train.py:12",
          "culprit": {"op": "aten.select_scatter.default", "source": "train.py:12"}}
    for i in range(5):
        report.append({"match": i != 2, "step": i, "first_divergence": fd if i == 2 else None,
                       "ignored": [{"name": "bn.running_var"}] if i == 4 else [],
                       "wall_s": {"legacy": 0.01, "functional": 0.03},
                       "graph_nodes": {"legacy": 40, "functional": 55}}, path)
    code = cli_main(["report", path])
    out = capsys.readouterr().out
    assert code == 1                                       # a mismatch: non-zero for CI
    assert "runs" in out and " 5" in out
    counts = {line.rsplit(None, 1)[0]: line.split()[-1] for line in out.splitlines()
              if line.strip() and line.split()[-1].isdigit()}
    assert counts["matches"] == "4" and counts["mismatches"] == "1"
    assert "aten.select_scatter.default (train.py:12)" in out
    assert "slowest path: functional (3.00x" in out
    assert [line.split()[-1] for line in out.splitlines()
            if line.startswith("ignored differences")] == ["1"]


def test_cli_report_runs_as_a_module(tmp_path):
    path = str(tmp_path / "dual.jsonl")
    report.append({"match": True, "wall_s": {"legacy": 0.1, "functional": 0.1}}, path)
    out = subprocess.run([sys.executable, "-m", "xla_compat", "report", path, "--json"],
                         capture_output=True, text=True, timeout=300,
                         cwd=os.path.dirname(os.path.dirname(__file__)))
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {
        "runs": 1, "skipped": 0, "matches": 1, "mismatches": 0}
