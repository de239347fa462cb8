"""Regression tests for the functional-path gaps an audit found (issue 3), against CPU eager.

A. a bool write through one piece of an expanded view reaches the base;
B. ``as_strided`` of a view indexes the storage it shares with its base (reads and writes);
C. ``as_strided_scatter`` with a static dense window is one dynamic_update_slice;
D. a user's own call of a ``*_copy`` op returns a fresh tensor with eager's (contiguous) layout.
"""
from __future__ import annotations

import pytest
import torch

import xla_compat as xc
from tests.conftest import assert_same

aten = torch.ops.aten


# -- A. bool writes through one piece of an expanded view ----------------------------------------

BOOL_PIECE_WRITES = {
    "setitem_row": ((4,), (3, 4), lambda e: e.__setitem__(1, False)),
    "fill_row": ((4,), (3, 4), lambda e: e[0].fill_(True)),
    "zero_row": ((4,), (3, 4), lambda e: e[2].zero_()),
    "logical_not_row": ((4,), (3, 4), lambda e: e[2].logical_not_()),
    "setitem_part_of_a_row": ((4,), (3, 4), lambda e: e[1, 1:3].fill_(True)),
    "logical_not_column": ((3, 1), (3, 4), lambda e: e[:, 2].logical_not_()),
    "setitem_0d_base": ((), (4,), lambda e: e.__setitem__(2, False)),
    "two_pieces_in_turn": ((4,), (3, 4), lambda e: (e[0].fill_(True), e[1].logical_not_())),
}


def _bools(shape):
    n = 1
    for s in shape:
        n *= s
    return (torch.arange(n) % 3 == 0).reshape(shape)


@pytest.mark.parametrize("name", sorted(BOOL_PIECE_WRITES))
def test_bool_write_through_a_piece_of_an_expanded_view_reaches_the_base(path, dev, name):
    base_shape, shape, write = BOOL_PIECE_WRITES[name]
    cpu = _bools(base_shape)
    d = cpu.to(dev)
    later = d.expand(shape)             # a view taken before the write sees it
    write(cpu.expand(shape))
    write(d.expand(shape))
    assert_same(d, cpu, msg=name)
    assert_same(later, cpu.expand(shape), msg=name)


def test_bool_piece_write_still_works_after_user_adds_bool_to_int(path, dev):
    """A user's ``bool + int`` with the write-back's geometry first (its trace must not be
    replayed for the write-back's add, which has to stay bool)."""
    m_cpu, n_cpu = _bools((4,)), torch.arange(4)
    m, n = m_cpu.to(dev), n_cpu.to(dev)
    for _ in range(2):
        assert_same(m + n, m_cpu + n_cpu)
        assert_same(m + n * 0.5, m_cpu + n_cpu * 0.5)
        cpu = _bools((4,))
        d = cpu.to(dev)
        cpu.expand(3, 4)[1] = True
        d.expand(3, 4)[1] = True
        assert_same(d, cpu)


def test_bool_in_place_add_of_int_raises_as_eager(path, dev):
    m = _bools((4,)).to(dev)
    with pytest.raises(RuntimeError):
        m.add_(torch.arange(4).to(dev))
    assert_same(m, _bools((4,)))


# -- B. as_strided of a view ---------------------------------------------------------------------

AS_STRIDED_OF_VIEWS = {
    "t": (lambda d: d.t(), ((2, 2), (1, 4), None)),
    "slice_offset_0": (lambda d: d[1:], ((2,), (1,), 0)),
    "slice_default_offset": (lambda d: d[1:], ((3, 2), (1, 4), None)),
    "select_column": (lambda d: d[:, 2], ((3,), (5,), 1)),
    "view_of_a_view": (lambda d: d[1:].t()[1:], ((2, 2), (4, 1), 2)),
}


@pytest.mark.parametrize("name", sorted(AS_STRIDED_OF_VIEWS))
def test_as_strided_of_a_view_reads_the_storage_it_shares_with_its_base(path, dev, name):
    view, (size, stride, offset) = AS_STRIDED_OF_VIEWS[name]
    cpu = torch.arange(12.).reshape(3, 4)
    d = cpu.to(dev)
    got = view(d).as_strided(size, stride, offset)
    exp = view(cpu).as_strided(size, stride, offset)
    assert_same(got, exp, msg=name)
    assert got.stride() == exp.stride() and got.storage_offset() == exp.storage_offset()


@pytest.mark.parametrize("name", sorted(AS_STRIDED_OF_VIEWS))
def test_write_through_as_strided_of_a_view_reaches_the_base_and_other_views(path, dev, name):
    view, (size, stride, offset) = AS_STRIDED_OF_VIEWS[name]
    cpu = torch.arange(12.).reshape(3, 4)
    d = cpu.to(dev)
    sibling_cpu, sibling = cpu[:, 1:], d[:, 1:]
    piece_cpu = view(cpu).as_strided(size, stride, offset)
    piece = view(d).as_strided(size, stride, offset)
    piece_cpu.add_(100)
    piece.add_(100)
    assert_same(d, cpu, msg=name)
    assert_same(sibling, sibling_cpu, msg=name)
    assert_same(piece, piece_cpu, msg=name)
    xc.sync()
    piece_cpu.mul_(-1)
    piece.mul_(-1)
    assert_same(d, cpu, msg=name)


def test_write_through_as_strided_of_a_detached_tensor_reaches_it(path, dev):
    cpu = torch.arange(12.).reshape(3, 4)
    d = cpu.to(dev)
    cpu.detach().as_strided((2, 2), (1, 4), 1).add_(1)
    d.detach().as_strided((2, 2), (1, 4), 1).add_(1)
    assert_same(d, cpu)


@pytest.mark.parametrize("make", ["base", "t_slice", "result"])
def test_detach_shares_storage_and_geometry_with_its_tensor_every_time(path, dev, make):
    """``detach`` (autograd's, on every accumulated gradient) takes a shortcut on both paths; its
    tensor has the argument's strides and storage, writes go both ways, the second call (a
    plan's) like the first, and a gradient read through it is eager's."""
    def program(x):
        y = {"base": lambda: x, "t_slice": lambda: x.t()[1:, ::2], "result": lambda: x * 2}[make]()
        seen = []
        for step in range(2):
            d = y.detach()
            assert tuple(d.stride()) == tuple(y.stride()) and d.shape == y.shape
            assert d.storage_offset() == y.storage_offset() and d.requires_grad is False
            d.add_(step + 1)
            y.mul_(3)
            seen += [d.cpu().clone(), y.cpu().clone()]
        return seen
    cpu = torch.arange(20.).reshape(4, 5)
    d = cpu.to(dev)
    for got, want in zip(program(d), program(cpu)):
        assert_same(got, want)
    assert_same(d, cpu)
    w_cpu = torch.ones(3, 2, requires_grad=True)
    w = w_cpu.detach().to(dev).requires_grad_()
    (w * w).sum().backward()
    (w_cpu * w_cpu).sum().backward()
    assert_same(w.grad, w_cpu.grad)
    assert_same(w.grad.detach(), w_cpu.grad)


def test_as_strided_past_a_view_without_a_nameable_base_is_the_documented_limit(dev):
    """migration_guide/model_developers.md: a view of ``y.detach()`` (``y`` an op's result) has
    no base the path can name; reaching past its own elements is a clear error, not a wrong read."""
    from xla_compat import paths
    from xla_compat.functional import FunctionalizationLimit
    with paths.activated("functional"):
        y = torch.arange(12.).reshape(3, 4).to(dev) * 1
        with pytest.raises(FunctionalizationLimit, match="as_strided"):
            y.detach()[1:].as_strided((2,), (1,), 0)
        assert_same(y.detach()[1:].as_strided((2,), (1,), 5), torch.tensor([5., 6.]))


def test_gradient_through_as_strided_of_a_view_matches_eager(path, dev):
    def grads(w):
        y = (w * 1).t().as_strided((2, 2), (1, 4)) * torch.tensor([[1., 2.], [3., 4.]]).to(
            w.device)
        y.sum().backward()
        return w.grad
    w_cpu = torch.arange(12.).reshape(3, 4).requires_grad_()
    w_dev = torch.arange(12.).reshape(3, 4).to(dev).requires_grad_()
    assert_same(grads(w_dev), grads(w_cpu))


def test_upstream_functionalize_on_cpu_keeps_upstream_as_strided():
    """The path's Functionalize kernel for as_strided serves hlo wrappers only: functionalization
    of CPU tensors (torch.func.functionalize) behaves as before."""
    def f(x):
        return x.t().as_strided((2, 2), (1, 4)) * 2
    x = torch.arange(12.).reshape(3, 4)
    assert_same(torch.func.functionalize(f)(x), f(x))


def test_upstream_functionalize_on_cpu_keeps_upstream_pack_padded_sequence():
    """The path's Functionalize kernel for ``_pack_padded_sequence`` (batch_sizes left
    unwrapped) serves hlo wrappers only: torch.func.functionalize of CPU code is as before."""
    from torch.nn.utils.rnn import pack_padded_sequence

    def f(x):
        packed = pack_padded_sequence(x, [3, 2])
        return packed.data * 2, packed.batch_sizes
    x = torch.randn(3, 2, 4)
    got, want = torch.func.functionalize(f)(x), f(x)
    assert_same(got[0], want[0], rtol=0, atol=0)
    assert torch.equal(got[1], want[1])


def test_as_strided_of_a_view_reaching_past_the_storage_raises_eagers_error(path, dev):
    cpu = torch.arange(12.).reshape(3, 4)
    with pytest.raises(RuntimeError, match="out of bounds"):
        cpu[1:].as_strided((4, 4), (4, 1), 0)
    with pytest.raises(RuntimeError, match="out of bounds"):
        cpu.to(dev)[1:].as_strided((4, 4), (4, 1), 0)


# -- C. as_strided_scatter lowering --------------------------------------------------------------

# (size, stride, offset, src shape) of as_strided_scatter into a (4, 4) tensor.
SCATTER_WINDOWS = {
    "rows": ((2, 4), (4, 1), 4, True),
    "block": ((2, 2), (4, 1), 5, True),
    "transposed_block": ((2, 3), (1, 4), 1, True),
    "with_unit_dims": ((1, 2, 1, 3), (7, 4, 9, 1), 0, True),
    "one_element": ((1,), (1,), 7, True),
    "strided_columns": ((4, 2), (4, 2), 0, False),
    "overlapping": ((3, 3), (1, 1), 0, False),
    "wrapping_rows": ((3,), (1,), 3, False),
}


@pytest.mark.parametrize("name", sorted(SCATTER_WINDOWS))
def test_as_strided_scatter_matches_eager_and_is_an_update_slice_where_dense(path, dev, name):
    size, stride, offset, dense = SCATTER_WINDOWS[name]
    n = 1
    for s in size:
        n *= s
    src_cpu = torch.arange(100., 100. + n).reshape(size)
    x_cpu = torch.zeros(4, 4)
    x = x_cpu.to(dev)
    xc.sync()
    y = aten.as_strided_scatter(x, src_cpu.to(dev), size, stride, offset)
    text = xc.hlo_text([y])
    assert_same(y, aten.as_strided_scatter(x_cpu, src_cpu, size, stride, offset), msg=name)
    if path == "functional":      # the legacy path writes through its own view machinery
        assert ("dynamic_update_slice" in text) == dense, text
        assert ("scatter" in text.replace("as_strided_scatter", "")) != dense, text


def test_dense_box_finds_only_dense_windows():
    from xla_compat.lowering.views import dense_box
    assert dense_box((4, 4), (2, 4), (4, 1), 4) == ((0, 1), (2, 4), (1, 0))
    assert dense_box((4, 4), (3, 2), (1, 4), 1) == ((1, 0), (2, 3), (0, 1))
    assert dense_box((4, 4), (2, 2), (8, 1), 0) is None      # rows 0 and 2: a gap
    assert dense_box((4, 4), (3,), (1,), 3) is None          # wraps from row 0 into row 1
    assert dense_box((4, 4), (2, 2), (0, 1), 0) is None      # overlapping
    assert dense_box((4, 4), (0, 2), (1, 1), 0) is None      # empty: nothing to update


# -- D. a user's own *_copy call -----------------------------------------------------------------

COPY_CALLS = {
    "expand_copy": lambda z: aten.expand_copy(z, [2, 3, 4]),
    "t_copy": lambda z: aten.t_copy(z),
    "transpose_copy": lambda z: aten.transpose_copy(z, 0, 1),
    "permute_copy": lambda z: aten.permute_copy(z, [1, 0]),
    "select_copy": lambda z: aten.select_copy(z, 1, 2),
    "slice_copy": lambda z: aten.slice_copy(z, 1, 1, 4, 2),
    "diagonal_copy": lambda z: aten.diagonal_copy(z),
    "unfold_copy": lambda z: aten.unfold_copy(z, 1, 2, 1),
    "as_strided_copy": lambda z: aten.as_strided_copy(z, (2, 2), (1, 4), 1),
    "unbind_copy": lambda z: aten.unbind_copy(z, 1),
    "split_copy": lambda z: aten.split_copy(z, 2, 1),
    "squeeze_copy.dim": lambda z: aten.squeeze_copy.dim(aten.unsqueeze_copy(z, 1), 1),
    "of_a_transposed_view": lambda z: aten.expand_copy(z.t(), [2, 4, 3]),
}


@pytest.mark.parametrize("name", sorted(COPY_CALLS))
def test_direct_copy_op_call_returns_a_fresh_tensor_laid_out_as_eager(path, dev, name):
    op = COPY_CALLS[name]
    cpu = torch.arange(12.).reshape(3, 4)
    d = cpu.to(dev)
    exp, got = op(cpu), op(d)
    exp_l = list(exp) if isinstance(exp, (list, tuple)) else [exp]
    got_l = list(got) if isinstance(got, (list, tuple)) else [got]
    for e, g in zip(exp_l, got_l, strict=True):
        assert_same(g, e, msg=name)
        assert (g.stride(), g.storage_offset()) == (e.stride(), e.storage_offset()), name
        e.add_(1)
        g.add_(1)                       # a fresh tensor: writable, and the input keeps its values
        assert_same(g, e, msg=name)
    assert_same(d, cpu, msg=name)


def test_views_do_not_go_through_the_copy_op_kernel(dev, monkeypatch):
    """Functionalization's own view kernels call *_copy ops below the Functionalize key: the
    user-call kernel never sees them (no cost on the view path)."""
    import importlib
    from xla_compat import paths
    boundary = importlib.import_module("xla_compat.functional.boundary")
    seen = []
    real = boundary._unwrap
    monkeypatch.setattr(boundary, "_unwrap", lambda t: (seen.append(t), real(t))[1])
    with paths.activated("functional"):
        x = torch.arange(12.).reshape(3, 4).to(dev)
        views = [x.t()[1:].expand(2, 3, 3), x.unfold(1, 2, 1).select(0, 1), x.diagonal()]
        assert seen == []
        aten.t_copy(x)
        assert seen                     # (the probe itself works)
    cpu = torch.arange(12.).reshape(3, 4)
    for got, exp in zip(views, [cpu.t()[1:].expand(2, 3, 3), cpu.unfold(1, 2, 1).select(0, 1),
                                cpu.diagonal()]):
        assert_same(got, exp)


@pytest.mark.parametrize("make", [
    lambda dev: torch.tensor([1., 2., 3.], device=dev),
    lambda dev: torch.as_tensor([1., 2., 3.], device=dev),
    lambda dev: torch.tensor([[1, 2, 3]], device=dev, dtype=torch.int32),
    lambda dev: torch.tensor(5.0, device=dev),
], ids=["tensor", "as_tensor", "int32 matrix", "0-dim"])
def test_a_tensor_made_from_data_on_the_device_is_a_user_tensor_whose_views_alias(path, dev, make):
    # torch.tensor(data, device=hlo) lifts a tensor made below the Functionalize key: it was
    # handed out bare on the functional path, and writes through its views were lost.
    cpu, d = make("cpu"), make(dev)
    for t in (cpu, d):
        t.view(-1)[0].add_(1)
        t.mul_(2)
    assert_same(d, cpu)
    assert_same(d.view(-1)[:1] + 1, cpu.view(-1)[:1] + 1)


def test_a_tensor_made_from_data_with_requires_grad_gets_its_gradient(path, dev):
    w_cpu = torch.tensor([1., -2., 3.], requires_grad=True)
    w = torch.tensor([1., -2., 3.], device=dev, requires_grad=True)
    for t in (w_cpu, w):
        (t * t).sum().backward()
    assert_same(w.grad, w_cpu.grad)
