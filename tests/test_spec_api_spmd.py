"""Audit of issues 9 (demo, torch_xla-shaped API, guide) and 11 (SPMD): behaviours the other
tests did not pin down, each on both paths and against torch on the CPU where values are involved.
"""
from __future__ import annotations

import pathlib
import re

import pytest
import torch

import xla_compat.core.xla_model as xm
import xla_compat.debug.metrics as met
from xla_compat import demo

from .conftest import assert_same

ROOT = pathlib.Path(__file__).resolve().parent.parent


# -- issue 9.1: the demo ------------------------------------------------------------------------

def _demo(capsys, tmp_path, *extra) -> str:
    argv = ["--steps", "3", "--batch", "4", "--seq", "16", "--dual-run", "off",
            "--checkpoint-dir", str(tmp_path), *extra]
    assert demo.main(argv) in (0, 1)          # 1 only says the loss did not fall in 3 steps
    return capsys.readouterr().out


@pytest.mark.slow       # about 10 s per path: the GPT's first compile; the repeat is cached
def test_demo_without_path_flag_trains_on_the_chosen_path_and_repeats(path, capsys, tmp_path):
    first = _demo(capsys, tmp_path)
    assert f"training a GPT on the {path} path" in first      # no --path: what is active
    assert re.search(r"step +3/3 \[#+\] loss [\d.]+ +[\d.]+ steps/s", first), first
    assert "== dual-run: off" in first
    assert "reloaded: identical" in first
    again = _demo(capsys, tmp_path)
    final = re.compile(r"final loss: ([\d.]+)")
    assert final.search(first).group(1) == final.search(again).group(1)


# -- issue 9.2: xm.wait_device_ops and the README sample ---------------------------------------

def test_xm_wait_device_ops_after_mark_step_leaves_correct_values(path):
    dev = xm.xla_device()
    a_cpu = torch.arange(12.0).reshape(3, 4)
    a = a_cpu.to(dev)
    a[1].mul_(3)
    a_cpu[1].mul_(3)
    xm.mark_step()
    xm.wait_device_ops()
    assert met.counter_value("MarkStep") == 1
    assert_same(a, a_cpu)


def test_readme_python_sample_runs_and_its_view_writes_through(path):
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"^```python\n(.*?)^```", text, re.S | re.M)
    assert blocks, "README.md has no python sample"
    scope: dict = {}
    exec(compile(blocks[0], "README.md", "exec"), scope)
    x, y = scope["x"], scope["y"]
    assert_same(y, x.cpu().t())                # y is a view of x, the write reached x
    assert y.stride() == x.cpu().t().stride()


# -- issue 9.3: the playbook's settings table names every variable and rollout field ------------

def test_playbook_table_lists_every_environment_variable_and_rollout_field():
    import inspect

    from xla_compat import rollout, settings
    text = (ROOT / "migration_guide" / "rollout_playbook.md").read_text()
    table = text.split("## Every setting", 1)[1]
    rows = [[c.strip() for c in line.strip("|").split("|")]
            for line in table.splitlines() if line.startswith("| `")]
    variables = {r[0].strip("`") for r in rows}
    fields = {r[1].strip("`") for r in rows} - {"–"}
    read = set(re.findall(r'"(XLA_[A-Z_]+)"', inspect.getsource(settings.Settings.from_env)))
    read |= {settings.JOB_ID_SOURCES[0]}
    assert read - variables == set(), f"variables read but not in the table: {read - variables}"
    assert variables - read == set(), f"variables in the table that nothing reads: {variables - read}"
    assert fields == set(rollout.FIELDS), (fields, set(rollout.FIELDS))
    defaults = {r[0].strip("`"): r[2] for r in rows}
    assert all(defaults.values()), "every row gives a default"
