"""cdist (both of ATen's algorithms and the backward), segment_reduce (lengths or offsets, every
reduction, initial values, NaN, the backward) and hash_tensor match CPU eager on both paths,
with no CPU fallback."""
from __future__ import annotations

import itertools

import pytest
import torch

import xla_compat as xc
from tests.conftest import PATHS, assert_same
from tests.sampling import all_pairs
from tests.lowering._core import core_no_fallback, dev  # noqa: F401 (autouse fixture)

MODES = ("use_mm_for_euclid_dist_if_necessary", "use_mm_for_euclid_dist",
         "donot_use_mm_for_euclid_dist")


@pytest.mark.parametrize("path,p,shapes", all_pairs(
    PATHS, [0, 0.5, 1, 1.5, 2, 3, float("inf")],
    [((3, 5, 4), (6, 4)), ((30, 3), (2, 30, 3)), ((2, 1, 4, 3), (5, 7, 3))]),
    indirect=["path"])
def test_cdist_values_and_gradients_with_broadcast_batches(path, p, shapes):
    torch.manual_seed(0)
    for mode in MODES:
        a = torch.randn(*shapes[0], requires_grad=True)
        b = torch.randn(*shapes[1], requires_grad=True)
        expected = torch.cdist(a, b, p, mode)
        g = torch.randn_like(expected)
        expected.backward(g)
        da = dev(a.detach()).requires_grad_()
        db = dev(b.detach()).requires_grad_()
        actual = torch.cdist(da, db, p, mode)
        actual.backward(dev(g))
        xc.sync([actual, da.grad, db.grad])          # (one graph for the three read below)
        assert_same(actual, expected.detach(), 1e-4, 1e-4, f"p={p} {mode}")
        assert_same(da.grad, a.grad, 1e-3, 1e-3, f"grad x1 p={p} {mode}")
        assert_same(db.grad, b.grad, 1e-3, 1e-3, f"grad x2 p={p} {mode}")


def test_cdist_of_identical_rows_has_zero_distance_and_zero_gradient(path):
    a = torch.tensor([[1., 2.], [1., 2.], [0., 5.]], requires_grad=True)
    expected = torch.cdist(a, a.detach())
    expected.sum().backward()
    da = dev(a.detach()).requires_grad_()
    actual = torch.cdist(da, dev(a.detach()))
    actual.sum().backward()
    assert_same(actual, expected.detach(), 1e-5, 1e-5)
    assert_same(da.grad, a.grad, 1e-5, 1e-5)


def _segments():
    torch.manual_seed(0)
    data = torch.randn(3, 6, 2)
    data[1, 2, 0] = float("nan")
    data[0, 1, 1] = 0.
    data[2, 3, :] = data[2, 4, :]          # a tie for max/min
    lengths = torch.tensor([[1, 0, 3, 2], [2, 2, 0, 2], [0, 1, 2, 3]])   # empty segments too
    offsets = torch.cat([torch.zeros(3, 1, dtype=torch.long), lengths.cumsum(-1)], -1)
    return data, lengths, offsets


@pytest.mark.parametrize("reduce,initial,kind", list(itertools.product(
    ["sum", "mean", "max", "min", "prod"], [None, 2.0], ["lengths", "offsets"])))
def test_segment_reduce_values_and_gradients(path, reduce, initial, kind):
    data, lengths, offsets = _segments()
    bounds = {kind: lengths if kind == "lengths" else offsets}
    a = data.clone().requires_grad_()
    expected = torch._segment_reduce(a, reduce, axis=1, initial=initial, **bounds)
    g = torch.randn_like(expected)
    (expected * g).nansum().backward()
    d = dev(data).requires_grad_()
    actual = torch._segment_reduce(d, reduce, axis=1, initial=initial,
                                   **{k: dev(v) for k, v in bounds.items()})
    assert_same(actual, expected.detach())
    (actual * torch.where(torch.isnan(actual), 0, dev(g))).nansum().backward()
    assert_same(d.grad, a.grad)


DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.int64, torch.int32, torch.uint8,
          torch.bool]


@pytest.mark.parametrize("dtype", DTYPES)
def test_hash_tensor_xors_the_64_bit_patterns_like_eager(path, dtype):
    torch.manual_seed(0)
    t = (torch.randn(3, 4) * 50).to(dtype)
    for kw in [{}, {"dim": 0}, {"dim": -1, "keepdim": True}, {"dim": (0, 1), "keepdim": True}]:
        expected = torch.hash_tensor(t, **kw)
        actual = torch.hash_tensor(dev(t), **kw).cpu()
        assert actual.dtype == expected.dtype == torch.uint64
        assert torch.equal(actual.view(torch.int64), expected.view(torch.int64)), kw
    special = torch.tensor([float("nan"), -0.0, 0.0, float("inf")])
    assert torch.equal(torch.hash_tensor(dev(special)).cpu().view(torch.int64),
                       torch.hash_tensor(special).view(torch.int64))
