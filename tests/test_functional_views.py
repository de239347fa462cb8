"""Functional path: views alias their base exactly as in eager (CPU eager is the reference)."""
from __future__ import annotations

import pytest
import torch

import xla_compat as xc
import xla_compat.functional  # noqa: F401  (registers the path)
from xla_compat import paths

from .conftest import assert_same


@pytest.fixture(autouse=True)
def functional():
    with paths.activated("functional"):
        yield


def _base(dtype, shape=(3, 4)):
    n = 1
    for s in shape:
        n *= s
    a = torch.arange(n).reshape(shape)
    if dtype is torch.bool:
        return a % 3 == 0
    return a.to(dtype)


def _write(v):
    if v.dtype is torch.bool:
        return v.logical_not_()
    return v.mul_(3).add_(1)


# Every view op functionalization turns into a *_copy op (plus a few composites built on them).
VIEWS = {
    "view": lambda b: b.view(2, 6),
    "view_flat": lambda b: b.view(-1),
    "reshape_contiguous": lambda b: b.reshape(6, 2),
    "alias": lambda b: torch.ops.aten.alias(b),
    "detach": lambda b: b.detach(),
    "as_strided": lambda b: b.as_strided((2, 2), (1, 4), 1),
    "diagonal": lambda b: b.diagonal(),
    "diagonal_offset": lambda b: b.diagonal(1),
    "permute": lambda b: b.permute(1, 0),
    "select": lambda b: b[1],
    "select_dim1": lambda b: b.select(1, -1),
    "slice": lambda b: b[:, 1:3],
    "slice_step": lambda b: b[::2],
    "narrow": lambda b: b.narrow(1, 1, 2),
    "split": lambda b: b.split(2, dim=1)[1],
    "split_with_sizes": lambda b: b.split_with_sizes([1, 3], dim=1)[1],
    "squeeze": lambda b: b.unsqueeze(0).squeeze(0),
    "squeeze_dim": lambda b: b[:1].squeeze(0),
    "squeeze_dims": lambda b: b[:1, None].squeeze((0, 1)),
    "t": lambda b: b.t(),
    "transpose": lambda b: b.transpose(0, 1),
    "unbind": lambda b: b.unbind(1)[2],
    "unfold": lambda b: b.unfold(1, 2, 2),
    "unsqueeze": lambda b: b.unsqueeze(1),
    "movedim": lambda b: b.movedim(0, 1),
    "expand_of_select": lambda b: b[0:1].expand(1, 4),
}
DTYPES = [torch.float32, torch.int64, torch.bool]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", sorted(VIEWS))
def test_write_through_view_reaches_base(name, dtype, dev):
    view = VIEWS[name]
    cpu = _base(dtype)
    d = cpu.to(dev)
    assert torch._is_functional_tensor(d)
    v_cpu, v_dev = view(cpu), view(d)
    assert v_dev.shape == v_cpu.shape
    assert v_dev.stride() == v_cpu.stride(), "view strides must be eager's"
    assert v_dev.storage_offset() == v_cpu.storage_offset()
    _write(v_cpu)
    _write(v_dev)
    assert_same(d, cpu)
    assert_same(v_dev, v_cpu)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", sorted(VIEWS))
def test_base_write_is_visible_through_earlier_view(name, dtype, dev):
    view = VIEWS[name]
    cpu = _base(dtype)
    d = cpu.to(dev)
    v_cpu, v_dev = view(cpu), view(d)
    _write(cpu)
    _write(d)
    assert_same(v_dev, v_cpu)


def test_view_as_real_and_complex_write_through(dev):
    cpu = torch.arange(12, dtype=torch.float32).reshape(3, 2, 2)
    d = cpu.to(dev)
    c_cpu, c_dev = torch.view_as_complex(cpu), torch.view_as_complex(d)
    c_cpu.mul_(2j)
    c_dev.mul_(2j)
    assert_same(d, cpu)
    r_cpu, r_dev = torch.view_as_real(c_cpu), torch.view_as_real(c_dev)
    r_cpu[:, 0].add_(5)
    r_dev[:, 0].add_(5)
    assert_same(c_dev, c_cpu)
    assert_same(d, cpu)


CHAINS = [
    ("t_then_select", lambda b: b.t()[1]),
    ("slice_then_t_then_slice", lambda b: b[1:].t()[::2]),
    ("view_then_diagonal", lambda b: b.view(2, 2, 3)[:, :, 1:].diagonal(0, 0, 1)),
    ("unsqueeze_permute_select", lambda b: b.unsqueeze(0).permute(2, 0, 1)[3]),
    ("transpose_unfold", lambda b: b.transpose(0, 1).unfold(1, 3, 3)),
    ("split_then_view", lambda b: b.split(2, dim=0)[0].view(-1)),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name,chain", CHAINS, ids=[c[0] for c in CHAINS])
def test_view_of_view_writes_and_reads(name, chain, dtype, dev):
    cpu = _base(dtype)
    d = cpu.to(dev)
    v_cpu, v_dev = chain(cpu), chain(d)
    assert v_dev.stride() == v_cpu.stride()
    _write(v_cpu)
    _write(v_dev)
    assert_same(d, cpu)
    _write(cpu)
    _write(d)
    assert_same(v_dev, v_cpu)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_sibling_views_stay_consistent(dtype, dev):
    cpu = _base(dtype)
    d = cpu.to(dev)
    row_c, col_c = cpu[1], cpu[:, 2]
    row_d, col_d = d[1], d[:, 2]
    _write(row_c)
    _write(row_d)
    assert_same(col_d, col_c)
    _write(col_c)
    _write(col_d)
    assert_same(row_d, row_c)
    assert_same(d, cpu)


@pytest.mark.parametrize("shape", [(0, 4), (3, 0), (0,)], ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_zero_size_views(shape, dtype, dev):
    cpu = _base(dtype, shape)
    d = cpu.to(dev)
    for view in (lambda b: b.t() if b.dim() == 2 else b.unsqueeze(0),
                 lambda b: b[..., :0], lambda b: b.reshape(-1), lambda b: b.unsqueeze(-1)):
        v_cpu, v_dev = view(cpu), view(d)
        assert v_dev.shape == v_cpu.shape
        _write(v_cpu)
        _write(v_dev)
        assert_same(v_dev, v_cpu)
        assert_same(d, cpu)


def test_transposed_view_is_not_contiguous_and_contiguous_copies(dev):
    cpu = torch.arange(12.).reshape(3, 4)
    d = cpu.to(dev)
    t = d.t()
    assert not t.is_contiguous()
    c = t.contiguous()
    c.add_(100)          # a copy: must not change d
    assert_same(d, cpu)
    assert_same(c, cpu.t() + 100)


def test_in_place_op_keeps_a_strided_view_strides(dev):
    d = torch.zeros(3, 4).to(dev)
    v = d[:, ::2]
    v.mul_(2)
    assert v.stride() == (4, 2)
    assert not v.is_contiguous()


def test_expand_write_through_one_piece(dev):
    cpu = torch.zeros(3)
    d = cpu.to(dev)
    cpu.expand(2, 3)[0].fill_(2)
    d.expand(2, 3)[0].fill_(2)
    assert_same(d, cpu)


def test_scatters_lower_to_dynamic_update_slice_for_dense_windows(dev):
    d = torch.zeros(8, 8).to(dev)
    d[2:5].add_(1)
    d[:, 3].fill_(7)
    text = xc.hlo_text([d])
    assert "dynamic_update_slice" in text
    assert "scatter" not in text.replace("dynamic_update_slice", "")
