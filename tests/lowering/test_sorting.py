"""Sorting and order statistics match CPU eager (exactly where eager defines the order of ties)."""
from __future__ import annotations

import pytest
import torch

import xla_compat as xc
from xla_compat import paths, settings
from tests.conftest import assert_same
from tests.lowering._core import core_no_fallback, dev  # noqa: F401 (autouse fixture)

NAN, INF = float("nan"), float("inf")


def _inputs(dtype):
    torch.manual_seed(0)
    if dtype == torch.bool:
        return [torch.rand(7) > 0.5, torch.rand(3, 5) > 0.5]
    if dtype.is_floating_point:
        return [torch.randn(7, dtype=dtype), torch.randn(3, 5, dtype=dtype),
                torch.randint(0, 3, (4, 9)).to(dtype),                       # many ties
                torch.tensor([3., NAN, -0.0, 0.0, INF, 1., -INF, NAN], dtype=dtype),
                torch.tensor(2.5, dtype=dtype), torch.empty(0, 3, dtype=dtype)]
    return [torch.randint(-5, 5, (7,), dtype=dtype), torch.randint(0, 3, (4, 9), dtype=dtype),
            torch.tensor([torch.iinfo(dtype).min, 0, torch.iinfo(dtype).max, -1], dtype=dtype)]


DTYPES = [torch.float32, torch.int64, torch.bool, torch.float64]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("descending", [False, True])
@pytest.mark.parametrize("d", [-1, 0])
def test_stable_sort_matches_eager_values_and_indices(dtype, descending, d):
    inputs = _inputs(dtype)
    expected = [(*x.sort(stable=True, dim=d, descending=descending),
                 x.argsort(dim=d, descending=descending, stable=True)) for x in inputs]
    actual = [(*dev(x).sort(stable=True, dim=d, descending=descending),
               dev(x).argsort(dim=d, descending=descending, stable=True)) for x in inputs]
    assert_same(actual, expected, msg=f"inputs {inputs}")      # (one graph for every input)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("descending", [False, True])
def test_unstable_sort_gives_eager_values_and_consistent_indices(dtype, descending):
    # Eager's default sort leaves the order of equal elements unspecified.
    inputs = _inputs(dtype)
    got = [dev(x).sort(descending=descending) for x in inputs]
    xc.sync([t for pair in got for t in pair])                 # (one graph for every input)
    for x, (av, ai) in zip(inputs, got):
        ev, _ = x.sort(descending=descending)
        assert_same(av, ev)
        assert_same(x.gather(-1, ai.cpu()) if x.dim() else x, ev)


def test_msort_sorts_along_the_first_dim():
    x = torch.randn(5, 3)
    assert_same(torch.msort(dev(x)), torch.msort(x))


@pytest.mark.parametrize("largest", [True, False])
@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize("d", [-1, 0])
def test_topk_values_match_and_indices_point_at_them(largest, k, d):
    torch.manual_seed(0)
    for x in [torch.randn(6, 5), torch.randint(0, 3, (6, 5)).float(), torch.randint(-9, 9, (6, 5)),
              torch.tensor([[3., NAN, 1., INF, -INF, 0.]] * 4)]:
        ev, _ = x.topk(k, dim=d, largest=largest)
        av, ai = dev(x).topk(k, dim=d, largest=largest)
        assert_same(av, ev)
        assert_same(x.gather(d, ai.cpu()), ev)


def test_topk_distinct_values_match_indices_exactly():
    x = torch.randperm(30).float().reshape(5, 6)
    assert_same(tuple(dev(x).topk(4)), tuple(x.topk(4)))
    assert_same(tuple(dev(x).topk(2, dim=0, largest=False)), tuple(x.topk(2, dim=0, largest=False)))


@pytest.mark.parametrize("k", [1, 3, 5])
@pytest.mark.parametrize("keepdim", [False, True])
def test_kthvalue(k, keepdim):
    x = torch.randperm(35).float().reshape(5, 7)
    assert_same(tuple(dev(x).kthvalue(k, 0, keepdim)), tuple(x.kthvalue(k, 0, keepdim)))
    assert_same(tuple(dev(x).kthvalue(k, -1, keepdim)), tuple(x.kthvalue(k, -1, keepdim)))


def test_median_is_the_lower_median():
    x = torch.randperm(8).float()
    assert_same(dev(x).median(), x.median())
    assert_same(dev(torch.arange(7)).median(), torch.arange(7).median())


@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize("d", [0, 1, -1])
def test_median_dim_distinct_values(d, keepdim):
    x = torch.randperm(24).float().reshape(4, 6)
    assert_same(tuple(dev(x).median(d, keepdim)), tuple(x.median(d, keepdim)))
    assert_same(tuple(dev(x).nanmedian(d, keepdim)), tuple(x.nanmedian(d, keepdim)))


def test_median_propagates_nan_and_nanmedian_skips_it():
    x = torch.tensor([[1., NAN, 0., NAN, 5.], [4., 3., 2., 1., 0.], [NAN, NAN, NAN, NAN, NAN]])
    assert_same(tuple(dev(x).median(1)), tuple(x.median(1)))
    ev, ei = x.nanmedian(1)
    av, ai = dev(x).nanmedian(1)
    assert_same(av, ev)
    # An all-NaN row's index comes from std::nth_element's internals in eager; compare the rest.
    assert_same(ai[:2], ei[:2])
    assert_same(dev(x).median(), x.median())
    assert_same(dev(x).nanmedian(), x.nanmedian())
    assert_same(dev(x[1]).nanmedian(), x[1].nanmedian())


def test_median_with_ties_returns_eager_value_and_a_matching_index():
    x = torch.randint(0, 3, (5, 8)).float()
    ev, _ = x.median(1)
    av, ai = dev(x).median(1)
    assert_same(av, ev)
    assert_same(x.gather(1, ai.cpu()[:, None])[:, 0], ev)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
@pytest.mark.parametrize("keepdim", [False, True])
def test_mode_is_the_smallest_most_frequent_value_at_its_last_index(dtype, keepdim):
    torch.manual_seed(0)
    for x in [torch.tensor([3, 1, 3, 1, 2]), torch.tensor([3, 1, 1, 3, 2]),
              torch.randint(0, 4, (6, 10)), torch.tensor([7])]:
        x = x.to(dtype)
        assert_same(tuple(dev(x).mode(-1, keepdim)), tuple(x.mode(-1, keepdim)))
        if x.dim() == 2:
            assert_same(tuple(dev(x).mode(0, keepdim)), tuple(x.mode(0, keepdim)))


@pytest.mark.parametrize("right", [False, True])
@pytest.mark.parametrize("out_int32", [False, True])
def test_searchsorted_and_bucketize(right, out_int32):
    seq = torch.tensor([1., 2., 2., 4., 7.])
    vals = torch.tensor([[0., 2., 3.], [7., 8., 2.]])
    kw = dict(right=right, out_int32=out_int32)
    assert_same(torch.searchsorted(dev(seq), dev(vals), **kw), torch.searchsorted(seq, vals, **kw))
    assert_same(torch.searchsorted(dev(seq), 2.0, **kw), torch.searchsorted(seq, 2.0, **kw))
    assert_same(torch.bucketize(dev(vals), dev(seq), **kw), torch.bucketize(vals, seq, **kw))
    nd_seq = torch.sort(torch.randn(2, 6)).values
    nd_vals = torch.randn(2, 4)
    assert_same(torch.searchsorted(dev(nd_seq), dev(nd_vals), **kw),
                torch.searchsorted(nd_seq, nd_vals, **kw))


def test_searchsorted_with_sorter_and_side():
    seq = torch.tensor([5., 1., 3., 3., 9.])
    sorter = seq.argsort(stable=True)
    vals = torch.tensor([3., 0., 10., 4.])
    for side in ("left", "right"):
        assert_same(torch.searchsorted(dev(seq), dev(vals), side=side, sorter=dev(sorter)),
                    torch.searchsorted(seq, vals, side=side, sorter=sorter))


def test_integer_sort_and_topk_of_large_values_stay_exact():
    x = torch.tensor([2**40 + 1, 2**40, -2**40, 2**40 + 3])
    assert_same(tuple(dev(x).sort(stable=True)), tuple(x.sort(stable=True)))
    assert_same(tuple(dev(x).topk(2)), tuple(x.topk(2)))
