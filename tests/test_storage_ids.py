"""``xc.storage_id`` / ``xc.shares_storage``: which tensors share memory, on both paths as eager.

Eager code tells shared storage (tied weights, a view and its base) by
``t.untyped_storage().data_ptr()``. An hlo tensor has no host memory: its storage has no
address, and its ``data_ptr()`` is only its storage offset in bytes (equal for any two tensors at
offset 0). These two functions answer the question on every path and on the CPU.
"""
from __future__ import annotations

import pytest
import torch

import xla_compat as xc


def _tensors(d):
    x = torch.arange(12.0, device=d).reshape(3, 4)
    y = torch.ones(3, 4, device=d)
    t = {"x": x, "row": x[1], "t": x.t(), "flat": x.view(-1), "detached": x.detach(),
         "y": y, "clone": x.clone(), "sum": x + 0, "y_diag": y.diagonal()}
    moved = torch.zeros(2, device=d)
    moved.data = y                 # now on y's storage
    t["moved"] = moved
    z = torch.zeros(4, device=d)
    z.set_(x.view(-1)[2:6])        # now on x's storage
    t["set"] = z
    return t


def test_storage_ids_group_tensors_as_eager_storages_do(path, dev):
    cpu, device = _tensors("cpu"), _tensors(dev)
    names = sorted(cpu)
    for a in names:
        for b in names:
            want = cpu[a].untyped_storage().data_ptr() == cpu[b].untyped_storage().data_ptr()
            assert xc.shares_storage(device[a], device[b]) == want, (a, b)
            assert (xc.storage_id(device[a]) == xc.storage_id(device[b])) == want, (a, b)
            assert xc.shares_storage(cpu[a], cpu[b]) == want, (a, b)


def test_a_results_storage_id_stays_when_it_is_first_viewed(path, dev):
    r = torch.ones(4, device=dev) * 2         # an op's result (legacy: no alias made yet)
    before = xc.storage_id(r)
    v = r[1:]
    assert xc.storage_id(r) == before == xc.storage_id(v)
    assert not xc.shares_storage(r, torch.ones(4, device=dev) * 2)


def test_tensors_of_two_paths_or_devices_never_share(dev):
    from xla_compat import paths
    with paths.activated("legacy"):
        a = torch.ones(2, device=dev)
    with paths.activated("functional"):
        b = torch.ones(2, device=dev)
    assert not xc.shares_storage(a, b)
    assert not xc.shares_storage(a, torch.ones(2))
    assert xc.storage_id(a)[0] == "legacy" and xc.storage_id(b)[0] == "functional"


def test_data_ptr_of_a_device_tensor_is_not_an_address(path, dev):
    """What the guide warns about: two unrelated tensors at offset 0 report the same
    ``data_ptr()``; ``shares_storage`` tells them apart."""
    a, b = torch.ones(2, device=dev), torch.zeros(2, device=dev)
    assert a.data_ptr() == b.data_ptr() and not xc.shares_storage(a, b)
    assert a[1:].data_ptr() - a.data_ptr() == a.element_size()


def test_storage_sizes_are_eagers_for_views_and_the_tensors_they_moved_onto(path, dev):
    """A view's storage is its base's, and reports the base's size (forward-mode AD, serializers
    and shared-tensor checks read ``untyped_storage().nbytes()``); legacy views reported their
    own extent before session 27. (The bases here are transferred: see the next test.)"""
    def made(d):
        t = _tensors(d)
        x = torch.arange(12.0).reshape(3, 4).to(d)
        t.update(x=x, row=x[1], t=x.t(), flat=x.view(-1), detached=x.detach(),
                 strided=x.as_strided((2, 2), (4, 1), 1), y_diag=t["y"].diagonal())
        t["set"] = torch.zeros(4, device=d).set_(x.view(-1)[2:6])
        return t
    cpu, device = made("cpu"), made(dev)
    for name in sorted(cpu):
        assert device[name].untyped_storage().nbytes() == cpu[name].untyped_storage().nbytes(), \
            name
        want = torch.ops.aten._has_same_storage_numel(cpu[name], cpu["x"])
        assert torch.ops.aten._has_same_storage_numel(device[name], device["x"]) == want, name
    assert xc.metrics.fallback_ops() == []


@pytest.mark.parametrize("factory", ["arange", "eye"])
def test_a_device_factory_built_through_out_reports_its_storage_size(path, dev, factory):
    make = {"arange": lambda d: torch.arange(6.0, device=d),
            "eye": lambda d: torch.eye(3, device=d)}[factory]
    if path == "functional":
        pytest.xfail("upstream's FunctionalTensorWrapper keeps the storage size of the empty "
                     "tensor these factories start from (their out= variant resizes it): "
                     "untyped_storage().nbytes() reads 0; values, views and forward AD's storage check "
                     "(which reads the inner tensor's size) are unaffected")
    assert make(dev).untyped_storage().nbytes() == make("cpu").untyped_storage().nbytes()
