"""Trace plans (``tracer.replay``): an op traced once with some argument geometry is replayed
from its plan afterwards. A plan must give exactly what the full tracer gives."""
import pytest
import torch

import xla_compat as xc
from xla_compat import metrics
from xla_compat.lazy import tracer
from xla_compat.lowering import registry
from tests.conftest import assert_same

aten = torch.ops.aten


def _program(x, y):
    z = x * 0.5 + y
    z = torch.sin(z) - 0.25
    z = torch.where(z > 0, z, -z)
    return (z * y).sum(dim=1), torch.max(z, dim=0)


def _slow_calls(fn):
    """How many ops ``fn`` sends through the full tracer (plans replay the others)."""
    calls = []
    real = tracer.trace

    def spy(cls, func, args, kwargs):
        calls.append(str(func))
        return real(cls, func, args, kwargs)
    tracer.trace = spy
    try:
        fn()
    finally:
        tracer.trace = real
    return calls


def test_a_repeated_program_is_replayed_from_plans_and_matches_eager(path, dev):
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(5, 7, generator=g), torch.randn(5, 7, generator=g)
    xd, yd = x.to(dev), y.to(dev)
    first = _program(xd, yd)
    again = []
    slow = _slow_calls(lambda: again.append(_program(xd, yd)))
    assert "aten.mul.Tensor" not in slow and "aten.sin.default" not in slow, slow
    expected = _program(x, y)
    for got in (first, again[0]):
        assert_same(got[0], expected[0])
        assert_same(got[1].values, expected[1].values)
        assert_same(got[1].indices, expected[1].indices)


def test_a_new_geometry_takes_the_full_tracer_and_keeps_eager_strides(path, dev):
    x = torch.randn(4, 6)
    xd = x.to(dev)
    (xd + 1).cpu()
    t = xd.t()
    slow = _slow_calls(lambda: t + 1)
    assert "aten.add.Tensor" in slow              # transposed input: a plan of its own
    out = t + 1
    assert out.stride() == (x.t() + 1).stride()
    assert_same(out, x.t() + 1)
    assert (t + 1).stride() == (x.t() + 1).stride()    # and replayed with the same strides


def test_scalar_values_stay_run_time_parameters(path, dev):
    x = torch.randn(3, 3)
    xd = x.to(dev)
    for scale in (0.5, 0.25, 3.0):
        assert_same(xd * scale, x * scale)
    compiles = metrics.counter("UncachedCompile")
    for scale in (1.5, -2.0):
        assert_same(xd * scale, x * scale)
    assert metrics.counter("UncachedCompile") == compiles


def test_a_replaced_rule_is_used_at_once(path, dev):
    x = torch.arange(4.0)
    xd = x.to(dev)
    assert_same(torch.cos(xd), torch.cos(x))
    undo = registry.override(aten.cos.default, lambda a, **_: a * 0 + 7)
    try:
        assert_same(torch.cos(xd), torch.full((4,), 7.0))
    finally:
        undo()
    assert_same(torch.cos(xd), torch.cos(x))


def test_a_plan_on_a_tensor_whose_sync_failed_raises_the_failure(path, dev):
    x = torch.ones(3).to(dev)
    (x + 2).cpu()                                 # a plan for add on this geometry
    undo = registry.override(aten.exp.default, lambda a, **_: (_ for _ in ()).throw(
        ValueError("planted")))
    try:
        bad = torch.exp(x)
        with pytest.raises(Exception, match="planted"):
            bad.cpu()
    finally:
        undo()
    with pytest.raises(RuntimeError, match="sync failed"):
        (bad + 2).cpu()
    assert_same(x + 2, torch.full((3,), 3.0))


def test_nodes_are_counted_for_replayed_ops(path, dev):
    xd = torch.ones(2, 2).to(dev)
    (xd * 3).cpu()
    before = metrics.counter("IrNodes")
    y = xd * 3
    y = y * 3
    assert metrics.counter("IrNodes") - before == 2
    assert_same(y, torch.full((2, 2), 9.0))


def _full_traces(fn):
    """The ops ``fn`` builds through the full tracer (``make_node``; plans build the rest)."""
    built = []
    real = tracer.make_node

    def spy(func, *args):
        built.append(str(func))
        return real(func, *args)
    tracer.make_node = spy
    try:
        fn()
    finally:
        tracer.make_node = real
    return built


def _momentum_step(p, buf, g, lr):
    """An optimizer's in-place updates: keywords (alpha=, value=) and a step size that changes
    every step, as in SGD with momentum and Adam."""
    buf.mul_(0.9).add_(g, alpha=0.1)
    p.add_(buf, alpha=-lr)
    p.addcdiv_(g, buf.abs() + 1, value=-lr / 3)
    # two keyword numbers, passed in schema order (beta before alpha), not by name
    mixed = torch.addmm(p[:, :4], buf[:, :4], g[:4, :4], beta=0.5, alpha=lr)
    return torch.clamp(p, min=-lr, max=lr * 10) / (1 - 0.9 ** (1 / lr)), mixed


def test_keyword_calls_and_changing_step_sizes_replay_from_plans(path, dev):
    g = torch.Generator().manual_seed(3)
    p, buf, grad = (torch.randn(4, 5, generator=g) for _ in range(3))
    pd, bufd, gradd = p.to(dev), buf.to(dev), grad.to(dev)
    for step in range(5):
        lr = 0.1 / (step + 1)
        want = _momentum_step(p, buf, grad, lr)
        got = []
        built = _full_traces(lambda: got.append(_momentum_step(pd, bufd, gradd, lr)))
        if step >= 2:   # every op of the step has its plan: alpha, value and lr are lifted
            assert built == [], built
        if step == 2:
            compiles = metrics.counter("UncachedCompile")
            tables = _memo_sizes()
        assert_same(got[0], want, msg=f"step {step}")
        assert_same(pd, p, msg=f"step {step}")
        assert_same(bufd, buf, msg=f"step {step}")
    assert metrics.counter("UncachedCompile") == compiles
    assert _memo_sizes() == tables      # a new step size is no new plan, meta or check entry


def _memo_sizes() -> dict:
    from xla_compat.functional import writes_eager
    from xla_compat.legacy import fast
    memos = {"plans": tracer._PLANS, "meta": tracer._META_CACHE,
             "legacy writes": fast._WRITE_PLANS, "functional meta references": writes_eager._PASSED}
    return {name: len(memo) for name, memo in memos.items()}


def test_tensor_lists_and_changing_scalar_lists_replay_from_plans(path, dev):
    g = torch.Generator().manual_seed(4)
    xs = [torch.randn(3, generator=g), torch.randn(2, 2, generator=g)]
    ys = [torch.randn(3, generator=g), torch.randn(2, 2, generator=g)]
    xd, yd = [x.to(dev) for x in xs], [y.to(dev) for y in ys]
    for step in range(4):
        scalars = [0.5 / (step + 1), -0.25 * (step + 1)]

        def program(xs, ys):
            out = torch._foreach_add(xs, ys, alpha=-0.1 * (step + 1))
            out = torch._foreach_div(out, scalars)
            return torch._foreach_addcmul(out, xs, ys, scalars)
        got = []
        built = _full_traces(lambda: got.append(program(xd, yd)))
        if step >= 1:
            assert built == [], built
        assert_same(got[0], program(xs, ys), msg=f"step {step}")
        torch._foreach_mul_(xd, scalars)            # in place: correct on both paths
        torch._foreach_mul_(xs, scalars)
        assert_same(xd, xs, msg=f"step {step}")


def test_floats_that_decide_something_at_trace_time_keep_their_value_in_the_key(path, dev):
    # softshrink's meta kernel checks lambd >= 0: a plan keyed by the float's type alone would
    # replay past eager's error.
    x = torch.randn(6)
    xd = x.to(dev)
    for lambd in (0.5, 0.25, 0.75):
        assert_same(torch.nn.functional.softshrink(xd, lambd),
                    torch.nn.functional.softshrink(x, lambd))
    for t in (x, xd):       # (the meta kernel words the range's bound and dtype its own way)
        with pytest.raises(RuntimeError, match=r"lambda must be in range \[0, .*found -0.5"):
            torch.nn.functional.softshrink(t, -0.5)
    # nan_to_num's replacements are compile-time constants (float, not Scalar): each value is
    # its own plan and graph.
    y = torch.tensor([float("nan"), 1.0, float("inf")])
    yd = y.to(dev)
    for nan in (0.0, 2.0, -3.0):
        assert_same(torch.nan_to_num(yd, nan=nan, posinf=9.0),
                    torch.nan_to_num(y, nan=nan, posinf=9.0))


def test_output_masks_key_plans_apart(path, dev):
    # native_layer_norm_backward's output_mask (a list of bools) decides which gradients exist
    g = torch.Generator().manual_seed(5)
    x, w = torch.randn(3, 4, generator=g), torch.randn(4, generator=g)
    for weight_grad in (False, True, False, True):
        want_x = x.clone().requires_grad_()
        want_w = w.clone().requires_grad_(weight_grad)
        torch.nn.functional.layer_norm(want_x, (4,), want_w).pow(2).sum().backward()
        got_x = x.to(dev).requires_grad_()
        got_w = w.to(dev).requires_grad_(weight_grad)
        torch.nn.functional.layer_norm(got_x, (4,), got_w).pow(2).sum().backward()
        assert_same(got_x.grad, want_x.grad, rtol=1e-5)
        assert (got_w.grad is None) == (want_w.grad is None)
        if weight_grad:
            assert_same(got_w.grad, want_w.grad, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
def test_casts_replay_from_plans_with_eagers_layout(path, dev, dtype):
    # autocast casts every weight every step: the second cast of a geometry is a plan's
    g = torch.Generator().manual_seed(1)
    x = torch.randn(4, 6, generator=g)
    img = torch.randn(2, 3, 4, 5, generator=g)
    xd, imgd = x.to(dev), img.to(dev)
    casts = [lambda t: t.to(dtype), lambda t: t.t().to(dtype),
             lambda t: t.to(dtype, memory_format=torch.contiguous_format)]
    for cast in casts:
        first = cast(xd)
        again = []
        slow = _slow_calls(lambda: again.append(cast(xd)))
        assert "aten._to_copy.default" not in slow, slow
        for got in (first, again[0]):
            assert got.dtype == dtype and got.stride() == cast(x).stride()
            assert_same(got, cast(x))
    last = imgd.to(dtype, memory_format=torch.channels_last)
    slow = _slow_calls(lambda: imgd.to(dtype, memory_format=torch.channels_last))
    assert "aten._to_copy.default" not in slow, slow
    want = img.to(dtype, memory_format=torch.channels_last)
    assert last.stride() == want.stride()
    assert_same(last, want)


def test_a_cast_eager_refuses_in_place_is_never_planned(path, dev):
    x = torch.tensor([1.5, -2.5, 3.0])
    xd = x.to(dev)
    for _ in range(2):
        out = []
        slow = _slow_calls(lambda: out.append(xd.to(torch.int64)))
        assert "aten._to_copy.default" in slow, slow
        assert_same(out[0], x.to(torch.int64))
    for _ in range(3):        # the result of an in-place op is cast back: eager's error each time
        n = torch.arange(3).to(dev)
        with pytest.raises(RuntimeError, match="can't be cast"):
            n.add_(0.5)
        assert_same(n, torch.arange(3))


def test_ops_that_check_index_values_run_their_meta_kernel_once_per_geometry(path, dev):
    # cross_entropy's nll_loss, gather and embedding check their indices on every call, but what
    # the meta kernel says of a geometry is cached (it ran torch's nll_loss decomposition each step)
    g = torch.Generator().manual_seed(2)
    logits, target = torch.randn(8, 5, generator=g), torch.randint(0, 5, (8,), generator=g)
    table, ids = torch.randn(10, 3, generator=g), torch.tensor([[1, 9], [0, 4]])
    programs = [
        lambda lg, t, tb, i: torch.nn.functional.cross_entropy(lg, t),
        lambda lg, t, tb, i: torch.gather(lg, 1, t[:, None]),
        lambda lg, t, tb, i: torch.nn.functional.embedding(i, tb),
    ]
    cpu = (logits, target, table, ids)
    on_dev = tuple(t.to(dev) for t in cpu)
    real = tracer.run_meta
    for program in programs:
        assert_same(program(*on_dev), program(*cpu), rtol=1e-6)
        ran = []
        tracer.run_meta = lambda func, *a, **k: (ran.append(str(func)), real(func, *a, **k))[1]
        try:
            got = program(*on_dev)
        finally:
            tracer.run_meta = real
        assert ran == [], ran
        assert_same(got, program(*cpu), rtol=1e-6)
    bad = torch.tensor([0, 5, 1, 2, 3, 4, 0, 1])      # out of range: eager's error still
    with pytest.raises(IndexError, match="out of bounds"):
        torch.nn.functional.cross_entropy(on_dev[0], bad.to(dev))


_VIEWS = {
    "view": lambda t: [t.view(3, 2, 4)],
    "view of a transposed": lambda t: [t.transpose(0, 1).view(4, 6)[1:]],
    "expand": lambda t: [t[:, :1].expand(6, 3)],
    "split": lambda t: list(t.split(2, dim=1)),
    "unbind": lambda t: list(t.unbind(1)),
    "unsqueeze and squeeze": lambda t: [t.unsqueeze(1).squeeze(1), t[None].squeeze(0)],
    "diagonal": lambda t: [t.diagonal(offset=1)],
    "unfold": lambda t: [t.unfold(0, 2, 2)],
    "heads": lambda t: [z.view(6, 1, 2).transpose(0, 1) for z in t.split(2, dim=1)],
}


@pytest.mark.parametrize("views", list(_VIEWS.values()), ids=list(_VIEWS))
def test_views_replay_from_plans_with_eagers_geometry_and_still_alias(path, dev, views):
    # The functional path gives view copies eager's strides after tracing them (a transformer's
    # heads, an LSTM's time steps, every step): the second time, a plan gives the same tensors.
    x = torch.arange(24.).view(6, 4)
    xd = x.to(dev)
    first = views(xd)
    again = []
    slow = _slow_calls(lambda: again.append(views(xd)))
    assert not [op for op in slow if op.endswith(("_copy.default", "_copy.int", "_copy.Tensor",
                                                  "_unsafe_view.default"))], slow
    want = views(x)
    for got in (first, again[0]):
        for g, w in zip(got, want):
            assert (g.shape, g.stride(), g.storage_offset()) == (w.shape, w.stride(),
                                                                 w.storage_offset())
            assert_same(g, w)
    for g, w in zip(again[0], want):     # a write through the replayed view reaches the base
        if g.numel() and w._base is not None and not w.stride().count(0):
            g.mul_(-1)
            w.mul_(-1)
    assert_same(xd, x)


# Ops a training step sends through the full tracer on every step, and why: they look at index
# values (nll_loss, embedding), draw random numbers (dropout), write an out= factory (arange),
# answer a metadata question (the optimizer's shallow-copy check), or update batch norm's
# running statistics in place (a mutation: the tracer plans none; native_batch_norm is
# decomposed into _native_batch_norm_legit, which writes them).
_MUST_TRACE = {"aten.nll_loss_forward.default", "aten.embedding.default",
               "aten.native_dropout.default", "aten.arange.start_out",
               "aten._has_compatible_shallow_copy_type.default",
               "aten.native_batch_norm.default", "aten._native_batch_norm_legit.default"}


def _training_step(model, opt, batch, loss_fn, amp=False):
    def step():
        opt.zero_grad()
        with torch.autocast("hlo", dtype=torch.bfloat16, enabled=amp):
            loss = loss_fn(model, *batch)
        loss.backward()
        opt.step()
    return step


def _mlp_sgd(dev):
    from tests.models import MLP
    model = MLP().to(dev)
    return _training_step(model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                          (torch.randn(8, 16).to(dev), torch.randint(0, 4, (8,)).to(dev)),
                          lambda m, x, y: torch.nn.functional.cross_entropy(m(x), y))


def _mlp_autocast_adamw(dev):
    from tests.models import MLP
    model = MLP().to(dev)
    return _training_step(model, torch.optim.AdamW(model.parameters(), lr=1e-3),
                          (torch.randn(8, 16).to(dev), torch.randint(0, 4, (8,)).to(dev)),
                          lambda m, x, y: torch.nn.functional.cross_entropy(m(x), y), amp=True)


def _gpt_adamw(dev):
    from tests.models import GPT
    model = GPT(dropout=0.1).to(dev)
    idx = torch.randint(0, 64, (2, 16))
    return _training_step(model, torch.optim.AdamW(model.parameters(), lr=1e-3),
                          (idx.to(dev), torch.roll(idx, -1, 1).to(dev)),
                          lambda m, x, y: m(x, y)[1])


def _cnn_adam(dev):
    # (the first convolution's backward computes no input gradient: an output left out)
    from tests.models import CNN
    model = CNN().to(dev)
    return _training_step(model, torch.optim.Adam(model.parameters(), lr=1e-3),
                          (torch.randn(4, 3, 12, 12).to(dev), torch.randint(0, 5, (4,)).to(dev)),
                          lambda m, x, y: torch.nn.functional.cross_entropy(m(x), y))


def _sdpa_adamw(dev):
    # scaled_dot_product_attention's math path (_safe_softmax: a rule, not a decomposition)
    proj = torch.nn.Linear(8, 24).to(dev)

    def loss(m, x):
        q, k, v = m(x).view(2, 6, 3, 2, 4).permute(2, 0, 3, 1, 4)
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True).sum()
    return _training_step(proj, torch.optim.AdamW(proj.parameters(), lr=1e-3),
                          (torch.randn(2, 6, 8).to(dev),), loss)


def _lstm_sgd(dev):
    model = torch.nn.LSTM(8, 16, batch_first=True).to(dev)
    return _training_step(model, torch.optim.SGD(model.parameters(), lr=0.1),
                          (torch.randn(2, 5, 8).to(dev),), lambda m, x: m(x)[0].pow(2).mean())


# The functional GPT's run (18 s) is make test-slow's: make test replays the functional path's
# plans on the five other steps here, and trains that GPT in test_training and
# test_dualrun_function.
SLOW_CASES = {"test_training_steps_after_warm_up_replay_plans_and_run_no_meta_kernel"
              "[functional-gpt adamw dropout]"}


@pytest.mark.parametrize("make", [_mlp_sgd, _mlp_autocast_adamw, _gpt_adamw, _cnn_adam,
                                  _sdpa_adamw, _lstm_sgd],
                         ids=["mlp sgd", "mlp autocast adamw", "gpt adamw dropout", "cnn adam",
                              "sdpa adamw", "lstm sgd"])
def test_training_steps_after_warm_up_replay_plans_and_run_no_meta_kernel(path, dev, make):
    # Not a timing: what a step does once its shapes were seen. A full trace costs 3-10x a plan
    # (a transformer's view copies took it every step on the functional path), a meta kernel
    # more (cross_entropy ran torch's nll_loss decomposition on meta tensors every step).
    torch.manual_seed(0)
    step = make(dev)
    for _ in range(3):
        step()
        xc.sync()
    metas = []
    real = tracer.run_meta
    tracer.run_meta = lambda func, *a, **k: (metas.append(str(func)), real(func, *a, **k))[1]
    try:
        slow = _slow_calls(lambda: (step(), xc.sync()))
    finally:
        tracer.run_meta = real
    assert metas == [], metas
    assert set(slow) <= _MUST_TRACE, sorted(set(slow) - _MUST_TRACE)


def test_index_ops_replay_plans_only_after_checking_each_calls_indices(path, dev):
    # an index op's plan is what its handler traces once the indices passed eager's bounds
    # check; it never replays before that check, so a bad index raises eager's error however
    # often the op ran with good ones (indices on the device are checked where their values
    # are known: device data, not a pending view of it)
    g = torch.Generator().manual_seed(4)
    x = torch.randn(6, 5, generator=g)
    rows, cols = ([0, 5, 2], [0, 6, 2]), ([0, 4, 2], [0, 5, 2])     # (good, bad) indices
    ops = {
        "index_select": (lambda t, i: t.index_select(0, i), rows),
        "getitem": (lambda t, i: t[i], rows),
        "gather": (lambda t, i: t.gather(1, i), ([[0], [4], [2]], [[0], [5], [2]])),
        "embedding": (lambda t, i: torch.nn.functional.embedding(i, t), rows),
        "cross_entropy": (lambda t, i: torch.nn.functional.cross_entropy(t[:3], i), cols),
        "index_add_": (lambda t, i: t.clone().index_add_(0, i, torch.ones_like(t[:3])), rows),
        "index_put_": (lambda t, i: t.clone().index_put_((i,), torch.ones_like(t[0])), rows),
        "scatter_add_": (lambda t, i: t.clone().scatter_add_(1, i, t[:3, :1]),
                         ([[0], [4], [2]], [[0], [5], [2]])),
    }
    xd = x.to(dev)
    for name, (op, (good, bad)) in ops.items():
        good, bad = torch.tensor(good), torch.tensor(bad)
        for _ in range(3):
            assert_same(op(xd, good.to(dev)), op(x, good), rtol=1e-6)
        with pytest.raises((IndexError, RuntimeError)) as want:
            op(x, bad)
        with pytest.raises(want.type) as got:
            op(xd, bad.to(dev))
        assert str(want.value).split("\n")[0] in str(got.value), (name, got.value)
    good = torch.tensor(rows[0])
    assert_same(xd[(-good).to(dev)], x[-good])          # x[i] takes negative indices
