"""Legacy path: views alias their base exactly as in eager (CPU eager is the reference)."""
from __future__ import annotations

import pytest
import torch

import xla_compat as xc
from xla_compat import paths
from tests.conftest import assert_same

aten = torch.ops.aten


@pytest.fixture(autouse=True)
def legacy():
    import xla_compat.legacy  # noqa: F401  (registers the path)
    with paths.activated("legacy"):
        yield


def run_both(prog, *inputs):
    """Run ``prog`` on CPU clones and on device copies; compare inputs and outputs after."""
    cpu_in = [t.clone() for t in inputs]
    dev_in = [t.to(xc.device()) for t in inputs]
    cpu_out = prog(*cpu_in)
    dev_out = prog(*dev_in)
    for d, c in zip(dev_out, cpu_out):
        if isinstance(c, torch.Tensor):
            assert tuple(d.stride()) == tuple(c.stride()), (d.stride(), c.stride())
            assert d.storage_offset() == c.storage_offset()
    assert_same([dev_out, dev_in], [cpu_out, cpu_in])          # (one sync for both)
    return dev_out


def make(dtype, shape=(4, 6)):
    n = 1
    for s in shape:
        n *= s
    x = torch.arange(n).reshape(shape)
    if dtype is torch.bool:
        return (x % 3) == 0
    return x.to(dtype)


def write(v):
    """An in-place op on ``v`` that any dtype supports and that changes every element."""
    if v.dtype is torch.bool:
        return v.logical_not_()
    return v.mul_(3).add_(1)


# Every view kind of the issue, on a (4, 6) base; the write goes through the view as given.
VIEWS = {
    "narrow": lambda x: x.narrow(1, 1, 3),
    "slice_step": lambda x: x[:, 1::2],
    "slice_negative": lambda x: x[-3:-1],
    "select": lambda x: x[2],
    "select_negative": lambda x: x.select(1, -1),
    "permute": lambda x: x.permute(1, 0),
    "t": lambda x: x.t(),
    "transpose": lambda x: x.transpose(0, 1),
    "movedim": lambda x: x.unsqueeze(0).movedim(0, 2),
    "mT": lambda x: x.mT,
    "view": lambda x: x.view(2, 12),
    "reshape": lambda x: x.reshape(3, 8),
    "flatten": lambda x: x.flatten(),
    "unflatten": lambda x: x.unflatten(1, (2, 3)),
    "squeeze": lambda x: x[:1].squeeze(0),
    "squeeze_dims": lambda x: x.unsqueeze(0).unsqueeze(-1).squeeze((0, 3)),
    "unsqueeze": lambda x: x.unsqueeze(1),
    "expand_piece": lambda x: x[:1].expand(3, 6)[1],
    "diagonal": lambda x: x.diagonal(),
    "diagonal_offset": lambda x: x.diagonal(2),
    "diagonal_dims": lambda x: x.diagonal(-1, 1, 0),
    "as_strided": lambda x: x.as_strided((2, 3), (6, 2), 1),
    "as_strided_of_view": lambda x: x.t()[1:].as_strided((3, 2), (1, 7)),
    "unfold_gaps": lambda x: x.unfold(1, 2, 3),
    "unfold_dense": lambda x: x.unfold(0, 2, 2),
    "split": lambda x: x.split(3)[1],
    "split_with_sizes": lambda x: x.split_with_sizes([1, 5], 1)[1],
    "chunk": lambda x: x.chunk(3, 1)[2],
    "unbind": lambda x: x.unbind(0)[3],
    "detach": lambda x: x.detach(),
    "alias": lambda x: aten.alias(x),
    "view_of_view": lambda x: x.t()[1:4].unsqueeze(0)[0, :, 2:],
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool])
@pytest.mark.parametrize("kind", VIEWS)
def test_write_through_view_reaches_base_and_siblings(kind, dtype):
    view = VIEWS[kind]

    def prog(x):
        sibling = x.t()[1]
        other = x.view(-1)
        v = view(x)
        write(v)
        return [v, sibling, other, view(x)]

    run_both(prog, make(dtype))


@pytest.mark.parametrize("kind", VIEWS)
def test_write_to_base_reaches_earlier_views(kind):
    view = VIEWS[kind]

    def prog(x):
        v = view(x)
        x.mul_(2).add_(1)
        return [v]

    run_both(prog, make(torch.float32))


@pytest.mark.parametrize("kind", ["t", "slice_step", "select", "diagonal", "unfold_gaps",
                                  "as_strided", "unbind"])
def test_two_sibling_views_stay_consistent(kind):
    view = VIEWS[kind]

    def prog(x):
        a, b = view(x), x[1:3]
        write(a)
        b.sub_(5)
        write(a)
        return [a, b]

    run_both(prog, make(torch.float32))


@pytest.mark.parametrize("shape", [(0, 6), (4, 0), (0,)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool])
def test_zero_size_views(shape, dtype):
    def prog(x):
        views = [x.t() if x.dim() == 2 else x.unsqueeze(1), x[0:0], x.reshape(-1),
                 x.unsqueeze(0).expand(2, *x.shape)[0], x.unsqueeze(0)]
        for v in views:
            write(v)
        return views

    run_both(prog, make(dtype, shape))


def test_bool_setitem_false_writes_through_select():
    def prog(x):
        x[0] = False
        x[:, 1] = True
        return [x[0], x.t()]

    run_both(prog, make(torch.bool, (3, 4)))


def test_bool_write_through_piece_of_expanded_view_reaches_base():
    def prog(x):
        e = x.expand(3, 4)
        e[1] = False
        return [e]

    run_both(prog, torch.ones(4, dtype=torch.bool))


def test_write_into_expanded_view_errors_where_eager_errors():
    x = torch.zeros(3, device=xc.device())
    with pytest.raises(RuntimeError, match="more than one element"):
        x.expand(2, 3).add_(1)
    with pytest.raises(RuntimeError, match="more than one element"):
        x.expand(2, 3).copy_(torch.ones(2, 3, device=xc.device()))


def test_fill_of_expanded_view_writes_base_like_eager():
    def prog(x):
        x.expand(2, 3).fill_(7)
        return [x]

    run_both(prog, torch.zeros(3))


def test_unfold_windows_with_gaps_keep_the_gap_elements():
    def prog(x):
        u = x.unfold(0, 2, 3)
        u.copy_(torch.full((3, 2), -1.0, device=x.device))
        return [u]

    run_both(prog, torch.arange(8.0))


def test_as_strided_uses_storage_semantics_of_a_view():
    def prog(x):
        v = x[1]                                    # storage offset 6
        a = v.as_strided((2, 2), (1, 6))            # default offset: v's own
        b = x.t().as_strided((3,), (7,), 0)         # the base's storage, not the view's order
        a.add_(100)
        b.mul_(-1)
        return [a, b, v]

    run_both(prog, torch.arange(24.0).reshape(4, 6))


def test_as_strided_out_of_bounds_raises_like_eager():
    x = torch.zeros(2, 3, device=xc.device())
    with pytest.raises(RuntimeError, match="out of bounds"):
        x.as_strided((4,), (2,), 0)


def test_multi_output_views_write_back():
    def prog(x):
        parts = x.split(2)
        rows = x.unbind(1)
        chunks = x.chunk(2, 1)
        parts[1].zero_()
        rows[0].fill_(9)
        chunks[1].mul_(-1)
        return [*parts, *rows, *chunks]

    run_both(prog, torch.arange(24.0).reshape(4, 6))


def test_detach_and_alias_share_storage():
    def prog(x):
        d = x.detach()
        d[0, 0] = 42
        a = aten.alias(x)
        a[1].zero_()
        return [d, a]

    run_both(prog, torch.arange(6.0).reshape(2, 3))


def test_view_as_real_and_complex_alias():
    def prog(c):
        r = torch.view_as_real(c)
        r[1, 0] = 7
        back = torch.view_as_complex(r)
        back[2] = 1 + 2j
        c.real[0] = -3
        return [r, back]

    run_both(prog, torch.randn(3, dtype=torch.complex64))


def test_view_dtype_reinterprets_and_aliases():
    def prog(x):
        i = x.view(torch.int32)
        i[3] = 0
        return [i]

    run_both(prog, torch.arange(6.0))


def test_out_argument_writes_through_view():
    def prog(x, y):
        torch.add(y, 1, out=x.t()[2])
        torch.mul(y, y, out=x[:, 1])
        return [x.t()]

    run_both(prog, torch.zeros(4, 6), torch.arange(4.0))


def test_out_of_another_shape_is_resized_like_eager():
    def prog(a):
        o = torch.empty(0, device=a.device)
        torch.add(a, 1, out=o)
        o.view(2, 3)[1].zero_()
        return [o]

    run_both(prog, torch.arange(6.0))


@pytest.mark.parametrize("reduce", ["prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
def test_index_reduce_with_empty_index_on_zero_size_dim(reduce, include_self):
    def prog(dest, src):
        idx = torch.tensor([], dtype=torch.long, device=dest.device)
        dest.unsqueeze(0)[0].index_reduce_(2, idx, src, reduce, include_self=include_self)
        return [dest]

    run_both(prog, torch.ones(3, 4, 0), torch.ones(3, 4, 0))


def test_write_after_sync_through_view_taken_before():
    dev = xc.device()
    cpu = torch.arange(12.0).reshape(3, 4)
    x = cpu.to(dev)
    v, d = x.t()[1], x.diagonal()
    v.add_(1)
    xc.sync()
    v.mul_(10)
    d.sub_(1)
    xc.sync()
    v.add_(1)
    ref = cpu.clone()
    rv, rd = ref.t()[1], ref.diagonal()
    rv.add_(1)
    rv.mul_(10)
    rd.sub_(1)
    rv.add_(1)
    assert_same([x, v, d], [ref, rv, rd])


def test_base_write_after_sync_visible_in_view_taken_before():
    cpu = torch.arange(6.0)
    x = cpu.to(xc.device())
    v = x[::2]
    xc.sync()
    x.mul_(3)
    xc.sync()
    assert_same(v, cpu.mul(3)[::2])


def test_views_of_views_chain_through_every_step():
    def prog(x):
        v = x.permute(2, 0, 1)[1:].diagonal(0, 1, 2).unsqueeze(0).transpose(0, 2)[1]
        v.fill_(-5)
        w = x.view(4, 6)[::2].unfold(1, 2, 2)[:, 1]
        w.add_(100)
        return [v, w]

    run_both(prog, torch.arange(24.0).reshape(2, 3, 4))


def test_inplace_metadata_ops_change_the_tensors_own_view():
    def prog(x):
        y = x[1:]
        y.t_()
        y[0].zero_()
        z = x.clone()
        z.unsqueeze_(0).squeeze_(0).transpose_(0, 1)
        z[1].fill_(7)
        w = x.view(-1)
        w.as_strided_((2, 2), (1, 3), 2)
        w.add_(50)
        return [y, z, w]

    run_both(prog, torch.arange(12.0).reshape(3, 4))


def test_inplace_metadata_op_bumps_version_like_eager():
    x = torch.zeros(3, 4, device=xc.device())
    c = torch.zeros(3, 4)
    for t in (x, c):
        t.t_()
        t.unsqueeze_(0)
    assert x._version == c._version
    assert x.shape == c.shape and x.stride() == c.stride()


def test_resize_within_storage_reinterprets_like_eager():
    def prog(x):
        x.resize_(2, 2)
        x[1, 1] = -1
        y = x.view(-1)
        x.resize_(6)
        return [x, y]

    run_both(prog, torch.arange(6.0))


def test_resize_beyond_storage_grows_it_in_place_like_eager():
    def prog(x):
        v = x[1:3]
        x.resize_(10)
        x[4:] = 2             # the new elements, uninitialised in eager: written before read
        v.add_(1)             # still a view of x's (grown) storage
        return [x, v]

    run_both(prog, torch.zeros(4))


def test_data_assignment_shares_storage():
    dev = xc.device()
    p = torch.zeros(3, device=dev, requires_grad=True)
    q = torch.ones(3, device=dev)
    p.data = q
    q[1] = 5
    assert_same(p.detach(), torch.tensor([1.0, 5.0, 1.0]))
    p.data.mul_(2)
    assert_same(q, torch.tensor([2.0, 10.0, 2.0]))
    assert p.requires_grad and not q.requires_grad


def test_set_shares_storage_and_takes_source_metadata():
    def prog(a, b):
        a.set_(b.t())
        a[0] = 9
        return [a, b]

    run_both(prog, torch.zeros(2), torch.arange(6.0).reshape(2, 3))


def test_ten_views_cost_nothing_until_one_is_read():
    from xla_compat import executor
    x = torch.randn(8, 8).to(xc.device())
    views = [x[i] for i in range(8)] + [x.t(), x.diagonal()]
    y = views[3] * 2
    assert [n.op for n in executor.collect([y._value]).nodes] == ["legacy.view", "aten.mul.Tensor"]
    assert_same(y, x.cpu()[3] * 2)


def test_write_through_one_of_ten_views_adds_one_read_and_one_write_back():
    from xla_compat import executor
    x = torch.randn(8, 8).to(xc.device())
    xc.sync()
    views = [x.t()[i] for i in range(8)] + [x[1:], x.diagonal()]
    views[5].add_(1)
    ops = [n.op for n in executor.collect([x._value]).nodes]
    assert ops == ["legacy.view", "aten.add.Tensor", "legacy.write"]



# Chains that come back to their base fold away, on the full path (first call) and on the view
# plans (later calls): autograd's weight gradient is ``mm(..).t().t()``.
FOLDING = {
    "t_t": (lambda x: x.t().t(), 0),
    "permute_permute": (lambda x: x.permute(1, 0).transpose(0, 1), 0),
    "view_view": (lambda x: x.view(2, 12).view(24).view(4, 6), 0),
    "t_view": (lambda x: x.t().contiguous().t(), None),   # contiguous copies: not a view
    # unsqueeze (a reshape), then two permutes that fold into one
    "permute_twice_to_a_permute": (lambda x: x.unsqueeze(0).permute(1, 2, 0).permute(2, 1, 0),
                                   2),
}


@pytest.mark.parametrize("kind", sorted(FOLDING))
def test_view_chains_that_return_to_their_base_fold(kind):
    view, steps = FOLDING[kind]
    for call in range(3):        # the first call takes the full path, later ones its plan
        base = (torch.arange(24.0).reshape(4, 6).to(xc.device()) + 0) * 1
        v = view(base)
        if steps is not None:
            assert len(v._chain) == steps, (call, v._chain)
            if steps == 0:
                assert v._value is base._value
        write(v)
        expected = torch.arange(24.0).reshape(4, 6)
        write(view(expected))
        assert_same(base, expected)


def test_a_captured_steps_weight_gradient_is_output_once():
    """A recorded step keeps every state tensor, views included: autograd's weight gradient
    ``mm(..).t().t()`` is the mm itself, not a second output XLA must copy it into."""
    from xla_compat import executor
    model = torch.nn.Linear(3, 4).to(xc.device())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(5, 3).to(xc.device())

    def train_step():
        opt.zero_grad()
        loss = model(x).square().sum()
        loss.backward()
        opt.step()
        return loss

    step = xc.compile(train_step)
    runs = []
    with executor.recording(runs):
        step()
    graph = runs[-1][0]
    same = [(v.node.op, v.aval.shape) for v in graph.roots
            if v.node.op == "legacy.view" and v.node.inputs[0] in graph.roots
            and v.node.inputs[0].aval == v.aval]
    assert not same, same
    assert model.weight.grad._chain == ()


def test_partial_sync_of_a_view_then_more_writes():
    cpu = torch.arange(12.0).reshape(3, 4)
    x = cpu.to(xc.device())
    v, w = x.t()[1], x[2]
    v.add_(1)
    xc.sync([v])
    v.mul_(2)
    w.sub_(1)
    text = xc.hlo_text([x])
    assert "stablehlo" in text or "mhlo" in text or "func" in text
    ref = cpu.clone()
    ref.t()[1].add_(1)
    ref.t()[1].mul_(2)
    ref[2].sub_(1)
    assert_same([x, v, w], [ref, ref.t()[1], ref[2]])


def test_path_registration_and_to_path():
    from xla_compat.legacy import LegacyTensor
    impl = paths.get("legacy")
    assert impl.probe() is None and impl.tensor_cls is LegacyTensor
    x = torch.arange(4.0, device=xc.device())
    assert paths.of(x) == "legacy" and impl.owns(x)
    with paths.activated("core"):
        c = torch.arange(4.0, device=xc.device()) * 2
    moved = impl.to_path(c)
    assert isinstance(moved, LegacyTensor)
    moved[0] = 7          # a copy: the core tensor is untouched
    assert_same(moved + x, torch.tensor([7.0, 3.0, 6.0, 9.0]))
    assert_same(c, torch.tensor([0.0, 2.0, 4.0, 6.0]))


@pytest.mark.parametrize("to", [torch.int8, torch.int16, torch.float32, torch.float64,
                                torch.complex128], ids=str)
def test_view_dtype_of_a_complex_tensor_reinterprets_its_parts(to):
    """A complex tensor viewed as another dtype reads its parts' bytes, real then imaginary
    (XLA bitcasts no complex type, and the lowering failed in jax's words); a write through the
    view reaches the complex base."""
    def prog(x):
        v = x.view(to)
        v[0] = 0
        return [v, x]

    run_both(prog, torch.tensor([1.5 - 2j, -0.25 + 4j, 3 + 0.5j, 0j], dtype=torch.complex64)
             if to != torch.complex128 else torch.randn(4, 4, dtype=torch.complex64))


def test_composite_views_reached_below_autograd_alias_their_base():
    """Composite views (``narrow``, ``chunk``, ``flatten``) called from inside another composite
    kernel reach the path as ops of their own; they are made through their composite kernels
    (slices and views), so writes through them reach the base, as in eager."""
    def prog(x):
        with torch._C._AutoDispatchBelowAutograd():
            torch.ops.aten.narrow.default(x, 0, 2, 3).mul_(-1)
            torch.ops.aten.chunk.default(x, 2)[1].add_(100)
            torch.ops.aten.flatten.using_ints(x.view(2, 3))[0:1].fill_(7)
        return [x]

    run_both(prog, torch.arange(6.0))
