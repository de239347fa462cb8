"""Data-dependent output shapes through a host round trip match CPU eager on both paths, with no
CPU fallback: repeat_interleave with a repeats tensor, unique along a dim (sorted, consecutive),
unique_consecutive with and without a dim; empty inputs; eager's own errors."""
from __future__ import annotations

import pytest
import torch

import xla_compat as xc
from tests.conftest import assert_same
from tests.lowering._core import core_no_fallback, dev  # noqa: F401 (autouse fixture)


def _slices():
    torch.manual_seed(0)
    x = torch.randint(0, 3, (6, 3, 2)).float()
    x[4] = x[1]          # a repeat far apart (merged by unique, not by unique_consecutive)
    x[2] = x[1]          # and a run
    return x


UNIQUES = {
    "unique_dim": lambda t, d: torch.unique(t, dim=d, return_inverse=True, return_counts=True),
    "unique_dim_unsorted": lambda t, d: torch.unique(t, sorted=False, dim=d, return_inverse=True,
                                                     return_counts=True),
    "unique_consecutive_dim": lambda t, d: torch.unique_consecutive(
        t, dim=d, return_inverse=True, return_counts=True),
    "unique_dim_consecutive": lambda t, d: torch.ops.aten.unique_dim_consecutive(t, d, True, True),
}


@pytest.mark.parametrize("name", sorted(UNIQUES))
@pytest.mark.parametrize("d", [0, 1, 2, -1])
def test_unique_slices_along_a_dim_with_inverse_and_counts(path, name, d):
    x = _slices()
    before = xc.metrics.counters().get("HostRoundTrip", 0)
    assert_same(tuple(UNIQUES[name](dev(x), d)), tuple(UNIQUES[name](x, d)))
    assert xc.metrics.counters().get("HostRoundTrip", 0) > before   # the size came from the host


def test_unique_consecutive_without_dim_still_flattens(path):
    x = _slices()
    f = lambda t: torch.unique_consecutive(t, return_inverse=True, return_counts=True)  # noqa: E731
    assert_same(tuple(f(dev(x))), tuple(f(x)))


def test_unique_dim_of_empty_and_eagers_error_for_unselected_empty_dims(path):
    e = torch.empty(0, 3)
    assert_same(tuple(torch.unique(dev(e), dim=0, return_inverse=True, return_counts=True)),
                tuple(torch.unique(e, dim=0, return_inverse=True, return_counts=True)))
    with pytest.raises(RuntimeError, match="0 sized dimensions"):
        torch.unique(dev(torch.empty(3, 0)), dim=0)


@pytest.mark.parametrize("case", ["indices", "tensor_repeats", "int_repeats", "output_size",
                                  "flat", "zero_total"])
def test_repeat_interleave_like_eager(path, case):
    torch.manual_seed(0)
    y, rep = torch.randn(4, 3), torch.tensor([2, 0, 3, 1])
    f = {
        "indices": lambda t, r: torch.repeat_interleave(r),
        "tensor_repeats": lambda t, r: torch.repeat_interleave(t, r, dim=0),
        "int_repeats": lambda t, r: t.repeat_interleave(2, dim=1),
        "output_size": lambda t, r: torch.repeat_interleave(t, r, dim=0, output_size=6),
        "flat": lambda t, r: t.repeat_interleave(3),
        "zero_total": lambda t, r: torch.repeat_interleave(t, r * 0, dim=0),
    }[case]
    assert_same(f(dev(y), dev(rep)), f(y, rep))


def test_repeat_interleave_with_output_size_needs_no_round_trip(path):
    rep = dev(torch.tensor([1, 2, 3]))
    before = xc.metrics.counters().get("HostRoundTrip", 0)
    out = torch.repeat_interleave(rep, output_size=6)
    assert xc.metrics.counters().get("HostRoundTrip", 0) == before
    assert_same(out, torch.tensor([0, 1, 1, 2, 2, 2]))


def test_tensor_split_takes_cpu_split_points_and_rejects_device_ones_like_eager(path):
    # eager requires the split points on the CPU whatever the input's device
    x, idx = torch.randn(5, 5, 5), torch.tensor([1, 3, 4])
    for points, d in [(idx, 1), (torch.tensor(3), 0), ([1, 2], 2), (2, -1)]:
        assert_same(tuple(torch.tensor_split(dev(x), points, d)),
                    tuple(torch.tensor_split(x, points, d)))
    with pytest.raises(RuntimeError, match="expected tensor_indices_or_sections to be on cpu, "
                                           "but it's on hlo:0"):
        torch.tensor_split(dev(x), dev(idx), 1)
