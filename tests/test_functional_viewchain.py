"""Writes through chains of views: eager's values on both paths, and on the functional path ONE
update of the base per write (functional/viewchain.py), with no whole-base transpose or copy."""
from __future__ import annotations

import re

import pytest
import torch

import xla_compat as xc
from tests.conftest import assert_same


def _ops(hlo: str, name: str) -> int:
    return len(re.findall(rf"stablehlo\.{name}\b", hlo))


def _kv_writes(cache, kv, positions):
    for t in range(positions):
        cache[:, :, :, t:t + 1] = kv[:, :, :, t:t + 1]
        cache.transpose(3, 4)[..., t] += 0.5


def test_kv_cache_writes_through_a_transposed_view_match_eager(path, dev):
    g = torch.Generator().manual_seed(0)
    cache, kv = torch.randn(2, 2, 3, 8, 4, generator=g), torch.randn(2, 2, 3, 5, 4, generator=g)
    d_cache, d_kv = cache.to(dev), kv.to(dev)
    for _ in range(2):                       # the second step starts from device data
        _kv_writes(cache, kv, 5)
        _kv_writes(d_cache, d_kv, 5)
        xc.sync()
    assert_same(d_cache, cache)


def test_kv_cache_write_is_one_update_of_the_cache_and_no_transpose(dev):
    with xc.use_path("functional"):
        cache = torch.randn(2, 2, 3, 8, 4).to(dev)
        kv = torch.randn(2, 2, 3, 5, 4).to(dev)
        xc.sync()
        _kv_writes(cache, kv, 5)
        hlo = xc.hlo_text([cache])
    assert _ops(hlo, "transpose") == 0, hlo
    # the slice write is overwritten by the +0.5 write of the same elements: one update each t
    assert _ops(hlo, "dynamic_update_slice") == 5, hlo
    assert _ops(hlo, "scatter") == 0, hlo


@pytest.mark.parametrize("write", [
    "x.transpose(0, 2)[1] += 1",
    "x.permute(2, 0, 1)[:, 1:3].mul_(2)",
    "x.transpose(1, 2)[:, ::2, 1] = 7",
    "x[1].t()[2:].sub_(0.5)",
    "x.transpose(0, 1).transpose(1, 2)[0, 1] = 3",
    "x[:, 1].transpose(0, 1)[1::2] *= -1",
])
def test_write_through_a_chain_of_views_reaches_the_base(path, dev, write):
    cpu = torch.arange(60, dtype=torch.float32).reshape(3, 4, 5)
    x = cpu.to(dev)
    exec(write, {}, {"x": cpu})
    exec(write, {}, {"x": x})
    assert_same(x, cpu)


def test_repeated_writes_of_one_place_keep_the_last_and_reads_see_it(path, dev):
    cpu = torch.zeros(4, 6)
    x = cpu.to(dev)
    for t in (cpu, x):
        v = t.t()[2]
        v += 1
        t[:, 2] = t.t()[2] * 3          # read of the place just written, written again
        t.t()[2].add_(t[:, 2])          # reads and writes of one place through both spellings
        t.t()[3] = t.t()[3]             # writing back what is there
    assert_same(x, cpu)
    assert_same(x.t()[2], cpu.t()[2])


def test_written_view_keeps_eager_strides_and_its_values(path, dev):
    cpu = torch.arange(24.).reshape(2, 3, 4)
    x = cpu.to(dev)
    vc, vx = cpu.transpose(0, 2), x.transpose(0, 2)
    vc[1].add_(10)
    vx[1].add_(10)
    assert vx.stride() == vc.stride() and vx[1].stride() == vc[1].stride()
    assert_same(vx, vc)
    assert_same(x, cpu)


def test_chain_write_then_sync_then_write_again(path, dev):
    cpu = torch.randn(3, 4, 5)
    x = cpu.to(dev)
    for t in (cpu, x):
        t.permute(2, 1, 0)[1, 2] = 5
    xc.sync()
    for t in (cpu, x):
        t.permute(2, 1, 0)[1, 2] += 1
        t.permute(2, 1, 0)[3] *= 2
    assert_same(x, cpu)
