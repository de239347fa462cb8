"""Normalisation on hlo matches CPU eager: outputs, gradients and running-statistics updates."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from xla_compat.lowering import registry
from xla_compat.lowering.registry import aten

from ._nn_check import check



@pytest.fixture(autouse=True)
def _seed_each_test():
    torch.manual_seed(0)     # inputs do not depend on which tests ran before


def test_norm_ops_have_rules():
    for op in (aten._native_batch_norm_legit_functional.default,
               aten._native_batch_norm_legit.no_stats,
               aten._native_batch_norm_legit_no_training.default,
               aten.native_batch_norm_backward.default,
               aten.native_group_norm.default, aten.native_group_norm_backward.default,
               aten.native_layer_norm.default, aten.native_layer_norm_backward.default):
        assert registry.lookup(op) is not None, op


def _bn_train(x, w, b, rm, rv):
    out = F.batch_norm(x, rm, rv, w, b, training=True, momentum=0.3, eps=1e-3)
    return out, rm, rv     # the running stats were updated in place


@pytest.mark.parametrize("shape", [(4, 3), (4, 3, 5), (2, 3, 4, 5), (2, 3, 2, 3, 4)])
def test_batch_norm_training_updates_running_stats_with_unbiased_var(shape):
    c = shape[1]
    check(_bn_train, torch.randn(shape) * 3 + 1, torch.randn(c), torch.randn(c),
          torch.randn(c), torch.rand(c) + 0.5, frozen=(3, 4))


def test_batch_norm_training_without_affine():
    check(lambda x, rm, rv: _bn_train(x, None, None, rm, rv), torch.randn(5, 2, 3),
          torch.zeros(2), torch.ones(2), frozen=(1, 2))


def test_batch_norm_without_running_stats_uses_batch_statistics():
    # dx = (dy - mean(dy) - proj) * invstd * w cancels to ~0 in places; such elements keep the
    # rounding of the O(1) terms (a few 1e-7 each), so absolute 5e-6 on the input gradient.
    check(lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True),
          torch.randn(3, 4, 5, 2), torch.randn(4), torch.randn(4), grad_atol=5e-6)


@pytest.mark.parametrize("shape", [(4, 3), (2, 3, 4, 5)])
def test_batch_norm_eval_uses_running_stats(shape):
    c = shape[1]
    check(lambda x, w, b, rm, rv: (F.batch_norm(x, rm, rv, w, b, training=False, eps=1e-4), rm, rv),
          torch.randn(shape), torch.randn(c), torch.randn(c), torch.randn(c),
          torch.rand(c) + 0.5, frozen=(3, 4))


def test_batch_norm_module_train_then_eval():
    bn = torch.nn.BatchNorm2d(3, momentum=None)    # cumulative average: momentum from a counter

    def run(x):
        m = copy.deepcopy(bn).to(x.device)
        m.train()
        y1 = m(x)
        y2 = m(x * 2 + 1)
        m.eval()
        return y1, y2, m(x), m.running_mean, m.running_var, m.num_batches_tracked

    check(run, torch.randn(2, 3, 4, 4))


def test_instance_norm():
    # (Its running stats are written through at::alias(running_mean).copy_: aliasing, which is
    # the paths' job, not the core's; the lowering only sees batch_norm on a reshaped input.)
    check(lambda x, w, b: F.instance_norm(x, weight=w, bias=b), torch.randn(2, 3, 4, 5),
          torch.randn(3), torch.randn(3))


@pytest.mark.parametrize("shape,groups", [((2, 6, 4, 5), 3), ((3, 4), 2), ((2, 4, 7), 4),
                                          ((2, 6, 2, 3, 2), 1)])
def test_group_norm(shape, groups):
    c = shape[1]
    check(lambda x, w, b: F.group_norm(x, groups, w, b, eps=1e-3),
          torch.randn(shape) * 2 + 1, torch.randn(c), torch.randn(c))


def test_group_norm_of_an_empty_batch():
    check(lambda x, w, b: F.group_norm(x, 1, w, b), torch.randn(0, 2), torch.randn(2),
          torch.randn(2))


def test_group_norm_without_affine():
    check(lambda x: F.group_norm(x, 2), torch.randn(2, 4, 3, 3))


@pytest.mark.parametrize("norm_shape", [(5,), (4, 5)])
def test_layer_norm(norm_shape):
    x = torch.randn(3, 4, 5) * 2 + 1
    check(lambda x, w, b: F.layer_norm(x, norm_shape, w, b), x, torch.randn(norm_shape),
          torch.randn(norm_shape))
    check(lambda x: F.layer_norm(x, norm_shape), x)



_B, _F, _H, _D = torch.bfloat16, torch.float32, torch.float16, torch.float64

# The normalisation ops, called as (input [2, 4, 3], weight [4] or None, bias, running_mean,
# running_var): each as its own name says.
_NORM_CALLS = {
    "layer_norm": lambda x, w, b, rm, rv: torch.native_layer_norm(
        x, [4, 3], None if w is None else w[:, None].expand(4, 3).contiguous(),
        None if b is None else b[:, None].expand(4, 3).contiguous(), 1e-5),
    "group_norm": lambda x, w, b, rm, rv: aten.native_group_norm(x, w, b, 2, 4, 3, 2, 1e-5),
    "native_batch_norm": lambda x, w, b, rm, rv: aten.native_batch_norm(
        x, w, b, rm, rv, True, 0.1, 1e-5),
    "batch_norm_functional": lambda x, w, b, rm, rv: aten._native_batch_norm_legit_functional(
        x, w, b, rm, rv, True, 0.1, 1e-5),
    "batch_norm_functional_eval": lambda x, w, b, rm, rv:
        aten._native_batch_norm_legit_functional(x, w, b, rm, rv, False, 0.1, 1e-5),
    "batch_norm_no_stats": lambda x, w, b, rm, rv: aten._native_batch_norm_legit.no_stats(
        x, w, b, True, 0.1, 1e-5),
    "batch_norm_no_training": lambda x, w, b, rm, rv:
        aten._native_batch_norm_legit_no_training(x, w, b, rm, rv, 0.1, 1e-5),
    "batch_norm_with_update": lambda x, w, b, rm, rv:
        aten._batch_norm_with_update_functional(x, w, b, rm, rv, 0.1, 1e-5),
}
# (input, weight, bias, running stats) dtypes: half inputs with half or float32 parameters
# (computed, statistics in eager's dtypes), and parameters eager refuses (mixed, or not alike).
_NORM_DTYPES = [(_B, _B, _B, _B), (_H, _H, None, _H), (_B, _F, _F, _F), (_H, _F, None, _F),
                (_F, _F, _F, _F), (_F, _B, _B, _B), (_B, _B, _F, _B), (_B, _F, _B, _F),
                (_H, _B, _B, _B), (_D, _F, _F, _F), (_F, _F, None, _B)]


def _norm_args(dtypes):
    xd, wd, bd, rd = dtypes
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 4, 3, generator=g).to(xd)
    w = torch.randn(4, generator=g).to(wd) if wd else None
    b = torch.randn(4, generator=g).to(bd) if bd else None
    return x, w, b, torch.rand(4, generator=g).to(rd), (torch.rand(4, generator=g) + 0.5).to(rd)


@pytest.mark.parametrize("dtypes", _NORM_DTYPES, ids=str)
@pytest.mark.parametrize("op", list(_NORM_CALLS))
def test_norm_dtypes_as_eager(path, op, dtypes):
    """Statistics (mean, rstd, saved and new running stats) in eager's dtypes: the input's, or
    float32 for a mixed call (half input, float32 parameters), where the meta kernels say
    float32 for every half input; parameters eager refuses raise its error."""
    import xla_compat as xc
    args = _norm_args(dtypes)
    try:
        want = _NORM_CALLS[op](*args)
    except RuntimeError as e:
        with pytest.raises(RuntimeError) as ours:
            _NORM_CALLS[op](*[t.to(xc.device()) if t is not None else None for t in args])
        assert str(ours.value).splitlines()[0] == str(e).splitlines()[0]
        return
    got = _NORM_CALLS[op](*[t.to(xc.device()) if t is not None else None for t in args])
    assert len(got) == len(want)
    xc.sync(list(got))                       # (one graph for all outputs; read one by one below)
    for g, e in zip(got, want):
        assert (g.dtype, g.shape) == (e.dtype, e.shape)
        # (half: eager's bfloat16 invstd is one rounding step away from ours in some channels,
        # which moves an output by a few of its steps where bias and mean cancel)
        tol = {} if e.dtype in (_F, _D) else {"rtol": 2e-2, "atol": 2e-2}
        torch.testing.assert_close(g.cpu(), e, **tol)


def test_layer_norm_module_trains_in_bfloat16_like_eager(path):
    """nn.LayerNorm in bfloat16: the saved statistics are bfloat16 in eager, and the backward
    reads them rounded, so the gradients match only when the device stores them alike."""
    import xla_compat as xc
    m = torch.nn.LayerNorm(8).to(torch.bfloat16)
    with torch.no_grad():
        m.weight.uniform_()
        m.bias.uniform_()
    md = copy.deepcopy(m).to(xc.device())
    x = torch.randn(6, 8, dtype=torch.bfloat16) * 3 + 1
    xd = x.to(xc.device()).requires_grad_()
    x.requires_grad_()
    (m(x) * torch.arange(8.0, dtype=torch.bfloat16)).sum().backward()
    (md(xd) * torch.arange(8.0, dtype=torch.bfloat16).to(xc.device())).sum().backward()
    torch.testing.assert_close(xd.grad.cpu(), x.grad)
    torch.testing.assert_close(md.weight.grad.cpu(), m.weight.grad)
    torch.testing.assert_close(md.bias.grad.cpu(), m.bias.grad)


# -- the batch-norm ops nn.BatchNorm reaches since torch 2.4, on both user paths -------------------

@pytest.fixture
def _no_fallback():
    from xla_compat import settings
    with settings.override(cpu_fallback="error"):
        yield


@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("track", [True, False])
def test_batch_norm_module_steps_update_running_stats_like_eager(path, _no_fallback, affine,
                                                                 track):
    import xla_compat as xc
    m = torch.nn.BatchNorm2d(3, affine=affine, track_running_stats=track)
    if affine:
        with torch.no_grad():
            m.weight.uniform_()
            m.bias.uniform_()
    md = copy.deepcopy(m).to(xc.device())
    for train in (True, True, False):
        m.train(train)
        md.train(train)
        x = torch.randn(4, 3, 5, 6, requires_grad=True)
        xd = x.detach().to(xc.device()).requires_grad_()
        e, r = m(x), md(xd)
        g = torch.randn_like(e)
        e.backward(g)
        with torch.autograd.set_multithreading_enabled(False):   # paths are per thread
            r.backward(g.to(xc.device()))
        torch.testing.assert_close(r.cpu(), e.detach(), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(xd.grad.cpu(), x.grad, rtol=1e-4, atol=1e-5)
        for (k, v), (_, vd) in zip(m.state_dict().items(), md.state_dict().items()):
            torch.testing.assert_close(vd.cpu(), v, msg=k)
        if affine:
            torch.testing.assert_close(md.weight.grad.cpu(), m.weight.grad, rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(md.bias.grad.cpu(), m.bias.grad, rtol=1e-4, atol=1e-4)


def test_batch_norm_with_update_returns_an_empty_reserve_and_writes_running_stats(path,
                                                                                  _no_fallback):
    import xla_compat as xc
    x, w, b = torch.randn(4, 3, 5), torch.rand(3), torch.rand(3)
    rm, rv = torch.zeros(3), torch.ones(3)
    expected = torch.ops.aten._batch_norm_with_update(x, w, b, rm, rv, 0.1, 1e-5)
    d = xc.device()
    rmd, rvd = torch.zeros(3).to(d), torch.ones(3).to(d)
    actual = torch.ops.aten._batch_norm_with_update(x.to(d), w.to(d), b.to(d), rmd, rvd, 0.1, 1e-5)
    for a, e in zip(actual, expected):
        assert a.dtype == e.dtype and a.shape == e.shape
        torch.testing.assert_close(a.cpu(), e, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(rmd.cpu(), rm)
    torch.testing.assert_close(rvd.cpu(), rv)
    for op in (aten._batch_norm_with_update_functional.default,
               aten._batch_norm_no_update.default, aten.batch_norm_backward.default):
        assert registry.lookup(op) is not None, op


_EVAL_BN = {
    "native_batch_norm": lambda x, w, b, rm, rv: aten.native_batch_norm(
        x, w, b, rm, rv, False, 0.1, 1e-5),
    "_native_batch_norm_legit": lambda x, w, b, rm, rv: aten._native_batch_norm_legit(
        x, w, b, rm, rv, False, 0.1, 1e-5),
    "_native_batch_norm_legit_no_training": lambda x, w, b, rm, rv:
        aten._native_batch_norm_legit_no_training(x, w, b, rm, rv, 0.1, 1e-5),
    "_native_batch_norm_legit_functional": lambda x, w, b, rm, rv:
        aten._native_batch_norm_legit_functional(x, w, b, rm, rv, False, 0.1, 1e-5),
    "_batch_norm_no_update": lambda x, w, b, rm, rv: aten._batch_norm_no_update(
        x, w, b, rm, rv, 0.1, 1e-5),
}


@pytest.mark.parametrize("op", sorted(_EVAL_BN))
def test_eval_batch_norm_returns_empty_saved_stats_like_cpu_eager(path, _no_fallback, op):
    import xla_compat as xc
    x, w, b = torch.randn(3, 2, 4), torch.randn(2), torch.randn(2)
    rm, rv = torch.randn(2), torch.rand(2) + 0.5
    expected = _EVAL_BN[op](x, w, b, rm, rv)
    d = xc.device()
    actual = _EVAL_BN[op](x.to(d), w.to(d), b.to(d), rm.to(d), rv.to(d))
    assert expected[1].shape == (0,)      # what CPU eager gives (the meta kernel says [C])
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        assert a.dtype == e.dtype and a.shape == e.shape
        torch.testing.assert_close(a.cpu(), e, rtol=1e-5, atol=1e-5)


def test_training_batch_norm_still_saves_per_channel_stats(path, _no_fallback):
    import xla_compat as xc
    x, w, b = torch.randn(3, 2, 4), torch.randn(2), torch.randn(2)
    rm, rv = torch.randn(2), torch.rand(2) + 0.5
    expected = aten.native_batch_norm(x, w, b, rm.clone(), rv.clone(), True, 0.1, 1e-5)
    d = xc.device()
    actual = aten.native_batch_norm(x.to(d), w.to(d), b.to(d), rm.to(d), rv.to(d), True, 0.1,
                                    1e-5)
    for a, e in zip(actual, expected):
        assert a.shape == e.shape
        torch.testing.assert_close(a.cpu(), e, rtol=1e-5, atol=1e-5)
