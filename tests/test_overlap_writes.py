"""Writes into views whose elements overlap (unfold with step < size, as_strided), and out= views
resized within their storage, against CPU eager.

Eager runs such a write element by element over the shared memory in its TensorIterator's order:
a pointwise in-place op compounds (an element in k windows is doubled k times by ``mul_(2)``),
a plain write (``copy_``, out=) keeps the last value written there, an accumulating index op
adds every contribution. Every program runs twice (the second call replays trace plans).
"""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from tests.conftest import PATHS, assert_same
from tests.sampling import all_pairs
from xla_compat.lowering.views import OverlapWalk, iteration_order


def _run_twice(program, cpu_base, dev):
    """``program(base)`` twice on CPU and on the device; the bases must agree after each call."""
    d = cpu_base.clone().to(dev)
    c = cpu_base.clone()
    for _ in range(2):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            program(c)
            program(d)
        assert_same(d, c)


# -- unfold geometries with overlapping windows: (base shape, dim, size, step) --------------------
WINDOWS = [((10,), 0, 3, 1), ((10,), 0, 4, 2), ((10,), 0, 8, 1), ((3, 1, 4), -1, 3, 1),
           ((2, 7), 1, 3, 2), ((6, 2), 0, 3, 1), ((4, 5), 0, 2, 1)]


def _windows(t, geometry):
    _, d, size, step = geometry
    return t.unfold(d, size, step)


def _values(view, dtype, offset=0):
    """A tensor of the view's shape whose elements all differ (so the element order shows)."""
    n = view.numel()
    return (torch.arange(n, dtype=torch.int64).reshape(view.shape) * 3 + offset).to(
        dtype).to(view.device)


@pytest.mark.parametrize("geometry", WINDOWS, ids=str)
@pytest.mark.parametrize("dtype", [torch.int64, torch.float32])
def test_in_place_mul_compounds_once_per_window(path, dev, geometry, dtype):
    base = torch.arange(1, int(np.prod(geometry[0])) + 1).reshape(geometry[0]).to(dtype)
    _run_twice(lambda t: _windows(t, geometry).mul_(2), base, dev)


@pytest.mark.parametrize("geometry", WINDOWS, ids=str)
def test_in_place_add_of_a_tensor_adds_every_windows_element(path, dev, geometry):
    base = torch.arange(int(np.prod(geometry[0]))).reshape(geometry[0]).double()
    _run_twice(lambda t: (lambda v: v.add_(_values(v, t.dtype)))(_windows(t, geometry)),
               base, dev)


@pytest.mark.parametrize("op", ["sub_div", "clamp_tensor", "add_self", "lerp", "sigmoid"])
def test_in_place_ops_walk_the_shared_memory_in_eagers_order(path, dev, op):
    """Non-commuting sequences (clamp with per-element bounds, lerp) show the element order."""
    def program(t):
        v = t.unfold(0, 4, 1)
        if op == "sub_div":
            v.sub_(1).div_(2)
        elif op == "clamp_tensor":
            v.clamp_(max=_values(v, t.dtype) % 7)
        elif op == "add_self":
            v.add_(v)
        elif op == "lerp":
            v.lerp_(_values(v, t.dtype), 0.25)
        else:
            v.sigmoid_()
    _run_twice(program, torch.arange(9.), dev)


@pytest.mark.parametrize("geometry", WINDOWS, ids=str)
@pytest.mark.parametrize("transposed", [False, True])
def test_copy_into_overlapping_windows_keeps_the_last_write_in_eagers_order(path, dev, geometry,
                                                                           transposed):
    """copy_'s walk order follows the destination's strides, ties broken by the source's."""
    def program(t):
        v = _windows(t, geometry)
        src = _values(v, t.dtype, offset=100)
        if transposed and v.dim() >= 2:
            src = src.transpose(-1, -2).contiguous().transpose(-1, -2)
        v.copy_(src)
    _run_twice(program, torch.zeros(geometry[0]), dev)


@pytest.mark.parametrize("geometry", WINDOWS, ids=str)
def test_out_into_overlapping_windows_keeps_the_last_write(path, dev, geometry):
    def program(t):
        v = _windows(t, geometry)
        torch.mul(_values(v, t.dtype), -1, out=v)
    _run_twice(program, torch.zeros(geometry[0]), dev)


@pytest.mark.parametrize("op", ["fill", "masked_fill", "index_fill", "index_put", "index_copy",
                                "scatter", "index_put_accumulate", "index_add", "scatter_add"])
def test_index_and_fill_ops_on_overlapping_windows_match_eager(path, dev, op):
    def program(t):
        v = t.unfold(0, 3, 1)
        idx = torch.tensor([1, 2], device=t.device)
        if op == "fill":
            v.fill_(7)
        elif op == "masked_fill":
            v.masked_fill_(_values(v, torch.int64) % 2 == 0, -5)
        elif op == "index_fill":
            v.index_fill_(0, idx, -5)
        elif op == "index_put":
            v.index_put_((idx,), torch.tensor([-1., -2, -3], device=t.device))
        elif op == "index_copy":
            v.index_copy_(0, idx, -torch.arange(6., device=t.device).reshape(2, 3))
        elif op == "scatter":
            v.scatter_(1, torch.tensor([[2], [0]] * 4, device=t.device), -9.)
        elif op == "index_put_accumulate":
            v.index_put_((idx,), torch.tensor([10., 20, 30], device=t.device), accumulate=True)
        elif op == "index_add":
            v.index_add_(0, idx, torch.ones(2, 3, device=t.device))
        else:
            v.scatter_add_(1, torch.tensor([[1], [0]] * 4, device=t.device),
                           torch.ones(8, 1, device=t.device))
    _run_twice(program, torch.arange(1., 11.), dev)


def test_in_place_op_on_overlapping_as_strided_view_compounds_like_eager(path, dev):
    _run_twice(lambda t: t.as_strided((4, 3), (2, 1)).mul_(2), torch.arange(1., 11.), dev)


# -- as_strided views whose elements overlap: (size, stride, storage offset) of a base of 12 ------
STRIDED = [((4, 3), (2, 1), 0), ((3, 3), (2, 1), 1), ((3, 2, 2), (2, 1, 1), 0),
           ((4, 3), (1, 1), 2), ((2, 3, 2), (3, 2, 1), 0), ((3, 3), (3, 2), 0)]


def _operand(view):
    """Per-element numbers that make the walk order show in non-commuting ops."""
    n = view.numel()
    return (torch.arange(n, dtype=torch.float64, device=view.device) * 7 % 5).reshape(
        view.shape).to(view.dtype)


def _permuted(shape, device):
    """A tensor of ``shape`` whose dims lie in memory in reverse order (each stride breaks the
    view's stride ties the other way)."""
    n = int(np.prod(shape))
    return torch.arange(float(n), device=device).reshape(shape[::-1]).permute(
        *range(len(shape) - 1, -1, -1))


# every op meets every geometry, and each of them both paths, in make test (all_pairs)
@pytest.mark.parametrize("path,op,geometry", all_pairs(
    PATHS, ["mul", "lerp", "add_self", "sub_div", "fill", "index_add", "index_put", "copy", "out",
            "out_permuted"], STRIDED), indirect=["path"])
def test_writes_into_an_overlapping_as_strided_view_follow_eagers_walk(path, dev, geometry, op):
    size, stride, offset = geometry

    def program(t):
        v = t.as_strided(size, stride, offset)
        if op == "mul":
            v.mul_(2)
        elif op == "lerp":
            v.lerp_(_operand(v), 0.25)
        elif op == "add_self":
            v.add_(v)
        elif op == "sub_div":
            v.sub_(1).div_(2)
        elif op == "fill":
            v.fill_(-3)
        elif op == "index_add":
            v.index_add_(0, torch.tensor([0, size[0] - 1], device=t.device),
                         torch.ones((2,) + size[1:], device=t.device))
        elif op == "index_put":
            v.index_put_((torch.tensor([1], device=t.device),),
                         -torch.arange(1., 1 + int(np.prod(size[1:])), device=t.device).reshape(
                             size[1:]))
        elif op == "copy":
            v.copy_(_operand(v) + 100)
        elif op == "out":
            torch.mul(_operand(v), -1, out=v)
        else:
            torch.mul(_permuted(size, t.device), -1, out=v)
    _run_twice(program, torch.arange(1., 13.), dev)


def test_as_strided_write_into_a_base_with_permuted_strides_follows_eagers_walk(path, dev):
    """as_strided indexes the base's storage, whose order is not its logical order here."""
    def program(device):
        x = torch.arange(1., 13., device=device).reshape(4, 3).t().mul(1)    # strides (1, 3)
        for _ in range(2):
            x.as_strided((4, 3), (2, 1), 1).mul_(2)
            x.as_strided((3, 3), (1, 1)).lerp_(torch.arange(9., device=device).reshape(3, 3) % 4,
                                               0.25)
        return x
    assert_same(program(dev), program("cpu"))


@pytest.mark.parametrize("view", ["unfold", "as_strided"])
def test_in_place_op_on_an_overlapping_view_read_before_a_sync_compounds(path, dev, view):
    """The view's value reaches the write as device data (no read left in the graph)."""
    import xla_compat as xc

    def program(t):
        v = t.unfold(0, 3, 1) if view == "unfold" else t.as_strided((4, 3), (2, 1))
        if t.device.type != "cpu":
            xc.sync()
        v.lerp_(_operand(v), 0.25)
    _run_twice(program, torch.arange(1., 11.), dev)


# (base shape, dim, size, step, input's dim order in memory, second operand's shape or None)
OUT_PERMUTED = [((2, 6), 1, 3, 1, (2, 1, 0), None), ((1, 2, 5), 2, 3, 1, (3, 0, 1, 2), None),
                ((3, 1, 5), 0, 2, 1, (1, 2, 3, 0), None), ((3, 7), 1, 3, 1, (0, 2, 1), (3, 5, 3)),
                ((2, 5), 1, 3, 1, (2, 0, 1), (1, 3, 1)), ((8,), 0, 3, 1, (1, 0), (6, 1))]


@pytest.mark.parametrize("case", OUT_PERMUTED, ids=str)
def test_out_write_into_overlapping_windows_of_permuted_inputs_matches_eager(path, dev, case):
    """The out= result's walk: the windows' strides first, ties broken by the inputs' layout."""
    shape, d, size, step, order, other = case

    def program(t):
        v = t.unfold(d, size, step)
        n = v.numel()
        inv = [order.index(i) for i in range(v.dim())]
        src = torch.arange(float(n), device=t.device).reshape(
            [v.shape[i] for i in order]).permute(inv)
        if other is None:
            torch.mul(src, -1, out=v)
        else:
            b = torch.arange(float(np.prod(other)), device=t.device).reshape(other) * 7 % 5
            torch.add(src, b, out=v)
    _run_twice(program, torch.zeros(shape), dev)


def test_in_place_op_with_a_permuted_operand_on_overlapping_windows_matches_eager(path, dev,
                                                                                 request):
    """Eager breaks the windows' stride tie with the operand's strides."""
    if path == "functional":
        request.applymarker(pytest.mark.xfail(strict=True, reason=(
            "open (functional): the in-place op's result reaches the write-back with the "
            "written view's strides (writes_eager._keep_written_layout), so the walk takes the "
            "other operand as contiguous")))
    _run_twice(lambda t: t.unfold(0, 3, 1).lerp_(
        (torch.arange(24., device=t.device) * 7 % 5).reshape(3, 8).t(), 0.25),
        torch.arange(1., 11.), dev)


@pytest.mark.parametrize("base, dim, size, step", [
    ((7,), 0, 2, 2), ((9,), 0, 2, 3), ((3, 8), 1, 2, 3), ((8, 3), 0, 3, 4)])
def test_out_write_into_unfold_windows_with_gaps_keeps_the_gap_elements(path, dev, base, dim,
                                                                        size, step):
    # The functional path writes the result into a fresh tensor and copies it into the view
    # (functional/checks.py): upstream's write-back of an out= result alone lost the gaps.
    def program(t):
        v = t.unfold(dim, size, step)
        torch.mul(torch.ones(v.shape, device=t.device), 2, out=v)
    _run_twice(program, torch.arange(float(torch.Size(base).numel())).reshape(base), dev)


def test_in_place_op_on_an_overlapping_view_reads_the_windows_value_after_the_write(path, dev):
    cpu = torch.arange(1., 11.)
    d = cpu.to(dev)
    vc, vd = cpu.unfold(0, 3, 1), d.unfold(0, 3, 1)
    vc.mul_(3)
    vd.mul_(3)
    assert_same(vd, vc)
    assert_same(d, cpu)


def test_out_write_into_overlapping_windows_of_a_transposed_input_matches_eager(path, dev):
    """Eager breaks the destination's stride tie with the input's strides."""
    def program(t):
        src = torch.arange(24., device=t.device).reshape(3, 8).t()
        torch.mul(src, -1, out=t.unfold(0, 3, 1))
    _run_twice(program, torch.zeros(10), dev)


# -- out= views resized within their storage ------------------------------------------------------
RESIZED = [((12,), (slice(3, 9),), (2, 2)), ((4, 4), (slice(None), slice(1, 3)), (2, 2)),
           ((12,), (slice(1, 3),), (3,)), ((12,), (slice(2, 12),), (2, 3)),
           ((12,), (slice(2, 12, 2),), (2, 2))]


@pytest.mark.parametrize("case", RESIZED, ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_out_view_resized_within_its_storage_writes_the_storage_from_its_offset(path, dev, case,
                                                                                dtype):
    base_shape, index, shape = case
    src = torch.arange(1, int(np.prod(shape)) + 1).reshape(shape).to(dtype)
    _run_twice(lambda t: torch.mul(src.to(t.device), 2, out=t[index]),
               torch.zeros(base_shape, dtype=dtype), dev)


# -- the walk order itself ------------------------------------------------------------------------
@pytest.mark.parametrize("shape,step", [((10,), 1), ((10,), 2), ((3, 9), 1), ((2, 3, 8), 3)])
def test_iteration_order_reproduces_eagers_last_write_on_cpu(shape, step):
    """Write each element's own index through overlapping windows on CPU: what survives in each
    storage element is the index the walk visits last there."""
    for size in (step + 1, step + 3):
        base = torch.zeros(shape, dtype=torch.int64)
        v = base.unfold(-1, size, step)
        v.copy_(torch.arange(v.numel()).reshape(v.shape))
        pos = np.arange(base.numel()).reshape(shape)
        pos = torch.from_numpy(pos).unfold(-1, size, step).numpy()
        walk = OverlapWalk(pos, iteration_order(tuple(v.shape), [v.stride(), v.stride()]))
        expected = base.clone().reshape(-1)
        expected[torch.from_numpy(pos.reshape(-1))] = torch.from_numpy(walk.last)
        assert torch.equal(base.reshape(-1), expected)


def test_the_quick_distinctness_test_never_calls_an_overlapping_layout_distinct():
    import itertools
    import numpy as np
    from xla_compat.lowering import views as lv
    said_distinct = 0
    for shape in itertools.product((1, 2, 3), repeat=3):
        for stride in itertools.product((0, 1, 2, 3, 6), repeat=3):
            pos = lv.strided_index(shape, stride, 0)
            if lv.surely_distinct(shape, stride):
                said_distinct += 1
                assert np.unique(pos).size == pos.size, (shape, stride)
    assert said_distinct > 500      # and it does say so for the ordinary layouts
    assert lv.surely_distinct((4, 4, 8, 32), (131072, 32768, 4096, 1))   # W4's view


@pytest.mark.parametrize("sizes, dim, size, step", [((10,), 0, 3, 1), ((4, 9), 1, 4, 2),
                                                   ((7,), 0, 2, 3)])
def test_a_programs_own_unfold_backward_sums_the_windows_like_eager(path, dev, sizes, dim, size,
                                                                    step):
    # istft's overlap-add calls unfold_backward itself: that is the sum of the windows, unlike
    # the write-back of an unfold view (the element walk above).
    windows = torch.randn(torch.empty(sizes).unfold(dim, size, step).shape)
    for _ in range(2):
        expected = torch.ops.aten.unfold_backward(windows, list(sizes), dim, size, step)
        got = torch.ops.aten.unfold_backward(windows.to(dev), list(sizes), dim, size, step)
        assert_same(got, expected)


# -- writes through a view of overlapping windows, and into windows a sync left materialised ----
def _sub(name):
    """A write through a view of ``v`` = windows of 6 elements (size 3, step 1)."""
    def idx(v):
        return torch.tensor([0, 2], device=v.device)
    return {
        "setitem_column": lambda v: v.__setitem__((slice(None), 1), 5.),
        "fill_column": lambda v: v[:, 1].fill_(5.),
        "fill_window": lambda v: v[1].fill_(5.),
        "fill_windows": lambda v: v[1:3].fill_(-1.),
        "fill_transposed": lambda v: v.t().fill_(2.),
        "mul_column": lambda v: v[:, 1].mul_(2.),
        "mul_window": lambda v: v[1].mul_(2.),
        "mul_tail_of_window": lambda v: v[2][1:].mul_(3.),
        "copy_column": lambda v: v[:, 1].copy_(torch.tensor([10., 20, 30, 40], device=v.device)),
        "index_fill_window": lambda v: v[1].index_fill_(0, idx(v), -1.),
    }[name]


SUB_WRITES = ["setitem_column", "fill_column", "fill_window", "fill_windows", "fill_transposed",
              "mul_column", "mul_window", "mul_tail_of_window", "copy_column", "index_fill_window"]


@pytest.mark.parametrize("synced", [False, True], ids=["pending", "synced"])
@pytest.mark.parametrize("write", SUB_WRITES)
def test_a_write_through_a_view_of_overlapping_windows_writes_the_shared_memory_like_eager(
        path, dev, write, synced):
    # Fuzz (session 18, seed 17021): upstream reads the windows once for the op and again for
    # the write-back through the view of them; the functional walk took the second read for
    # another value and kept the unwritten copies of each shared element (``v[:, 1] = 5`` left
    # elements 1-3 alone).
    def program(t):
        v = t.unfold(0, 3, 1)
        if synced:
            v.add_(0)
            if t.device.type != "cpu":
                import xla_compat as xc
                xc.sync()
        _sub(write)(v)
    _run_twice(program, torch.arange(6.), dev)


SYNCED_WRITES = {
    "mul": lambda v: v.mul_(2),
    "add_self": lambda v: v.add_(v),
    "index_fill": lambda v: v.index_fill_(0, torch.tensor([0, 2], device=v.device), -1),
    "masked_fill": lambda v: v.masked_fill_(v > 3, 0),
    "clamp": lambda v: v.clamp_(2, 4),
    "copy_host": lambda v: v.copy_(torch.arange(12.).reshape(4, 3) * 10),
    "copy_device": lambda v: v.copy_(torch.ones(4, 3, device=v.device) * 7),
    "out_add": lambda v: torch.add(torch.arange(12.).reshape(4, 3).to(v.device), 1, out=v),
}


@pytest.mark.parametrize("write", sorted(SYNCED_WRITES))
def test_a_write_into_overlapping_windows_written_before_a_sync_walks_like_eager(path, dev, write):
    # Fuzz (session 18, seed 17021): after ``v.clamp_(..)`` and a sync the functional view holds
    # device data of its own (upstream does not re-read it from its base), so the write-back
    # found no read of the windows and wrote each element once: ``v.mul_(2)`` doubled each
    # element once, ``v.index_fill_`` kept the unfilled copies of the shared elements.
    def program(t):
        v = t.unfold(0, 3, 1)
        v.clamp_(1, 8)
        if t.device.type != "cpu":
            import xla_compat as xc
            xc.sync()
        SYNCED_WRITES[write](v)
    _run_twice(program, torch.arange(6.), dev)


# Views of the windows a write goes through (each is a view of overlapping windows ``v``; most of
# them overlap themselves), and in-place ops: eager walks the op over the view's elements.
VIEWS_OF_WINDOWS = {
    "rows": lambda v: v[1:3], "columns": lambda v: v[:, :2], "t": lambda v: v.t(),
    "rows_t": lambda v: v[1:3].t(), "t_rows": lambda v: v.t()[1:],
    "columns_rows": lambda v: v[:, 1:][1:3], "every_other": lambda v: v[::2],
    "t_select": lambda v: v.t()[1], "permute": lambda v: v.permute(1, 0),
    "transpose": lambda v: v.transpose(0, 1), "last_rows": lambda v: v[-3:],
}
OPS_ON_VIEWS = {"mul": lambda w: w.mul_(2.), "add_self": lambda w: w.add_(w),
                "sub_div": lambda w: w.sub_(1).div_(2), "fill": lambda w: w.fill_(-1.),
                "add_ones": lambda w: w.add_(torch.ones_like(w)), "clamp": lambda w: w.clamp_(2, 4)}
# (base shape, unfold dim, size, step); a 2-D base's windows are taken through select too
WINDOWED = [((6,), 0, 3, 1), ((10,), 0, 4, 2), ((2, 7), 1, 3, 2)]


@pytest.mark.parametrize("view,op,geometry", all_pairs(sorted(VIEWS_OF_WINDOWS),
                                                      sorted(OPS_ON_VIEWS), WINDOWED))
def test_an_in_place_op_through_a_view_of_overlapping_windows_walks_that_view_like_eager(
        path, dev, view, op, geometry):
    # Session 18: a pointwise op through a view of the windows whose own elements share memory
    # (``v[1:3].mul_(2)``, ``v.t().mul_(2)``) compounds within that view in eager; the functional
    # walk ran at the windows' write-back and applied it once per element.
    shape, d, size, step = geometry

    def program(t):
        v = t.unfold(d, size, step)
        if v.dim() > 2:
            v = v[0]
        OPS_ON_VIEWS[op](VIEWS_OF_WINDOWS[view](v))
    _run_twice(program, torch.arange(float(np.prod(shape))).reshape(shape), dev)


@pytest.mark.parametrize("view", sorted(VIEWS_OF_WINDOWS))
def test_an_in_place_op_through_a_view_of_synced_overlapping_windows_walks_like_eager(path, dev,
                                                                                    view):
    def program(t):
        v = t.unfold(0, 3, 1)
        v.add_(0)
        if t.device.type != "cpu":
            import xla_compat as xc
            xc.sync()
        VIEWS_OF_WINDOWS[view](v).mul_(2.)
    _run_twice(program, torch.arange(6.), dev)
