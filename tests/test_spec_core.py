"""Spec checks for the core issue (the hlo device, LazyTensor IR, lowering, executor) that the
other test files leave implicit: each test names one requirement and compares with CPU eager."""
from __future__ import annotations

import os
import re
import warnings

import pytest
import torch
import torch.nn.functional as F

import xla_compat as xc
from xla_compat import metrics, paths, settings
from xla_compat.lazy.tensor import LazyTensor
from xla_compat.lowering import registry
from tests.conftest import assert_same
from tests.models import MLP

aten = torch.ops.aten


# -- 2. the device: the factories and transfers test_device.py does not name ----------------------

def test_empty_random_like_factories_and_string_device_transfers(path, dev):
    e = torch.empty(2, 3, device=dev)
    el = torch.empty_like(e, dtype=torch.int32)
    big = torch.empty(4000, device=dev)
    r, n, i = torch.rand_like(big), torch.randn_like(big), torch.randint_like(big, 2, 7)
    i32 = torch.randint(10, (50,), device=dev, dtype=torch.int32)
    xc.sync()                                             # one graph for every draw
    assert (e.shape, e.dtype, e.device) == ((2, 3), torch.float32, dev)
    assert (el.shape, el.dtype, el.device) == ((2, 3), torch.int32, dev)
    r, n, i, i32 = r.cpu(), n.cpu(), i.cpu(), i32.cpu()
    assert 0 <= r.min() and r.max() < 1 and abs(r.mean() - 0.5) < 0.05
    assert abs(n.mean()) < 0.1 and abs(n.std() - 1) < 0.1
    assert i.dtype == torch.float32 and set(i.unique().tolist()) == {2.0, 3.0, 4.0, 5.0, 6.0}
    assert i32.dtype == torch.int32 and 0 <= i32.min() and i32.max() < 10
    c = torch.arange(6).reshape(2, 3)
    for moved in (c.to("hlo"), c.to("hlo:0"), torch.tensor(c.tolist(), device="hlo")):
        assert moved.device == dev
        assert_same(moved, c, rtol=0, atol=0)


# -- 3. LazyTensor and its IR ----------------------------------------------------------------------

def test_ops_only_record_ir_until_a_sync_or_a_transfer_runs_them(path, dev):
    x = torch.arange(6.0).to(dev)
    xc.sync()
    runs, nodes = metrics.counter("ExecuteTime"), metrics.counter("IrNodes")
    y = (x * 2 + 1).exp()
    z = x.sum()
    assert metrics.counter("ExecuteTime") == runs          # nothing ran yet
    assert metrics.counter("IrNodes") >= nodes + 4         # mul, add, exp, sum were recorded
    xc.sync()
    assert metrics.counter("ExecuteTime") == runs + 1      # one graph for both y and z
    w = x - 3
    assert metrics.counter("ExecuteTime") == runs + 1
    assert_same(w, torch.arange(6.0) - 3)                  # the transfer runs w's graph
    assert metrics.counter("ExecuteTime") == runs + 2
    assert_same([y, z], [(torch.arange(6.0) * 2 + 1).exp(), torch.arange(6.0).sum()])


def test_on_the_bare_core_views_are_copies_and_in_place_ops_rebind_only_their_tensor(dev):
    cpu = torch.arange(6.0).reshape(2, 3)
    with paths.activated("core"):
        x = cpu.to(dev)
        assert type(x) is LazyTensor
        v = x.t()                      # a *_copy: a tensor of its own, no alias with x
        before = v._value
        v.mul_(10)
        assert v._value is not before  # the in-place op rebound v's own IR value
        x.add_(1)
        assert_same(v, cpu.t() * 10)   # x's write does not reach v ...
        assert_same(x, cpu + 1)        # ... nor v's write x
        xc.sync()
        assert_same([x, v], [cpu + 1, cpu.t() * 10])


# -- 4. lowering: the transformer trains without any CPU fallback ---------------------------------
# (the CNN's is tests/lowering/test_nn_training.py; test_training.py compares all three with eager)

def test_a_transformer_step_with_dropout_needs_no_cpu_fallback(path, dev):
    from tests.models import GPT
    torch.manual_seed(0)
    model = GPT(d=16, heads=2, layers=1, seq=8, dropout=0.1).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    idx = torch.randint(0, 64, (2, 8)).to(dev)
    with settings.override(cpu_fallback="error"):
        loss = model(idx, torch.roll(idx, -1, dims=1))[1]
        loss.backward()
        opt.step()
        xc.sync()
    assert torch.isfinite(loss.detach().cpu())
    assert metrics.fallback_ops() == []


# -- 5. CPU fallback: one warning per op, every call counted ---------------------------------------

def test_cpu_fallback_warns_once_per_op_and_counts_every_call(path, dev):
    from xla_compat.lazy import tracer
    rule = registry._RULES.pop(aten.atan2.default)
    tracer._warned.discard(aten.atan2.default)
    try:
        a, b = torch.randn(5), torch.randn(5)
        with settings.override(cpu_fallback="warn"), warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            outs = [torch.atan2(a.to(dev), b.to(dev)) for _ in range(3)]
        mine = [w for w in seen if "aten.atan2" in str(w.message)]
        assert len(mine) == 1, [str(w.message) for w in mine]
        assert metrics.counter("aten::atan2") == 3
        for out in outs:
            assert_same(out, torch.atan2(a, b))
    finally:
        registry._RULES[aten.atan2.default] = rule


# -- 6. the executor: device data are parameters, x64 ----------------------------------------------

def test_device_data_are_graph_parameters_so_new_values_reuse_the_compiled_graph(path, dev):
    def f(a):
        return (a @ a.t()).relu() + 1

    new_compiles = []
    for seed in range(3):
        c = torch.randn(5, 5, generator=torch.Generator().manual_seed(seed))
        d = c.to(dev)
        xc.sync()
        before = metrics.counter("CompileTime")
        out = f(d)
        xc.sync()
        new_compiles.append(metrics.counter("CompileTime") - before)
        assert_same(out, f(c))
    assert new_compiles[1:] == [0, 0], new_compiles
    text = xc.hlo_text([f(d)])
    assert re.search(r"%arg\d+: tensor<5x5xf32>", text), text   # the data is an argument ...
    assert "dense<[[" not in text                                 # ... not a baked-in constant


def test_jax_runs_with_x64_so_float64_and_int64_keep_their_precision(path, dev):
    import jax
    assert jax.config.read("jax_enable_x64")
    x = torch.tensor([1.0, 2.0 ** -40, 1e-300, 3.0], dtype=torch.float64)
    d = x.to(dev)
    assert_same((d + 1) - 1, (x + 1) - 1, rtol=0, atol=0)          # 2**-40 survives 1 + x - 1
    assert_same(d / 3 * 3, x / 3 * 3, rtol=0, atol=0)
    assert_same(d.sum(), x.sum(), rtol=0, atol=0)
    big = torch.tensor([2 ** 53 + 1, -(2 ** 62)], dtype=torch.int64)
    assert_same(big.to(dev) + 2, big + 2, rtol=0, atol=0)          # beyond float64's mantissa too


# -- 7. random numbers: the RNG state flows through the cached graph --------------------------------

def test_a_cached_random_graph_draws_new_numbers_every_run(path, dev):
    xc.manual_seed(11)
    x = torch.ones(256, device=dev)
    xc.sync()
    masks, compiles = [], []
    for _ in range(4):
        masks.append(F.dropout(x, 0.5, training=True).cpu())
        xc.sync()
        compiles.append(metrics.counter("CompileTime"))
    assert compiles[1:] == [compiles[0]] * 3, compiles     # the same executable every step ...
    assert len({tuple(m.tolist()) for m in masks}) == 4     # ... and a new mask each time


# -- 8. metrics: count and total time ----------------------------------------------------------------

def test_metrics_report_gives_count_and_total_time_of_compile_and_execute(path, dev):
    from xla_compat import executor
    executor.clear_cache()
    x = torch.randn(7).to(dev)
    for _ in range(2):
        (x * 3 - 1).cpu()
    report, counts = xc.metrics.report(), xc.metrics.counters()
    for name in ("CompileTime", "ExecuteTime"):
        m = re.search(rf"Metric: {name}\n  TotalSamples: (\d+)\n  Accumulator: ([\d.]+)(s|ms|us|ns)",
                      report)
        assert m, report
        assert int(m.group(1)) == counts[name] >= 1
        assert float(m.group(2)) > 0
    assert counts["CompileTime"] == 1 and counts["ExecuteTime"] == 2
    assert counts["CachedCompile"] == 1 and counts["IrNodes"] >= 4


# -- 8, 5. the environment variables: XLA_HLO_DUMP and XLA_CPU_FALLBACK=error ----------------------

@torch.library.custom_op("spec_core::twice", mutates_args=())
def _twice(x: torch.Tensor) -> torch.Tensor:
    """An op with a CPU kernel and no lowering."""
    return x * 2


@_twice.register_fake
def _(x):
    return torch.empty_like(x)


def test_env_vars_dump_every_compiled_graph_and_turn_fallback_into_an_error(path, dev, tmp_path,
                                                                          monkeypatch):
    from xla_compat import executor
    executor.clear_cache()
    dump = tmp_path / "graphs.txt"
    env = {k: v for k, v in os.environ.items() if not k.startswith("XLA_")}
    env.update(XLA_HLO_DUMP=str(dump), XLA_CPU_FALLBACK="error")
    # The settings the process would read at start-up with these variables set.
    monkeypatch.setattr(settings, "_current", settings.Settings.from_env(env))
    a = torch.randn(3, 4).to(dev)
    (a @ a.t()).cpu()
    (a + 1).cpu()
    with pytest.raises(xc.UnsupportedOpError) as err:
        _twice(a).cpu()
    msg = str(err.value)
    assert "spec_core.twice" in msg and "float32[3, 4]" in msg, msg
    assert "XLA_CPU_FALLBACK=error" in msg and f"{path} path" in msg, msg
    compiles = metrics.counter("CompileTime")
    text = dump.read_text()
    assert compiles >= 2 and text.count("## StableHLO") == compiles   # one entry per compile
    assert "aten.mm.default" in text and "dot_general" in text
    assert "aten.add.Tensor" in text


# -- must be shown: a training loop hits the cache once per step -----------------------------------

def test_identical_training_steps_compile_twice_then_hit_the_cache_once_per_step(path, dev):
    torch.manual_seed(0)
    model = MLP().to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    x, y = torch.randn(8, 16).to(dev), torch.randint(0, 4, (8,)).to(dev)
    xc.sync()
    seen = []
    for _ in range(6):
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
        xc.sync()
        seen.append((metrics.counter("CompileTime"), metrics.counter("CachedCompile")))
    compiles = [c for c, _ in seen]
    hits = [h for _, h in seen]
    assert compiles[1:] == [compiles[1]] * 5, seen          # momentum buffers appear at step 1
    assert [b - a for a, b in zip(hits[1:], hits[2:])] == [1, 1, 1, 1], seen
