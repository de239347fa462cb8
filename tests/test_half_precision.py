"""float16/bfloat16 results are the ones eager computes: each op in float32, rounded once.

Eager's CPU kernels compute reduced-precision floats in float32 ("opmath") and store each op's
result in the tensor's dtype. Pointwise ops here are compared bit for bit with torch on CPU,
also when several run in one graph (where XLA must not skip the rounding between them).
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import xla_compat as xc
from tests.conftest import assert_same
from tests.sampling import all_pairs

DTYPES = (torch.bfloat16, torch.float16)
# Rounding rules of the lowerings, code the paths share: each case on one path in make test,
# the paths taking turns (tests/sampling.alternate_paths); make test-slow runs the other.
ALTERNATE_PATHS = True
N = 2048


def _inputs(dtype, k, *, positive=False, scale=3.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    xs = [torch.randn(N, generator=g) * scale for _ in range(k)]
    if positive:
        xs = [x.abs() + 0.01 for x in xs]
    return [x.to(dtype) for x in xs]


def assert_bitwise(actual, expected, msg=""):
    assert_same(actual, expected, rtol=0, atol=0, msg=msg)


# name -> (function, number of tensor inputs, positive inputs only)
UNARY = {
    "exp": (torch.exp, False), "exp2": (torch.exp2, False), "expm1": (torch.expm1, False),
    "log": (torch.log, True), "log2": (torch.log2, True), "log10": (torch.log10, True),
    "log1p": (torch.log1p, True), "sqrt": (torch.sqrt, True), "rsqrt": (torch.rsqrt, True),
    "reciprocal": (torch.reciprocal, False), "sin": (torch.sin, False), "cos": (torch.cos, False),
    "tan": (torch.tan, False), "atan": (torch.atan, False), "asinh": (torch.asinh, False),
    "sinh": (torch.sinh, False), "cosh": (torch.cosh, False), "tanh": (torch.tanh, False),
    "sigmoid": (torch.sigmoid, False),
    "square": (torch.square, False), "frac": (torch.frac, False),
    "relu": (F.relu, False), "silu": (F.silu, False), "mish": (F.mish, False),
    "softplus": (F.softplus, False), "elu": (F.elu, False), "selu": (F.selu, False),
    "leaky_relu": (lambda x: F.leaky_relu(x, 0.1), False), "hardswish": (F.hardswish, False),
    "hardsigmoid": (F.hardsigmoid, False), "logsigmoid": (F.logsigmoid, False),
    "mul_scalar": (lambda x: x * 0.1, False), "div_scalar": (lambda x: x / 3, False),
    "add_scalar": (lambda x: x + 0.1, False), "sub_scalar": (lambda x: x - 0.1, False),
    "rdiv_scalar": (lambda x: 0.1 / x, False), "pow_scalar": (lambda x: x ** 1.5, True),
    "pow_inexact_scalar": (lambda x: x ** 0.1, True),
    "pow_2": (lambda x: x ** 2, False), "clamp": (lambda x: x.clamp(-0.7, 0.3), False),
}
BINARY = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div,
    "add_alpha": lambda x, y: torch.add(x, y, alpha=0.3), "atan2": torch.atan2,
    "maximum": torch.maximum, "hypot": torch.hypot, "fmod": torch.fmod,
    "remainder": torch.remainder, "pow": lambda x, y: x.abs() ** y,
    "lerp": lambda x, y: torch.lerp(x, y, 0.3), "lerp_tensor": lambda x, y: torch.lerp(x, y, y),
    "addcmul": lambda x, y: torch.addcmul(x, x, y, value=0.3),
    "copysign": torch.copysign, "a*b+b": lambda a, b: a * b + b,
}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_op_is_bitwise_eager(path, dev, name, dtype):
    fn, positive = UNARY[name]
    (x,) = _inputs(dtype, 1, positive=positive)
    assert_bitwise(fn(x.to(dev)), fn(x), name)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_op_is_bitwise_eager(path, dev, name, dtype):
    fn = BINARY[name]
    x, y = _inputs(dtype, 2)
    assert_bitwise(fn(x.to(dev), y.to(dev)), fn(x, y), name)


# Ops whose float32 math differs from eager's by an ulp of float32 now and then, which the
# final rounding sometimes shows: eager's vectorised erf (a polynomial) and its scalar one
# (std::erf) disagree in the same way (see the test below), and XLA's CPU flushes float32
# subnormal results (erfc of large x) to zero. Compared at one ulp of the dtype.
ULP_OPS = {
    "erf": torch.erf, "erfc": torch.erfc, "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    # a composite eager runs in the tensor's dtype, each step (and its constant) rounded; its
    # lgamma is XLA's, within an ulp of float32 of std::lgamma (computed in float32 it was 2-4
    # ulps of the dtype off on 8-12% of the elements)
    "mvlgamma": lambda x: torch.mvlgamma(x.abs() + 0.5, 2),
    "multigammaln": lambda x: torch.special.multigammaln(x.abs() + 1.5, 4),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", sorted(ULP_OPS))
def test_transcendental_op_is_within_one_ulp_of_eager(path, dev, name, dtype):
    fn = ULP_OPS[name]
    (x,) = _inputs(dtype, 1)
    got, exp = fn(x.to(dev)).cpu(), fn(x)
    eps = torch.finfo(dtype).eps
    assert_same(got, exp, rtol=eps, atol=1e-5, msg=name)
    if not name.startswith("gelu"):      # GELU's rounding hits follow eager's polynomial erf/tanh
        assert (got != exp).float().mean() < 0.01, f"{name}: more than 1% of elements differ"


def test_eager_gelu_itself_differs_between_its_vector_and_scalar_loops():
    """Why GELU and erf are compared at one ulp: eager's own results depend on the loop."""
    (x,) = _inputs(torch.bfloat16, 1)
    vector = F.gelu(x)
    scalar = torch.stack([F.gelu(x[i:i + 1])[0] for i in range(len(x))])
    assert (vector != scalar).any()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_chain_in_one_graph_rounds_between_ops_like_eager(path, dev, dtype):
    x, y, z = _inputs(dtype, 3)
    def chain(a, b, c):
        return torch.sigmoid(a * b + c).mul(b).sub(a / 3).exp().add(c, alpha=0.5)
    got = chain(x.to(dev), y.to(dev), z.to(dev))
    assert "convert" in xc.hlo_text([got])
    assert_bitwise(got, chain(x, y, z))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_in_place_chain_rounds_like_eager(path, dev, dtype):
    x, y = _inputs(dtype, 2)
    d = x.to(dev)
    for t in (x, d):
        t.mul_(y.to(t.device)).add_(y.to(t.device)).div_(7).sqrt_()
    assert_bitwise(d, x)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_float32_graph_has_no_reduced_precision_rounding(path, dev, dtype):
    x, y = (t.float() for t in _inputs(dtype, 2))
    text = xc.hlo_text([x.to(dev) * y.to(dev) + y.to(dev)])
    assert "reduce_precision" not in text and "convert" not in text


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", ["softmax", "log_softmax", "layer_norm", "sum", "mean",
                                  "cumsum", "matmul"])
def test_accumulating_op_rounds_once_like_eager(path, dev, name, dtype):
    g = torch.Generator().manual_seed(1)
    x = (torch.randn(16, 64, generator=g) * 3).to(dtype)
    w = torch.randn(64, generator=g).to(dtype)
    fns = {
        "softmax": lambda t: t.softmax(-1), "log_softmax": lambda t: t.log_softmax(-1),
        "layer_norm": lambda t: F.layer_norm(t, (64,), w.to(t.device), w.to(t.device) / 2),
        "sum": lambda t: t.sum(-1), "mean": lambda t: t.mean(-1), "cumsum": lambda t: t.cumsum(-1),
        "matmul": lambda t: t @ t.T,
    }
    got, exp = fns[name](x.to(dev)).cpu(), fns[name](x)
    # Sums in float32 in another order may land on the other side of a rounding boundary:
    # one ulp of the dtype, in few elements.
    assert_same(got, exp, rtol=torch.finfo(dtype).eps, atol=1e-5, msg=name)
    assert (got != exp).float().mean() < 0.05, f"{name}: more than 5% of elements differ"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(5,), (5, 5), (5, 10, 5), (64, 300), (3, 0)], ids=str)
def test_log_softmax_over_the_last_dim_keeps_the_row_sum_in_the_dtype_like_eager(path, dev,
                                                                                 dtype, shape):
    """Eager's last-dim kernel stores each row's sum of exponentials and its log in the half
    dtype: where the other elements add under half an ulp to 1, the row's maximum is exactly 0
    (one rounding at the end gave -0.0039 in bfloat16). Bit for bit, masked rows too."""
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(shape, generator=g) * 5).to(dtype)
    if x.dim() == 2 and x.numel():
        x[0, 1:] = float("-inf")        # a row with one live element: exactly 0 there
    assert_bitwise(x.to(dev).log_softmax(-1), x.log_softmax(-1))
    if x.dim() > 1:                     # other dims: float32 throughout, one rounding
        assert_same(x.to(dev).log_softmax(0), x.log_softmax(0),
                    rtol=torch.finfo(dtype).eps, atol=1e-5)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_xlogy_rounds_log_first_like_eager(path, dev, dtype):
    x, y = _inputs(dtype, 2)
    assert_bitwise(torch.xlogy(x.to(dev), y.abs().to(dev)), torch.xlogy(x, y.abs()))


def test_addcdiv_multiplies_before_dividing_like_eager(path, dev):
    x, y = _inputs(torch.float16, 2)
    fn = lambda a, b: torch.addcdiv(a, a, b, value=0.3)  # noqa: E731
    assert_bitwise(fn(x.to(dev), y.to(dev)), fn(x, y))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("exponent", [2, 3, 4, 5, -1, -2, -3, 0.5, -0.5, 1.7, 0, 1])
def test_pow_by_a_number_rounds_like_eager(path, dev, dtype, exponent):
    """Eager special-cases 2, 3, -1, -2, +-0.5 (bfloat16 rounds x*x before the third factor,
    float16 does not) and computes other exponents, rounded to the dtype, in one float32 pow."""
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(2048, generator=g) * 3).to(dtype)
    assert_bitwise(torch.pow(x.to(dev), exponent), torch.pow(x, exponent))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("size", [(3, 4, 2), (5, 7, 4), 1, (None, 3, 2)], ids=str)
@pytest.mark.parametrize("channels_last", [False, True])
def test_adaptive_avg_pool3d_sums_in_the_half_dtype_like_eager(path, dev, dtype, size,
                                                              channels_last):
    """Eager's 3-d kernel adds a window's elements in the tensor's own dtype and divides by each
    window extent in turn (2-d accumulates in float32): bit for bit, windows of every size."""
    g = torch.Generator().manual_seed(2)
    x = (torch.randn(2, 3, 8, 9, 6, generator=g) * 3).to(dtype)
    if channels_last:
        x = x.to(memory_format=torch.channels_last_3d)
    assert_bitwise(F.adaptive_avg_pool3d(x.to(dev), size), F.adaptive_avg_pool3d(x, size))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("lead", [(), (7,), (2, 5)], ids=str)
@pytest.mark.parametrize("bias", [True, False])
def test_bilinear_rounds_each_product_like_eager(path, dev, dtype, lead, bias):
    """Eager's _trilinear multiplies input1 with the weight first, rounds to the dtype, then
    with input2 (and F.bilinear adds the bias as its own op); its backward's _trilinear calls
    add a summed dim up slice by slice in the dtype: forward and gradients bit for bit."""
    g = torch.Generator().manual_seed(4)
    x1, x2 = (torch.randn(*lead, 6, generator=g) * 2).to(dtype), \
        (torch.randn(*lead, 5, generator=g) * 2).to(dtype)
    w = torch.randn(4, 6, 5, generator=g).to(dtype)
    b = torch.randn(4, generator=g).to(dtype) if bias else None
    cpu = [t.requires_grad_() if t is not None else None for t in (x1, x2, w, b)]
    on = [t.detach().to(dev).requires_grad_() if t is not None else None for t in cpu]
    got, want = F.bilinear(*on), F.bilinear(*cpu)
    assert_bitwise(got, want)
    seed = torch.randn(want.shape, generator=g).to(dtype)
    got.backward(seed.to(dev))
    want.backward(seed)
    for a, e in zip(on, cpu):
        if e is not None:
            assert_bitwise(a.grad, e.grad)


_BATCH_NORMS = {
    "train": lambda x, w, b, rm, rv: (F.batch_norm(x, rm, rv, w, b, training=True), rm, rv),
    "eval": lambda x, w, b, rm, rv: F.batch_norm(x, rm, rv, w, b, training=False),
    "batch stats only": lambda x, w, b, rm, rv: F.batch_norm(x, None, None, w, b, training=True),
    "instance norm": lambda x, w, b, rm, rv: (
        F.instance_norm(x, rm, rv, w, b, use_input_stats=True), rm, rv),
    "functional op": lambda x, w, b, rm, rv: torch.ops.aten._native_batch_norm_legit_functional(
        x, w, b, rm, rv, True, 0.1, 1e-5),
    "with update": lambda x, w, b, rm, rv: (*torch.ops.aten._batch_norm_with_update(
        x, w, b, rm, rv, 0.1, 1e-5)[:3], rm, rv),
}


@pytest.mark.parametrize("kind,affine,dtype",
                         all_pairs(sorted(_BATCH_NORMS), [True, False], DTYPES))
def test_batch_norm_statistics_round_where_eager_stores_them(path, dev, dtype, affine, kind):
    """Eager's bfloat16 kernel keeps mean, sum of squares, variance and invstd in bfloat16 as it
    goes and updates the running stats in bfloat16 arithmetic; its float16 calls compute in
    float32 and normalise with the statistics as stored: outputs, saved statistics and running
    stats bit for bit, over shapes with and without spatial dims."""
    g = torch.Generator().manual_seed(6)
    for shape in ((4, 3, 5), (2, 4, 3, 3), (8, 3)):
        if kind == "instance norm" and len(shape) < 3:
            continue
        for _ in range(2):
            x = (torch.randn(*shape, generator=g) * 2 + 0.5).to(dtype)
            c = shape[1]
            w = torch.randn(c, generator=g).to(dtype) if affine else None
            b = torch.randn(c, generator=g).to(dtype) if affine else None
            rm = torch.randn(c, generator=g).to(dtype)
            rv = (torch.rand(c, generator=g) + 0.5).to(dtype)
            cpu = [t.clone() if t is not None else None for t in (x, w, b, rm, rv)]
            on = [t.clone().to(dev) if t is not None else None for t in (x, w, b, rm, rv)]
            want, got = _BATCH_NORMS[kind](*cpu), _BATCH_NORMS[kind](*on)
            want = want if isinstance(want, tuple) else (want,)
            got = got if isinstance(got, tuple) else (got,)
            for i, (a, e) in enumerate(zip(got, want)):
                assert_bitwise(a, e, msg=f"{kind} {shape} output {i}")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("mode,shape", [("linear", (2, 3, 7)), ("bicubic", (2, 3, 5, 6)),
                                        ("trilinear", (2, 3, 4, 5, 6)),
                                        ("bilinear", (2, 3, 5, 6))], ids=str)
@pytest.mark.parametrize("align_corners", [False, True])
def test_interpolation_weights_round_like_eager(path, dev, dtype, mode, shape, align_corners):
    """Eager's generic upsampling kernel stores each dim's weights in the half dtype (linear:
    lambda1, then 1 - lambda1 in that dtype) and accumulates the taps in float32 with fused
    multiply-adds; bilinear 2-d takes a float32 kernel. Bit for bit up- and downsampling, in
    both memory formats."""
    g = torch.Generator().manual_seed(7)
    x = (torch.randn(*shape, generator=g) * 3).to(dtype)
    formats = {4: torch.channels_last, 5: torch.channels_last_3d}
    inputs = [x] + ([x.contiguous(memory_format=formats[x.dim()])] if x.dim() in formats else [])
    for xi in inputs:
        for size in (tuple(2 * s - 1 for s in shape[2:]), tuple(max(s - 2, 1) for s in shape[2:])):
            got = F.interpolate(xi.to(dev), size=size, mode=mode, align_corners=align_corners)
            want = F.interpolate(xi, size=size, mode=mode, align_corners=align_corners)
            if mode == "bilinear":      # its float32 kernel's sums: a few elements one ulp off
                steps = (got.cpu().view(torch.int16).int() - want.view(torch.int16).int()).abs()
                assert int(steps.max()) <= 1 and (steps > 0).float().mean() < 0.05
            else:
                assert_bitwise(got, want, msg=f"{mode} {size}")
