"""Trace plans (``tracer.replay``): an op traced once with some argument geometry is replayed
from its plan afterwards. A plan must give exactly what the full tracer gives."""
import pytest
import torch

import xla_compat as xc
from xla_compat import metrics
from xla_compat.lazy import tracer
from xla_compat.lowering import registry
from tests.conftest import assert_same

aten = torch.ops.aten


def _program(x, y):
    z = x * 0.5 + y
    z = torch.sin(z) - 0.25
    z = torch.where(z > 0, z, -z)
    return (z * y).sum(dim=1), torch.max(z, dim=0)


def _slow_calls(fn):
    """How many ops ``fn`` sends through the full tracer (plans replay the others)."""
    calls = []
    real = tracer.trace

    def spy(cls, func, args, kwargs):
        calls.append(str(func))
        return real(cls, func, args, kwargs)
    tracer.trace = spy
    try:
        fn()
    finally:
        tracer.trace = real
    return calls


def test_a_repeated_program_is_replayed_from_plans_and_matches_eager(path, dev):
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(5, 7, generator=g), torch.randn(5, 7, generator=g)
    xd, yd = x.to(dev), y.to(dev)
    first = _program(xd, yd)
    again = []
    slow = _slow_calls(lambda: again.append(_program(xd, yd)))
    assert "aten.mul.Tensor" not in slow and "aten.sin.default" not in slow, slow
    expected = _program(x, y)
    for got in (first, again[0]):
        assert_same(got[0], expected[0])
        assert_same(got[1].values, expected[1].values)
        assert_same(got[1].indices, expected[1].indices)


def test_a_new_geometry_takes_the_full_tracer_and_keeps_eager_strides(path, dev):
    x = torch.randn(4, 6)
    xd = x.to(dev)
    (xd + 1).cpu()
    t = xd.t()
    slow = _slow_calls(lambda: t + 1)
    assert "aten.add.Tensor" in slow              # transposed input: a plan of its own
    out = t + 1
    assert out.stride() == (x.t() + 1).stride()
    assert_same(out, x.t() + 1)
    assert (t + 1).stride() == (x.t() + 1).stride()    # and replayed with the same strides


def test_scalar_values_stay_run_time_parameters(path, dev):
    x = torch.randn(3, 3)
    xd = x.to(dev)
    for scale in (0.5, 0.25, 3.0):
        assert_same(xd * scale, x * scale)
    compiles = metrics.counter("UncachedCompile")
    for scale in (1.5, -2.0):
        assert_same(xd * scale, x * scale)
    assert metrics.counter("UncachedCompile") == compiles


def test_a_replaced_rule_is_used_at_once(path, dev):
    x = torch.arange(4.0)
    xd = x.to(dev)
    assert_same(torch.cos(xd), torch.cos(x))
    undo = registry.override(aten.cos.default, lambda a, **_: a * 0 + 7)
    try:
        assert_same(torch.cos(xd), torch.full((4,), 7.0))
    finally:
        undo()
    assert_same(torch.cos(xd), torch.cos(x))


def test_a_plan_on_a_tensor_whose_sync_failed_raises_the_failure(path, dev):
    x = torch.ones(3).to(dev)
    (x + 2).cpu()                                 # a plan for add on this geometry
    undo = registry.override(aten.exp.default, lambda a, **_: (_ for _ in ()).throw(
        ValueError("planted")))
    try:
        bad = torch.exp(x)
        with pytest.raises(Exception, match="planted"):
            bad.cpu()
    finally:
        undo()
    with pytest.raises(RuntimeError, match="sync failed"):
        (bad + 2).cpu()
    assert_same(x + 2, torch.full((3,), 3.0))


def test_nodes_are_counted_for_replayed_ops(path, dev):
    xd = torch.ones(2, 2).to(dev)
    (xd * 3).cpu()
    before = metrics.counter("IrNodes")
    y = xd * 3
    y = y * 3
    assert metrics.counter("IrNodes") - before == 2
    assert_same(y, torch.full((2, 2), 9.0))
