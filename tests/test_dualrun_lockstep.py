"""Lockstep: every op runs on both paths; a sync compares them and names the first divergent op."""
from __future__ import annotations

import inspect

import torch
import torch.nn.functional as F

import xla_compat as xc
from xla_compat import metrics
from xla_compat.dualrun import PairTensor
from tests.conftest import tolerance
from tests.models import MLP
from tests.test_dualrun_function import planted_select_scatter_bug


def _line_after() -> int:
    """The line number of the caller's next line."""
    return inspect.currentframe().f_back.f_lineno + 1


def test_lockstep_training_matches_cpu_and_finds_no_divergence(dev):
    torch.manual_seed(0)
    cpu = MLP(d_in=8, hidden=16, d_out=4)
    x, y = torch.randn(12, 8), torch.randint(0, 4, (12,))
    ref_opt = torch.optim.SGD(cpu.parameters(), lr=0.1, momentum=0.9)
    ref_losses, dev_losses = [], []
    with xc.lockstep() as ls:
        model = MLP(d_in=8, hidden=16, d_out=4).to(dev)
        model.load_state_dict(cpu.state_dict())
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        xd, yd = x.to(dev), y.to(dev)
        assert isinstance(xd, PairTensor)
        for _ in range(3):
            for m, o, a, b, out in ((model, opt, xd, yd, dev_losses),
                                    (cpu, ref_opt, x, y, ref_losses)):
                o.zero_grad()
                loss = F.cross_entropy(m(a), b)
                loss.backward()
                o.step()
                out.append(loss)
            xc.sync()
    for a, b in zip(dev_losses, ref_losses):
        torch.testing.assert_close(a.detach().cpu(), b.detach(), **tolerance(1e-5, 1e-6))
    assert ls.first_divergence is None
    assert ls.results and all(r.match for r in ls.results), \
        [str(m) for r in ls.results for m in r.mismatches]
    assert metrics.counter("DualRunMismatch") == 0
    for p, q in zip(model.parameters(), cpu.parameters()):
        torch.testing.assert_close(p.detach().cpu(), q.detach(), **tolerance(1e-5, 1e-6))


def test_lockstep_names_the_planted_op_and_its_source_line(dev):
    with planted_select_scatter_bug(), xc.lockstep() as ls:
        x = torch.arange(12.0).reshape(3, 4).to(dev)
        y = x * 2
        line = _line_after()
        y[1].add_(1)                    # the functional path writes this back with select_scatter
        z = (y * 3).sum(0)              # every later value differs too; only the first is named
        xc.sync()
    fd = ls.first_divergence
    assert fd is not None and fd["level"] == "op"
    assert fd["op"] == "aten.add_.Tensor"
    assert fd["source"] == f"{__file__}:{line}"
    assert fd["inputs"] == ["float32[4]"]
    culprit = fd["culprit"]
    assert culprit["path"] == "functional"
    assert culprit["op"] == "aten.select_scatter.default"
    assert culprit["source"] == f"{__file__}:{line}"
    assert culprit["inputs"] == ["float32[3, 4]", "float32[4]"]
    assert [c["op"] for c in fd["culprits"]] == ["aten.select_scatter.default"]
    # The authoritative (legacy, the default decision) values are the correct ones.
    expected = torch.arange(12.0).reshape(3, 4) * 2
    expected[1] += 1
    assert xc.explain().path == "legacy"
    assert torch.equal(z.cpu(), (expected * 3).sum(0))
    assert metrics.counter("DualRunMismatch") == 1


def test_lockstep_strict_raises_with_the_first_op(dev):
    try:
        with planted_select_scatter_bug(), xc.lockstep(strict=True):
            x = torch.zeros(2, 3).to(dev)
            x[0].sub_(1)
            xc.sync()
    except xc.MismatchError as e:
        assert "first divergent op: aten.sub_.Tensor" in str(e)
    else:
        raise AssertionError("strict lockstep did not raise")


def test_lockstep_ignore_rule_counts_known_differences_separately(dev):
    with planted_select_scatter_bug(), xc.lockstep(ignore=("op:aten.add_.*",)) as ls:
        x = torch.zeros(2, 3).to(dev)
        x[1].add_(1)
        xc.sync()
    r = ls.results[0]
    assert r.ignored and all("aten.add_" in m.name for m in r.ignored)
    assert r.match and r.mismatches == ()           # the ignored op leaves the sync matching
    assert ls.first_divergence is None
    assert metrics.counter("DualRunIgnored") == len(r.ignored)
    assert metrics.counter("DualRunMismatch") == 0


def test_xla_dual_run_lockstep_turns_lockstep_on_at_first_device_use():
    from xla_compat import settings
    from xla_compat.dualrun import pairs
    with settings.override(dual_run="lockstep"):
        dev = xc.device()                       # first device use in this mode starts lockstep
    try:
        session = pairs.active()
        assert session is not None
        t = torch.ones(3, device=dev) + 1
        assert isinstance(t, PairTensor) and set(t._twins) == {"legacy", "functional"}
        xc.sync()
        assert session.results[-1].match
    finally:
        pairs.stop()
    assert not isinstance(torch.ones(3, device=dev), PairTensor)
