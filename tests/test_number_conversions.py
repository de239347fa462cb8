"""Numbers converted between kinds as eager converts them, on both paths against CPU eager.

Complex values becoming bool (either part nonzero) or filling a real tensor (bool: nonzero;
others: the real part, refused with an imaginary part), a complex power of zero, numbers of
different kinds or zero signs that Python finds equal (``0 == 0j``, ``-0.0 == 0.0``) but that
compute differently, and an op without a lowering rule that eager refuses for a dtype its
decomposition would take. Found by a promotion sweep (sessions 30-33).
"""
from __future__ import annotations

import pytest
import torch

import xla_compat as xc
from tests.conftest import assert_same, tolerance


def _same_bits(got: torch.Tensor, want: torch.Tensor, rtol: float = 0.0,
               signs: bool = True) -> None:
    """Equal dtype, NaN and infinity places, values (within ``rtol``, else exactly) and zero
    signs (``signs``); complex part by part."""
    got = got.cpu()
    assert got.dtype == want.dtype
    if want.is_complex():
        got, want = torch.view_as_real(got), torch.view_as_real(want)
    assert torch.equal(got.isnan(), want.isnan()), (got, want)
    keep = ~want.isnan()
    if rtol:
        torch.testing.assert_close(got[keep], want[keep], rtol=rtol, atol=rtol)  # (platform's)
        assert torch.equal(got[keep].isinf(), want[keep].isinf()), (got, want)
    else:
        assert torch.equal(got[keep], want[keep]), (got, want)
    if signs and want.is_floating_point():
        assert torch.equal(got[keep].signbit(), want[keep].signbit()), (got, want)


def _same_power(got, want):
    # cpowf and XLA's power round apart (a few float32 ulps; a value that should be real gets
    # an imaginary part of 1e-7 against 1e-15); the sign of a zero part is not eager's either
    _same_bits(got, want, rtol=tolerance(2e-6, 2e-6)["rtol"], signs=False)


def _outcome(fn):
    try:
        return fn()
    except Exception as e:      # noqa: BLE001 - eager's error is part of what is compared
        return e


def _assert_like_eager(got, want):
    if isinstance(want, Exception):
        assert isinstance(got, Exception), f"eager raises {want!r}, the device gave {got}"
        assert type(got) is type(want)
        assert str(got).splitlines()[0] == str(want).splitlines()[0]
        return
    assert not isinstance(got, Exception), f"eager gives {want}, the device raised {got!r}"
    for g, w in zip(got, want):
        _same_bits(g, w)


# -- complex to bool -------------------------------------------------------------------------------

Z = torch.tensor([1j, 0j, 1 + 0j, 0.5j, -0.0 + 0j, complex(0, -0.0)])


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128], ids=str)
def test_complex_to_bool_is_nonzero_in_either_part(path, dev, dtype):
    z = Z.to(dtype)
    _same_bits(z.to(dev).to(torch.bool), z.to(torch.bool))
    _same_bits(torch.zeros(6, dtype=torch.bool, device=dev).copy_(z.to(dev)),
               torch.zeros(6, dtype=torch.bool).copy_(z))
    _same_bits(z.to(dev).bool().logical_not(), z.bool().logical_not())


# -- masked_fill with a complex value ------------------------------------------------------------

VALUES = [1 + 2j, 0j, 2 + 0j, 1j, -3.5 + 0j]


def _fill(d, dtype, value, in_place: bool):
    x = torch.tensor([1, 0, 3, 1], dtype=dtype, device=d)
    mask = torch.tensor([True, False, True, False], device=d)
    return [x.clone().masked_fill_(mask, value) if in_place else x.masked_fill(mask, value)]


@pytest.mark.parametrize("in_place", [False, True], ids=["out_of_place", "in_place"])
@pytest.mark.parametrize("dtype", [torch.bool, torch.int64, torch.float32, torch.float16],
                         ids=str)
def test_masked_fill_with_a_complex_number_converts_or_refuses_as_eager(path, dev, dtype,
                                                                        in_place):
    for value in VALUES:
        want = _outcome(lambda: _fill("cpu", dtype, value, in_place))
        _assert_like_eager(_outcome(lambda: _fill(dev, dtype, value, in_place)), want)


@pytest.mark.parametrize("where", ["cpu", "pending", "materialised"])
@pytest.mark.parametrize("dtype", [torch.bool, torch.int64, torch.float32], ids=str)
def test_masked_fill_with_a_complex_tensor_value_converts_or_refuses_as_eager(path, dev, dtype,
                                                                              where):
    """Eager reads a 0-dim value tensor (item()); a complex one with an imaginary part cannot
    fill a real, non-bool tensor. The device reads it too, pending or not."""
    for value in VALUES:
        v = torch.tensor(value, dtype=torch.complex64)
        if where == "pending":
            dv = v.to(dev) * 1
        elif where == "materialised":
            dv = v.to(dev)
            xc.sync([dv])
        else:
            dv = v
        want = _outcome(lambda: _fill("cpu", dtype, v, in_place=False))
        _assert_like_eager(_outcome(lambda: _fill(dev, dtype, dv, in_place=False)), want)


def test_a_complex_fill_value_with_an_imaginary_part_raises_after_a_plan_of_a_real_one(path,
                                                                                       dev):
    """The refusal is not skipped by the plan of an earlier call with another value."""
    x = torch.ones(3, device=dev)
    mask = torch.tensor([True, False, True], device=dev)
    for _ in range(3):
        assert_same(x.masked_fill(mask, 2 + 0j), torch.tensor([2.0, 1.0, 2.0]))
    with pytest.raises(RuntimeError, match="value cannot be converted to type float without "
                                           "overflow"):
        x.masked_fill(mask, 2 + 1j)
    assert_same(x, torch.ones(3))


# -- complex powers of zero ------------------------------------------------------------------------

EXPONENTS = torch.tensor([1 + 1j, 0j, -1 + 0j, 1j, 2 + 0j, 0.5 - 2j, -0.5 + 3j, 3 + 0j])


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128], ids=str)
def test_complex_power_of_zero_is_eagers(path, dev, dtype):
    """Eager computes cexp(y * clog(0)): 0 where y's real part is positive, (inf, nan) where it
    is negative, nan where it is zero; XLA gave nan for all but positive real exponents."""
    base = torch.tensor([0j, complex(-0.0, 0.0), 0j, 2 + 1j, 0j, 0j, 0j, -1.5 + 0j], dtype=dtype)
    y = EXPONENTS.to(dtype)
    want = torch.pow(base, y)
    _same_power(torch.pow(base.to(dev), y.to(dev)), want)
    for e in (1 + 1j, -2 + 0.5j, 2.5, 1j):        # a number exponent, and a number base
        _same_power(torch.pow(base.to(dev), e), torch.pow(base, e))
    _same_power(torch.pow(0, y.to(dev)), torch.pow(0, y))
    _same_power(torch.float_power(base.to(dev), y.to(dev)), torch.float_power(base, y))


@pytest.mark.parametrize("base_dtype", [torch.bool, torch.int64, torch.float32], ids=str)
def test_a_real_zero_to_a_complex_power_is_eagers(path, dev, base_dtype):
    base = torch.tensor([0, 1, 0, 1], dtype=base_dtype)
    for e in (1 + 1j, 2 + 0j, -1 + 0j):
        _same_power(torch.pow(base.to(dev), e), torch.pow(base, e))
        t = torch.tensor([e, e, 1j, 0j])
        _same_power(torch.pow(base.to(dev), t.to(dev)), torch.pow(base, t))


# -- numbers Python finds equal: their own executables and plans ----------------------------------

def test_pow_by_0_and_0j_and_false_do_not_share_an_executable(path, dev):
    """pow(x, 0j) fills ones, as eager does (not a complex power of zero) and pow(x, 0) and
    pow(x, False) lower through other branches: each runs its own, in either order."""
    x = torch.tensor([0j, 2 + 0j, 1j, float("nan")])
    for exponents in ([0j, 0, False, 0.0, 1 + 0j, 1, True], [1, True, 1 + 0j, 0.0, False, 0, 0j]):
        for e in exponents:
            _same_power(torch.pow(x.to(dev), e), torch.pow(x, e))
    y = torch.tensor([0.0, 2.0, -1.5])
    for e in (2, 2.0, 2 + 0j, 2.0, 2):
        _same_power(torch.pow(y.to(dev), e), torch.pow(y, e))


def test_a_negative_zero_argument_is_not_its_positive_twin(path, dev):
    """-0.0 == 0.0 in Python; a static argument keeps its sign in plans and executables."""
    x = torch.tensor([float("nan"), 1.0, float("nan")])
    for v in (0.0, -0.0, 0.0, -0.0, float("nan"), float("nan"), -0.0):
        _same_bits(x.to(dev).nan_to_num(nan=v), x.nan_to_num(nan=v))
        _same_bits(torch.full((2,), v, device=dev), torch.full((2,), v))


# -- ops without a rule: eager's dtype refusal before the decomposition ---------------------------

@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bool], ids=str)
def test_logaddexp_of_integers_is_refused_as_eager_refuses_it(path, dev, dtype):
    a, b = torch.tensor([1, 0, 3]).to(dtype), torch.tensor([0, 1, 2]).to(dtype)
    with pytest.raises(NotImplementedError) as want:
        torch.logaddexp(a, b)
    for _ in range(2):          # the check is remembered passed only, never skipped
        with pytest.raises(NotImplementedError) as got:
            torch.logaddexp(a.to(dev), b.to(dev))
        assert str(got.value).splitlines()[0] == str(want.value)
        assert "logaddexp" in str(got.value)
    f = torch.tensor([0.5, -1.0, 2.0])
    assert_same(torch.logaddexp(a.to(dev), f.to(dev)), torch.logaddexp(a, f))
    assert_same(torch.logaddexp2(f.to(dev), a.to(dev)), torch.logaddexp2(f, a))


def test_signatures_and_plan_keys_tell_equal_numbers_apart():
    """What executables and plans are keyed on: numbers that Python finds equal (0, 0.0, -0.0,
    0j, False), and NaN, which is unequal to itself (a plan or executable per call)."""
    from xla_compat.lazy import ir, tracer
    numbers = [0, 0.0, -0.0, 0j, complex(0, -0.0), False, 1, 1.0, True]
    sigs = [ir.sig_id(("op", None, (1, x), (), ())) for x in numbers]
    assert len(set(sigs)) == len(numbers)
    assert len({tracer.static_key(x) for x in numbers}) == len(numbers)
    nan = float("nan")
    assert ir.sig_id(("op", None, (nan,), (), ())) == ir.sig_id(("op", None, (float("nan"),),
                                                                  (), ()))
    assert tracer.static_key(nan) == tracer.static_key(float("nan"))
    assert ir.sig_id(("op", None, ([0, 1.5],), (), ())) != ir.sig_id(("op", None, ([0.0, 1.5],),
                                                                        (), ()))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.complex64], ids=str)
def test_a_bool_converted_to_a_float_meets_non_finite_numbers_as_eager(path, dev, dtype):
    """XLA's simplifier rewrote convert(mask) * y as select(mask, y, 0): False gave 0 where
    eager's 0 * inf, 0 / 0 and 0 * nan are NaN."""
    mask = torch.tensor([True, False, True, False])
    y = torch.tensor([float("inf"), float("nan"), 2.0, float("-inf")]).to(dtype)
    cases = [lambda m, y: torch.div(m, 0), lambda m, y: m.to(y.dtype) * y,
             lambda m, y: m.to(y.dtype) * float("inf"), lambda m, y: m.to(y.dtype) / 0.0,
             lambda m, y: torch.mul(m, y)]
    for fn in cases:
        _same_bits(fn(mask.to(dev), y.to(dev)), fn(mask, y), signs=False)


# -- narrowing integer conversions feeding and/or -----------------------------------------------

_NARROWING = [(torch.int32, torch.int64), (torch.int16, torch.int32), (torch.int8, torch.int64)]
_AND_OR = {
    "x & y.to(x.dtype)": lambda x, y: x & y.to(x.dtype),
    "x | y.to(x.dtype)": lambda x, y: x | y.to(x.dtype),
    "x.bitwise_and_(y)": lambda x, y: x.bitwise_and_(y),
    "x.bitwise_or_(y)": lambda x, y: x.bitwise_or_(y),
    "y.to(x.dtype) & 5": lambda x, y: y.to(x.dtype) & 5,
}


@pytest.mark.parametrize("dtypes", _NARROWING,
                         ids=lambda d: f"{d[0]}<-{d[1]}".replace("torch.", ""))
@pytest.mark.parametrize("name", list(_AND_OR))
def test_and_or_of_a_narrowed_signed_integer_computes_like_eager(path, dev, name, dtypes):
    """XLA:CPU (jaxlib 0.10) killed the process with SIGSEGV compiling a fused and/or of a signed
    integer with a conversion to it from a wider signed integer; ``cast`` narrows through the
    unsigned dtype of the target's width, which truncates alike (sweep, session 34). Here the
    values, under the suite's XLA flags; the next test compiles under XLA's defaults."""
    narrow, wide = dtypes
    fn = _AND_OR[name]

    def program(device):
        x = torch.tensor([0, -1, 2, -7, 100, 55], dtype=narrow, device=device)
        y = torch.tensor([3, 1, -2, 100, -1, 2 ** 14 + 6], dtype=wide, device=device)
        return fn(x, y)
    got = program(dev)
    xc.sync()
    want = program("cpu")
    assert got.dtype == want.dtype
    assert torch.equal(got.cpu(), want)


# The crash is XLA's, whatever the path: make test runs the subprocess (10 s) on legacy.
SLOW_CASES = {"test_and_or_of_a_narrowed_signed_integer_compiles_under_xlas_default_emitters"
              "[functional]"}


def test_and_or_of_a_narrowed_signed_integer_compiles_under_xlas_default_emitters(path):
    """The crash is in XLA:CPU's fusion emitters, which the suite turns off (conftest's
    TEST_XLA_FLAGS): a subprocess under XLA's defaults runs the cases above, every one of which
    killed it before."""
    import os
    import subprocess
    import sys
    from tests.conftest import TEST_XLA_FLAGS
    script = f"""
import torch, xla_compat as xc
from tests.test_number_conversions import _AND_OR, _NARROWING
dev = xc.device()
with xc.use_path({path!r}):
    for narrow, wide in _NARROWING:
        for name, fn in _AND_OR.items():
            def program(device):
                x = torch.tensor([0, -1, 2, -7, 100, 55], dtype=narrow, device=device)
                y = torch.tensor([3, 1, -2, 100, -1, 2 ** 14 + 6], dtype=wide, device=device)
                return fn(x, y)
            got, want = program(dev).cpu(), program("cpu")
            assert got.dtype == want.dtype and torch.equal(got, want), (name, narrow, got, want)
print("all computed")
"""
    env = dict(os.environ, XLA_FLAGS=os.environ.get("XLA_FLAGS", "").replace(TEST_XLA_FLAGS, ""),
               XLA_COMPAT_TEST_XLA_DEFAULT="1")
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=300, cwd=os.path.dirname(os.path.dirname(__file__)))
    assert done.returncode == 0 and "all computed" in done.stdout, (done.returncode,
                                                                    done.stderr[-2000:])


# -- complex add and sub at non-finite parts ------------------------------------------------------

_INF, _NAN = float("inf"), float("nan")
_ALPHA_OPS = {
    "a + b": lambda a, b, f: a + b,
    "b + a": lambda a, b, f: b + a,
    "a - b": lambda a, b, f: a - b,
    "rsub": lambda a, b, f: torch.rsub(a, b),
    "alpha 2": lambda a, b, f: torch.add(a, b, alpha=2),
    "alpha 1j": lambda a, b, f: torch.add(a, b, alpha=1j),
    "real + complex": lambda a, b, f: f + b,
    "complex + real": lambda a, b, f: b + f,
    "complex + inf number": lambda a, b, f: a + complex(_INF, 0),
    "add_": lambda a, b, f: a.clone().add_(b),
    "sub_": lambda a, b, f: a.clone().sub_(b),
}


@pytest.mark.parametrize("name", list(_ALPHA_OPS))
def test_complex_add_and_sub_make_eagers_nans_at_non_finite_parts(path, dev, name):
    """Eager's add and sub multiply the other operand by alpha even when alpha is 1, part by
    part: ``0j + (inf + 1j)`` is ``inf + nanj`` there (``0 * inf`` in the imaginary part). The
    device skipped the multiplication and gave ``inf + 1j`` (sweep, session 34)."""
    fn = _ALPHA_OPS[name]
    a = torch.tensor([0j, 0j, 1 + 2j, complex(_INF, 1), complex(_NAN, 0), complex(1, _INF)])
    b = torch.tensor([complex(_INF, 1), complex(_NAN, 0), complex(_INF, 0), 0j, 1j, 2 + 0j])
    f = torch.tensor([_NAN, 0.0, 1.0, 2.0, _INF, -1.0])
    got = fn(a.to(dev), b.to(dev), f.to(dev))
    _same_bits(got, fn(a, b, f), signs=False)


# -- writes whose operands promote past the written tensor's dtype --------------------------------

_INT_WRITES = {
    "floor_divide_": lambda a, b: a.floor_divide_(b),
    "remainder_": lambda a, b: a.remainder_(b),
    "fmod_": lambda a, b: a.fmod_(b),
    "div trunc out=": lambda a, b: torch.div(a, b, rounding_mode="trunc", out=a),
    "add_": lambda a, b: a.add_(b),
}


@pytest.mark.parametrize("dtypes", [(torch.uint8, torch.int8), (torch.int8, torch.uint8),
                                    (torch.uint8, torch.int64)], ids=str)
@pytest.mark.parametrize("name", list(_INT_WRITES))
def test_an_integer_write_computes_in_the_operands_common_dtype(path, dev, name, dtypes):
    # uint8.floor_divide_(int8) divides in int16 and stores the quotient's low byte (200 // -3
    # is -67, stored as 189); legacy divided in uint8 (-3 read as 253: 0)
    written, other = dtypes
    a = torch.tensor([200, 7, 13, 255, 0, 100, 1, 99], dtype=torch.int64).to(written)
    b = torch.tensor([-3, 2, -5, 7, -1, 3, -128, 9], dtype=torch.int64).to(other)
    fn = _INT_WRITES[name]
    want = fn(a.clone(), b)
    got = a.to(dev)
    for _ in range(2):                    # the traced call, then its plan
        got = a.to(dev)
        fn(got, b.to(dev))
    _same_bits(got, want)


_FLOAT_WRITES = {
    "sub_": lambda a, b: a.sub_(b),
    "add_ alpha": lambda a, b: a.add_(b, alpha=0.3),
    "pow_": lambda a, b: a.abs_().pow_(b),
    "atan2_": lambda a, b: a.atan2_(b),
    "fmod_": lambda a, b: a.fmod_(b),
    "hypot_": lambda a, b: a.hypot_(b),
    "sub out=": lambda a, b: torch.sub(a, b, out=a),
    "add_ 0-dim": lambda a, b: a.add_(b[3]),
}


@pytest.mark.parametrize("dtypes", [(torch.bfloat16, torch.float32),
                                    (torch.float16, torch.float64),
                                    (torch.bfloat16, torch.float16),
                                    (torch.float32, torch.float64)], ids=str)
@pytest.mark.parametrize("name", list(_FLOAT_WRITES))
def test_a_float_write_with_a_wider_operand_computes_in_it_and_rounds_once(path, dev, name,
                                                                           dtypes):
    # TensorIterator computes bfloat16.sub_(float32) in float32 and rounds on storing; legacy
    # rounded the float32 operand to bfloat16 first (285 of 1000 results off), and computed
    # float32.sub_(float64) in float32 (a quarter of the results an ulp off); a 0-dim float16
    # added into bfloat16 is rounded to bfloat16 (both paths widened it unrounded)
    written, other = dtypes
    g = torch.Generator().manual_seed(5)
    a = (torch.randn(512, generator=g) * 3).to(written)
    b = (torch.randn(512, generator=g) * 3).to(other)
    fn = _FLOAT_WRITES[name]
    got = a.to(dev)
    fn(got, b.to(dev))
    _same_bits(got, fn(a.clone(), b))


_TENSOR_VALUE_FILLS = {
    "masked_fill": lambda x, v: x.masked_fill(x == 0, v),
    "masked_fill_": lambda x, v: x.masked_fill_(x == 0, v),
    "index_fill_": lambda x, v: x.index_fill_(0, torch.tensor([0, 2], device=x.device), v),
}


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.float16], ids=str)
@pytest.mark.parametrize("name", list(_TENSOR_VALUE_FILLS))
def test_a_cpu_tensor_fill_value_is_range_checked_at_every_call(path, dev, name, dtype):
    # eager reads a 0-dim value tensor and refuses one its dtype cannot hold; the device's
    # checks ran once per signature, so 300.0 after 5.0 filled uint8 with 255
    fn = _TENSOR_VALUE_FILLS[name]
    x = torch.tensor([0, 1, 0, 3], dtype=dtype)
    for value in (5.0, 300.0, 7.0, -3.0, 1e6, 2.0):
        v = torch.tensor(value)
        want = _outcome(lambda: fn(x.clone(), v))
        _assert_like_eager(_outcome(lambda: fn(x.to(dev), v)), want)
