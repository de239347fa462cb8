"""Legacy trace plans for views, in-place ops and copy_ (``legacy/fast.py``): an op seen once with
some geometry is replayed without the full path afterwards, and gives eager's result; writes
whose checks or route depend on more than the plan key (overlap with the source, an overlapping
written view, another dtype) take the full path every time and keep eager's errors."""
from __future__ import annotations

import pytest
import torch

import xla_compat as xc
from xla_compat import paths
from tests.conftest import assert_same

aten = torch.ops.aten


@pytest.fixture(autouse=True)
def legacy():
    import xla_compat.legacy  # noqa: F401  (registers the path)
    with paths.activated("legacy"):
        yield


def _full_path_calls(fn):
    """The ops ``fn`` sends through the legacy path's full handlers (``ops.dispatch``)."""
    from xla_compat.legacy import ops
    calls = []
    real = ops.dispatch

    def spy(func, args, kwargs):
        calls.append(func)
        return real(func, args, kwargs)
    ops.dispatch = spy
    try:
        fn()
    finally:
        ops.dispatch = real
    return calls


def _kv_step(cache, kv, positions):
    for t in range(positions):
        cache[:, :, t:t + 1] = kv[:, :, t:t + 1]
        cache.transpose(2, 3)[..., t] += 0.5


def test_kv_cache_writes_replay_from_plans_and_match_eager():
    g = torch.Generator().manual_seed(1)
    cache, kv = torch.randn(2, 3, 6, 4, generator=g), torch.randn(2, 3, 6, 4, generator=g)
    dc, dkv = cache.to(xc.device()), kv.to(xc.device())
    _kv_step(dc, dkv, 6)
    _kv_step(cache, kv, 6)
    assert_same(dc, cache)
    kv.mul_(-2)
    dkv.copy_(kv.to(xc.device()))
    slow = _full_path_calls(lambda: _kv_step(dc, dkv, 6))
    assert slow == [], slow
    _kv_step(cache, kv, 6)
    assert_same(dc, cache)
    xc.sync()
    _full_path_calls(lambda: _kv_step(dc, dkv, 6))   # after a sync: from device data
    _kv_step(cache, kv, 6)
    assert_same(dc, cache)


def test_replayed_views_keep_eager_metadata():
    x = torch.arange(120.0).reshape(2, 3, 4, 5)
    d = x.to(xc.device())
    for _ in range(2):
        for view in (lambda t: t.transpose(1, 3)[:, 2], lambda t: t[:, 1:3].select(3, -1),
                     lambda t: t.permute(3, 0, 1, 2)[1:4:2, :, 1], lambda t: t.unbind(2)[3],
                     lambda t: t.split(2, 2)[1]):
            got, want = view(d), view(x)
            assert got.shape == want.shape and got.stride() == want.stride()
            assert got.storage_offset() == want.storage_offset()
            assert_same(got, want)


def test_a_write_through_a_view_of_a_view_replays_and_matches_eager():
    x = torch.randn(5, 6)
    d = x.to(xc.device())
    for k in range(3):
        src = torch.full((3,), float(k))
        d[1:4][:, 2].copy_(src.to(xc.device()))
        x[1:4][:, 2].copy_(src)
        d.t()[1:5:2][1].mul_(1.5)
        x.t()[1:5:2][1].mul_(1.5)
        assert_same(d, x)


def test_writes_into_a_view_from_the_same_storage_match_eager_each_time():
    x = torch.randn(4, 5)
    d = x.to(xc.device())
    for _ in range(3):
        d[1].copy_(d[0])               # distinct rows of one storage
        x[1].copy_(x[0])
        d[2].add_(d[3])
        x[2].add_(x[3])
        d[3].add_(d[3])                # two views of the same elements, same layout
        x[3].add_(x[3])
        v = d[0]
        v.mul_(v)                      # the written tensor is its own operand
        w = x[0]
        w.mul_(w)
        assert_same(d, x)


def test_a_copy_from_a_partially_overlapping_view_raises_as_eager_every_time():
    x = torch.randn(4, 4)
    d = x.to(xc.device())
    with pytest.raises(RuntimeError, match="unsupported operation"):
        x.t().copy_(x)
    for _ in range(2):
        with pytest.raises(RuntimeError, match="unsupported operation"):
            d.t().copy_(d)
    d[0].copy_(d[1])                   # the same geometries without the overlap: no plan reuse
    x[0].copy_(x[1])
    assert_same(d, x)


def test_an_in_place_op_on_an_expanded_view_raises_as_eager_every_time():
    x = torch.randn(1, 4)
    d = x.to(xc.device())
    with pytest.raises(RuntimeError, match="unsupported operation"):
        x.expand(3, 4).add_(1)
    for _ in range(2):
        with pytest.raises(RuntimeError, match="unsupported operation"):
            d.expand(3, 4).add_(1)
        with pytest.raises(RuntimeError, match="unsupported operation"):
            d.expand(3, 4).copy_(torch.ones(3, 4).to(xc.device()))
    assert_same(d, x)


def test_an_in_place_op_on_overlapping_windows_takes_eager_walk_every_time():
    x = torch.arange(8.0)
    d = x.to(xc.device())
    for _ in range(2):
        d.unfold(0, 3, 1).mul_(2)
        x.unfold(0, 3, 1).mul_(2)
        assert_same(d, x)


def test_a_copy_of_another_dtype_converts_each_time_after_a_planned_one():
    x = torch.zeros(3, 4)
    d = x.to(xc.device())
    for k in range(2):
        for src in (torch.arange(4.0) + k, torch.arange(4, dtype=torch.float64) / 3 + k,
                    torch.arange(4) * 7 + k):
            d[1].copy_(src.to(xc.device()))
            x[1].copy_(src)
            assert d.dtype == torch.float32
            assert_same(d, x)
        d[2].copy_(torch.tensor(2.5).to(xc.device()))     # a broadcast source
        x[2].copy_(torch.tensor(2.5))
        assert_same(d, x)


def test_an_in_place_op_whose_result_dtype_cannot_be_written_raises_every_time():
    x = torch.arange(12).reshape(3, 4)
    d = x.to(xc.device())
    with pytest.raises(RuntimeError, match="can't be cast"):
        x[1].mul_(0.5)
    for _ in range(2):
        d[1].mul_(2)
        x[1].mul_(2)
        with pytest.raises(RuntimeError, match="can't be cast"):
            d[1].mul_(0.5)
    assert_same(d, x)


def test_a_planned_write_keeps_autograd_of_the_view():
    base = torch.randn(3, 4, requires_grad=True)
    db = base.detach().to(xc.device()).requires_grad_()
    for b in (base, db):
        y = b * 1
        for _ in range(2):
            y[1].mul_(3)
            y.t()[2].add_(1)
        (y * y).sum().backward()
    assert_same(db.grad, base.grad)


def test_a_copy_into_a_whole_tensor_replays_and_keeps_both_values_through_syncs():
    # copy_ into a base (no view) binds the source's value as copy_ into a view does: an EMA
    # model's or a buffer's update each step. Both tensors then hold one value, and one buffer
    # after a sync: writes to either afterwards (donated buffers included) leave the other alone.
    g = torch.Generator().manual_seed(3)
    x, y = torch.randn(4, 5, generator=g), torch.zeros(4, 5)
    ys = y[1:3]                                   # a view of the written tensor
    xd, yd = x.to(xc.device()), y.to(xc.device())
    ysd = yd[1:3]
    for step in range(4):
        calls = _full_path_calls(lambda: yd.copy_(xd))
        y.copy_(x)
        if step:
            assert calls == [], calls
        xd.add_(1.0)
        x.add_(1.0)
        if step % 2:
            yd.mul_(2.0)
            y.mul_(2.0)
        xc.sync()
        assert_same(yd, y)
        assert_same(xd, x)
        assert_same(ysd, ys)
    with pytest.raises(RuntimeError):            # eager's partial-overlap error, planned or not
        yd[1:].copy_(yd[:-1])
