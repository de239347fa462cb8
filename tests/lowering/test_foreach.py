"""_foreach_* ops and the optimizers that call them compute what CPU eager computes, without recompiling."""
from __future__ import annotations

import copy

import pytest
import torch

import xla_compat as xc
from xla_compat import paths, settings
from tests.conftest import assert_same
from tests.lowering._core import core_no_fallback  # noqa: F401 (autouse fixture)

aten = torch.ops.aten


def _lists(dtype=torch.float32, positive=False):
    torch.manual_seed(0)
    shapes = [(3,), (2, 4), (), (0, 3)]
    if dtype == torch.bool:
        return [torch.rand(s) > 0.5 for s in shapes]
    if dtype.is_floating_point:
        xs = [torch.randn(s, dtype=dtype) for s in shapes]
        return [x.abs() + 0.5 for x in xs] if positive else xs
    return [torch.randint(1, 9, s, dtype=dtype) for s in shapes]


def _on_device(v):
    if isinstance(v, torch.Tensor):
        return v.to(xc.device())
    if isinstance(v, (list, tuple)):
        return type(v)(_on_device(e) for e in v)
    return v


def _check(fn, *args, rtol=1.3e-6, atol=1e-5):
    expected = fn(*args)
    actual = fn(*_on_device(args))
    assert_same(list(actual), list(expected), rtol=rtol, atol=atol)


BINARY = ["add", "sub", "mul", "div", "clamp_min", "clamp_max", "maximum", "minimum", "pow"]


@pytest.mark.parametrize("name", BINARY)
def test_binary_list_overload_matches_eager(name):
    xs, ys = _lists(positive=True), [y + 1 for y in _lists(positive=True)]
    _check(getattr(torch, f"_foreach_{name}"), xs, ys)


@pytest.mark.parametrize("name", BINARY)
@pytest.mark.parametrize("scalar", [2, 0.75, -1.5])
def test_binary_scalar_overload_matches_eager(name, scalar):
    xs = _lists(positive=True)
    _check(getattr(torch, f"_foreach_{name}"), xs, scalar)


@pytest.mark.parametrize("name", BINARY)
def test_binary_scalarlist_overload_matches_eager(name):
    xs = _lists(positive=True)
    _check(getattr(torch, f"_foreach_{name}"), xs, [0.5, 2, -1.25, 3.0])


@pytest.mark.parametrize("name", ["add", "mul", "div"])
def test_tensor_overload_broadcasts_one_scalar_tensor(name):
    _check(getattr(torch, f"_foreach_{name}"), _lists(), torch.tensor(1.75))


@pytest.mark.parametrize("name", ["add", "sub"])
def test_alpha_scales_the_other_list(name):
    fn = getattr(torch, f"_foreach_{name}")
    _check(lambda a, b: fn(a, b, alpha=-0.3), _lists(), _lists(positive=True))


@pytest.mark.parametrize("dtype", [torch.int64, torch.bool])
def test_integer_and_bool_lists_keep_their_dtypes(dtype):
    xs = _lists(dtype)
    _check(torch._foreach_add, xs, xs)
    _check(torch._foreach_mul, xs, xs)
    if dtype == torch.int64:
        _check(torch._foreach_add, xs, 3)
        _check(torch._foreach_div, xs, 2)     # true division promotes to float
        _check(torch._foreach_maximum, xs, [4, 1, 7, 2])
        _check(torch._foreach_neg, xs)
        _check(torch._foreach_abs, xs)


@pytest.mark.parametrize("name", ["addcmul", "addcdiv"])
@pytest.mark.parametrize("value", [1, -0.5, [0.5, 2.0, -1.0, 3.0]])
def test_pointwise_scalar_and_scalarlist(name, value):
    fn = getattr(torch, f"_foreach_{name}")
    _check(lambda a, b, c: fn(a, b, c, value), _lists(), _lists(), _lists(positive=True))


@pytest.mark.parametrize("name", ["addcmul", "addcdiv"])
def test_pointwise_tensor_of_scalars_gives_one_value_per_element(name):
    fn = getattr(torch, f"_foreach_{name}")
    xs, t1, t2 = _lists(), _lists(), _lists(positive=True)
    scal = torch.tensor([0.5, -2.0, 3.0, 1.0])
    expected = fn(xs, t1, t2, scal)
    # Eager wants the per-element values in a CPU tensor, whatever the device of the lists.
    actual = fn(*_on_device((xs, t1, t2)), scal)
    assert_same(list(actual), list(expected))
    getattr(torch, f"_foreach_{name}_")(xs, t1, t2, scal)
    dx = _on_device(_lists())
    getattr(torch, f"_foreach_{name}_")(dx, *_on_device((t1, t2)), scal)
    assert_same(dx, xs)


@pytest.mark.parametrize("weight", [0.3, 0.7, [0.1, 0.9, 0.5, 0.2], "list"])
def test_lerp_scalar_scalarlist_and_tensor_list(weight):
    xs, ends = _lists(), [x * 3 for x in _lists(positive=True)]
    if weight == "list":
        weight = [torch.rand(x.shape) for x in xs]
    _check(torch._foreach_lerp, xs, ends, weight)


UNARY = ["abs", "ceil", "cos", "erf", "exp", "expm1", "floor", "frac", "log", "log1p",
         "neg", "reciprocal", "round", "sigmoid", "sign", "sin", "sqrt", "tanh", "trunc"]


@pytest.mark.parametrize("name", UNARY)
def test_unary_matches_eager(name):
    _check(getattr(torch, f"_foreach_{name}"), _lists(positive=name in ("log", "sqrt", "log1p")))


@pytest.mark.parametrize("ord", [2, 1, 3, float("inf"), 0])
def test_norm_per_tensor(ord):
    # Eager refuses the infinity norm of an empty tensor (no identity).
    xs = [x for x in _lists() if x.numel() or ord != float("inf")]
    _check(lambda a: torch._foreach_norm(a, ord), xs)


def test_pow_with_scalar_base_and_tensor_exponents():
    _check(lambda xs: torch._foreach_pow(2.0, xs), _lists())


def test_max_of_each_tensor():
    xs = [x for x in _lists() if x.numel()]
    _check(lambda a: aten._foreach_max.default(a), xs)


def test_inplace_overloads_rebind_every_tensor():
    xs, ys = _lists(), _lists(positive=True)
    dx = _on_device(xs)
    torch._foreach_mul_(xs, 0.5)
    torch._foreach_mul_(dx, 0.5)
    torch._foreach_addcdiv_(xs, ys, ys, [0.1, 0.2, 0.3, 0.4])
    torch._foreach_addcdiv_(dx, _on_device(ys), _on_device(ys), [0.1, 0.2, 0.3, 0.4])
    torch._foreach_sqrt_(ys)
    dy = _on_device(_lists(positive=True))
    torch._foreach_sqrt_(dy)
    assert_same(dx, xs)
    assert_same(dy, ys)


def test_zero_and_copy_overwrite_in_place():
    xs, src = _lists(), _lists(positive=True)
    dx = _on_device(xs)
    torch._foreach_copy_(xs, src)
    torch._foreach_copy_(dx, _on_device(src))
    assert_same(dx, xs)
    torch._foreach_zero_(xs)
    torch._foreach_zero_(dx)
    assert_same(dx, xs)


def test_changing_python_scalars_do_not_recompile():
    dx = _on_device(_lists())
    torch._foreach_add_(dx, 0.1)
    xc.sync()
    before = xc.metrics.counter("CompileTime")
    for s in (0.2, 0.3, 0.4):
        torch._foreach_add_(dx, s)
        torch._foreach_addcmul_(dx, dx, dx, [s, -s, 2 * s, s / 2])
        xc.sync()
    torch._foreach_add_(dx, 1.0)
    torch._foreach_addcmul_(dx, dx, dx, [0.5, -0.5, 1.0, 0.25])
    xc.sync()
    assert xc.metrics.counter("CompileTime") == before + 1   # the second graph shape only


# ----------------------------------------------------------------------------------------------
# Optimizers: 5 steps on a small model match CPU eager and stop compiling after step 2.

OPTIMIZERS = {
    "sgd_momentum": lambda p, fe: torch.optim.SGD(p, lr=0.1, momentum=0.9, foreach=fe),
    "sgd_nesterov_wd": lambda p, fe: torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True,
                                                      weight_decay=0.01, foreach=fe),
    "adam": lambda p, fe: torch.optim.Adam(p, lr=0.01, foreach=fe),
    "adam_wd": lambda p, fe: torch.optim.Adam(p, lr=0.01, weight_decay=0.1, foreach=fe),
    "adamw": lambda p, fe: torch.optim.AdamW(p, lr=0.01, foreach=fe),
    "adamw_amsgrad": lambda p, fe: torch.optim.AdamW(p, lr=0.01, amsgrad=True, foreach=fe),
}


def _train(model, make_opt, foreach, dev, steps=5):
    torch.manual_seed(1)
    X, Y = torch.randn(16, 4), torch.randn(16, 2)
    model = copy.deepcopy(model).to(dev)
    opt = make_opt(model.parameters(), foreach)
    x, y = X.to(dev), Y.to(dev)
    compiles, cached = [], []
    for _ in range(steps):
        opt.zero_grad()
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
        if dev != "cpu":
            xc.sync()
            compiles.append(xc.metrics.counter("CompileTime"))
            cached.append(xc.metrics.counter("CachedCompile"))
    return [p.detach().cpu() for p in model.parameters()], compiles, cached


@pytest.mark.parametrize("foreach", [True, False, None], ids=["foreach", "for_loop", "default"])
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_optimizer_steps_match_eager_and_stop_compiling(name, foreach):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    expected, _, _ = _train(model, OPTIMIZERS[name], foreach, "cpu")
    xc.metrics.reset()
    actual, compiles, cached = _train(model, OPTIMIZERS[name], foreach, xc.device())
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-6)
    assert compiles[1] == compiles[-1], f"recompiled after step 2: {compiles}"
    assert all(b - a >= 1 for a, b in zip(cached[1:], cached[2:])), cached
    assert not [k for k in xc.metrics.counters() if k.startswith("aten::")]
