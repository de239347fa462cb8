"""Gaps found by the audits of issues 6, 9 and 11: a shadow path whose lowering fails at a
lockstep sync is recorded, not raised; the report CLI names a step-level mismatch; torch.load
with an hlo map_location gives device tensors (and tied storages stay tied) on both paths."""
from __future__ import annotations

import contextlib
import inspect
import io

import pytest
import torch
import torch.nn as nn

import xla_compat as xc
from xla_compat import metrics, paths, settings
from xla_compat.__main__ import main as cli_main
from xla_compat.dualrun import report
from xla_compat.lowering import registry
from tests.conftest import assert_same

aten = torch.ops.aten


# -- issue 6 / 10.6: a shadow lowering that fails at a lockstep sync ---------------------------

@contextlib.contextmanager
def shadow_lowering_raises(shadow: str):
    """Make a lowering that only ``shadow`` uses for a write through a selected row raise:
    the functional path lowers it as select_scatter, the legacy path as its own write chain."""
    if shadow == "functional":
        def planted(x, src, dim, index, **_):
            raise RuntimeError("planted")
        undo = registry.override(aten.select_scatter.default, planted)
        try:
            yield "aten.select_scatter.default"
        finally:
            undo()
    else:
        from xla_compat.legacy import views

        def planted(self, base, value):
            raise RuntimeError("planted")
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(views.WriteChain, "__call__", planted)
            yield "legacy.write"


def test_a_shadow_lowering_failing_at_sync_is_recorded_and_the_caller_gets_its_values(path, dev):
    shadow = "functional" if path == "legacy" else "legacy"
    with shadow_lowering_raises(shadow) as planted_op, xc.lockstep() as ls:
        x = torch.zeros(2, 3).to(dev)
        line = inspect.currentframe().f_lineno + 1
        x[1].add_(1)
        xc.sync()                                   # raised LoweringError ... planted before
    expected = torch.zeros(2, 3)
    expected[1].add_(1)
    assert_same(x, expected)
    assert (ls.auth, ls.shadow) == (path, shadow)
    result = ls.results[0]
    assert not result.match and "planted" in result.shadow_exception
    assert result.mismatches[0].kind == "exception"
    assert "failed at sync" in result.mismatches[0].detail
    fd = ls.first_divergence
    assert (fd["op"], fd["source"]) == ("aten.add_.Tensor", f"{__file__}:{line}")
    assert (fd["culprit"]["path"], fd["culprit"]["op"]) == (shadow, planted_op)
    assert metrics.counter("DualRunMismatch") == 1


def test_after_a_shadow_failure_lockstep_keeps_running_the_authoritative_path(path, dev):
    shadow = "functional" if path == "legacy" else "legacy"
    with shadow_lowering_raises(shadow), xc.lockstep() as ls:
        w = torch.arange(6.0).reshape(2, 3).to(dev)
        w[0].mul_(3)
        xc.sync()
        y = w.t() @ torch.ones(2, 4).to(dev)          # new pairs and ops after the failure
        y[2].sub_(1)
        xc.sync()
    w_cpu = torch.arange(6.0).reshape(2, 3)
    w_cpu[0].mul_(3)
    y_cpu = w_cpu.t() @ torch.ones(2, 4)
    y_cpu[2].sub_(1)
    assert_same(w, w_cpu)
    assert_same(y, y_cpu)
    assert ls.shadow_failure and "planted" in ls.shadow_failure
    assert [r.match for r in ls.results] == [False, True]    # later syncs: nothing to compare
    xc.sync()                                        # a full mark_step after the session works


def test_strict_lockstep_turns_a_shadow_failure_into_a_mismatch_error(dev):
    with pytest.raises(xc.MismatchError, match="failed at sync"):
        with shadow_lowering_raises("functional"), xc.lockstep(strict=True):
            x = torch.zeros(2, 3).to(dev)
            x[1].add_(1)
            xc.sync()


# -- issue 6.5: the report CLI names a step-level (function) mismatch ----------------------------

def test_the_report_cli_names_the_first_differing_value_of_a_function_level_mismatch(
        dev, tmp_path, capsys):
    log = tmp_path / "dual.jsonl"
    with settings.override(dual_run_report=str(log)):
        x = torch.arange(6.0).reshape(2, 3).to(dev)
        r = xc.dual_run(lambda t: t * (2.0 if xc.path() == "functional" else 1.0) + 1, x)
    assert not r.match and r.first_divergence["level"] == "function"
    records, _ = report.read(str(log))
    assert report._first_op(records[0]) == "output [values] (function level)"
    assert cli_main(["report", str(log)]) == 1
    out = capsys.readouterr().out
    assert "output [values] (function level)" in out and "? (?)" not in out


def test_the_report_cli_still_names_a_lockstep_op_without_a_source_line():
    record = {"match": False, "first_divergence": {"level": "op", "op": "aten.mul.Tensor",
                                                   "source": None, "culprit": None}}
    assert report._first_op(record) == "aten.mul.Tensor (line not recorded)"


# -- issue 9: torch.load(f, map_location=<hlo>) -------------------------------------------------

def _saved(obj) -> io.BytesIO:
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return buf


def _tensors():
    base = torch.arange(12.0).reshape(3, 4)
    return {"f32": base, "t": base.t(), "row": base[1], "i64": torch.tensor([1, -2, 3]),
            "bool": torch.tensor([True, False]), "bf16": torch.linspace(-2, 2, 5).bfloat16(),
            "f64": torch.randn(2, 2, dtype=torch.float64),
            "u16": torch.tensor([1, 65535], dtype=torch.uint16)}


@pytest.mark.parametrize("where", ["device()", "hlo", "hlo:0", "torch.device", "dict"])
def test_torch_load_with_an_hlo_map_location_gives_device_tensors_equal_to_the_saved(
        path, dev, where):
    location = {"device()": dev, "hlo": "hlo", "hlo:0": "hlo:0",
                "torch.device": torch.device("hlo"), "dict": {"cpu": "hlo:0"}}[where]
    saved = _tensors()
    loaded = torch.load(_saved(saved), map_location=location)
    assert loaded.keys() == saved.keys()
    for name, t in loaded.items():
        assert t.device == dev and paths.of(t) == path, name
        assert t.stride() == saved[name].stride(), name
        assert_same(t, saved[name], rtol=0, atol=0, msg=name)


def test_tensors_sharing_a_storage_in_the_file_share_it_on_the_device(path, dev):
    cpu = torch.load(_saved(_tensors()))
    loaded = torch.load(_saved(_tensors()), map_location=dev)
    for d in (cpu, loaded):               # eager semantics: a write to one shows in the others
        d["f32"][1, 2] = 100.0
        d["t"][0, 2].mul_(-1)
    for name in ("f32", "t", "row"):
        assert_same(loaded[name], cpu[name], rtol=0, atol=0, msg=name)


def test_a_state_dict_saved_from_the_device_loads_back_onto_it(path, dev):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    on_dev = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)).to(dev)
    on_dev.load_state_dict(model.state_dict())
    state = torch.load(_saved(on_dev.state_dict()), map_location=dev)
    for name, t in state.items():
        assert t.device == dev and paths.of(t) == path, name
        assert_same(t, model.state_dict()[name], rtol=0, atol=0, msg=name)
    fresh = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)).to(dev)
    fresh.load_state_dict(state)
    x = torch.randn(3, 4)
    assert_same(fresh(x.to(dev)), model(x))


def test_a_saved_parameter_and_module_load_as_trainable_device_parameters(path, dev):
    torch.manual_seed(0)
    p = nn.Parameter(torch.randn(3))
    q = torch.load(_saved(p), map_location=dev)
    assert isinstance(q, nn.Parameter) and q.requires_grad and q.device == dev
    assert_same(q, p)
    model = nn.Linear(3, 2)
    loaded = torch.load(_saved(model), map_location=dev, weights_only=False)
    assert all(t.device == dev and t.requires_grad for t in loaded.parameters())
    x = torch.randn(5, 3)
    loaded(x.to(dev)).sum().backward()
    model(x).sum().backward()
    assert_same(loaded.weight.grad, model.weight.grad)
    assert_same(loaded.bias.grad, model.bias.grad)


def test_torch_load_onto_a_device_index_that_does_not_exist_says_so(dev):
    with pytest.raises(RuntimeError, match="hlo has one device"):
        torch.load(_saved({"a": torch.ones(2)}), map_location="hlo:1")


def test_torch_load_without_an_hlo_map_location_is_unchanged():
    saved = _tensors()
    loaded = torch.load(_saved(saved))
    for name, t in loaded.items():
        assert t.device.type == "cpu" and torch.equal(t, saved[name]), name
    loaded = torch.load(_saved(saved), map_location="cpu")
    assert loaded["row"].untyped_storage().data_ptr() == loaded["f32"].untyped_storage().data_ptr()


def test_moving_a_storage_to_hlo_says_to_move_tensors_instead(dev):
    with pytest.raises(RuntimeError, match=r"map_location='hlo'"):
        torch.ones(3).untyped_storage().to(device=dev)
