"""Issue 8, W4: writes through a slice and through a transposed view of a KV cache are each ONE
update of the cache buffer on both paths: the compiled step holds no transpose and no copy of
the whole cache, and the values match eager."""
import re

import torch

import xla_compat as xc
from xla_compat import executor

from .conftest import assert_same

SHAPE = (2, 2, 4, 16, 8)


def _writes(cache, kv, positions):
    for t in range(positions):
        cache[:, :, :, t:t + 1] = kv[:, :, :, t:t + 1]
        cache.transpose(3, 4)[..., t] += 0.5


def _whole_cache_ops(hlo: str) -> tuple:
    """(transposes, copies) of a whole cache in an optimised HLO module."""
    whole = "f32[" + ",".join(map(str, SHAPE)) + "]"
    lines = [ln for ln in hlo.splitlines() if whole in ln.split("=", 1)[-1][:60]]
    return (sum(1 for ln in lines if re.search(r"\btranspose\(", ln)),
            sum(1 for ln in lines if re.search(r"\bcopy\(", ln)))


def test_kv_cache_writes_are_single_updates_of_the_cache(path, dev):
    g = torch.Generator().manual_seed(0)
    cache = torch.randn(SHAPE, generator=g)
    kv = torch.randn(SHAPE[:3] + (12, SHAPE[4]), generator=g)
    d_cache, d_kv = cache.to(dev), kv.to(dev)
    counts = {}
    for positions in (3, 3, 12, 12):        # each second run uses the cached executable
        _writes(d_cache, d_kv, positions)
        total = d_cache.sum()
        xc.sync()
        _writes(cache, kv, positions)
        assert_same(d_cache, cache)
        assert_same(total, cache.sum(), rtol=1e-5, atol=1e-4)
        hlo = executor.compiled_text()
        counts[positions] = _whole_cache_ops(hlo)
    transposes, copies = counts[12]
    assert transposes == 0
    assert copies == counts[3][1], f"whole-cache copies grow with the writes: {counts}"


def test_reading_a_view_just_written_and_writing_it_back_is_no_extra_write(path, dev):
    cpu = torch.arange(24.).reshape(2, 3, 4)
    d = cpu.to(dev)
    for x in (cpu, d):
        v = x.transpose(1, 2)[:, 1]
        v += 1                               # Python then writes v back through the same view
        x.transpose(1, 2)[:, 1] = v
        x.transpose(1, 2)[:, 2] *= 2
    assert_same(d, cpu)
