"""gather and the scatter family (scatter, scatter_add, scatter_reduce, index_add/copy/fill/reduce,
masked_scatter) match CPU eager, including repeated indices, negative dims and empty indices."""
from __future__ import annotations

import pytest
import torch

import xla_compat as xc
from xla_compat import paths, settings
from tests.conftest import assert_same
from tests.lowering._core import core_no_fallback  # noqa: F401 (autouse fixture)


def dev(t):
    return t.to(xc.device()) if isinstance(t, torch.Tensor) else t


def _x(dtype, shape):
    if dtype == torch.bool:
        return torch.rand(shape) > 0.5
    if dtype.is_floating_point:
        return torch.randn(shape, dtype=dtype)
    return torch.randint(-9, 9, shape, dtype=dtype)


def check(fn, *args, **kw):
    expected = fn(*args, **kw)
    actual = fn(*(dev(a) for a in args), **kw)
    assert_same(actual, expected)


DTYPES = [torch.float32, torch.int64, torch.bool]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", [0, 1, -1])
def test_gather(dtype, d):
    torch.manual_seed(0)
    x = _x(dtype, (4, 5, 6))
    shape = [3, 4, 5]
    idx = torch.randint(0, x.shape[d], shape)
    check(torch.gather, x, d, idx)
    check(torch.gather, x, d, idx[:, :0])
    along = list(x.shape)
    along[d] = 7
    check(torch.take_along_dim, x, torch.randint(0, x.shape[d], along), d)


def test_gather_of_0d_tensor():
    check(torch.gather, torch.tensor(4.0), 0, torch.tensor(0))


def test_an_empty_index_of_higher_rank_gathers_nothing_and_scatters_nothing(path):
    x, idx = torch.randn(5), torch.zeros(2, 0, dtype=torch.long)   # eager accepts the rank
    check(torch.gather, x, 0, idx)
    check(torch.scatter, x, 0, idx, 1.0)
    check(torch.scatter_add, x, 0, idx, torch.randn(2, 0))
    check(torch.scatter_reduce, x, 0, idx, torch.randn(2, 0), "amax")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", [0, -1])
def test_scatter_src_and_value_keep_the_last_write(dtype, d):
    torch.manual_seed(0)
    x = _x(dtype, (4, 6))
    idx = torch.randint(0, x.shape[d], (3, 4))   # many duplicates
    src = _x(dtype, (5, 6))                      # larger than index: only the covered part counts
    check(torch.scatter, x, d, idx, src)
    check(lambda a, i: torch.scatter(a, d, i, 3 if dtype != torch.bool else True), x, idx)
    check(torch.scatter, x, d, idx[:0], src)


@pytest.mark.parametrize("reduce", ["add", "multiply"])
def test_scatter_with_legacy_reduce(reduce):
    torch.manual_seed(0)
    x, idx, src = torch.randn(4, 6), torch.randint(0, 4, (5, 6)), torch.randn(5, 6)
    check(lambda a, i, s: a.scatter(0, i, s, reduce=reduce), x, idx, src)
    check(lambda a, i: a.scatter(0, i, 1.5, reduce=reduce), x, idx)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_scatter_add_sums_duplicates(dtype):
    torch.manual_seed(0)
    x, idx, src = _x(dtype, (3, 5)), torch.randint(0, 5, (3, 7)), _x(dtype, (3, 7))
    check(torch.scatter_add, x, 1, idx, src)
    y, dy = x.clone(), dev(x)
    y.scatter_add_(1, idx, src)
    dy.scatter_add_(1, dev(idx), dev(src))
    assert_same(dy, y)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
@pytest.mark.parametrize("include_self", [True, False])
@pytest.mark.parametrize("reduce", ["sum", "prod", "mean", "amax", "amin"])
def test_scatter_reduce(reduce, include_self, dtype):
    torch.manual_seed(0)
    x, idx, src = _x(dtype, (4, 5)), torch.randint(0, 4, (6, 5)), _x(dtype, (6, 5))
    check(lambda a, i, s: a.scatter_reduce(0, i, s, reduce, include_self=include_self), x, idx, src)
    check(lambda a, i, s: a.scatter_reduce(-1, i, s, reduce, include_self=include_self),
          x, idx[:4, :3] % 5, src)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_index_add_with_alpha_and_duplicates(dtype):
    torch.manual_seed(0)
    x, idx = _x(dtype, (4, 5, 3)), torch.tensor([0, 4, 0, 2])
    src = _x(dtype, (4, 4, 3))
    check(lambda a, i, s: a.index_add(1, i, s), x, idx, src)
    check(lambda a, i, s: a.index_add(-2, i, s, alpha=3), x, idx, src)


@pytest.mark.parametrize("dtype", DTYPES)
def test_index_copy_keeps_the_last_write_and_index_fill(dtype):
    torch.manual_seed(0)
    x, idx = _x(dtype, (5, 3)), torch.tensor([4, 1, 4])
    src = _x(dtype, (3, 3))
    check(lambda a, i, s: a.index_copy(0, i, s), x, idx, src)
    value = 2 if dtype != torch.bool else True
    check(lambda a, i: a.index_fill(-1, i, value), x, torch.tensor([0, -1]))
    check(lambda a, i, v: a.index_fill(0, i, v), x, idx, torch.tensor(value, dtype=dtype))


@pytest.mark.parametrize("include_self", [True, False])
@pytest.mark.parametrize("reduce", ["prod", "mean", "amax", "amin"])
def test_index_reduce(reduce, include_self):
    torch.manual_seed(0)
    x, idx, src = torch.randn(4, 5), torch.tensor([0, 3, 0, 0]), torch.randn(4, 4)
    check(lambda a, i, s: a.index_reduce(1, i, s, reduce, include_self=include_self),
          x, idx, src)
    xi = torch.randint(-5, 5, (5, 3))
    check(lambda a, i, s: a.index_reduce(0, i, s, reduce, include_self=include_self),
          xi, idx, torch.randint(-5, 5, (4, 3)))


@pytest.mark.parametrize("dtype", DTYPES)
def test_masked_scatter_fills_in_order_with_broadcast_mask(dtype):
    torch.manual_seed(0)
    x = _x(dtype, (3, 4))
    mask = torch.rand(4) > 0.4
    src = _x(dtype, (20,))
    check(lambda a, m, s: a.masked_scatter(m, s), x, mask, src)
    check(lambda a, m, s: a.masked_scatter(m, s), x, torch.zeros(3, 4, dtype=torch.bool), src)


def test_gather_and_scatter_gradients():
    torch.manual_seed(0)
    x, idx = torch.randn(4, 5), torch.randint(0, 5, (4, 3))
    src = torch.randn(4, 3)
    grads = []
    for device in ("cpu", xc.device()):
        a = x.clone().to(device).requires_grad_()
        s = src.clone().to(device).requires_grad_()
        out = a.gather(1, idx.to(device)) * 2 + a.scatter_add(1, idx.to(device), s).sum(1, True)
        m = a.masked_scatter(a.detach() > 0, s.flatten().repeat(2))
        (out.sum() + (m ** 2).sum()).backward()
        grads.append((a.grad, s.grad))
    assert_same(grads[1], grads[0])


@pytest.mark.parametrize("alpha", [False, True])
@pytest.mark.parametrize("inplace", [False, True])
def test_index_add_on_bool_ors_source_times_alpha(path, alpha, inplace):
    """alpha=False makes the bool source all False (self unchanged); alpha=True ORs it in."""
    torch.manual_seed(0)
    x, src, idx = _x(torch.bool, (5, 5)), _x(torch.bool, (5, 5)), torch.tensor([0, 4, 0, 2, 1])
    if inplace:
        check(lambda a, i, s: a.clone().index_add_(-1, i, s, alpha=alpha), x, idx, src)
    else:
        check(lambda a, i, s: a.index_add(-1, i, s, alpha=alpha), x, idx, src)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8])
@pytest.mark.parametrize("alpha", [0.5, 1.7, -1.7, 2.0])
@pytest.mark.parametrize("form", ["index_add", "index_add_", "out="])
def test_index_add_into_integers_takes_a_float_alpha_as_eager_casts_it(path, dtype, alpha, form):
    """CPU eager casts the float alpha to the integer dtype (toward zero); torch's meta kernel
    refuses it, and so did both paths (found by the fuzz)."""
    if dtype == torch.uint8 and alpha < 0:
        alpha = -alpha
    torch.manual_seed(0)
    x = torch.randint(0, 9, (4, 3)).to(dtype)
    src, idx = torch.randint(0, 5, (2, 3)).to(dtype), torch.tensor([3, 1])

    def run(a, i, s):
        if form == "index_add":
            return a.index_add(0, i, s, alpha=alpha)
        if form == "index_add_":
            return a.clone().index_add_(0, i, s, alpha=alpha)
        return torch.index_add(a, 0, i, s, alpha=alpha, out=torch.empty_like(a))
    check(run, x, idx, src)
    bad = torch.tensor([7])                  # eager's IndexError comes first, alpha accepted
    with pytest.raises(IndexError):
        run(x, bad, src[:1])
    with pytest.raises(IndexError):
        run(dev(x), dev(bad), dev(src[:1]))
        xc.sync()
