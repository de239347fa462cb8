"""In-place foreach ops (an optimizer's multi-tensor step) on both paths, against CPU eager.

torch's optimizers take their foreach kernels on either path (legacy lists its tensor type as
DTensor does); legacy replays a traced foreach write from a plan; a call whose written tensors
share memory with another list position runs position by position, as eager's CPU kernels do."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.optim.optimizer import _default_to_fused_or_foreach
from torch.utils._foreach_utils import _has_foreach_support

import xla_compat as xc

OPTIMIZERS = {
    "sgd_nesterov": (torch.optim.SGD, dict(lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01)),
    "adam_amsgrad": (torch.optim.Adam, dict(lr=0.01, amsgrad=True)),
    "adamw": (torch.optim.AdamW, dict(lr=0.01, weight_decay=0.1)),
    "rmsprop": (torch.optim.RMSprop, dict(lr=0.01, momentum=0.5, centered=True)),
    "adagrad": (torch.optim.Adagrad, dict(lr=0.1)),
}


def test_optimizers_take_the_foreach_kernels(path, dev):
    params = list(nn.Linear(3, 2).to(dev).parameters())
    assert _default_to_fused_or_foreach(params, False, False) == (False, True)
    grads = [torch.ones(2).to(dev), torch.ones(3).to(dev)]   # (clip_grad_norm_ asks of grads)
    assert _has_foreach_support(grads, dev)


def _train(dev, name, foreach, steps=4, spy=None):
    cls, kw = OPTIMIZERS[name]
    g = torch.Generator().manual_seed(5)
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.4)
    x, y = torch.randn(5, 6, generator=g), torch.randint(0, 3, (5,), generator=g)
    model, x, y = model.to(dev), x.to(dev), y.to(dev)
    opt = cls(model.parameters(), foreach=foreach, **kw)
    for i in range(steps):
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        nn.utils.clip_grad_norm_(model.parameters(), 0.5, foreach=foreach)
        if spy is not None and i == steps - 1:
            spy.clear()
        opt.step()
        if dev != "cpu":
            xc.sync()
    state = [v for s in opt.state.values() for v in s.values() if torch.is_tensor(v)]
    return [t.detach().cpu() for t in (*model.parameters(), *state)]


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_foreach_optimizer_steps_match_cpu(path, dev, name, monkeypatch):
    full = []
    if path == "legacy":       # after the first steps, no foreach write takes the full path
        from xla_compat.legacy import fast, ops
        real = ops.dispatch

        def counting(func, args, kwargs):
            if fast._foreach_in_place(func):
                full.append(func)
            return real(func, args, kwargs)
        monkeypatch.setattr(ops, "dispatch", counting)
    want = _train("cpu", name, foreach=False)
    got = _train(dev, name, foreach=None, spy=full)      # (foreach chosen by default)
    assert len(got) == len(want)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=2e-5, atol=2e-6)
    assert full == []


def _cross_position_writes(dev):
    a = torch.ones(3).to(dev)
    b = torch.arange(6.0).to(dev)
    c, d = torch.arange(4.0).to(dev), torch.arange(4.0).to(dev)
    for _ in range(2):                          # the second call meets the first one's plan
        torch._foreach_mul_([c, d], 2.0)        # distinct storages: one op
        torch._foreach_mul_([a, a], 2.0)        # one tensor twice: a * 4
        torch._foreach_add_([b, b[:3]], [b[3:].repeat(2), torch.ones(3).to(dev)])
        torch._foreach_mul_([c, c[1:]], 3.0)    # same geometry as above, now sharing
        s = torch.full((), 2.0).to(dev)
        torch._foreach_mul_([s, d], s)          # a lone operand, written first: d * 4
    return [t.cpu() for t in (a, b, c, d)]


def test_writes_across_list_positions_run_in_eager_order(path, dev):
    for got, want in zip(_cross_position_writes(dev), _cross_position_writes("cpu")):
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("case", ["partial", "expanded"])
def test_overlapping_writes_raise_eagers_error(path, dev, case):
    def call(device):
        if case == "partial":
            c = torch.arange(5.0).to(device)
            torch._foreach_add_([c[1:]], [c[:-1]])
        else:
            c = torch.zeros(1).to(device).expand(3)
            torch._foreach_add_([c], [torch.ones(3).to(device)])
    with pytest.raises(RuntimeError) as cpu_error:
        call("cpu")
    for _ in range(2):
        with pytest.raises(RuntimeError) as error:
            call(dev)
        assert str(cpu_error.value).splitlines()[0] in str(error.value)


# ----------------------------------------------------------------------------------------------
# Functional: a foreach call like one upstream's kernel accepted skips its meta check.

def _counting_fast_path(monkeypatch):
    from xla_compat.functional import checks
    calls = []
    real = checks._functional_foreach

    def counted(*a, **k):
        done = real(*a, **k)
        calls.append(done)
        return done
    monkeypatch.setattr(checks, "_functional_foreach", counted)
    return calls


FOREACH_CALLS = {
    "add_list_alpha": lambda ts, os: torch._foreach_add_(ts, os, alpha=-0.5),
    "mul_scalar": lambda ts, os: torch._foreach_mul_(ts, 0.9),
    "addcmul_scalar": lambda ts, os: torch._foreach_addcmul_(ts, os, os, value=0.25),
    "div_scalarlist": lambda ts, os: torch._foreach_div_(ts, [1.5 + i for i in range(len(ts))]),
    "lerp_scalar": lambda ts, os: torch._foreach_lerp_(ts, os, 0.3),
    "sqrt_": lambda ts, os: torch._foreach_sqrt_(ts),
}


@pytest.mark.parametrize("name", sorted(FOREACH_CALLS))
def test_a_repeated_foreach_write_matches_cpu_on_every_call(path, dev, name, monkeypatch):
    """The same in-place foreach call, five times, on contiguous and transposed tensors (the
    functional path runs upstream's kernel the first time and its own fast path after): CPU
    eager's values and strides every time."""
    fast = _counting_fast_path(monkeypatch)
    g = torch.Generator().manual_seed(3)
    cpu = [torch.rand(3, 4, generator=g) + 0.5, (torch.rand(4, 2, generator=g) + 0.5).t(),
           torch.rand(5, generator=g) + 0.5]
    others = [torch.rand(t.shape, generator=g) + 0.5 for t in cpu]
    ts = [t.to(dev) if t.is_contiguous() else t.t().contiguous().to(dev).t() for t in cpu]
    os = [o.to(dev) for o in others]
    for _ in range(5):
        FOREACH_CALLS[name](cpu, others)
        FOREACH_CALLS[name](ts, os)
        for t, c in zip(ts, cpu):
            assert t.stride() == c.stride()
            torch.testing.assert_close(t.cpu(), c, rtol=1e-5, atol=1e-6)
        xc.sync()
    if path == "functional":
        assert fast == [True] * 4          # the first call through upstream's kernel


def test_a_foreach_call_unlike_an_accepted_one_still_raises_eagers_error(path, dev, monkeypatch):
    """An accepted call does not vouch for one whose tensors differ: an int list added a float
    list raises eager's cast error, a list whose operand broadcasts past the written tensor
    raises eager's size error, after calls that passed with other dtypes and shapes."""
    fast = _counting_fast_path(monkeypatch)
    floats = [torch.ones(2, 3).to(dev), torch.ones(3).to(dev)]
    for _ in range(2):
        torch._foreach_add_(floats, [torch.ones(2, 3).to(dev), torch.ones(3).to(dev)])
    ints = [torch.ones(2, 3, dtype=torch.int64).to(dev), torch.ones(3, dtype=torch.int64).to(dev)]
    with pytest.raises(RuntimeError) as got:
        torch._foreach_add_(ints, [torch.ones(2, 3).to(dev), torch.ones(3).to(dev)])
    with pytest.raises(RuntimeError) as want:
        torch._foreach_add_([torch.ones(2, 3, dtype=torch.int64), torch.ones(3, dtype=torch.int64)],
                            [torch.ones(2, 3), torch.ones(3)])
    assert str(got.value).splitlines()[0] == str(want.value).splitlines()[0]   # eager's words
    with pytest.raises(RuntimeError):
        torch._foreach_add_([torch.ones(3)], [torch.ones(2, 3)])          # eager refuses it
    with pytest.raises(RuntimeError, match="size|shape|broadcast"):
        torch._foreach_add_([torch.ones(3).to(dev)], [torch.ones(2, 3).to(dev)])
    assert_same_list = [t.cpu() for t in floats]
    torch.testing.assert_close(assert_same_list[0], torch.full((2, 3), 3.0))
    if path == "functional":
        assert fast == [True]              # the second float call only
