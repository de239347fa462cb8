"""A full sync right after another one has nothing to do, and does nothing (executor.quiet):
it neither collects a graph nor walks the live tensors; anything made since runs as before."""
from __future__ import annotations

import pytest
import torch

import xla_compat as xc
from xla_compat import executor


@pytest.fixture
def collects(monkeypatch):
    """How many graphs the executor collects."""
    calls = []
    real = executor.collect

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)
    monkeypatch.setattr(executor, "collect", counting)
    return calls


def test_a_sync_after_a_sync_collects_nothing_and_counts_its_mark_step(path, dev, collects):
    x = torch.arange(6.0).to(dev)
    y = (x * 2).sin()
    xc.sync()
    assert len(collects) == 1
    before = xc.metrics.counter("MarkStep")
    xc.sync()
    xc.sync()
    assert len(collects) == 1
    assert xc.metrics.counter("MarkStep") == before + 2
    torch.testing.assert_close(y.cpu(), (torch.arange(6.0) * 2).sin())


def test_any_op_after_a_sync_makes_the_next_one_run(path, dev, collects):
    x = torch.arange(6.0).to(dev)
    xc.sync()
    xc.sync()
    n = len(collects)
    x.add_(1)
    xc.sync()
    assert len(collects) == n + 1
    assert x.cpu().tolist() == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]


def test_a_write_of_an_existing_value_through_a_view_still_syncs(path, dev, collects):
    base = torch.zeros(4, 3).to(dev)
    src = torch.ones(3).to(dev)
    base[1].copy_(src)        # warm: a plan binds the source's value to the view next time
    xc.sync()
    n = len(collects)
    base[2].copy_(src)        # the source is device data: no new node on legacy
    xc.sync()
    assert len(collects) == n + 1        # the write is materialised by this sync
    xc.sync()
    assert len(collects) == n + 1
    want = torch.zeros(4, 3)
    want[1:3] = 1
    torch.testing.assert_close(base.cpu(), want)


def test_a_failed_sync_leaves_the_next_one_to_run(path, dev, monkeypatch):
    x = torch.arange(4.0).to(dev) * 1
    xc.sync()
    y = x * 3

    def fail(graph):
        raise RuntimeError("planted execution failure")
    monkeypatch.setattr(executor, "_fault_hooks", [fail])
    with pytest.raises(Exception, match="planted"):
        xc.sync()
    monkeypatch.setattr(executor, "_fault_hooks", [])
    assert not executor.quiet()
    with pytest.raises(RuntimeError, match="sync failed"):
        y.cpu()                  # (no earlier value to return to)
    z = x + 1
    xc.sync()
    assert z.cpu().tolist() == [1.0, 2.0, 3.0, 4.0]
    assert x.cpu().tolist() == [0.0, 1.0, 2.0, 3.0]


def test_a_partial_sync_does_not_make_the_next_full_one_quiet(path, dev):
    a = torch.arange(3.0).to(dev) + 1
    b = a * 2
    xc.sync([a])
    assert not executor.quiet()
    xc.sync()
    assert executor.quiet()
    assert b.cpu().tolist() == [2.0, 4.0, 6.0]
