"""SPMD API in this process (one jax device): meshes and partition specs mean what torch_xla's do,
mistakes get errors that say what to do, and a one-device mesh trains like no mesh at all.
The multi-device behaviour is in test_spmd_devices.py (8 simulated devices, in a subprocess)."""
from __future__ import annotations

import copy
import os

import jax
import pytest
import torch
import torch.nn as nn

import xla_compat as xc
import xla_compat.distributed.spmd as xs
from xla_compat import executor, sharding
from xla_compat.lazy import ir

from .conftest import assert_same


def test_mesh_forms_agree():
    assert xc.Mesh((1,), ("data",)) == xc.Mesh([0], (1,), ("data",))
    m = xc.Mesh([0], (1, 1), ("data", "model"))
    assert m.shape() == {"data": 1, "model": 1}
    assert m.get_logical_mesh().tolist() == [[0]]
    assert xc.Mesh([0], (1,)).axis_names == ("dim0",)     # torch_xla: axis names optional
    assert xs.get_1d_mesh("batch").shape() == {"batch": len(jax.devices())}


def test_mesh_beyond_the_devices_says_how_to_simulate_more():
    with pytest.raises(ValueError, match=r"simulate_host_devices\(N\).*"
                                         r"xla_force_host_platform_device_count"):
        xc.Mesh((8,), ("data",))


def test_simulating_devices_once_they_exist_keeps_their_count_or_says_it_is_too_late(dev):
    """(Asking for devices before the first one is used: tests/test_spmd_devices.py's worker.)"""
    have = jax.local_device_count("cpu")
    flags = os.environ.get("XLA_FLAGS")
    xs.simulate_host_devices(have)                       # what is there already: nothing to do
    with pytest.raises(RuntimeError, match=rf"simulate_host_devices\({have + 7}\): jax already "
                                           rf"started with {have} CPU device"):
        xs.simulate_host_devices(have + 7)
    assert os.environ.get("XLA_FLAGS") == flags


@pytest.mark.parametrize("bad, match", [
    (dict(device_ids=[0, 0], mesh_shape=(2,)), "distinct"),
    (dict(device_ids=[0], mesh_shape=(2,)), "needs 2 device ids"),
    (dict(device_ids=[0], mesh_shape=(1,), axis_names=("a", "b")), "axis names"),
])
def test_malformed_mesh_is_rejected(bad, match):
    with pytest.raises(ValueError, match=match):
        xc.Mesh(**bad)


def test_partition_spec_entries_are_axis_names_indices_tuples_or_none():
    mesh = xc.Mesh([0], (1, 1), ("data", "model"))
    assert xs.spec(mesh, (0, None)).partition == ("data", None)
    assert xs.spec(mesh, ("model", "data")).partition == ("model", "data")
    assert xs.spec(mesh, (("data", "model"), None)).partition == (("data", "model"), None)


@pytest.mark.parametrize("pspec, err, match", [
    (("data",), ValueError, "2 dimensions"),
    (("nope", None), ValueError, "names no mesh axis"),
    ((5, None), ValueError, "not a mesh axis index"),
    (("data", "data"), ValueError, "twice"),
    ((1.5, None), TypeError, "mesh axis name or index"),
])
def test_bad_partition_spec_is_rejected(path, dev, pspec, err, match):
    mesh = xc.Mesh([0], (1, 1), ("data", "model"))
    t = torch.ones(4, 4, device=dev)
    with pytest.raises(err, match=match):
        xc.mark_sharding(t, mesh, pspec)
    assert xs.get_sharding(t) is None


def test_marking_a_cpu_tensor_says_to_move_it(path):
    with pytest.raises(TypeError, match=r"\.to\(xc\.device\(\)\)"):
        xc.mark_sharding(torch.ones(2), xc.Mesh((1,), ("data",)), ("data",))


def test_marking_a_view_says_to_mark_its_base(path, dev):
    base = torch.ones(4, 4, device=dev)
    with pytest.raises(ValueError, match="Mark the base"):
        xc.mark_sharding(base.t(), xc.Mesh((1,), ("data",)), ("data", None))


def test_get_and_clear_sharding(path, dev):
    mesh = xc.Mesh((1,), ("data",))
    t = torch.arange(6.0, device=dev)
    assert xs.get_sharding(t) is None
    assert xc.mark_sharding(t, mesh, ("data",)) is t
    assert xs.get_sharding(t) == xs.spec(mesh, ("data",))
    t.add_(1)
    xc.sync()
    assert xs.get_sharding(t) == xs.spec(mesh, ("data",))
    assert_same(t, torch.arange(6.0) + 1)
    xc.clear_sharding(t)
    assert xs.get_sharding(t) is None
    assert_same(t, torch.arange(6.0) + 1)


def test_pending_value_gets_a_constraint_node(path, dev):
    mesh = xc.Mesh((1,), ("data",))
    a = torch.ones(4, device=dev)
    xc.sync()
    b = a * 3
    xc.mark_sharding(b, mesh, ("data",))
    inner = xc._paths.inner_tensor(b)
    assert inner._value.node.op == sharding.CONSTRAINT_OP
    assert "sharding" in xc.hlo_text([b])          # with_sharding_constraint in the StableHLO
    assert_same(b, torch.full((4,), 3.0))


def test_device_data_key_holds_its_layout():
    one = ir.DeviceData(jax.numpy.ones(3))
    assert one.placement is None                    # one device: keys as before SPMD
    assert one.signature() == ("device_data", one.avals, None)


def test_one_device_mesh_trains_like_no_mesh(path, dev):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    x, y = torch.randn(16, 8), torch.randint(0, 4, (16,))
    mesh = xc.Mesh((1, 1), ("data", "model"))

    def run(m, device, marked):
        m = m.to(device)
        if marked:
            xc.mark_sharding(m[0].weight, mesh, ("model", None))
            xc.mark_sharding(m[2].weight, mesh, (None, "model"))
        opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
        losses = []
        for _ in range(3):
            xb, yb = x.to(device), y.to(device)
            if marked:
                xc.mark_sharding(xb, mesh, ("data", None))
            opt.zero_grad()
            loss = nn.functional.cross_entropy(m(xb), yb)
            loss.backward()
            opt.step()
            if device != "cpu":
                xc.sync()
            losses.append(loss.item())
        return losses, list(m.parameters())

    ref_losses, ref_params = run(copy.deepcopy(model), "cpu", False)
    losses, params = run(copy.deepcopy(model), dev, True)
    assert losses == pytest.approx(ref_losses, rel=1e-5)
    assert_same(params, [p.detach() for p in ref_params])
    assert xs.get_sharding(params[0]).partition == ("model", None)
    assert executor.compiled_text()                 # the optimised HLO of the last step
