"""Legacy path: an op's result has no Alias until something views, writes or lays out its
storage (``LegacyTensor._alias``). Until then the tensor is its storage's only member; a sync,
a failed sync and every later view or write treat it as eager treats any tensor."""
from __future__ import annotations

import pytest
import torch

import xla_compat as xc
from xla_compat import executor, paths
from xla_compat.legacy import alias as alias_module
from xla_compat.lowering import registry
from tests.conftest import assert_same

aten = torch.ops.aten


@pytest.fixture(autouse=True)
def legacy():
    import xla_compat.legacy  # noqa: F401  (registers the path)
    with paths.activated("legacy"):
        yield


def _loose(t) -> bool:
    return t._a is None


def test_a_chain_of_ops_makes_no_alias_and_syncs_its_results():
    dev = xc.device()
    x_cpu = torch.linspace(-1, 1, 12).reshape(3, 4)
    x = x_cpu.to(dev)
    before = len(alias_module.live_aliases())
    ys, ys_cpu = [], []
    for b, y in ((x, ys), (x_cpu, ys_cpu)):
        h = b
        for _ in range(6):
            h = torch.sin(h * 2 + 1)
            y.append(h)
    assert all(_loose(t) for t in ys)
    assert len(alias_module.live_aliases()) == before
    xc.sync()                                  # every loose result is a root of the full sync
    assert all(t._v.node.is_leaf for t in ys)
    assert_same(ys, ys_cpu)


def test_a_result_viewed_and_written_after_a_sync_writes_its_storage_like_eager():
    dev = xc.device()
    outs = []
    for b in (torch.arange(12.).reshape(3, 4), torch.arange(12.).reshape(3, 4).to(dev)):
        r = b * 2
        if b.device.type != "cpu":
            xc.sync()
            assert _loose(r)
        v = r.t()[1]                            # the first view makes the storage's Alias
        v.add_(100)
        r[0].mul_(-1)
        outs.append((r, v, r.sum()))
    assert not _loose(outs[1][0])
    assert_same(outs[1], outs[0])


def test_a_result_with_a_permuted_layout_keeps_it_as_its_storage_layout():
    """as_strided reads a storage through its root layout: the lazily made Alias takes the
    result's own strides (a channels-last result here), as eager's storage has them."""
    dev = xc.device()
    outs = []
    for b in (torch.arange(24.).reshape(1, 2, 3, 4), torch.arange(24.).reshape(1, 2, 3, 4).to(dev)):
        r = b.contiguous(memory_format=torch.channels_last) + 1
        s = r.as_strided((4, 3), (1, 4), 2)
        s.mul_(10)
        outs.append((r, s, tuple(r.stride())))
    assert_same(outs[1][:2], outs[0][:2])
    assert outs[1][2] == outs[0][2]


def test_resize_and_set_on_a_loose_result_match_eager():
    dev = xc.device()
    outs = []
    for b in (torch.arange(12.), torch.arange(12.).to(dev)):
        r = b + 1
        r.resize_(2, 3)
        q = b * 3
        p = b - 1
        p.set_(q)                               # p joins q's storage (q had none yet)
        p[0].fill_(-7)
        outs.append((r, p, q))
    assert_same(outs[1], outs[0])


def test_a_loose_result_computed_before_a_failed_sync_keeps_its_value_and_a_new_one_is_poisoned():
    dev = xc.device()
    x = torch.arange(6.).to(dev)
    kept = x * 2
    xc.sync()                                   # kept: materialised, still loose
    assert _loose(kept)

    def planted(*args, **kwargs):
        raise ValueError("planted lowering bug")
    undo = registry.override(aten.add.Tensor, planted)
    try:
        fresh = kept + kept                     # only the failed sync computes it
        with pytest.raises(xc.LoweringError):
            xc.sync()
    finally:
        undo()
    assert xc.metrics.counters().get("FailedSync", 0) >= 1
    torch.testing.assert_close(kept.cpu(), torch.arange(6.) * 2)
    with pytest.raises(RuntimeError, match="whose sync failed"):
        fresh.cpu()
    again = kept + kept
    torch.testing.assert_close(again.cpu(), torch.arange(6.) * 4)


def test_a_failed_read_of_one_loose_result_poisons_it_alone():
    dev = xc.device()
    x = torch.arange(4.).to(dev)
    xc.sync()
    other = x * 5                               # pending, not in the failed read's graph

    def hook(graph):
        raise ValueError("planted execution fault")
    target = x - 1
    executor._fault_hooks.append(hook)
    try:
        with pytest.raises(ValueError):
            target.cpu()
    finally:
        executor._fault_hooks.remove(hook)
    with pytest.raises(RuntimeError, match="whose sync failed"):
        target.cpu()
    torch.testing.assert_close(other.cpu(), torch.arange(4.) * 5)


def test_a_loose_result_is_never_donated_while_held():
    """A full sync may donate buffers nothing holds: a loose tensor's materialised value is held
    (donating it would free what the tensor reads next)."""
    dev = xc.device()
    x = torch.ones(8).to(dev)
    r = x * 3
    xc.sync()
    for _ in range(3):
        x.copy_(r + x)          # r is the graph's first leaf: donatable first, were it not held
        xc.sync()
    torch.testing.assert_close(r.cpu(), torch.full((8,), 3.))
    torch.testing.assert_close(x.cpu(), torch.full((8,), 10.))
