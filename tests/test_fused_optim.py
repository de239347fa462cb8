"""``fused=True`` optimizers and ``torch.amp.GradScaler`` on the device match CPU eager's fused
kernels on both paths, without CPU fallbacks and without a recompile when the learning rate
changes. Before session 26 legacy ran every fused step and both GradScaler kernels on the CPU;
on the functional path Adam/AdamW without amsgrad and SGD without momentum stopped on an
internal assert (an empty state list), SGD and Adagrad found no meta kernel."""
from __future__ import annotations

import pytest
import torch

import xla_compat as xc
from xla_compat import metrics
from tests.conftest import assert_same
from tests.sampling import one_path_each

OPTIMIZERS = {
    "adam": (torch.optim.Adam, dict(lr=0.01)),
    "adam amsgrad maximize decay": (torch.optim.Adam,
                                    dict(lr=0.02, amsgrad=True, maximize=True, weight_decay=0.1)),
    "adamw": (torch.optim.AdamW, dict(lr=0.01, weight_decay=0.05, betas=(0.8, 0.9))),
    "adamw amsgrad": (torch.optim.AdamW, dict(lr=0.01, amsgrad=True)),
    "sgd": (torch.optim.SGD, dict(lr=0.1)),
    "sgd nesterov decay": (torch.optim.SGD,
                           dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.01)),
    "sgd dampening maximize": (torch.optim.SGD,
                               dict(lr=0.05, momentum=0.5, dampening=0.3, maximize=True)),
    "adagrad": (torch.optim.Adagrad, dict(lr=0.1, lr_decay=0.01, weight_decay=0.1)),
    "adam tensor lr": (torch.optim.Adam, dict(lr=torch.tensor(0.01))),
}


def _model(device, dtype=torch.float32):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.Tanh(),
                               torch.nn.Linear(4, 2)).to(device=device, dtype=dtype)


def _train(device, name, steps=3, scaler=None, dtype=torch.float32, inf_at=None, fused=True):
    """Parameters, optimizer state and (with a scaler) its scale after ``steps`` steps."""
    cls, kwargs = OPTIMIZERS[name]
    kwargs = dict(kwargs, fused=fused)
    if isinstance(kwargs["lr"], torch.Tensor):
        kwargs["lr"] = kwargs["lr"].clone()
    model = _model(device, dtype)
    opt = cls(model.parameters(), **kwargs)
    x = torch.randn(3, 5, generator=torch.Generator().manual_seed(1)).to(device, dtype)
    scales = []
    for step in range(steps):
        opt.zero_grad()
        loss = model(x).float().pow(2).sum()
        if step == inf_at:
            loss = loss * float("inf")
        if scaler is None:
            loss.backward()
            opt.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            scales.append(scaler._get_scale_async().clone())   # (read at the end: no sync)
    if torch.device(device).type == "hlo":
        xc.sync()                  # (one graph for everything read below, not one per tensor)
    params = [p.detach().cpu() for p in model.parameters()]
    state = [v.detach().cpu() for s in opt.state.values() for v in s.values()
             if isinstance(v, torch.Tensor)]
    return params, state, [float(s.cpu()) for s in scales]


@pytest.mark.parametrize("path,name", one_path_each(OPTIMIZERS), indirect=["path"])
def test_fused_optimizer_matches_eager(path, dev, name):
    want = _train("cpu", name, steps=2)
    got = _train(dev, name, steps=2)
    assert_same(got[0], want[0])
    assert_same(got[1], want[1])
    assert xc.metrics.fallback_ops() == []


@pytest.mark.parametrize("path,name", one_path_each(
    ["adam amsgrad maximize decay", "sgd nesterov decay", "adagrad"]), indirect=["path"])
def test_fused_optimizer_bfloat16_rounds_like_eager(path, dev, name):
    """bfloat16 parameters: eager computes in float32 and stores each tensor once.

    The reference for SGD is eager's unfused step: torch 2.13's fused CPU SGD kernel for
    bfloat16/float16 never stores the parameters its vector loop updates and reads the momentum
    buffer as float32 (only the last ``numel % 16`` elements are right); the device computes what
    the scalar loop and CUDA's kernel do."""
    want = _train("cpu", name, steps=2, dtype=torch.bfloat16, fused=not name.startswith("sgd"))
    got = _train(dev, name, steps=2, dtype=torch.bfloat16)
    for g, w in zip(got[0] + got[1], want[0] + want[1]):
        assert g.dtype == w.dtype
        # a bfloat16 rounding step apart at most (eager's vector loop casts a few coefficients
        # through bfloat16 that its scalar loop keeps in float32; the unfused step rounds
        # after every op)
        assert_same(g.float(), w.float(), rtol=1.6e-2, atol=1e-2)
    assert xc.metrics.fallback_ops() == []


SCALED = {"adam": True, "adagrad": True, "sgd nesterov decay": False}


@pytest.mark.parametrize("path,name", one_path_each(SCALED), indirect=["path"])
def test_grad_scaler_skips_inf_steps_and_scales_like_eager(path, dev, name):
    """A step whose gradients overflow changes nothing and halves the scale; a clean step
    (``growth_interval=1``) doubles it. A fused step unscales the gradients itself (grad_scale /
    found_inf); the unfused SGD goes through ``unscale_``'s kernel."""
    def scaler(device):
        return torch.amp.GradScaler(torch.device(device).type, init_scale=2.0 ** 10,
                                    growth_interval=1)
    fused = SCALED[name]
    want = _train("cpu", name, steps=3, scaler=scaler("cpu"), inf_at=1, fused=fused)
    got = _train(dev, name, steps=3, scaler=scaler(dev), inf_at=1, fused=fused)
    assert got[2] == want[2] == [2.0 ** 11, 2.0 ** 10, 2.0 ** 11]
    assert_same(got[0], want[0])
    assert_same(got[1], want[1])
    assert xc.metrics.fallback_ops() == []


def test_amp_kernels_match_eager(path, dev):
    """The two GradScaler kernels called directly, non-finite values of every kind."""
    grads = [torch.tensor([1.0, 2.0, -4.0]), torch.tensor([[0.5, float("nan")]]),
             torch.tensor([float("-inf")])]
    for chosen in ([0], [0, 1], [2], [0, 1, 2]):
        for prior in (0.0, 1.0):
            cpu = [grads[i].clone() for i in chosen]
            hlo = [t.to(dev) for t in cpu]
            found_cpu, found_hlo = torch.tensor([prior]), torch.tensor([prior]).to(dev)
            inv = torch.tensor([0.25])
            torch._amp_foreach_non_finite_check_and_unscale_(cpu, found_cpu, inv)
            torch._amp_foreach_non_finite_check_and_unscale_(hlo, found_hlo, inv.to(dev))
            assert_same([t.cpu() for t in hlo], cpu)
            assert_same(found_hlo.cpu(), found_cpu)
    for found in (0.0, 1.0):
        for tracker in (0, 2, 3):
            for scale in (3.0, 3e38):
                s_cpu, t_cpu = torch.tensor([scale]), torch.tensor([tracker], dtype=torch.int32)
                s_hlo, t_hlo = s_cpu.to(dev), t_cpu.to(dev)
                for s, t, f in ((s_cpu, t_cpu, torch.tensor([found])),
                                (s_hlo, t_hlo, torch.tensor([found]).to(dev))):
                    torch._amp_update_scale_(s, t, f, 2.0, 0.5, 3)
                assert_same(s_hlo.cpu(), s_cpu)
                assert torch.equal(t_hlo.cpu(), t_cpu)
    assert xc.metrics.fallback_ops() == []


def test_fused_step_direct_call_with_found_inf(path, dev):
    """``found_inf == 1`` leaves parameters, gradients and state as they were."""
    p, g = torch.randn(4, 3), torch.randn(4, 3)
    m, v, step = torch.zeros(4, 3), torch.zeros(4, 3), torch.tensor(1.0)
    results = []
    for device in ("cpu", dev):
        ts = [t.clone().to(device) for t in (p, g, m, v, step)]
        for found in (1.0, 0.0):
            torch._fused_adamw_([ts[0]], [ts[1]], [ts[2]], [ts[3]], [], [ts[4]], lr=0.1,
                                beta1=0.9, beta2=0.99, weight_decay=0.1, eps=1e-8,
                                amsgrad=False, maximize=False,
                                grad_scale=torch.tensor(2.0).to(device),
                                found_inf=torch.tensor(found).to(device))
            results.append([t.to("cpu", copy=True) for t in ts])
    assert_same(results[2], results[0])
    assert_same(results[3], results[1])
    assert torch.equal(results[0][0], p)         # the skipped step wrote nothing


def test_changing_learning_rate_compiles_once(path, dev):
    """An LR scheduler changes ``lr`` every step: a run-time parameter, never a recompile."""
    model = _model(dev)
    opt = torch.optim.Adam(model.parameters(), lr=0.01, fused=True)
    sched = torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.5)
    x = torch.randn(3, 5).to(dev)
    compiles = []
    for _ in range(4):
        opt.zero_grad()
        model(x).pow(2).sum().backward()
        opt.step()
        sched.step()
        xc.sync()
        compiles.append(metrics.counter("CompileTime"))
    assert compiles[1] == compiles[2] == compiles[3]


def test_mismatched_state_lists_raise_clear_errors(path, dev):
    p = [torch.zeros(3).to(dev), torch.zeros(2).to(dev)]
    with pytest.raises(RuntimeError, match=r"_fused_sgd_.*momentum_buffer_list"):
        torch._fused_sgd_(p, [t.clone() for t in p], [torch.zeros(3).to(dev)],
                          weight_decay=0.0, momentum=0.9, lr=0.1, dampening=0.0,
                          nesterov=False, maximize=False, is_first_step=True)
    with pytest.raises(RuntimeError, match=r"_fused_adagrad_.*shape"):
        torch._fused_adagrad_(p, [torch.zeros(3).to(dev), torch.zeros(5).to(dev)],
                              [t.clone() for t in p], [torch.tensor(1.0).to(dev)] * 2,
                              lr=0.1, lr_decay=0.0, weight_decay=0.0, eps=1e-10,
                              maximize=False)


def test_dual_run_and_step_capture_of_an_autocast_fused_step(dev):
    """A bfloat16-autocast step with fused AdamW agrees across the paths (dual-run) and replays
    under step capture to the traced run's weights."""
    def setup():
        torch.manual_seed(0)
        model = _model(dev)
        return model, torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)

    def step(model, opt, x):
        opt.zero_grad()
        with torch.autocast("hlo", dtype=torch.bfloat16):
            loss = model(x).float().pow(2).mean()
        loss.backward()
        opt.step()
        return loss

    x = torch.randn(3, 5, generator=torch.Generator().manual_seed(1)).to(dev)
    model, opt = setup()
    for _ in range(2):
        assert xc.dual_run(step, model, opt, x).match
    traced, captured = setup(), setup()
    replay = xc.compile(step)
    for _ in range(3):
        step(*traced, x)
        replay(*captured, x)
    xc.sync()
    assert metrics.counter("StepCaptureReplay") >= 1
    assert_same([p.cpu() for p in captured[0].parameters()],
                [p.cpu() for p in traced[0].parameters()])
    assert xc.metrics.fallback_ops() == []
