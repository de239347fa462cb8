"""Issue 8, functional path: the memoised plans of the direct route (functional/direct.py). A copy_
between views of two plain roots (``planned_copy``) and an in-place op through a view (``in_place``)
remember, per key of everything the full route's checks read, whether that route writes through
the roots and along which chains. Pinned here: a loop's later iterations replay the plan and
match eager; the cases that must not take it (shared storage, a root written whole, autograd,
refused writes, unknown view kinds, another root geometry) take the full path, every time, with
eager's results and errors."""
import pytest
import torch

import xla_compat as xc
from xla_compat.debug import metrics as met
from xla_compat.functional import direct

from .conftest import assert_same
from .test_functional_direct import _both, _randn


@pytest.fixture
def planned(monkeypatch):
    """Records, per call of ``planned_copy``, whether its plan took the copy."""
    seen = []
    real = direct.planned_copy

    def spy(*args):
        out = real(*args)
        seen.append(out is not None)
        return out
    monkeypatch.setattr(direct, "planned_copy", spy)
    return seen



def test_a_kv_loop_replays_the_copy_plan_and_matches_eager(dev, planned):
    def program(cache, kv):
        for _ in range(3):
            for t in range(4):
                cache[:, :, t:t + 1] = kv[:, :, t:t + 1]
                cache.transpose(2, 3)[..., t] += 0.5
        return cache.sum()
    with xc.use_path("functional"):
        _both(program, _randn(2, 3, 8, 4), _randn(2, 3, 5, 4, seed=1), dev=dev, atol=1e-4)
    # every copy between two different storages' views took the plan (the stores of the
    # transposed view's own elements return earlier, as eager's copy_ does)
    assert planned.count(True) == 12


def test_the_same_plan_serves_after_a_sync_and_the_values_follow(dev, planned):
    with xc.use_path("functional"):
        a, b = _randn(6, 5).to(dev), _randn(6, 5, seed=1).to(dev)
        ea, eb = a.cpu(), b.cpu()
        del planned[:]                          # (the copies onto the device: not views)
        for i in range(4):
            b.add_(1.0)
            eb.add_(1.0)
            a[:, i:i + 1].copy_(b[:, 4 - i:5 - i])
            ea[:, i:i + 1].copy_(eb[:, 4 - i:5 - i])
            if i == 1:
                xc.sync()
        assert_same(a, ea)
        assert_same(b, eb)
    assert planned == [True] * 4


def test_copies_the_plan_must_leave_to_the_full_path_match_eager(dev, planned):
    def program(x, y, w):
        for _ in range(2):                      # the memoised verdict holds the second time too
            x.t()[1].copy_(x.t()[2])            # one storage: overlap checks
            x.copy_(y)                          # a root written whole
            x[1:3].copy_(y[0:2].double().float())   # a fresh root as source: not a view
            x[0].copy_(y.diagonal()[:5].clone().view(5))
            x.diagonal()[1:3].copy_(y[3, 0:2])  # a view kind the chains do not know
            x.unfold(1, 2, 2)[1, 0].copy_(y[1, 0:2])   # through unfold: upstream's sync
            x[2].copy_(w[0, :5])                # another dtype: the full path casts
        return x * 1
    with xc.use_path("functional"):
        _both(program, _randn(5, 5), _randn(5, 5, seed=1),
              torch.arange(12, dtype=torch.int64).reshape(2, 6), dev=dev)
    assert planned and not any(planned)


def test_a_copy_into_an_expanded_view_raises_eagers_error_every_time(dev, planned):
    with xc.use_path("functional"):
        x = torch.zeros(1, 4).to(dev)
        y = _randn(3, 4).to(dev)
        for _ in range(2):
            with pytest.raises(RuntimeError, match="more than one element of the written-to"):
                x.expand(3, 4)[0:3].copy_(y[0:3])
        assert_same(x, torch.zeros(1, 4))
    assert not any(planned)


def test_copies_needing_autograd_take_the_full_path(dev, planned):
    with xc.use_path("functional"):
        w = _randn(4, 3).to(dev).requires_grad_()
        x = torch.zeros(5, 3).to(dev)
        for i in range(2):
            x[i:i + 1].copy_(w[i:i + 1])
        x.sum().backward()
        assert_same(w.grad, torch.tensor([[1.0] * 3] * 2 + [[0.0] * 3] * 2))
    assert not any(planned)


def test_the_plan_key_holds_the_roots_geometry(dev, planned):
    """Views of one geometry from roots of other shapes: each root's own chain."""
    def program(x, z, y):
        x[1, :, 1:2].copy_(y[:, 0:1])
        z[1, :, 1:2].copy_(y[:, 1:2])            # x's view geometry, another root shape
        x[1, :, 1:2].copy_(y[:, 2:3])
        return x * 1, z * 1
    with xc.use_path("functional"):
        x, z = torch.zeros(2, 4, 3), torch.zeros(3, 4, 3)
        assert (x[1, :, 1:2].stride(), x[1, :, 1:2].storage_offset()) == \
            (z[1, :, 1:2].stride(), z[1, :, 1:2].storage_offset())
        _both(program, x, z, _randn(4, 3), dev=dev)
    assert planned.count(True) == 3


def test_in_place_plans_replay_in_a_loop_and_refuse_what_they_must(path, dev):
    def program(x, m, y):
        for t in range(3):
            x.t()[t].mul_(1.5)
            x[t, 1:4].sub_(y[t], alpha=2)
            x.t()[t + 1][1:3].add_(0.25)         # a view of a view
            m.t()[t].add_(True)                  # bool: the full path
            x.diagonal()[0:2].add_(1)           # a view kind the chains do not know
        return x * 1, m * 1
    _both(program, _randn(5, 6), torch.zeros(6, 5, dtype=torch.bool), _randn(4, 3, seed=2),
          dev=dev, atol=1e-5)


def _nodes():
    return met.counter_value("IrNodes") or 0


def test_a_views_value_is_read_once_however_often_it_is_read(dev):
    """A view born from a root and then read again by a write through it (a copy's source, an
    in-place op's operand, a later view of the same elements) is one node, not one per read."""
    with xc.use_path("functional"):
        cache, kv = torch.zeros(2, 3, 8, 4).to(dev), _randn(2, 3, 8, 4, seed=1).to(dev)
        ec, ek = cache.cpu(), kv.cpu()
        counts = []
        for t in range(3):
            before = _nodes()
            cache[:, :, t:t + 1] = kv[:, :, t:t + 1]
            cache.transpose(2, 3)[..., t] += 0.5
            counts.append(_nodes() - before)
            ec[:, :, t:t + 1] = ek[:, :, t:t + 1]
            ec.transpose(2, 3)[..., t] += 0.5
        # two view births (cache's, kv's slices), the write, the transposed view's birth, the
        # select (kv's slice re-laid out), the number, the add and its write: nothing read twice
        assert counts == [8, 8, 8]
        assert_same(cache, ec)


def test_reads_kept_across_syncs_and_writes_match_eager(path, dev):
    def program(cache, kv):
        for t in range(4):
            cache[:, t:t + 1] = kv[:, t:t + 1]
            s = cache.t()[t]
            if t == 1:
                xc.sync()                        # the view's root is device data now
            s += 0.5
            cache.t()[t] = s
            r = cache.t()[t]
            kv[:, t:t + 1] = cache[:, t:t + 1] * 2   # the read's source is written over
            r.mul_(3)
            cache.t()[t].sub_(kv.t()[t])
        return cache * 1, kv * 1
    _both(program, torch.zeros(5, 6), _randn(5, 6, seed=3), dev=dev)
