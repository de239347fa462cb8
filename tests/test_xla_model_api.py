"""The torch_xla-shaped API (xm, met): a torch_xla-style script runs with only its imports changed."""
from __future__ import annotations

import os

import torch

import xla_compat.core.xla_model as xm
import xla_compat.debug.metrics as met
from tests.conftest import assert_same
from tests.scripts.xla_style_train import train


def test_torch_xla_style_script_matches_cpu_eager(path, tmp_path):
    ckpt = tmp_path / "model.pt"
    losses, weights = train(checkpoint=ckpt)
    ref_losses, ref_weights = train(device=torch.device("cpu"))
    assert_same(torch.tensor(losses), torch.tensor(ref_losses), rtol=1e-5, atol=1e-6)
    for name, w in weights.items():
        assert_same(w, ref_weights[name], rtol=1e-5, atol=1e-6, msg=name)
    saved = torch.load(ckpt)
    assert all(t.device.type == "cpu" for t in saved.values())
    assert_same(saved["0.weight"], ref_weights["0.weight"], rtol=1e-5, atol=1e-6)


def test_xm_device_and_tensor_queries(path):
    dev = xm.xla_device()
    assert str(dev) == "hlo:0"
    assert xm.get_xla_supported_devices() == ["hlo:0"]
    assert xm.is_xla_tensor(torch.ones(2, device=dev)) and not xm.is_xla_tensor(torch.ones(2))
    assert xm.get_ordinal() == 0 and xm.xrt_world_size() == 1 and xm.is_master_ordinal()
    assert xm.xla_device_hw(dev) == "CPU"


def test_xr_runtime_queries_answer_for_one_process_driving_every_device(path):
    import jax

    import xla_compat.runtime as xr
    assert xr.device_type() == "CPU"
    assert (xr.world_size(), xr.global_ordinal(), xr.local_ordinal()) == (1, 0, 0)
    assert (xr.process_index(), xr.process_count()) == (0, 1)
    assert xr.global_runtime_device_count() == xr.addressable_runtime_device_count() \
        == len(jax.devices())
    xr.use_spmd()
    assert xr.is_spmd()
    if not os.environ.get("XLA_PERSISTENT_CACHE_PATH"):
        assert xr.is_cache_initialized() is False     # no persistent compile cache unless asked


def test_met_counters_and_metrics_have_torch_xla_shapes(path):
    from xla_compat import executor
    executor.clear_cache()  # the twin test on the other path may have compiled this graph
    met.clear_all()
    dev = xm.xla_device()
    x = torch.randn(4, 4).to(dev)
    (x @ x).sum().item()
    xm.mark_step()
    assert "CompileTime" in met.metric_names() and "ExecuteTime" in met.metric_names()
    count, total, samples = met.metric_data("CompileTime")
    assert count >= 1 and total > 0 and len(samples) == count
    assert all(len(s) == 2 for s in samples)
    assert met.counter_value("MarkStep") == 1
    assert met.counter_value("NoSuchCounter") is None
    assert "MarkStep" in met.counter_names()
    assert "Metric: CompileTime" in met.metrics_report()
    assert "CompileTime" in met.short_metrics_report()
    met.clear_counters()
    assert met.counter_value("MarkStep") is None and met.metric_data("CompileTime") is not None
    met.clear_all()
    assert met.metric_data("CompileTime") is None


def test_executed_fallback_ops_lists_cpu_fallbacks(path):
    from xla_compat.lowering import registry
    from xla_compat import settings
    op = torch.ops.aten.atan2.default
    before = registry._RULES.pop(op)
    try:
        met.clear_all()
        with settings.override(cpu_fallback="silent"):
            a = torch.randn(3, device=xm.xla_device())
            torch.atan2(a, a).cpu()
        assert met.executed_fallback_ops() == ["aten::atan2"]
    finally:
        registry._RULES[op] = before


def test_optimizer_step_with_barrier_marks_a_step(path):
    dev = xm.xla_device()
    p = torch.nn.Parameter(torch.ones(3, device=dev))
    opt = torch.optim.SGD([p], lr=0.5)
    p.sum().backward()
    met.clear_all()
    xm.optimizer_step(opt, barrier=True)
    assert met.counter_value("MarkStep") == 1
    assert_same(p, torch.full((3,), 0.5))
