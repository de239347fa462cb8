"""Legacy path: training loops match CPU eager, compile once, donate, and autograd works through views."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

import xla_compat as xc
from xla_compat import metrics, paths
from tests.conftest import assert_same
from tests.models import GPT, MLP


@pytest.fixture(autouse=True)
def legacy():
    import xla_compat.legacy  # noqa: F401  (registers the path)
    with paths.activated("legacy"):
        yield


def _train(model, data, opt_fn, loss_fn, device, steps):
    model = model.to(device)
    opt = opt_fn(model)
    x, y = (t.to(device) for t in data)
    losses, compiles, aliased = [], [], []
    for _ in range(steps):
        opt.zero_grad()
        loss = loss_fn(model, x, y)
        loss.backward()
        opt.step()
        if device != "cpu":
            xc.sync()
            compiles.append(metrics.counter("CompileTime"))
            aliased.append(metrics.counter("InputOutputAliasCount"))
        losses.append(loss.detach().to("cpu"))
    return model, losses, compiles, aliased


CASES = {
    "mlp_sgd_momentum": (
        lambda: (MLP(), (torch.randn(24, 16), torch.randint(0, 4, (24,)))),
        lambda m: torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9),
        lambda m, x, y: F.cross_entropy(m(x), y), 1e-6),
    "transformer_adamw": (
        lambda: (GPT(), (lambda i: (i, torch.roll(i, -1, dims=1)))(torch.randint(0, 64, (4, 16)))),
        lambda m: torch.optim.AdamW(m.parameters(), lr=3e-3, weight_decay=0.1),
        lambda m, x, y: m(x, y)[1], 1e-5),   # AdamW amplifies ulp-level gradient noise (see
}                                            # tests/test_training.py)


@pytest.mark.parametrize("case", CASES)
def test_training_loop_matches_cpu_eager_compiles_once_and_donates(case):
    make, opt_fn, loss_fn, atol_w = CASES[case]
    torch.manual_seed(0)
    model, data = make()
    twin = copy.deepcopy(model)
    steps = 8
    ref, ref_losses, _, _ = _train(model, data, opt_fn, loss_fn, "cpu", steps)
    got, losses, compiles, aliased = _train(twin, data, opt_fn, loss_fn, xc.device(), steps)
    for i, (a, e) in enumerate(zip(losses, ref_losses)):
        assert_same(a, e, rtol=1e-5, atol=1e-6, msg=f"loss at step {i}")
    for (name, p), r in zip(got.state_dict().items(), ref.state_dict().values()):
        assert_same(p, r, rtol=1e-5, atol=atol_w, msg=name)
    assert compiles[2] == compiles[-1], f"recompiled after warm-up: {compiles}"
    # Parameters and optimizer state are overwritten every step: their buffers are donated.
    grew = [b - a for a, b in zip(aliased[2:], aliased[3:])]
    assert all(g > 0 and g == grew[0] for g in grew), aliased


# 15 s: make test-slow's. make test holds the same property on both paths in
# test_spec_paths (50 optimizer steps) and test_reliability_long (300 steps).
@pytest.mark.slow
def test_live_device_buffers_do_not_grow_over_a_loop():
    import gc

    from xla_compat.legacy.alias import live_aliases, loose_tensors
    torch.manual_seed(0)
    model = MLP().to(xc.device())
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    x, y = torch.randn(8, 16).to(xc.device()), torch.randint(0, 4, (8,)).to(xc.device())
    counts = []
    for _ in range(12):
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
        xc.sync()
        gc.collect()
        counts.append(len(live_aliases()) + len(loose_tensors()))   # storages
    assert counts[3] == counts[-1], counts


def test_kv_cache_write_through_transposed_view_compiles_once():
    dev = xc.device()
    cache_cpu = torch.zeros(2, 8, 4)          # (heads, seq, dim) written as (dim, seq) views
    cache = cache_cpu.to(dev)
    compiles = []
    for step in range(6):
        new = torch.full((2, 4), float(step + 1))
        for c, n in ((cache_cpu, new), (cache, new.to(dev))):
            c.transpose(1, 2)[:, :, step % 2].copy_(n)     # positions are static indices
            c.transpose(1, 2)[:, 1:3, 4:].mul_(1.5)
        xc.sync()
        compiles.append(metrics.counter("CompileTime"))
    assert_same(cache, cache_cpu)
    assert compiles[1] == compiles[-1], compiles


VIEW_PROGRAMS = {
    "transpose_then_inplace": lambda x: (lambda y: (y.t()[1].mul_(3), y)[1])(x * 2).sum(),
    "slice_inplace_then_reduce": lambda x: (lambda y: (y[:, 1:3].exp_(), y)[1])(x + 0).pow(2).sum(),
    "diagonal_read": lambda x: x.diagonal().pow(2).sum() + x.diagonal(1).sum(),
    "unfold_read": lambda x: x.unfold(1, 2, 1).exp().sum(),
    "expand_read": lambda x: (x[:1].expand(3, 4) * x[:3]).sum(),
    "as_strided_read": lambda x: x.as_strided((2, 2), (1, 4), 1).sin().sum(),
    "split_unbind": lambda x: sum(p.sum() * i for i, p in enumerate(x.split(1))) + x.unbind(1)[2].sum(),
    "view_reshape_permute": lambda x: x.view(2, 6).permute(1, 0).reshape(3, 4).mul(
        torch.arange(12.0, device=x.device).view(3, 4)).sum(),
    "inplace_on_base_after_view": lambda x: (lambda y: (y.add_(1), (y.t() * y.t()).sum())[1])(x * 1),
}


@pytest.mark.parametrize("name", VIEW_PROGRAMS)
def test_autograd_through_views_matches_cpu(name):
    prog = VIEW_PROGRAMS[name]
    torch.manual_seed(0)
    a = torch.randn(3, 4, requires_grad=True)
    b = a.detach().to(xc.device()).requires_grad_()
    la, lb = prog(a), prog(b)
    la.backward()
    lb.backward()
    assert_same(lb, la, rtol=1e-5, atol=1e-5)
    assert_same(b.grad, a.grad, rtol=1e-5, atol=1e-5)


def test_parameter_grads_through_inplace_view_write_match_cpu():
    torch.manual_seed(0)
    lin = torch.nn.Linear(4, 6)
    twin = copy.deepcopy(lin).to(xc.device())
    x = torch.randn(5, 4)
    outs = []
    for m, inp in ((lin, x), (twin, x.to(xc.device()))):
        h = m(inp)
        h.t()[2:4].mul_(3)          # in-place through a view of a non-leaf
        h[:, 0].add_(1)
        loss = h.pow(2).sum()
        loss.backward()
        outs.append(loss)
    assert_same(outs[1], outs[0], rtol=1e-5, atol=1e-5)
    assert_same(twin.weight.grad, lin.weight.grad, rtol=1e-5, atol=1e-5)
    assert_same(twin.bias.grad, lin.bias.grad, rtol=1e-5, atol=1e-5)
