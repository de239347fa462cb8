"""The process decision at first device use, scoped overrides, path memory and mixing errors."""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import xla_compat as xc
from xla_compat import dispatch, paths, settings
from xla_compat.lazy.tensor import LazyTensor
from xla_compat.lazy.tracer import PathMixError
from xla_compat.paths import PathImpl
from xla_compat.rollout import Reason

from .conftest import assert_same


class FakeTensor(LazyTensor):
    """A LazyTensor of a fake path: behaves like core, remembers it is not core."""

    path_name = "fake"


def _fake_impl(name="fake", probe=lambda: None, torch_versions=">=2.13"):
    return PathImpl(name=name, version="0.1", torch_versions=torch_versions,
                    tensor_cls=FakeTensor, owns=lambda t: type(t) is FakeTensor, probe=probe)


@pytest.fixture
def fake_path():
    paths.register(_fake_impl())
    yield "fake"
    paths.unregister("fake")


@pytest.fixture
def fresh_decision():
    """Forget the process decision for one test and put the original back afterwards."""
    saved_decision, saved_default = dispatch._decision, paths._default
    dispatch.forget_decision()
    yield
    dispatch._decision = saved_decision
    paths.set_default(saved_default)
    paths.set_default_resolver(None if saved_decision is not None else dispatch.ensure_decided)


# -- the process decision -------------------------------------------------------------------------

def test_first_factory_call_makes_the_decision_without_device(fresh_decision):
    with settings.override(use_functionalization=False, kill_switch=None, dispatch_errors=(),
                           rollout_config=None):
        assert dispatch._decision is None
        t = torch.zeros(2, device="hlo")
        d = dispatch._decision
        assert d is not None and d.reason in (Reason.EXPLICIT_FLAG, Reason.VERSION_GATE)
        assert paths.of(t) == d.path == xc.path()


def test_device_makes_the_decision(fresh_decision):
    with settings.override(kill_switch=True):
        xc.device()
        assert dispatch._decision is not None and dispatch._decision.reason is Reason.KILL_SWITCH


def test_decision_is_frozen_after_first_use(fresh_decision):
    with settings.override(kill_switch=True):
        first = xc.explain()
    with settings.override(kill_switch=False, use_functionalization=True):
        torch.ones(1, device="hlo")
        assert xc.explain() is first and xc.path() == first.path


def test_decision_is_logged_once_at_info_and_in_the_metrics_report(fresh_decision, caplog):
    with caplog.at_level(logging.INFO, logger="xla_compat.dispatch"), \
            settings.override(kill_switch=True):
        for _ in range(3):
            torch.ones(2, device=xc.device()) + 1
    records = [r for r in caplog.records if r.name == "xla_compat.dispatch"
               and r.levelno == logging.INFO]
    assert len(records) == 1 and "KILL_SWITCH" in records[0].getMessage()
    report = xc.metrics.report()
    assert "Dispatch:" in report and "reason: KILL_SWITCH" in report


def test_kill_switch_refuses_a_scoped_override_to_another_path(fresh_decision, fake_path):
    with settings.override(kill_switch=True):
        xc.device()
        with pytest.raises(xc.PathUnavailableError, match="kill switch"):
            with xc.use_path("fake"):
                pass


def test_a_new_process_decides_at_its_first_factory_call():
    script = textwrap.dedent("""
        import json, torch, xla_compat as xc
        from xla_compat import dispatch
        before = dispatch._decision
        t = torch.arange(3.0, device="hlo") * 2
        print(json.dumps({"before": before is None, "decision": xc.explain().as_dict(),
                          "value": t.cpu().tolist()}))
    """)
    env = dict(os.environ, XLA_USE_FUNCTIONALIZATION="0", XLA_JOB_ID="job-sub-1")
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout.strip().splitlines()[-1])
    assert data["before"] and data["value"] == [0.0, 2.0, 4.0]
    d = data["decision"]
    assert d["job_id"] == "job-sub-1" and d["settings"]["XLA_USE_FUNCTIONALIZATION"] == "0"
    assert d["reason"] in ("EXPLICIT_FLAG", "VERSION_GATE")


# -- scoped overrides and path memory ---------------------------------------------------------

def test_use_path_creates_tensors_on_that_path_and_they_remember_it(fake_path, dev):
    with xc.use_path("fake"):
        assert xc.path() == "fake"
        a = torch.arange(6.0).reshape(2, 3).to(dev)
        b = torch.ones(2, 3, device=dev)
    assert xc.path() == xc.explain().path
    assert paths.of(a) == paths.of(b) == paths.of(a + b) == "fake"
    assert_same(a + b, torch.arange(6.0).reshape(2, 3) + 1)


def test_use_path_nests_and_restores(fake_path, dev):
    with xc.use_path("fake"):
        with xc.use_path("core"):
            assert paths.of(torch.zeros(1, device=dev)) == "core"
        assert paths.of(torch.zeros(1, device=dev)) == "fake"


def test_use_path_of_an_unknown_path_lists_the_known_ones():
    with pytest.raises(xc.PathUnavailableError, match="registered paths: .*core"):
        with xc.use_path("nonexistent"):
            pass


def test_use_path_of_a_path_this_torch_cannot_run_says_why():
    paths.register(_fake_impl("fake_gated", probe=lambda: "needs torch._frobnicate"))
    try:
        with pytest.raises(xc.PathUnavailableError, match="needs torch._frobnicate"):
            with xc.use_path("fake_gated"):
                pass
    finally:
        paths.unregister("fake_gated")


def test_mixing_paths_in_one_op_names_both_and_says_how_to_move(fake_path, dev):
    with xc.use_path("fake"):
        a = torch.ones(3, device=dev)
    with xc.use_path("core"):
        b = torch.arange(3.0, device=dev)
    with pytest.raises(PathMixError) as info:
        a + b
    text = str(info.value)
    assert "fake" in text and "core" in text and "xc.to_path(" in text


def test_to_path_moves_a_tensor_across_and_the_op_then_matches_cpu(fake_path, dev):
    with xc.use_path("fake"):
        a = torch.linspace(-1, 1, 6).reshape(2, 3).to(dev)
    with xc.use_path("core"):
        b = torch.arange(6.0).reshape(2, 3).to(dev)
    moved = xc.to_path(a, "core")
    assert paths.of(moved) == "core" and paths.of(a) == "fake"
    assert_same(moved * b, torch.linspace(-1, 1, 6).reshape(2, 3) * torch.arange(6.0).reshape(2, 3))


def test_to_path_keeps_requires_grad_and_returns_same_path_tensors_unchanged(fake_path, dev):
    with xc.use_path("fake"):
        a = torch.ones(2, device=dev, requires_grad=True)
    assert xc.to_path(a, "fake") is a
    moved = xc.to_path(a, "core")
    assert moved.requires_grad and moved.is_leaf


def test_to_path_moves_a_cpu_tensor_onto_the_device_on_that_path(fake_path):
    moved = xc.to_path(torch.arange(4), "fake")
    assert paths.of(moved) == "fake" and moved.device.type == "hlo"
    assert_same(moved * 2, torch.arange(4) * 2)


@pytest.mark.parametrize("default, scoped", [("legacy", "functional"), ("functional", "legacy"),
                                             ("core", "functional"), ("core", "legacy")])
def test_backward_under_a_scope_creates_its_tensors_on_the_scoped_path(default, scoped):
    """Autograd runs the device's backward on its own thread, outside the caller's scope; the
    zeros it makes for an unused piece's gradient must still land on the scoped path (they used
    to land on the default path, mix with the graph's tensors and abort the process)."""
    saved = paths._default
    paths.set_default(default)
    try:
        a_cpu = torch.randn(4, 3, requires_grad=True)
        for split in (lambda t: t.chunk(2, 0), lambda t: t.split([1, 3]),
                      lambda t: t.unbind(0)):
            with xc.use_path(scoped):
                a = a_cpu.detach().to(xc.device()).requires_grad_()
                pieces = split(a)
                (pieces[-1] * 3).sum().backward()
                assert paths.of(a.grad) == scoped
            a_cpu.grad = None
            (split(a_cpu)[-1] * 3).sum().backward()
            assert_same(a.grad, a_cpu.grad)
    finally:
        paths.set_default(saved)
