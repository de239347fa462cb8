"""Property test: calls with keyword arguments, changing floats and lists agree with CPU eager
however often they replay from trace plans (``tracer._plan_key``: floats of arithmetic ops are
keyed by type, keywords by name, lists of tensors by each geometry)."""
from __future__ import annotations

import math
import re

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from tests.conftest import RANDOM_DRAWS, assert_same

# Floats a step might use: small and large, either side of float16's largest (65504), signed
# zeros, and the ones no dtype holds.
FLOATS = st.one_of(st.floats(-4.0, 4.0, allow_nan=False, width=32),
                   st.sampled_from([0.0, -0.0, 1.0, 65504.0, -65504.0, 70000.0, 1e30, -1e30,
                                    math.inf, -math.inf, math.nan]))


def _calls(a, b, c, f, g, dev_ints):
    """Each call takes tensors ``a``, ``b``, ``c`` (float) and numbers ``f``, ``g``."""
    return {
        "add alpha": lambda: torch.add(a, b, alpha=f),
        "sub_ alpha": lambda: a.clone().sub_(b, alpha=f),
        "mul number": lambda: a * f,
        "rsub": lambda: torch.rsub(a, f),
        "div number": lambda: b / f,
        "div floor": lambda: torch.div(a, b, rounding_mode="floor"),
        "addcmul value": lambda: torch.addcmul(a, b, c, value=f),
        "addcdiv_ value": lambda: a.clone().addcdiv_(b, c.abs() + 1, value=f),
        "lerp weight": lambda: torch.lerp(a, b, f),
        "clamp bounds": lambda: torch.clamp(a, min=min(f, g), max=max(f, g)),
        "pow exponent": lambda: torch.pow(c.abs() + 0.5, f if abs(f) < 8 else 2.0),
        # (finite alpha: eager's BLAS scales inside the sum, so alpha=inf gives NaN from
        # products of mixed sign where XLA scales the sum to +-inf)
        "addmm beta alpha": lambda: torch.addmm(a[:, :3], b, c[:, :3], beta=g,
                                                alpha=f if math.isfinite(f) else 2.0),
        "foreach add alpha": lambda: torch._foreach_add([a, b], [b, c], alpha=f),
        "foreach mul list": lambda: torch._foreach_mul([a, c], [f, g]),
        "foreach addcdiv list": lambda: torch._foreach_addcdiv([a, b], [b, c], [c.abs() + 1,
                                                                               a.abs() + 1],
                                                               [f, g]),
        "cat": lambda: torch.cat([a, b * f, c], dim=1),
        "clone channels": lambda: a.unsqueeze(0).unsqueeze(0).clone(
            memory_format=torch.channels_last),
        "softshrink": lambda: torch.nn.functional.softshrink(a, abs(f)),
        "nan_to_num": lambda: torch.nan_to_num(a / 0, nan=f, posinf=g, neginf=-g),
        "int add alpha": lambda: torch.add(dev_ints, dev_ints, alpha=int(g) if math.isfinite(g)
                                           else 3),
        "half mul": lambda: a.half() * f,
        "half add alpha": lambda: torch.add(a.half(), b.half(), alpha=f),
    }


def _outcome(fn):
    try:
        return fn(), None
    except Exception as e:  # eager's error must be ours too
        return None, type(e)


@pytest.fixture(scope="module")
def inputs():
    gen = torch.Generator().manual_seed(7)
    a, b, c = (torch.randn(4, 4, generator=gen) for _ in range(3))
    ints = torch.randint(-5, 5, (4, 4), generator=gen)
    return a, b, c, ints


@settings(max_examples=60, deadline=None, derandomize=not RANDOM_DRAWS, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_keyword_list_and_float_calls_match_eager_across_replays(path, dev, inputs, data):
    a, b, c, ints = inputs
    on_dev = [t.to(dev) for t in (a, b, c, ints)]
    names = sorted(_calls(a, b, c, 0.0, 0.0, ints))
    # the same call three times with new numbers: the first may trace, the others replay
    for name in data.draw(st.lists(st.sampled_from(names), min_size=1, max_size=4)):
        for _ in range(3):
            f, g = data.draw(FLOATS), data.draw(FLOATS)
            want, want_err = _outcome(_calls(a, b, c, f, g, ints)[name])
            got, got_err = _outcome(_calls(*on_dev[:3], f, g, on_dev[3])[name])
            assert got_err == want_err, (name, f, g, got_err, want_err)
            if want_err is None:     # (float16: eager's fused multiply-add may round once less)
                tol = 1e-3 if name.startswith("half") else 1e-5
                assert_same(got, want, rtol=tol, atol=tol, msg=f"{name} f={f} g={g}")


OVERFLOWING = [(torch.int8, 1000), (torch.uint8, 300), (torch.int16, 70000),
               (torch.int32, 2 ** 40), (torch.bfloat16, 1e39), (torch.float32, 1e39),
               (torch.float16, 65519.0), (torch.float16, -1e5), (torch.uint8, -256)]
FITTING = [(torch.float16, 65504.0), (torch.float16, math.inf), (torch.int8, 127),
           (torch.float16, math.nan), (torch.uint8, -255), (torch.uint8, -5)]


@pytest.mark.parametrize("op", ["add", "sub_", "clamp", "clamp_"])
@pytest.mark.parametrize("dtype, number", OVERFLOWING + FITTING,
                         ids=[f"{d}-{n}".replace("torch.", "") for d, n in OVERFLOWING + FITTING])
def test_numbers_the_dtype_cannot_hold_raise_like_eager(path, dev, op, dtype, number):
    """alpha and clamp's bounds are converted to the dtype eager computes in, with an overflow
    check (value-keyed plans: a float beyond float16's range is never keyed by type)."""
    def run(t, n=number):
        return {"add": lambda: torch.add(t, t, alpha=n),
                "sub_": lambda: t.clone().sub_(t, alpha=n),
                "clamp": lambda: torch.clamp(t, min=n),
                "clamp_": lambda: t.clone().clamp_(max=n)}[op]()
    x = torch.ones(3, dtype=dtype)
    xd = x.to(dev)
    run(xd, type(number)(2)).cpu()  # a plan for the op on this dtype, from a number that fits
    _assert_like_eager(run, x, xd, match="cannot be converted to type .* without overflow")


def _assert_like_eager(run, x, xd, match=None):
    """``run(xd)`` gives what ``run(x)`` gives on CPU, or raises its error type matching
    ``match`` (default: eager's exact message) and writes nothing into ``xd``."""
    want, want_err = _outcome(lambda: run(x))
    got, got_err = _outcome(lambda: run(xd).cpu())
    assert got_err == want_err
    if want_err is None:
        assert_same(got, want)
    else:
        if match is None:
            with pytest.raises(want_err) as eager:
                run(x)
            match = re.escape(str(eager.value))
        with pytest.raises(want_err, match=match):
            run(xd)
        assert_same(xd, x)          # nothing written


POW_CASES = [(torch.float16, 1e5), (torch.float16, 2 ** 40), (torch.float16, 65504.0),
             (torch.bfloat16, 1e39), (torch.bfloat16, 1e5), (torch.float32, 1e39),
             (torch.float64, 1e300), (torch.complex64, 1e30), (torch.int8, 300),
             (torch.int8, 127), (torch.uint8, 300), (torch.int32, 2 ** 40), (torch.int64, 2 ** 40),
             (torch.int32, -1), (torch.int8, -2 ** 40), (torch.uint8, -1), (torch.bool, -1),
             (torch.int32, -1.5), (torch.int32, 1e39), (torch.float16, -math.inf)]


@pytest.mark.parametrize("inplace", [False, True], ids=["pow", "pow_"])
@pytest.mark.parametrize("dtype, exponent", POW_CASES,
                         ids=[f"{d}-{n}".replace("torch.", "") for d, n in POW_CASES])
def test_pow_exponents_raise_like_eager(path, dev, inplace, dtype, exponent):
    """pow of a tensor by a number: no negative integer exponent for an integer tensor, and an
    exponent converted to a half-precision or integer dtype must fit it (float32 computes in
    double). Checked after a plan for the op exists, so a replay cannot skip the check."""
    def run(t, n=exponent):
        return t.clone().pow_(n) if inplace else torch.pow(t, n)
    x = torch.ones(3, dtype=dtype)
    xd = x.to(dev)
    _outcome(lambda: run(xd, type(exponent)(2)).cpu())   # a plan, from an exponent that fits
    _assert_like_eager(run, x, xd)


def test_nan_to_num_maps_each_element_once(path, dev):
    # posinf=-inf and neginf=inf swap the infinities; a replacement must not be replaced again
    x = torch.tensor([math.nan, math.inf, -math.inf, 1.5, -0.0])
    for nan, posinf, neginf in ((0.0, -math.inf, math.inf), (math.inf, math.nan, -1.0),
                                (None, None, None)):
        assert_same(torch.nan_to_num(x.to(dev), nan, posinf, neginf),
                    torch.nan_to_num(x, nan, posinf, neginf))
    z = torch.tensor([complex(math.inf, math.nan), complex(-math.inf, 1.0)])
    assert_same(torch.nan_to_num(z.to(dev), 1.0, -math.inf, math.inf),
                torch.nan_to_num(z, 1.0, -math.inf, math.inf))
