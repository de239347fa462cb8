"""Long runs: after warm-up a training loop holds live device tensors, compile-cache entries and
process memory flat; the compile cache is an LRU with a size limit and an eviction counter."""
from __future__ import annotations

import copy
import gc

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import xla_compat as xc
from xla_compat import executor, metrics, settings
from xla_compat.lazy.tensor import live_tensors

WARMUP = 20
RSS_GROWTH_BOUND = 64 * 2**20     # bytes; a leak of one small graph or buffer per step exceeds it


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def _snapshot():
    gc.collect()
    return len(live_tensors()), len(executor.cache), rss_bytes()


def _long_run(dev, steps: int):
    torch.manual_seed(0)
    cpu_model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
    model = copy.deepcopy(cpu_model).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    x_cpu, y_cpu = torch.randn(8, 4), torch.randint(0, 2, (8,))
    x, y = x_cpu.to(dev), y_cpu.to(dev)
    after_warmup = None
    for i in range(steps):
        if i == WARMUP:
            after_warmup = _snapshot()
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        xc.sync()
    end = _snapshot()
    return cpu_model, model, (x_cpu, y_cpu), after_warmup, end, loss


def _check_flat(dev, steps):
    executor.clear_cache()
    cpu_model, model, (x, y), (live0, cache0, rss0), (live1, cache1, rss1), loss = \
        _long_run(dev, steps)
    assert live1 <= live0, f"live device tensors grew from {live0} to {live1} over {steps} steps"
    assert cache1 == cache0, f"compile-cache entries grew from {cache0} to {cache1}"
    assert rss1 - rss0 < RSS_GROWTH_BOUND, f"RSS grew by {(rss1 - rss0) / 2**20:.1f} MiB"
    # ... and the numbers are still right: the same loop on CPU eager ends at the same loss.
    opt = torch.optim.SGD(cpu_model.parameters(), lr=0.05, momentum=0.9)
    for _ in range(steps):
        opt.zero_grad()
        cpu_loss = F.cross_entropy(cpu_model(x), y)
        cpu_loss.backward()
        opt.step()
    torch.testing.assert_close(loss.cpu(), cpu_loss.detach(), rtol=1e-4, atol=1e-5)
    for p, q in zip(model.parameters(), cpu_model.parameters()):
        torch.testing.assert_close(p.cpu(), q.detach(), rtol=1e-4, atol=1e-5)


def test_300_step_loop_holds_device_tensors_cache_and_memory_flat(path, dev):
    _check_flat(dev, 300)


@pytest.mark.slow
def test_2000_step_loop_holds_device_tensors_cache_and_memory_flat(path, dev):
    _check_flat(dev, 2000)


def test_compile_cache_evicts_the_least_recently_used_graph_and_counts_it(path, dev):
    executor.clear_cache()
    x = {n: torch.ones(n).to(dev) for n in (2, 3, 4)}
    xc.sync()

    def run(n):        # one graph per shape
        return (x[n] * 3 + 1).cpu()

    with settings.override(compile_cache_size=2):
        run(2)
        run(3)
        assert len(executor.cache) == 2 and metrics.counter("CompileCacheEviction") == 0
        run(2)                                      # 2 is now the most recently used
        run(4)                                      # evicts 3, the least recently used
        assert len(executor.cache) == 2 and metrics.counter("CompileCacheEviction") == 1
        compiles = metrics.counter("UncachedCompile")
        run(2)                                      # still cached: no compile
        assert metrics.counter("UncachedCompile") == compiles
        assert torch.equal(run(3), torch.full((3,), 4.))   # recompiled after eviction
        assert metrics.counter("UncachedCompile") == compiles + 1
        assert metrics.counter("CompileCacheEviction") == 2 and len(executor.cache) == 2


def test_compile_cache_is_bounded_by_the_mappings_executables_hold(dev, monkeypatch):
    """Each executable holds memory mappings of its own; past vm.max_map_count LLVM cannot map
    the next one and the process dies (an L-BFGS job making new graphs every iteration did,
    session 26). The cache evicts its least recently used executables to stay within its
    mapping budget, and evicted executables give their mappings back."""
    # every compile measured (the bound itself, not _MapsMeter's sampling, is under test: a
    # charged mean carries the sizes of graphs compiled by earlier tests in this process)
    monkeypatch.setattr(executor, "_maps_meter", executor._MapsMeter())
    monkeypatch.setattr(executor._MapsMeter, "EVERY", 1)
    executor.clear_cache()
    x = torch.ones(8, 8).to(dev)
    xc.sync()

    def run(n):        # one graph per length of the chain
        y = x
        for k in range(n):
            y = (y * 1.5).sin()
        return y.cpu()

    run(3)
    cost = executor.cache.maps_held()
    assert cost >= 1
    budget = 3 * cost + 2
    with settings.override(compile_cache_maps=budget):
        before = executor.maps_in_use()
        for n in range(4, 16):
            run(n)
            assert executor.cache.maps_held() <= max(budget, cost)
        assert metrics.counter("CompileCacheEviction") > 0
        assert 1 <= len(executor.cache) < 12
        grown = executor.maps_in_use() - before
    # 12 graphs compiled, their mappings held by at most a budget's worth of executables
    assert grown <= budget + 12 * 8, grown
    assert executor.maps_budget() > 1000            # (the default: half of vm.max_map_count)


def test_the_mappings_of_a_compile_are_measured_on_a_sample_and_the_rest_charged_their_mean(
        monkeypatch):
    """Reading /proc/self/maps costs milliseconds in a process with many mappings, more than a
    small compile: the first compiles and every EVERY-th are measured, the others charged the
    mean of the measured."""
    counts = iter(range(0, 10 ** 6, 10))          # each reading 10 mappings more than the last
    reads = []

    def fake_maps():
        reads.append(1)
        return next(counts)

    monkeypatch.setattr(executor, "maps_in_use", fake_maps)
    meter = executor._MapsMeter()

    class Lowered:
        def compile(self):
            return "compiled"

    n = meter.FIRST + 3 * meter.EVERY
    costs = [meter.compile(Lowered()) for _ in range(n)]
    assert all(c == ("compiled", 10) for c in costs)       # measured: the reading's step
    measured = meter.FIRST + sum(1 for k in range(meter.FIRST, n) if k % meter.EVERY == 0)
    assert len(reads) == 2 * measured < n
