"""A lowering or execution error, or KeyboardInterrupt, during a sync: every tensor keeps the value
it had before the step (on both paths, views included), the compile cache stays usable, and the
next step computes what CPU eager computes."""
from __future__ import annotations

import pytest
import torch

import xla_compat as xc
from xla_compat import executor
from xla_compat.lowering import registry

aten = torch.ops.aten


def _planted_lowering():
    def planted(*args, **kwargs):
        raise ValueError("planted lowering bug")
    undos = [registry.override(op, planted) for op in (aten.add.Tensor, aten.add_.Tensor)]
    return lambda: [u() for u in undos]


def _planted_execution(error):
    def hook(graph):
        raise error
    executor._fault_hooks.append(hook)
    return lambda: executor._fault_hooks.remove(hook)


FAULTS = {
    "lowering": (_planted_lowering, xc.LoweringError),
    "execution": (lambda: _planted_execution(ValueError("planted execution fault")), ValueError),
    "interrupt": (lambda: _planted_execution(KeyboardInterrupt()), KeyboardInterrupt),
}


def _state(dev):
    x = torch.arange(6.).reshape(2, 3).to(dev)
    w = torch.ones(3).to(dev)
    z = torch.zeros(2).to(dev)
    for t in (x, w, z):       # one real step first: every tensor holds a computed device value
        t.add_(0)
    xc.sync()
    return x, w, z


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_failed_sync_leaves_every_tensor_with_its_previous_value(path, dev, fault):
    plant, error = FAULTS[fault]
    x, w, z = _state(dev)
    undo = plant()
    try:
        v = x.t()
        x.mul_(2)
        v[0].add_(w[:2])          # a write through a view
        x[0].add_(w)
        z.unsqueeze(0).add_(1)
        fresh = x.sum(0)          # computed only by the failed step: no earlier value
        with pytest.raises(error):
            xc.sync()
    finally:
        undo()
    assert xc.metrics.counters().get("FailedSync", 0) >= 1
    torch.testing.assert_close(x.cpu(), torch.arange(6.).reshape(2, 3))
    torch.testing.assert_close(v.cpu(), torch.arange(6.).reshape(2, 3).t())
    torch.testing.assert_close(w.cpu(), torch.ones(3))
    torch.testing.assert_close(z.cpu(), torch.zeros(2))
    with pytest.raises(RuntimeError, match="whose sync failed"):
        fresh.cpu()
    # The next step works, through the same view, and matches eager.
    x.add_(1)
    v.mul_(2)
    xc.sync()
    expected = (torch.arange(6.).reshape(2, 3) + 1) * 2
    torch.testing.assert_close(x.cpu(), expected)
    torch.testing.assert_close(v.cpu(), expected.t())


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_a_tensor_whose_first_sync_fails_returns_to_its_transferred_value(path, dev, fault):
    plant, error = FAULTS[fault]
    x = torch.arange(6.).reshape(2, 3).to(dev)   # never synced: its only value is the transfer
    v = x.t()
    undo = plant()
    try:
        x.mul_(2)
        v[0].add_(1)
        with pytest.raises(error):
            xc.sync()
    finally:
        undo()
    torch.testing.assert_close(x.cpu(), torch.arange(6.).reshape(2, 3))
    torch.testing.assert_close(v.cpu(), torch.arange(6.).reshape(2, 3).t())
    v.add_(1)
    xc.sync()
    torch.testing.assert_close(x.cpu(), torch.arange(6.).reshape(2, 3) + 1)


@pytest.mark.parametrize("fault", sorted(FAULTS))
@pytest.mark.parametrize("sync", ["full", "read"])
def test_a_failed_sync_returns_the_random_state_to_before_its_draws(path, dev, fault, sync):
    """The device generator's state is a value like any other: a failed sync returns it to the
    state its draws started from. It stayed at the failed graph's output, so every later
    draw, in any graph, failed again ("computed by a graph whose sync failed")."""
    plant, error = FAULTS[fault]
    torch.manual_seed(5)
    first = torch.rand(4, device=dev).cpu()      # a materialised state to return to
    second = torch.rand(4, device=dev).cpu()
    torch.manual_seed(5)
    torch.rand(4, device=dev).cpu()
    undo = plant()
    try:
        r = torch.rand(4, device=dev)
        bad = (r + r).mul(torch.randn(4, device=dev))
        with pytest.raises(error):
            xc.sync() if sync == "full" else bad.cpu()
    finally:
        undo()
    # the failed step's draws are gone with it: the next draw is the one it would have made
    torch.testing.assert_close(torch.rand(4, device=dev).cpu(), second)
    assert not torch.equal(first, second)
    t = torch.randn(3, device=dev) * 2
    xc.sync()
    assert t.cpu().isfinite().all()


def test_a_failed_compile_is_not_cached_and_the_same_graph_compiles_after(path, dev):
    x, w, _ = _state(dev)

    def step():
        x.add_(w)
        xc.sync()
    undo = _planted_lowering()
    try:
        with pytest.raises(xc.LoweringError, match="add"):
            step()
    finally:
        undo()
    step()
    size, hits = len(executor.cache), xc.metrics.counters().get("CachedCompile", 0)
    step()                        # the fixed graph, run again, comes from the cache
    assert len(executor.cache) == size
    assert xc.metrics.counters().get("CachedCompile", 0) == hits + 1
    torch.testing.assert_close(x.cpu(), torch.arange(6.).reshape(2, 3) + 2)


def test_a_training_step_after_a_failed_one_matches_eager(path, dev):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    ref = torch.nn.Linear(4, 2)
    ref.load_state_dict(model.state_dict())
    model.to(dev)
    data, target = torch.randn(8, 4), torch.randn(8, 2)

    def step(m, d, t):
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        loss = torch.nn.functional.mse_loss(m(d), t)
        loss.backward()
        opt.step()
        opt.zero_grad()
    step(model, data.to(dev), target.to(dev))
    xc.sync()
    step(ref, data, target)
    undo = _planted_execution(ValueError("planted"))
    try:
        step(model, data.to(dev), target.to(dev))
        with pytest.raises(ValueError):
            xc.sync()
    finally:
        undo()
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.detach().cpu(), q.detach())
    step(model, data.to(dev), target.to(dev))
    xc.sync()
    step(ref, data, target)
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.detach().cpu(), q.detach(), rtol=1e-5, atol=1e-6)


class _ConsumesThenFails:
    """Stands for an XLA executable whose run fails after taking its donated buffers (an
    out-of-memory error at launch does this): the donated input arrays are deleted, then it
    raises."""

    def __init__(self, donate):
        self.donate = donate

    def __call__(self, *params):
        for i in self.donate:
            params[i].delete()
        raise RuntimeError("RESOURCE_EXHAUSTED: planted out of memory")


def test_a_first_run_that_fails_after_taking_donated_buffers_loses_nothing(path, dev, monkeypatch):
    w = torch.arange(4.0).to(dev)
    m = torch.ones(4).to(dev)
    w.add_(1)
    m.mul_(3)
    xc.sync()                                   # w and m hold computed device buffers
    real = executor.compile_graph

    def planted(graph, params):
        real(graph, params)                     # compiles fine
        assert graph.donate, "the step below must donate w's and m's buffers"
        return _ConsumesThenFails(graph.donate)
    monkeypatch.setattr(executor, "compile_graph", planted)
    executor.clear_cache()
    w.add_(m)
    m.mul_(2)
    with pytest.raises(executor.GraphError, match=r"executing a graph of \d+ ops failed.*"
                                                  r"RESOURCE_EXHAUSTED(.|\n)*aten.add"):
        xc.sync()
    monkeypatch.setattr(executor, "compile_graph", real)
    executor.clear_cache()
    torch.testing.assert_close(w.cpu(), torch.arange(4.0) + 1)
    torch.testing.assert_close(m.cpu(), torch.full((4,), 3.0))
    w.add_(m)                                   # the next step works
    xc.sync()
    torch.testing.assert_close(w.cpu(), torch.arange(4.0) + 4)


def test_a_compile_error_names_the_ops_and_where_they_were_created(path, dev, monkeypatch):
    x = torch.arange(3.0).to(dev)
    xc.sync()

    def planted(graph, params):
        raise RuntimeError("INTERNAL: planted XLA compile failure")
    monkeypatch.setattr(executor, "compile_graph", planted)
    executor.clear_cache()
    y = x * 2
    with pytest.raises(executor.GraphError) as info:
        y.cpu()
    text = str(info.value)
    assert "compiling a graph" in text and "planted XLA compile failure" in text
    assert "aten.mul" in text and "test_reliability_failures.py" in text
    monkeypatch.undo()
    torch.testing.assert_close(x.cpu(), torch.arange(3.0))
    torch.testing.assert_close((x * 2).cpu(), torch.arange(3.0) * 2)


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_a_failed_read_of_one_tensor_keeps_the_pending_writes_of_the_others(path, dev, fault):
    # A sync of one tensor (its .cpu()) fails: only what that sync computes returns to its last
    # value; the other tensors' pending writes (views included) are still there afterwards.
    plant, error = FAULTS[fault]
    x, w, z = _state(dev)
    x_cpu, w_cpu, z_cpu = x.cpu(), w.cpu(), z.cpu()
    v = w[1:]
    v.mul_(3)                      # pending on w's storage, through a view
    z.add_(5)                      # pending on z
    for t in (w_cpu[1:],):
        t.mul_(3)
    z_cpu.add_(5)
    undo = plant()
    try:
        x.add_(x)                  # the read that fails computes only x
        with pytest.raises(error):
            x.cpu()
    finally:
        undo()
    torch.testing.assert_close(x.cpu(), x_cpu)       # back to its last value
    torch.testing.assert_close(w.cpu(), w_cpu)       # its pending write kept
    torch.testing.assert_close(v.cpu(), w_cpu[1:])
    torch.testing.assert_close(z.cpu(), z_cpu)


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_a_failed_read_that_only_reads_another_storage_keeps_that_storages_writes(path, dev,
                                                                                 fault):
    # y is computed from w's materialised value; w then gets a pending write through a view.
    # The failed read of y returns y to its last value but must leave w's write in place.
    plant, error = FAULTS[fault]
    x, w, z = _state(dev)
    w_cpu = w.cpu()
    undo = plant()
    try:
        y = w.add(w)
        w[1:].mul_(3)
        w_cpu[1:].mul_(3)
        with pytest.raises(error):
            y.cpu()
    finally:
        undo()
    torch.testing.assert_close(w.cpu(), w_cpu)
