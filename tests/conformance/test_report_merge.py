"""Combining conformance runs: the same paths over other dtypes, and a rerun of a few ops."""
from __future__ import annotations

from tests.conformance import report


def _run(dtype, passed, failed, error="", op="abs"):
    cell = {"passed": passed, "failed": failed, "fallback": 0, "skipped": 0,
            "first_error": f"[{dtype}] {error}" if error else "", "skip_reason": "",
            "fallback_ops": {}, "seconds": 1.0, "by_dtype": {dtype: [passed, failed, 0, 0]}}
    return {"meta": {"paths": ["legacy"], "dtypes": [dtype], "ops_selected": 702,
                     "date": "d", "commit": "c", "jax": "j", "wall_seconds": 1, "jobs": 1,
                     "cap": 8},
            "totals": {}, "comparison": {},
            "ops": [{"op": op, "variant": "", "dtypes": [dtype], "paths": {"legacy": cell}}]}


def test_runs_over_other_dtypes_add_up_per_op_and_a_rerun_replaces_its_cells():
    merged = report.merge_dtypes(_run("float32", 4, 0), _run("int64", 3, 1, "boom"))
    (abs_row,) = [e for e in merged["ops"] if e["op"] == "abs"]
    cell = abs_row["paths"]["legacy"]
    assert cell["by_dtype"] == {"float32": [4, 0, 0, 0], "int64": [3, 1, 0, 0]}
    assert (cell["passed"], cell["failed"]) == (7, 1)
    assert cell["first_error"] == "[int64] boom"
    t = merged["totals"]["legacy"]
    assert t["float32_all_pass"] == 1 and t["opinfos_all_pass"] == 0
    fixed = report.merge_dtypes(_run("float32", 4, 0), _run("int64", 3, 1, "boom"),
                                _run("int64", 4, 0))
    cell = [e for e in fixed["ops"] if e["op"] == "abs"][0]["paths"]["legacy"]
    assert cell["by_dtype"]["int64"] == [4, 0, 0, 0] and cell["first_error"] == ""
    assert fixed["totals"]["legacy"]["opinfos_all_pass"] == 1
