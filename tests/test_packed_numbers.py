"""A graph's Python numbers reach its executable packed, one host vector per kind (issue 8):
the results are eager's for every dtype a number meets, and new numbers never recompile."""
from __future__ import annotations

import pytest
import torch

import xla_compat as xc
from xla_compat import executor, metrics, packed_numbers
from tests.conftest import assert_same


def _program(x, a, b, k):
    """Numbers of every kind (float, int, bool, complex-free) meeting a tensor of x's dtype."""
    y = x * a + b
    y = y - k
    y = torch.where(y > a, y, y * 2)
    return y.clamp(min=-b, max=b * 3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64,
                                   torch.int32, torch.int64, torch.uint8])
def test_numbers_keep_their_weak_type_for_every_dtype(path, dev, dtype):
    cpu = (torch.arange(24) % 7).reshape(4, 6).to(dtype)
    a, b, k = (2, 5, 1) if not dtype.is_floating_point else (0.75, 2.5, 1)
    expected = _program(cpu, a, b, k)
    got = _program(cpu.to(dev), a, b, k)
    xc.sync()
    assert type(executor._last_compiled) is packed_numbers.Packed
    assert got.dtype == expected.dtype
    assert_same(got, expected, rtol=0, atol=0)


def test_float32_arithmetic_with_numbers_rounds_like_eager(path, dev):
    # A number made a float64 operand would compute in float64 and round once at the end:
    # thousands of the elements would differ from eager's float32 arithmetic by an ulp. (abs
    # between the ops: XLA's CPU compiler contracts x * a + b into one fused multiply-add, which
    # rounds once where eager rounds twice; that ulp is XLA's, not the numbers'.)
    cpu = torch.randn(64, 64, generator=torch.Generator().manual_seed(3))
    expected = (cpu * 0.3333333).abs() - 0.05
    got = (cpu.to(dev) * 0.3333333).abs() - 0.05
    assert_same(got, expected, rtol=0, atol=0)


def test_comparisons_with_numbers_happen_in_the_tensors_dtype(path, dev):
    # float32(0.1) > 0.1 in float64, but not in float32 (eager compares in float32): a number
    # passed as a float64 operand would flip these.
    def compare(t):
        return (t > 0.1), (t == 0.3), (t <= 0.2), (t > 0.1) & (t < 0.3)
    cpu = torch.tensor([0.1, 0.2, 0.3, -0.1], dtype=torch.float32)
    for g, e in zip(compare(cpu.to(dev)), compare(cpu)):
        assert_same(g, e, rtol=0, atol=0)


def test_complex_and_bool_numbers(path, dev):
    z = torch.tensor([1 + 2j, -3j, 0.5], dtype=torch.complex64)
    m = torch.tensor([True, False, True])
    exp = (z * (2 - 1j) + 0.5j, m & True, m.logical_xor(torch.tensor(False)) | False)
    got = (z.to(dev) * (2 - 1j) + 0.5j, m.to(dev) & True,
           m.to(dev).logical_xor(torch.tensor(False)) | False)
    for g, e in zip(got, exp):
        assert g.dtype == e.dtype
        assert_same(g, e)


def test_new_numbers_run_the_same_executable(path, dev):
    x = torch.randn(8, 8).to(dev)

    def step(a, b):
        y = (x * a + b).sin() * (a - b)
        xc.sync()
        return y
    step(0.5, 1.5)
    compiles = metrics.counter("UncachedCompile")
    for i in range(5):
        a, b = 0.1 * i, -0.3 * i
        assert_same(step(a, b), ((x.cpu() * a + b).sin() * (a - b)))
    assert metrics.counter("UncachedCompile") == compiles


def test_written_tensors_are_still_donated(path, dev):
    cpu = torch.randn(16, 16)
    d = cpu.to(dev)
    xc.sync()
    for i in range(3):
        for t in (cpu, d):
            t.mul_(0.5).add_(i).sub_(0.25 * i)
        xc.sync()
    assert metrics.counter("InputOutputAliasCount") >= 3
    assert_same(d, cpu)


def test_layout_groups_numbers_by_kind_and_leaves_one_number_alone():
    arr = object()
    plan = packed_numbers.layout([arr, 1.5, 2, arr, 3.0, True, 7])
    assert plan is not None
    arrays, groups = plan
    assert arrays == (0, 3)
    assert {g[0] for g in groups} == {(1, 4), (2, 6), (5,)}
    assert packed_numbers.layout([arr, 1.5]) is None          # one number: passed as it is
    assert packed_numbers.layout([2 ** 70, 1]) is None         # beyond int64: passed as it is


def test_a_captured_steps_recorded_numbers_are_packed_once(path, dev, monkeypatch):
    # A replayed step passes its recorded numbers as the same device scalars every time: the
    # packed vectors are made once, not converted back to the host on every replay.
    from xla_compat import capture
    monkeypatch.setattr(capture, "BAKE_HORIZON", 0)    # numbers stay parameters (device scalars)
    x = torch.randn(8, 8).to(dev)

    @xc.compile
    def step():
        x.mul_(0.5).add_(0.25).sub_(0.125)
    made = []
    real = packed_numbers.number_vectors
    monkeypatch.setattr(packed_numbers, "number_vectors",
                        lambda params, plan: made.append(1) or real(params, plan))
    expected = x.cpu()
    for _ in range(6):
        step()
        xc.sync()
        expected = expected * 0.5 + 0.25 - 0.125
    assert_same(x, expected)
    assert len(made) <= 3          # recording and the first replays, not one per replay


def test_new_number_objects_are_packed_anew():
    import jax.numpy as jnp
    calls = []
    packed = packed_numbers.Packed(lambda *ins: calls.append(ins) or ins, ((0,), (((1, 2),
                                                                            packed_numbers.np.float64, True),)))
    a, b = jnp.asarray(1.5), jnp.asarray(2.5)
    packed("x", a, b)
    packed("x", a, b)
    assert calls[0][1] is calls[1][1]                  # the same objects: the same vector
    packed("x", jnp.asarray(1.5), b)
    assert calls[2][1] is not calls[1][1]
    assert [float(v) for v in calls[2][1]] == [1.5, 2.5]
    packed("y", 3.0, 4.0)                              # Python numbers: packed
    assert list(calls[3][1]) == [3.0, 4.0] and calls[3][0] == "y"
    packed("z", 3.0, 4.0)                              # equal ones again: the same vector
    assert calls[4][1] is calls[3][1] and calls[4][0] == "z"
    packed("z", 3.0, 4.5)
    assert list(calls[5][1]) == [3.0, 4.5]


def test_a_loops_own_number_objects_are_packed_once_and_new_ones_are_not_mistaken(path, dev,
                                                                                 monkeypatch):
    # A traced loop passes the same numbers each step (its code's literals): their vectors are
    # made once. -0.0 after 0.0 (equal, different sign) is packed anew: 1 / -0.0 is -inf.
    x = torch.tensor([1.0, -2.0, 3.0])
    d = x.to(dev)
    made = []
    real = packed_numbers.number_vectors
    monkeypatch.setattr(packed_numbers, "number_vectors",
                        lambda params, plan: made.append(1) or real(params, plan))
    half, quarter = 0.5, 0.25

    def step(zero):
        y = (d * half - quarter) / (d * 0 + zero)    # 1 / -0.0 is -inf
        xc.sync()
        return y
    assert_same(step(0.0), (x * half - quarter) / (x * 0 + 0.0))
    first = len(made)          # compiling packs once, and so does the first run
    for _ in range(3):
        assert_same(step(0.0), (x * half - quarter) / (x * 0 + 0.0))
    assert len(made) == first
    neg = float("-0.0")
    assert_same(step(neg), (x * half - quarter) / (x * 0 + neg))
    assert len(made) == first + 1
    assert_same(step(0.0), (x * half - quarter) / (x * 0 + 0.0))
    assert len(made) == first + 2
