"""linear_cross_entropy's chunked custom ops (torch_nn::) run as one lowering rule on both paths,
with no CPU fallback: loss and gradients match eager's chunked loop, with class weights,
ignore_index, label smoothing and a bias; reduction mean, sum and none."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import xla_compat as xc
from tests.lowering._core import core_no_fallback, dev  # noqa: F401 (autouse fixture)

Options = pytest.importorskip(
    "torch.nn.modules.linear_cross_entropy_options").LinearCrossEntropyOptions


@pytest.mark.parametrize("reduction,allow_retain_graph", [("mean", True), ("sum", False),
                                                          ("none", False)])
@pytest.mark.parametrize("extras", ["plain", "bias_weights_ignore", "smoothing"])
def test_chunked_linear_cross_entropy_matches_eager(path, reduction, allow_retain_graph, extras):
    torch.manual_seed(0)
    x, w = torch.randn(8, 5), torch.randn(6, 5)
    target = torch.randint(0, 6, (8,))
    kw = {}
    if extras == "bias_weights_ignore":
        target[2] = -100
        kw = dict(linear_bias=torch.randn(6), weight=torch.rand(6) + 0.5, ignore_index=-100)
    elif extras == "smoothing" and reduction != "none":
        kw = dict(label_smoothing=0.2)
    opts = Options(allow_retain_graph=allow_retain_graph, batch_chunk_size=3)

    def run(device):
        xx = x.detach().clone().to(device).requires_grad_()
        ww = w.detach().clone().to(device).requires_grad_()
        extra = {k: (v.detach().clone().to(device).requires_grad_() if k == "linear_bias" else
                     v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
        loss = F.linear_cross_entropy(xx, ww, target.to(device), reduction=reduction,
                                      options=opts, **extra)
        g = torch.linspace(0.5, 1.5, loss.numel()).reshape(loss.shape).to(device)
        with torch.autograd.set_multithreading_enabled(False):   # paths are per thread
            (loss * g).sum().backward()
        grads = [xx.grad, ww.grad] + ([extra["linear_bias"].grad] if "linear_bias" in extra
                                      else [])
        return [t.detach().cpu() for t in [loss] + grads]

    expected = run("cpu")
    before = dict(xc.metrics.counters())
    actual = run(xc.device())
    assert not any(k.startswith(("aten::", "torch_nn::")) and v != before.get(k)
                   for k, v in xc.metrics.counters().items())
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-5)
