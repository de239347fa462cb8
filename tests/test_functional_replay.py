"""Issue 8, functional path: ops traced once are replayed from memos keyed by geometry on later
calls (view copies and scatters before the path's handlers, a passed meta reference of an
in-place op, an inner ``copy`` without overlap). Each program here runs twice, the second time
replayed, and must give eager's result, or eager's error, both times; the cases that must not
replay (aliasing between the written view and the source, a view of a view, another dtype, a
resized write-back) are among them."""
import warnings

import pytest
import torch

import xla_compat as xc
from xla_compat.functional import viewchain

from .conftest import assert_same


@pytest.fixture
def replays(monkeypatch):
    """Counts the view copies and scatters served by ``viewchain.replay``."""
    served = []
    real = viewchain.replay

    def spy(cls, func, args):
        out = real(cls, func, args)
        if out is not None:
            served.append(str(func))
        return out
    monkeypatch.setattr(viewchain, "replay", spy)
    return served


def _twice(program, make, dev, **compare):
    """``program`` on device twins of ``make()``, twice (the second call replays), vs eager."""
    for _ in range(2):
        cpu = make()
        on_dev = [t.to(dev) for t in cpu]
        expected = program(*cpu)
        actual = program(*on_dev)
        xc.sync()
        assert_same(actual, expected, **compare)
        assert_same(on_dev, cpu, **compare)


def _kv(cache, kv):
    for t in range(3):
        cache[:, :, t:t + 1] = kv[:, :, t:t + 1]
        cache.transpose(2, 3)[..., t] += 0.5
    return cache.sum()


def test_kv_cache_writes_replayed_on_the_second_call_match_eager(dev, replays):
    from xla_compat import paths
    with paths.activated("functional"):
        g = torch.Generator().manual_seed(0)
        _twice(_kv, lambda: (torch.randn(2, 3, 8, 4, generator=g),
                             torch.randn(2, 3, 8, 4, generator=g)), dev, atol=1e-4)
    # (the writes themselves go through the cache's root wrapper, direct.py: no scatter reaches
    # the inner tensor; the views they write are born from replayed view copies)
    assert "aten.transpose_copy.int" in replays and "aten.select_copy.int" in replays


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64])
def test_the_same_writes_in_another_dtype_after_float32_match_eager(path, dev, dtype):
    def program(x):
        x[1:3] = x[0:2].clone() * 2
        x.t()[0] += 1
        x.transpose(0, 1)[1:3, 2] = 7
        return x
    g = torch.Generator().manual_seed(1)
    for dt in (torch.float32, dtype, torch.float32):
        _twice(program, lambda: ((torch.randn(5, 4, generator=g) * 10).to(dt),), dev)


def test_a_view_of_a_view_written_twice_matches_eager(path, dev):
    def program(x):
        v = x.t()[1:3]
        v[:, 0] = -1
        v.transpose(0, 1)[2] *= 3
        x.t()[1:3].t()[0:2] += v.t()[0:2]
        return x
    g = torch.Generator().manual_seed(2)
    _twice(program, lambda: (torch.randn(6, 4, generator=g),), dev)


@pytest.mark.parametrize("write", [
    lambda x: x[1:4].copy_(x[0:3]),                 # source and destination overlap in part
    lambda x: x.t().copy_(x),                       # a square tensor into its own transpose
        lambda x: x[1:3].add_(x[0:2]),                  # in place, the operand overlaps in part
])
def test_writes_from_a_partially_overlapping_source_raise_like_eager_every_time(path, dev, write):
    x = torch.randn(4, 4)
    with pytest.raises(RuntimeError) as cpu_error:
        write(x.clone())
    d = x.to(dev)
    for _ in range(3):
        with pytest.raises(RuntimeError) as dev_error:
            write(d)
        assert str(cpu_error.value).splitlines()[0] in str(dev_error.value)
        xc.sync()
    assert_same(d, x)


def test_a_write_through_a_slice_after_a_sync_still_raises_when_it_overlaps(path, dev):
    x = torch.randn(8)
    d = x.to(dev)
    d[4:8].copy_(d[0:4])            # disjoint: traced, then replayed below
    xc.sync()
    d[4:8].copy_(d[0:4])
    xc.sync()
    with pytest.raises(RuntimeError, match="unsupported operation"):
        d[1:5].copy_(d[0:4])         # same shapes and dtype, overlapping storage
    x[4:8].copy_(x[0:4])
    x[4:8].copy_(x[0:4])
    assert_same(d, x)


def test_an_in_place_cast_error_is_raised_every_time_not_remembered(path, dev):
    x = torch.arange(6).reshape(2, 3)
    d = x.to(dev)
    for _ in range(3):
        with pytest.raises(RuntimeError, match="can't be cast"):
            d.t()[0].add_(0.5)
        d.t()[0].add_(2)             # the same geometry with an integer passes
        x.t()[0].add_(2)
    xc.sync()
    assert_same(d, x)


def test_an_in_place_write_into_an_expanded_view_raises_every_time(path, dev):
    d = torch.zeros(3, 1).to(dev)
    for _ in range(3):
        with pytest.raises(RuntimeError):
            d.expand(3, 4).add_(1)
        d.add_(1)


def test_a_resized_out_write_back_after_a_plain_slice_write_matches_eager(path, dev):
    def program(base, src):
        base[3:9] = base[0:6] + 1                   # a plain slice write-back, replayed
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.mul(src, 2, out=base[3:9])        # eager resizes the view to [2, 2]
        base[3:9] = base[0:6] + 1
        return base
    g = torch.Generator().manual_seed(3)
    _twice(program, lambda: (torch.randn(12, generator=g), torch.randn(2, 2, generator=g)), dev)


def test_copy_into_a_view_made_before_other_writes_keeps_the_order_of_writes(path, dev):
    """copy_ does not read its destination; the writes queued before it still land first."""
    def program(x, src):
        v = x[1:3]                     # made before the writes below: out of date at the copy
        x[2] = 5
        x.t()[0] += 1
        v.copy_(src)
        w = x.transpose(0, 1)[1:3]     # a view of a written tensor, then a copy into a view of it
        w[0].copy_(src.reshape(-1)[:4] * 2)
        x.copy_(x * 2)                 # the whole tensor, with its views' writes pending
        v[0, 1] = -3
        return x, v, w
    g = torch.Generator().manual_seed(4)
    _twice(program, lambda: (torch.randn(4, 3, generator=g), torch.randn(2, 3, generator=g)), dev)


def test_a_view_written_by_copy_keeps_eager_strides_and_offset(path, dev):
    x, s = torch.randn(4, 5), torch.randn(4)
    d, ds = x.to(dev), s.to(dev)
    for _ in range(2):
        r, dr = x.t()[2].copy_(s), d.t()[2].copy_(ds)
        assert (dr.shape, dr.stride(), dr.storage_offset()) == \
            (r.shape, r.stride(), r.storage_offset())
        assert_same(dr, r)
        assert_same(d, x)


def test_a_view_written_by_copy_whose_base_is_gone_survives_a_sync(path, dev):
    import gc
    src = torch.randn(3)
    v = torch.zeros(5, 4, device=dev)[1:4, 2]       # the base wrapper is dropped at once
    gc.collect()
    v.copy_(src.to(dev))
    xc.sync()
    v.mul_(2)
    xc.sync()
    w = v[1:]
    w.copy_(torch.ones(2, device=dev))
    assert_same(v, torch.stack([src[0] * 2, torch.tensor(1.0), torch.tensor(1.0)]))
