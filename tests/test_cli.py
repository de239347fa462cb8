"""The command line and the process-wide switch, end to end in subprocesses."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

# One small program with the things the two paths do differently: writes through views, autograd
# and an optimizer-style in-place update. Run on CPU here and on hlo in a subprocess.
PROGRAM = textwrap.dedent("""
    import torch

    def program(dev):
        g = torch.Generator().manual_seed(0)
        w = torch.randn(4, 3, generator=g).to(dev).requires_grad_()
        x = torch.randn(5, 4, generator=g).to(dev)
        x.t()[1].mul_(3)             # write through a view of a view
        x[:, 2:].add_(1)
        out = (x @ w).relu()
        out.sum().backward()
        with torch.no_grad():
            w.sub_(0.1 * w.grad)
        return {"x": x, "out": out, "w": w, "grad": w.grad}
""")

SCRIPT = PROGRAM + textwrap.dedent("""
    import json, sys
    import xla_compat as xc
    result = program(xc.device())
    d = xc.explain()
    print(json.dumps({"path": xc.path(), "reason": d.reason.value, "argv": sys.argv[1:],
                      "result": {k: v.detach().cpu().tolist() for k, v in result.items()}}))
""")


def cpu_reference():
    scope: dict = {}
    exec(PROGRAM, scope)
    return {k: v.detach() for k, v in scope["program"]("cpu").items()}


def run(args, tmp_path, **env_changes):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("XLA_ROLLOUT") and k != "XLA_USE_FUNCTIONALIZATION"}
    env.update(env_changes, XLA_JOB_ID="cli-test-job")
    out = subprocess.run([sys.executable, *args], env=env, cwd=tmp_path, capture_output=True,
                         text=True, timeout=400)
    return out


def script_result(out) -> dict:
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def assert_matches_cpu(result):
    expected = cpu_reference()
    for name, value in expected.items():
        torch.testing.assert_close(torch.tensor(result[name], dtype=value.dtype), value,
                                   rtol=1e-5, atol=1e-5, msg=name)


@pytest.fixture
def script(tmp_path):
    p = tmp_path / "user_script.py"
    p.write_text(SCRIPT)
    return str(p)


@pytest.mark.parametrize("flag, path", [("0", "legacy"), ("1", "functional")])
def test_same_program_under_the_flag_matches_cpu_eager(tmp_path, script, flag, path):
    data = script_result(run([script], tmp_path, XLA_USE_FUNCTIONALIZATION=flag))
    assert (data["path"], data["reason"]) == (path, "EXPLICIT_FLAG")
    assert_matches_cpu(data["result"])


@pytest.mark.parametrize("flag, path", [("0", "legacy"), ("1", "functional")])
def test_doctor_reports_the_path_used_and_checks_every_path(tmp_path, flag, path):
    out = run(["-m", "xla_compat", "doctor"], tmp_path, XLA_USE_FUNCTIONALIZATION=flag)
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    text = out.stdout
    assert f"torch {torch.__version__}" in text and "jax " in text
    assert f"path: {path} (version" in text and "reason: EXPLICIT_FLAG" in text
    assert f"path used: {path} (EXPLICIT_FLAG)" in text
    for name in ("legacy", "functional"):
        assert f"  {name}: OK" in text, text
        assert any(line.split()[:1] == [name] and line.rstrip().endswith("supported")
                   for line in text.splitlines()), text


def test_run_forces_the_path_over_the_environment_and_passes_arguments(tmp_path, script):
    out = run(["-m", "xla_compat", "run", "--path", "functional", script, "--steps", "2", "x"],
              tmp_path, XLA_USE_FUNCTIONALIZATION="0")
    data = script_result(out)
    assert (data["path"], data["reason"]) == ("functional", "EXPLICIT_FLAG")
    assert data["argv"] == ["--steps", "2", "x"]
    assert_matches_cpu(data["result"])


def test_run_without_a_path_leaves_the_decision_to_the_settings(tmp_path, script):
    data = script_result(run(["-m", "xla_compat", "run", script], tmp_path,
                             XLA_USE_FUNCTIONALIZATION="1", XLA_ROLLOUT_KILL_SWITCH="1"))
    assert (data["path"], data["reason"]) == ("legacy", "KILL_SWITCH")
    assert_matches_cpu(data["result"])


def test_a_malformed_rollout_file_never_stops_the_job(tmp_path, script):
    bad = tmp_path / "rollout.json"
    bad.write_text('{"percentage": 150}')
    out = run([script], tmp_path, XLA_ROLLOUT_CONFIG=str(bad))
    data = script_result(out)
    assert (data["path"], data["reason"]) == ("legacy", "CONFIG_ERROR")
    assert_matches_cpu(data["result"])
    doctor = run(["-m", "xla_compat", "doctor"], tmp_path, XLA_ROLLOUT_CONFIG=str(bad))
    assert "reason: CONFIG_ERROR" in doctor.stdout and "'percentage'" in doctor.stdout


def test_help_lists_the_subcommands(tmp_path):
    out = run(["-m", "xla_compat", "--help"], tmp_path)
    assert out.returncode == 0 and "doctor" in out.stdout and "run" in out.stdout
    bad = run(["-m", "xla_compat", "run", "--path", "nonsense", "x.py"], tmp_path)
    assert bad.returncode == 2 and "legacy" in bad.stderr and "functional" in bad.stderr
