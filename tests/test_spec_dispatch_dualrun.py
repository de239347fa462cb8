"""Issues 5 and 6, requirement by requirement, where the other suites left a behaviour untested:
a malformed rollout setting still runs the job (in-process, one per kind of bad value), what a
function-level dual run compares (aliasing, mutated inputs, exceptions), name ignores, the modes
read from the settings, and a lockstep report summarised by the CLI."""
from __future__ import annotations

import json

import pytest
import torch

import xla_compat as xc
from xla_compat import dispatch, metrics, paths, settings
from xla_compat.__main__ import main as cli_main
from xla_compat.dualrun import last_result, modes, report
from xla_compat.rollout import Reason
from tests.test_dualrun_function import planted_select_scatter_bug, write_through_row


# -- issue 5: a malformed setting never stops the job ------------------------------------------

@pytest.fixture
def fresh_decision():
    """Forget the process decision and the settings for one test; put both back afterwards."""
    saved_settings = settings.get()
    saved_decision, saved_default = dispatch._decision, paths._default
    dispatch.forget_decision()
    yield
    settings._current = saved_settings
    dispatch._decision = saved_decision
    paths.set_default(saved_default)
    paths.set_default_resolver(None if saved_decision is not None else dispatch.ensure_decided)


def _program(dev):
    x = torch.arange(12.0).reshape(3, 4).to(dev)
    x.t()[1].mul_(3)                  # a write through a view of a view
    return (x @ torch.ones(4, 2).to(dev)).relu(), x


# (rollout file name, its text, or None; extra environment; text the message must name)
MALFORMED = [
    ("r.json", "{bad json", {}, "not valid JSON"),
    ("r.toml", "percentage = = 3", {}, "not valid TOML"),
    ("r.json", '{"percentage": 150}', {}, "'percentage'"),
    ("r.json", '{"percentage": -1}', {}, "'percentage'"),
    ("r.json", '{"percentage": 5, "percentge": 6}', {}, "unknown field 'percentge'"),
    ("r.json", '{"percentage": "50"}', {}, "'percentage'"),
    ("r.toml", 'kill_switch = "yes"', {}, "'kill_switch'"),
    (None, None, {"XLA_ROLLOUT_PERCENTAGE": "150"}, "XLA_ROLLOUT_PERCENTAGE"),
    (None, None, {"XLA_ROLLOUT_PERCENTAGE": "-1"}, "XLA_ROLLOUT_PERCENTAGE"),
    (None, None, {"XLA_ROLLOUT_PERCENTAGE": "ten"}, "XLA_ROLLOUT_PERCENTAGE"),
    (None, None, {"XLA_USE_FUNCTIONALIZATION": "maybe"}, "XLA_USE_FUNCTIONALIZATION"),
    (None, None, {"XLA_ROLLOUT_MIN_TORCH": "latest"}, "XLA_ROLLOUT_MIN_TORCH"),
]


@pytest.mark.parametrize("name, text, env, field", MALFORMED,
                         ids=[f"{n or 'env'}-{i}" for i, (n, _, _, _) in enumerate(MALFORMED)])
def test_each_malformed_rollout_setting_gives_config_error_and_the_job_runs_like_cpu(
        fresh_decision, tmp_path, name, text, env, field):
    env = dict(env, XLA_JOB_ID="spec-job", XLA_ROLLOUT_ALLOW="spec-*")   # would be functional
    if name is not None:
        (tmp_path / name).write_text(text)
        env["XLA_ROLLOUT_CONFIG"] = str(tmp_path / name)
    settings.reload(env)
    dev = xc.device()                               # first device use: decides, never raises
    d = xc.explain()
    assert (d.path, d.reason) == ("legacy", Reason.CONFIG_ERROR), d.message
    assert field in d.message and "legacy" in d.message
    out, x = _program(dev)
    assert paths.of(out) == "legacy"
    want_out, want_x = _program("cpu")
    assert torch.equal(out.cpu(), want_out) and torch.equal(x.cpu(), want_x)


def test_the_real_functional_probe_gates_a_torch_without_to_functional_tensor(monkeypatch):
    from xla_compat.settings import Settings
    dispatch.load_paths()
    assert dispatch.supported()["functional"] is None
    monkeypatch.delattr(torch, "_to_functional_tensor")
    why = dispatch.supported()["functional"]
    assert why is not None and "_to_functional_tensor" in why
    d = dispatch.decide(Settings(use_functionalization=True, job_id="j"))
    assert (d.path, d.reason) == ("legacy", Reason.VERSION_GATE)
    assert "_to_functional_tensor" in d.message and d.warnings


# -- issue 6.1: what a function-level dual run compares -----------------------------------------

def test_an_output_that_aliases_its_input_on_one_path_only_is_a_mismatch(path, dev):
    x = torch.arange(12.0).reshape(3, 4).to(dev)
    r = xc.dual_run(lambda t: t[1] if xc.path() == path else t[1].clone(), x)
    assert [m.kind for m in r.mismatches] == ["alias"], [str(m) for m in r.mismatches]
    assert "args[0]" in r.mismatches[0].detail
    assert torch.equal(r.value.cpu(), torch.arange(12.0).reshape(3, 4)[1])
    r = xc.dual_run(lambda t: t[1], x)                   # a view on both paths
    assert r.match, [str(m) for m in r.mismatches]


@pytest.mark.parametrize("shadow_does, kind", [
    (lambda t: t.add_(2), "values"),          # mutated differently
    (lambda t: t, "values"),                  # mutated on the authoritative path only
    (lambda t: t.unsqueeze_(0), "shape"),     # mutated to another shape
], ids=["values", "one_side", "shape"])
def test_an_input_the_shadow_mutates_differently_is_named(path, dev, shadow_does, kind):
    x = torch.arange(6.0).reshape(2, 3).to(dev)

    def step(t):
        (t.add_(1) if xc.path() == path else shadow_does(t))
        return None

    r = xc.dual_run(step, x)
    assert [(m.name, m.kind) for m in r.mismatches] == [("input args[0]", kind)], \
        [str(m) for m in r.mismatches]
    assert torch.equal(x.cpu(), torch.arange(6.0).reshape(2, 3) + 1)   # authoritative write


def test_a_different_output_dtype_is_a_dtype_mismatch(path, dev):
    x = torch.arange(4.0).to(dev)
    r = xc.dual_run(lambda t: t * 2 if xc.path() == path else (t * 2).double(), x)
    assert [m.kind for m in r.mismatches] == ["dtype"]
    assert r.value.dtype == torch.float32


def test_an_authoritative_exception_the_shadow_did_not_raise_is_recorded_then_reraised(
        path, dev, tmp_path):
    log = tmp_path / "dual.jsonl"

    def step(t):
        if xc.path() == path:
            raise ValueError("planted: authoritative failure")
        return t + 1

    with settings.override(dual_run_report=str(log)), \
            pytest.raises(ValueError, match="planted: authoritative failure"):
        xc.dual_run(step, torch.ones(2).to(dev))
    r = last_result()
    assert not r.match and [m.kind for m in r.mismatches] == ["exception"]
    assert r.authoritative_exception.startswith("ValueError") and r.shadow_exception is None
    line = json.loads(log.read_text().splitlines()[-1])
    assert line["match"] is False and "planted" in line["authoritative_exception"]
    assert metrics.counter("DualRunMismatch") == 1


def test_the_report_line_holds_both_paths_times_graph_sizes_and_the_decision(path, dev, tmp_path):
    log = tmp_path / "dual.jsonl"
    with settings.override(dual_run_report=str(log)):
        r = xc.dual_run(lambda t: (t * 2).sum(), torch.arange(5.0).to(dev))
    assert r.value.item() == 20.0
    line = json.loads(log.read_text())
    assert line["match"] is True and line["authoritative"] == path
    assert set(line["wall_s"]) == set(line["graph_nodes"]) == {"legacy", "functional"}
    assert all(t > 0 for t in line["wall_s"].values())
    assert all(n > 0 for n in line["graph_nodes"].values())
    assert line["decision"]["reason"] == xc.explain().reason.value
    assert line["decision"]["path"] == xc.explain().path


# -- issue 6.2: ignore rules by tensor name ----------------------------------------------------

def test_a_name_ignore_rule_counts_a_known_difference_apart_from_mismatches(path, dev):
    def step(t):
        return {"loss": t.sum(), "stat": t.mean() + (0 if xc.path() == path else 1)}

    x = torch.arange(4.0).to(dev)
    decorated = xc.dual_run_step(mode="strict", ignore=("name:*'stat'*",))(step)
    out = decorated(x)                                     # strict, yet no MismatchError
    assert out["loss"].item() == 6.0 and out["stat"].item() == 1.5
    r = last_result()
    assert r.match and r.mismatches == ()
    assert [m.name for m in r.ignored] == ["output['stat']"]
    assert metrics.counter("DualRunIgnored") == 1 and metrics.counter("DualRunMismatch") == 0
    with settings.override(dual_run_ignore=("name:*'stat'*",)):
        assert xc.dual_run(step, x).match                  # XLA_DUAL_RUN_IGNORE does the same
    assert not xc.dual_run(step, x).match                  # and without it, a mismatch


# -- issue 6.4: modes come from the settings ------------------------------------------------

def test_xla_dual_run_strict_makes_dual_run_raise_mismatch_error(dev):
    with planted_select_scatter_bug(), xc.use_path("legacy"), \
            settings.override(dual_run="strict"):
        x = torch.arange(12.0).reshape(3, 4).to(dev)
        with pytest.raises(xc.MismatchError, match="input args\\[0\\]") as info:
            xc.dual_run(write_through_row, x)
    assert info.value.result.authoritative == "legacy"
    assert metrics.counter("DualRunMismatch") == 1


def test_xla_dual_run_sample_and_rate_drive_an_undecorated_mode(dev):
    @xc.dual_run_step(name="spec-sampled")
    def step(t):
        return t + 1

    x = torch.zeros(2).to(dev)
    modes.steps.reset()
    with settings.override(dual_run="sample", dual_run_rate=0.25):
        for _ in range(40):
            step(x)
    want = sum(modes.sampled("spec-sampled", i, 0.25) for i in range(40))
    assert 0 < want < 40
    assert metrics.counter("DualRunMatch") == want
    assert metrics.counter("DualRunSkipped") == 40 - want
    with settings.override(dual_run="off"):
        step(x)
    assert metrics.counter("DualRunMatch") + metrics.counter("DualRunSkipped") == 40


# -- issue 6.3 + 6.5: a lockstep report, summarised by the CLI ----------------------------------

def test_a_lockstep_report_is_summarised_by_its_first_op_and_line(dev, tmp_path, capsys):
    import inspect
    log = tmp_path / "dual.jsonl"
    with settings.override(dual_run_report=str(log)), planted_select_scatter_bug(), \
            xc.lockstep() as ls:
        x = torch.arange(6.0).reshape(2, 3).to(dev)
        line = inspect.currentframe().f_lineno + 1
        x[0].mul_(5)
        xc.sync()
    assert ls.first_divergence["source"] == f"{__file__}:{line}"
    records, skipped = report.read(str(log))
    assert skipped == 0 and len(records) == 1 and records[0]["mode"] == "lockstep"
    assert records[0]["decision"]["path"] == xc.explain().path
    assert cli_main(["report", str(log)]) == 1
    out = capsys.readouterr().out
    assert f"aten.select_scatter.default ({__file__}:{line})" in out
    assert "slowest path:" in out


def test_lockstep_names_the_planted_op_whichever_path_is_authoritative(path, dev):
    import inspect
    with planted_select_scatter_bug(), xc.lockstep() as ls:
        x = torch.arange(6.0).reshape(2, 3).to(dev)
        line = inspect.currentframe().f_lineno + 1
        x[1].sub_(2)
        y = x * 2
        xc.sync()
    assert ls.auth == path and ls.shadow != path
    fd = ls.first_divergence
    assert (fd["op"], fd["source"]) == ("aten.sub_.Tensor", f"{__file__}:{line}")
    assert (fd["culprit"]["path"], fd["culprit"]["op"]) == ("functional",
                                                            "aten.select_scatter.default")
    expected = torch.arange(6.0).reshape(2, 3)
    expected[1] -= 2
    assert torch.equal(y.cpu(), expected * 2) is (path == "legacy")   # the caller sees its path
