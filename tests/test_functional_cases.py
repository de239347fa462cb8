"""Functional path: the cases that broke torch_xla's integration, and where upstream alone is wrong."""
from __future__ import annotations

import copy
import io

import pytest
import torch

import xla_compat as xc
import xla_compat.functional as fn
from xla_compat import paths

from .conftest import assert_same


@pytest.fixture(autouse=True)
def functional():
    with paths.activated("functional"):
        yield


# -- section 5 ------------------------------------------------------------------------------------

def test_bool_item_assignment(dev):
    cpu = torch.ones(3, 4, dtype=torch.bool)
    d = cpu.to(dev)
    cpu[0] = False
    d[0] = False
    assert_same(d, cpu)


@pytest.mark.parametrize("include_self", [True, False])
@pytest.mark.parametrize("reduce", ["prod", "mean", "amax", "amin"])
def test_index_reduce_empty_index_on_size_zero_dim(reduce, include_self, dev):
    cpu = torch.empty(3, 4, 0)
    src = torch.empty(3, 4, 0)
    index = torch.empty(0, dtype=torch.long)
    d = cpu.to(dev)
    exp = cpu.index_reduce_(2, index, src, reduce, include_self=include_self)
    got = d.index_reduce_(2, index.to(dev), src.to(dev), reduce, include_self=include_self)
    assert got.shape == exp.shape == (3, 4, 0)
    assert_same(d, cpu)


def test_narrow_copy_of_non_contiguous_input(dev):
    cpu = torch.arange(24.).reshape(4, 6)
    d = cpu.to(dev)
    exp = cpu.t().narrow_copy(0, 1, 3)
    got = d.t().narrow_copy(0, 1, 3)
    assert_same(got, exp)
    got.add_(1)            # a copy: the base stays
    assert_same(d, cpu)


def test_view_taken_before_sync_and_written_after(dev):
    cpu = torch.arange(12.).reshape(3, 4)
    d = cpu.to(dev)
    v_cpu, v_dev = cpu.t()[1], d.t()[1]
    xc.sync()
    v_cpu.mul_(10)
    v_dev.mul_(10)
    xc.sync()
    assert_same(d, cpu)
    cpu.add_(1)
    d.add_(1)
    xc.sync()
    assert_same(v_dev, v_cpu)


def test_pending_alias_update_is_applied_before_the_graph_is_cut(dev):
    d = torch.zeros(4, 4).to(dev)
    d[1].fill_(3)          # an update pending on d's storage
    xc.sync()
    inner = fn.inner(d)
    assert inner._value.node.is_leaf, "sync must leave the base materialised, not stale"
    assert_same(d, torch.zeros(4, 4).index_fill_(0, torch.tensor([1]), 3))


# -- section 6: where upstream alone differs from eager -------------------------------------------

def test_writes_through_unfold_with_gaps_keep_the_gaps(dev):
    cpu = torch.arange(12.)
    d = cpu.to(dev)
    cpu.unfold(0, 2, 3).mul_(10)
    d.unfold(0, 2, 3).mul_(10)
    assert_same(d, cpu)


def test_writes_through_unfold_with_a_tail_keep_the_tail(dev):
    cpu = torch.arange(24.).reshape(2, 12)
    d = cpu.to(dev)
    cpu.unfold(1, 5, 5).add_(100)
    d.unfold(1, 5, 5).add_(100)
    assert_same(d, cpu)


def test_unfold_gradient_still_zero_between_windows(dev):
    cpu = torch.arange(10.).requires_grad_()
    d = cpu.detach().to(dev).requires_grad_()
    (cpu.unfold(0, 2, 3) ** 2).sum().backward()
    (d.unfold(0, 2, 3) ** 2).sum().backward()
    assert_same(d.grad, cpu.grad)


@pytest.mark.parametrize("view", [lambda b: b.t(), lambda b: b[1:], lambda b: b[:, 1:].t()],
                         ids=["t", "slice", "slice_t"])
def test_as_strided_of_a_view_reads_storage_positions(view, dev):
    cpu = torch.arange(12.).reshape(3, 4)
    d = cpu.to(dev)
    exp = view(cpu).as_strided((2, 2), (1, 4), 5)
    got = view(d).as_strided((2, 2), (1, 4), 5)
    assert_same(got, exp)


def test_as_strided_of_a_view_outside_the_view_reads_the_base_storage(dev):
    cpu = torch.arange(12.).reshape(3, 4)
    assert_same(cpu.to(dev)[1:].as_strided((2,), (1,), 0), cpu[1:].as_strided((2,), (1,), 0))


def test_write_through_as_strided_of_a_view_reaches_the_base(dev):
    cpu = torch.arange(12.).reshape(3, 4)
    d = cpu.to(dev)
    cpu.t().as_strided((2, 2), (1, 4)).add_(1)
    d.t().as_strided((2, 2), (1, 4)).add_(1)
    assert_same(d, cpu)


def test_as_strided_of_base_writes_through(dev):
    cpu = torch.arange(12.).reshape(3, 4)
    d = cpu.to(dev)
    cpu.as_strided((2, 3), (1, 2), 1).mul_(-1)
    d.as_strided((2, 3), (1, 2), 1).mul_(-1)
    assert_same(d, cpu)


# -- boundaries -----------------------------------------------------------------------------------

def test_factories_transfers_and_results_are_wrappers(dev):
    made = [torch.zeros(3, device=dev), torch.randn(2, 2, device=dev),
            torch.arange(3.).to(dev), torch.ones(2, device=dev) + 1,
            torch.zeros_like(torch.ones(2, device=dev))]
    for t in made:
        assert fn.owns(t)
        assert isinstance(fn.inner(t), fn.FunctionalInner)
        assert not torch._is_functional_tensor(fn.inner(t))
    assert paths.of(made[0]) == "functional"


def test_leaving_the_device(dev, capsys):
    cpu = torch.arange(6.).reshape(2, 3)
    d = cpu.to(dev)
    d[0].add_(1)
    cpu[0].add_(1)
    out = d.cpu()
    assert not torch._is_functional_tensor(out) and out.device.type == "cpu"
    assert_same(out, cpu)
    assert d[0, 1].item() == cpu[0, 1].item()
    assert d.tolist() == cpu.tolist()
    print(d)
    text = capsys.readouterr().out
    assert "device='hlo:0'" in text and "_to_functional_tensor" not in text and "2." in text
    buf = io.BytesIO()
    torch.save({"t": d}, buf)
    buf.seek(0)
    loaded = torch.load(buf)["t"]
    assert loaded.device.type == "cpu"
    assert_same(loaded, cpu)


def test_module_to_device_parameters_buffers_state_dict_and_deepcopy(dev):
    torch.manual_seed(0)
    cpu = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    m = copy.deepcopy(cpu).to(dev)
    for p in m.parameters():
        assert isinstance(p, torch.nn.Parameter) and fn.owns(p) and p.requires_grad
    for b in m.buffers():
        assert fn.owns(b)
    x = torch.randn(5, 3)
    assert_same(m(x.to(dev)), cpu(x), atol=1e-5)
    sd = m.state_dict()
    for k, v in cpu.state_dict().items():
        assert_same(sd[k], v, atol=1e-6)
    twin = copy.deepcopy(m)
    for a, b in zip(twin.state_dict().values(), m.state_dict().values()):
        assert fn.owns(a)
        assert_same(a, b.cpu())
    twin[1].running_mean.add_(1)
    assert_same(m[1].running_mean, cpu[1].running_mean, atol=1e-6)


def test_parameter_on_device_and_grad(dev):
    p = torch.nn.Parameter(torch.ones(3, device=dev))
    assert fn.owns(p) and p.requires_grad
    (p * torch.arange(3.).to(dev)).sum().backward()
    assert fn.owns(p.grad)
    assert_same(p.grad, torch.arange(3.))


def test_mixing_paths_in_one_op_is_a_clear_error(dev):
    pytest.importorskip("xla_compat.legacy")
    if "legacy" not in paths.names():
        pytest.skip("legacy path not registered")
    a = torch.ones(2, device=dev)
    with paths.activated("legacy"):
        b = torch.ones(2, device=dev)
    with pytest.raises(RuntimeError, match="path"):
        (a + b).cpu()


def test_to_path_copies_from_another_path(dev):
    with paths.activated("core"):
        c = torch.arange(4.).to(dev)
    f = fn.to_path(c)
    assert fn.owns(f)
    assert_same(f, torch.arange(4.))


def test_alias_id_survives_in_place_replacement(dev):
    p = torch.zeros(4).to(dev)
    first = fn.inner(p)
    aid = fn.alias_id(first)
    p.add_(1)
    p.mul_(2)
    second = fn.inner(p)
    assert second is not first
    assert fn.alias_id(second) == aid


def test_factories_that_write_an_out_tensor(dev):
    for made, ref in [(torch.arange(5, device=dev), torch.arange(5)),
                      (torch.linspace(0, 1, 3, device=dev), torch.linspace(0, 1, 3)),
                      (torch.full((2,), 3.0, device=dev), torch.full((2,), 3.0))]:
        assert fn.owns(made)
        assert_same(made, ref)
