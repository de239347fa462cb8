"""Two chains of permutes, selects and slices that view the same elements of a storage.

``cache[:, :, t:t+1] = kv`` then ``cache.transpose(2, 3)[..., t] += 0.5`` (issue 8's W4) writes
one region through two chains. A read through the second chain is the first write's value,
rearranged (no read of the base, which would wait for its update), and the second write makes the
first dead (one update of the base instead of two). Every case is checked against eager; the
graph checks pin the route."""
from __future__ import annotations

import re

import pytest
import torch

import xla_compat as xc
from xla_compat import paths
from tests.conftest import assert_same
from tests.test_legacy_write_plans import _kv_step


@pytest.fixture(autouse=True, params=["legacy", "functional"])
def on_path(request):
    """Every case on both paths against eager; the graph checks pin legacy's route."""
    import xla_compat.legacy  # noqa: F401  (registers the paths)
    import xla_compat.functional  # noqa: F401
    with paths.activated(request.param):
        yield request.param


def _updates(t) -> int:
    """dynamic_update_slice ops in the graph computing ``t``."""
    return len(re.findall(r"stablehlo\.dynamic_update_slice", xc.hlo_text([t])))


def _ops_of(t) -> list:
    """IR ops of the pending graph behind ``t``'s current value."""
    from xla_compat.lazy.ir import reaches
    return sorted(n.op for n in reaches([t._value]))


def test_a_decode_loop_writes_each_position_once_and_matches_eager(on_path):
    g = torch.Generator().manual_seed(0)
    cache, kv = torch.randn(2, 3, 8, 4, generator=g), torch.randn(2, 3, 4, 4, generator=g)
    dev = xc.device()
    dcache, dkv = cache.to(dev), kv.to(dev)
    xc.sync()
    _kv_step(cache, kv, 4)
    _kv_step(dcache, dkv, 4)
    assert _updates(dcache) == 4          # one per position, not two (both paths)
    assert_same(dcache, cache)
    assert_same(dcache.sum(), cache.sum())


def test_a_read_of_what_another_chain_just_wrote_is_that_value_rearranged(on_path):
    base = torch.arange(24.0).reshape(2, 3, 4)
    x = base.clone().to(xc.device())
    xc.sync()
    src = torch.full((2, 1, 4), 7.0).to(xc.device())
    x[:, 1:2] = src
    got = x.transpose(1, 2)[..., 1]        # the same 8 elements, another order
    if on_path == "legacy":
        assert "legacy.rebox" in _ops_of(got) and "legacy.view" not in _ops_of(got)
    expected = base.clone()
    expected[:, 1:2] = 7.0
    assert_same(got, expected.transpose(1, 2)[..., 1])
    assert_same(x, expected)


@pytest.mark.parametrize("read", [
    lambda x: x.transpose(1, 2)[..., 1:3],      # more elements than were written
    lambda x: x[:, 1, :2],                      # fewer
    lambda x: x[:, 2],                          # others
], ids=["wider", "narrower", "elsewhere"])
def test_reads_of_other_elements_read_the_base(read, on_path):
    base = torch.arange(24.0).reshape(2, 3, 4)
    x = base.clone().to(xc.device())
    xc.sync()
    x[:, 1:2] = torch.full((2, 1, 4), -1.0).to(xc.device())
    got = read(x)
    if on_path == "legacy":
        assert "legacy.rebox" not in _ops_of(got)
    expected = base.clone()
    expected[:, 1:2] = -1.0
    assert_same(got, read(expected))


def test_a_write_in_another_dtype_is_read_back_in_the_base_dtype():
    base = torch.zeros(2, 3, 4)
    x = base.clone().to(xc.device())
    xc.sync()
    x[:, 0:1] = torch.full((2, 1, 4), 3, dtype=torch.int64).to(xc.device())
    got = x.transpose(1, 2)[..., 0]
    expected = base.clone()
    expected[:, 0:1] = torch.full((2, 1, 4), 3, dtype=torch.int64)
    assert got.dtype == torch.float32
    assert_same(got, expected.transpose(1, 2)[..., 0])


def test_a_second_write_of_the_same_elements_leaves_other_views_and_the_base_right(on_path):
    base = torch.arange(24.0).reshape(2, 3, 4)
    x = base.clone().to(xc.device())
    xc.sync()
    old_view = x[:, 1]                      # taken before both writes
    x[:, 1:2] = torch.full((2, 1, 4), 5.0).to(xc.device())
    middle = x[:, 1].clone()                # read between the writes: the first write's value
    x.transpose(1, 2)[..., 1] *= 2
    expected = base.clone()
    expected[:, 1:2] = 5.0
    e_middle = expected[:, 1].clone()
    expected.transpose(1, 2)[..., 1] *= 2
    if on_path == "legacy":
        assert _updates(x) == 1
    assert_same(middle, e_middle)
    assert_same(old_view, expected[:, 1])
    assert_same(x, expected)
    xc.sync()
    assert_same(x, expected)
    assert_same(old_view, expected[:, 1])


def test_a_partial_second_write_keeps_both(on_path):
    base = torch.arange(24.0).reshape(2, 3, 4)
    x = base.clone().to(xc.device())
    xc.sync()
    x[:, 1:2] = torch.full((2, 1, 4), 5.0).to(xc.device())
    x.transpose(1, 2)[:2, 1] += 1           # half of what was written
    expected = base.clone()
    expected[:, 1:2] = 5.0
    expected.transpose(1, 2)[:2, 1] += 1
    if on_path == "legacy":
        assert _updates(x) == 2
    assert_same(x, expected)


def test_writes_through_a_view_of_a_view_and_autograd_still_match_eager():
    w = torch.randn(2, 3, 4, requires_grad=True)
    dw = w.detach().to(xc.device()).requires_grad_(True)
    for t, src in ((w, torch.ones(2, 1, 4)), (dw, torch.ones(2, 1, 4).to(xc.device()))):
        y = t * 2
        y[:, 1:2] = src
        y.transpose(1, 2)[..., 1] += 3
        (y * y).sum().backward()
    assert_same(dw.grad, w.grad)
