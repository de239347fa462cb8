"""Legacy-path gaps from the issue 4 audit: out= ops, ``_unsafe_view`` aliasing, host transfers.

``out=`` ops run as functionalization runs them (the functional op, then a write into each out
tensor), ``aten._unsafe_view`` shares its input's storage as in eager, and a transfer to the
device copies the host tensor once, into memory only the device value uses. CPU eager is the
reference throughout; where a behaviour is not legacy-specific both paths run.
"""
from __future__ import annotations

import functools
import time
import warnings

import pytest
import torch

import xla_compat as xc
from tests.conftest import assert_same

aten = torch.ops.aten


# -- H: a transfer copies the host tensor into memory of its own ---------------------------------

def test_a_cpu_tensor_written_after_its_transfer_leaves_the_device_value_alone(path, dev):
    cpu = torch.arange(6.)
    d = cpu.to(dev)
    cpu.add_(100)
    assert_same(d, torch.arange(6.))
    cpu.resize_(12)      # still resizable, as an eager tensor never exported to numpy is
    assert cpu.shape == (12,)


@pytest.mark.parametrize("make", [
    lambda: torch.arange(12.).reshape(3, 4).t(),                     # non-contiguous
    lambda: torch.arange(12.).reshape(3, 4)[1:, ::2],                # offset and step
    lambda: (torch.arange(4.) + 1j * torch.arange(4.)).conj(),       # conj bit
    lambda: torch.arange(4.)._neg_view(),                            # neg bit
    lambda: torch.arange(6.).to(torch.bfloat16).reshape(2, 3).t(),   # bfloat16 travels as bits
    lambda: torch.tensor(3.5),                                       # 0-dim
    lambda: torch.zeros(0, 3),                                       # zero-size
], ids=["transposed", "sliced", "conj", "neg", "bfloat16", "scalar", "empty"])
def test_transfer_keeps_values_of_every_layout(path, dev, make):
    cpu = make()
    expected = cpu.resolve_conj().resolve_neg().clone()
    d = cpu.to(dev)
    assert_same(d, expected)
    if cpu.numel():
        cpu.zero_()       # writes through the original layout; the device copy is unaffected
    assert_same(d, expected)


def test_a_cpu_tensor_used_as_an_operand_stays_resizable(path, dev):
    """A CPU 0-dim operand is lifted into the graph with the same transfer."""
    s = torch.tensor(2.)
    d = torch.ones(3).to(dev) * s
    s.add_(1)
    assert_same(d, torch.full((3,), 2.))
    s.resize_(4)
    assert s.shape == (4,)


# -- E: aten._unsafe_view shares its input's storage -----------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool], ids=str)
def test_unsafe_view_writes_reach_the_base_and_base_writes_reach_it(path, dev, dtype):
    def run(x):
        v = aten._unsafe_view(x, [3, 4])
        v[1].logical_not_() if dtype is torch.bool else v[1].add_(100)
        w = aten._unsafe_view(x[2:], [2, 5])        # of a view: offset 2
        x[3:5].logical_not_() if dtype is torch.bool else x[3:5].mul_(-1)
        return v, w
    cpu = (torch.arange(12) % 3 == 0) if dtype is torch.bool else torch.arange(12).to(dtype)
    d = cpu.to(dev)
    exp, got = run(cpu), run(d)
    assert_same(d, cpu)
    assert_same(got, exp)
    assert got[1].stride() == exp[1].stride()
    assert got[1].storage_offset() == exp[1].storage_offset()


def test_unsafe_view_of_an_incompatible_layout_raises_like_eager(path, dev):
    cpu = torch.arange(12.).reshape(3, 4).t()
    with pytest.raises(RuntimeError, match="view size is not compatible") as eager:
        aten._unsafe_view(cpu, [12])
    with pytest.raises(type(eager.value), match="view size is not compatible"):
        aten._unsafe_view(torch.arange(12.).to(dev).reshape(3, 4).t(), [12])
