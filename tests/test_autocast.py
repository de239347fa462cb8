"""``torch.autocast("hlo")`` casts like CUDA's autocast on both paths, against CPU eager running
the same casts by hand. Before session 26 every op inside ``torch.autocast("hlo")`` failed
("Could not run 'aten::matmul' with arguments from the 'Autocasthlo' backend")."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import xla_compat as xc
from tests.conftest import assert_same

H, B, F32, F64 = torch.float16, torch.bfloat16, torch.float32, torch.float64


def _inputs():
    g = torch.Generator().manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=g)   # noqa: E731
    return {"a": r(4, 6), "b": r(6, 5), "c": r(4, 5), "v": r(6), "img": r(1, 2, 5, 5),
            "k": r(3, 2, 3, 3), "p": r(4, 5).abs() + 0.5, "i": torch.arange(6).reshape(2, 3),
            "d": r(4, 6).double(), "h": r(4, 5).half(), "q": r(2, 3, 4), "bb": r(2, 4, 3), "tgt": torch.tensor([0, 1, 2, 3])}


# name -> (what runs inside autocast, the CPU reference with the casts spelled out, its dtype
# under the float16 autocast dtype)
CASES = {
    "mm": (lambda t: t["a"] @ t["b"], lambda t: t["a"].half() @ t["b"].half(), H),
    "linear": (lambda t: F.linear(t["a"], t["b"].t(), t["c"][0]),
               lambda t: F.linear(t["a"].half(), t["b"].t().half(), t["c"][0].half()), H),
    "addmm": (lambda t: torch.addmm(t["c"], t["a"], t["b"]),
              lambda t: torch.addmm(t["c"].half(), t["a"].half(), t["b"].half()), H),
    "bmm": (lambda t: torch.bmm(t["q"], t["bb"]), lambda t: torch.bmm(t["q"].half(),
                                                                       t["bb"].half()), H),
    "conv2d": (lambda t: F.conv2d(t["img"], t["k"]),
               lambda t: F.conv2d(t["img"].half(), t["k"].half()), H),
    "mv": (lambda t: torch.mv(t["a"], t["v"]), lambda t: torch.mv(t["a"].half(),
                                                                  t["v"].half()), H),
    "exp of half": (lambda t: t["h"].exp(), lambda t: t["h"].float().exp(), F32),
    "log of mm": (lambda t: (t["a"] @ t["b"]).abs().log(),
                  lambda t: (t["a"].half() @ t["b"].half()).abs().float().log(), F32),
    "pow": (lambda t: t["h"] ** 2, lambda t: t["h"].float() ** 2, F32),
    "layer_norm": (lambda t: F.layer_norm(t["h"], (5,)),
                   lambda t: F.layer_norm(t["h"].float(), (5,)), F32),
    "mse_loss": (lambda t: F.mse_loss(t["h"], t["c"]),
                 lambda t: F.mse_loss(t["h"].float(), t["c"]), F32),
    "sum": (lambda t: t["h"].sum(), lambda t: t["h"].sum(dtype=F32), F32),
    "softmax": (lambda t: torch.softmax(t["h"], 1), lambda t: torch.softmax(t["h"], 1, F32),
                F32),
    "softmax keeps its dtype": (lambda t: torch.softmax(t["h"], 1, dtype=H),
                                lambda t: torch.softmax(t["h"], 1, dtype=H), H),
    "cumsum": (lambda t: t["h"].cumsum(0), lambda t: t["h"].cumsum(0, dtype=F32), F32),
    "norm": (lambda t: torch.norm(t["h"]), lambda t: torch.norm(t["h"].float()), F32),
    "norm dim": (lambda t: torch.norm(t["h"], 2, 1), lambda t: torch.norm(t["h"].float(), 2, 1),
                 F32),
    "addcmul promotes": (lambda t: torch.addcmul(t["h"], t["c"], t["h"]),
                         lambda t: torch.addcmul(t["h"].float(), t["c"], t["h"].float()), F32),
    "addcmul of half": (lambda t: torch.addcmul(t["h"], t["h"], t["h"]),
                        lambda t: torch.addcmul(t["h"], t["h"], t["h"]), H),
    "relu falls through": (lambda t: torch.relu(t["h"]), lambda t: torch.relu(t["h"]), H),
    "add promotes as usual": (lambda t: t["h"] + t["c"], lambda t: t["h"] + t["c"], F32),
    "float64 untouched": (lambda t: t["d"] @ t["b"].double(), lambda t: t["d"] @ t["b"].double(),
                          F64),
    "int untouched": (lambda t: t["i"] @ t["i"].t(), lambda t: t["i"] @ t["i"].t(), torch.int64),
    "cross_entropy": (lambda t: F.cross_entropy(t["a"] @ t["b"], t["tgt"]),
                      # (its composite asks log_softmax for the input's own dtype)
                      lambda t: F.nll_loss(torch.log_softmax(t["a"].half() @ t["b"].half(), 1,
                                                             dtype=H).float(), t["tgt"]), F32),
}


def test_autocast_casts_like_cuda(path, dev):
    """Every case in one autocast region and one graph, each result against its reference."""
    cpu = _inputs()
    hlo = {k: v.to(dev) for k, v in cpu.items()}
    with torch.autocast("hlo"):
        got = {name: fn(hlo) for name, (fn, _, _) in CASES.items()}
        with torch.autocast("hlo", enabled=False):
            off = hlo["a"] @ hlo["b"]
    assert off.dtype == F32
    for name, (_, ref, dtype) in CASES.items():
        want = ref(cpu)
        assert got[name].dtype == want.dtype == dtype, name
        tol = 1e-3 if dtype in (H, B) else 1e-5
        assert_same(got[name], want, rtol=tol, atol=tol, msg=name)
    assert xc.metrics.fallback_ops() == []


def test_autocast_bfloat16_dtype_and_banned_ops(path, dev):
    x = torch.randn(3, 4).to(dev)
    with torch.autocast("hlo", dtype=torch.bfloat16):
        assert torch.get_autocast_dtype("hlo") == B
        assert (x @ x.t()).dtype == B
        with pytest.raises(RuntimeError, match="unsafe to autocast"):
            F.binary_cross_entropy(torch.rand(3).to(dev), torch.rand(3).to(dev))
    assert (x @ x.t()).dtype == F32


def test_autocast_training_matches_cpu_autocast(path, dev):
    """An MLP step under bfloat16 autocast: linear in bfloat16, the loss in float32, float32
    gradients; CPU's autocast casts these ops alike."""
    def step(device):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                                    torch.nn.Linear(16, 4)).to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        x = torch.randn(5, 8, generator=torch.Generator().manual_seed(1)).to(device)
        y = torch.randn(5, 4, generator=torch.Generator().manual_seed(2)).to(device)
        losses = []
        for _ in range(2):
            opt.zero_grad()
            with torch.autocast(torch.device(device).type, dtype=torch.bfloat16):
                out = model(x)
                loss = F.mse_loss(out, y)
            assert out.dtype == B and loss.dtype == F32
            loss.backward()
            opt.step()
            losses.append(loss.detach().cpu())
        return losses, [p.detach().cpu() for p in model.parameters()]
    want, got = step("cpu"), step(dev)
    assert_same(got, want, rtol=1e-2, atol=1e-2)
    assert xc.metrics.fallback_ops() == []


def _casts_in(fn) -> int:
    """How many casts (``_to_copy``) ``fn()`` dispatches."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten._to_copy.default:
                Count.n += 1
            return func(*args, **(kwargs or {}))
    with Count():
        fn()
    return Count.n


def test_a_weight_is_cast_once_per_region_and_its_gradient_is_eagers(path, dev):
    """torch's cached_cast: a float32 weight used by four matmuls in one region is cast once
    (an RNN loop's weights are cast once, not per step), anew in the next region, and never
    with the cache off, as CPU autocast casts it; the gradient is CPU autocast's."""
    def run(device, cache=True):
        torch.manual_seed(0)
        w = torch.randn(4, 4).to(device).requires_grad_()
        h = torch.randn(2, 4).to(device)

        def compute():
            nonlocal h
            with torch.autocast(device if device == "cpu" else "hlo", dtype=torch.bfloat16,
                                cache_enabled=cache):
                for _ in range(4):
                    h = torch.tanh(h @ w)
            h.float().sum().backward()
        casts = _casts_in(compute)
        return casts, h, w.grad

    cached, uncached = run(dev)[0], run(dev, cache=False)[0]
    assert uncached - cached == 6     # w cast once, not 4 times: 3 casts fewer, and 3 grads
    assert (cached, uncached) == (run("cpu")[0], run("cpu", cache=False)[0])   # eager's count
    from xla_compat import autocast
    assert autocast._cached == {}                            # cleared when the region exited
    _, h, grad = run(dev)
    _, want_h, want_grad = run("cpu")
    assert_same([h, grad], [want_h.detach(), want_grad], rtol=2e-2, atol=2e-2)
