"""Bad input: each mistake raises the exception type PyTorch CPU raises (where it raises one),
the message names the op, and every tensor keeps its value.

Covered elsewhere, not repeated here: writes to expanded views and partially overlapping copies
(tests/test_reliability_regressions.py), a failed sync and the next step
(tests/test_reliability_failures.py), rollout settings that become CONFIG_ERROR
(tests/test_rollout.py)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import xla_compat as xc
from xla_compat import settings
from xla_compat.lazy.tracer import PathMixError
from xla_compat.lowering import registry
from xla_compat.settings import SettingError, Settings

from .conftest import assert_same, cyclic_garbage

aten = torch.ops.aten
BASE = torch.arange(12.).reshape(3, 4)


def cpu_error(fn, *args):
    """The exception CPU eager raises for ``fn(*args)``."""
    with pytest.raises(Exception) as err:
        fn(*args)
    return err.value


def check_like_cpu(fn, cpu_args, dev_args, op_words):
    """``fn`` on the device raises CPU's type, names the op, and leaves every input intact."""
    expected = cpu_error(fn, *cpu_args)
    before = [a.cpu().clone() for a in dev_args if isinstance(a, torch.Tensor)]
    with pytest.raises(type(expected)) as err:
        fn(*dev_args)
        xc.sync()
    assert type(err.value) is type(expected), f"{type(err.value)} vs CPU {type(expected)}"
    assert any(w.lower() in str(err.value).lower() for w in op_words), str(err.value)
    xc.sync()     # nothing broken was left pending
    after = [a.cpu() for a in dev_args if isinstance(a, torch.Tensor)]
    for b, a in zip(before, after):
        assert torch.equal(a, b)
    return err.value


# -- shapes ----------------------------------------------------------------------------------

@pytest.mark.parametrize("fn,op", [
    (lambda x: x + torch.ones(5, device=x.device), "aten.add.Tensor"),
    (lambda x: x @ x, "aten.mm"),
    (lambda x: x.view(5, 2), "view"),
    (lambda x: x.add_(torch.ones(2, 4, device=x.device)), "add"),
    (lambda x: torch.cat([x, torch.ones(2, 3, device=x.device)]), "cat"),
], ids=["broadcast", "matmul", "view", "in-place add", "cat"])
def test_shape_mismatch_raises_like_cpu_and_names_the_op(path, dev, fn, op, request):
    check_like_cpu(fn, (BASE.clone(),), (BASE.to(dev),), [op])


# -- dtypes ----------------------------------------------------------------------------------

def test_gather_with_a_float_index_raises_like_cpu(path, dev):
    idx = torch.zeros(1, 4)
    check_like_cpu(lambda x, i: x.gather(0, i), (BASE.clone(), idx), (BASE.to(dev), idx.to(dev)),
                   ["gather"])


def test_indexing_with_a_float_tensor_raises_index_error_like_cpu(path, dev):
    idx = torch.tensor([0.5])
    check_like_cpu(lambda x, i: x[i], (BASE.clone(), idx), (BASE.to(dev), idx.to(dev)),
                   ["index"])


def test_matmul_of_two_dtypes_raises_like_cpu(path, dev):
    check_like_cpu(lambda a, b: torch.mm(a, b), (BASE.clone(), BASE.t().double()),
                   (BASE.to(dev), BASE.t().double().to(dev)), ["mm"])


@pytest.mark.parametrize("fn,op", [
    (lambda x, i: x[i.bool()[:2, :2]], "index"),
    (lambda x, i: aten.index.Tensor(x, [i.long()[0, :1]] * 3), "index"),
    (lambda x, i: x.index_put_((i[0, :1],), torch.tensor(1.).to(x.device)), "index_put"),
    (lambda x, i: x.index_select(0, i[0, :1]), "index_select"),
    (lambda x, i: x.index_add_(0, i[0, :1], torch.ones(1, 4).to(x.device)), "index_add"),
    (lambda x, i: x.index_fill_(0, i[0, :1], 2.0), "index_fill"),
    (lambda x, i: x.index_copy(0, i[0, :1].int(), torch.ones(1, 4).to(x.device)), "index_copy"),
], ids=["mask of another shape", "too many indices", "index_put_ float index",
        "index_select float index", "index_add_ float index", "index_fill_ float index",
        "index_copy int32 index"])
def test_index_of_a_wrong_kind_raises_like_cpu(path, dev, fn, op):
    # The meta kernels check none of these, or raise RuntimeError where eager raises IndexError.
    idx = torch.zeros(3, 4)
    check_like_cpu(fn, (BASE.clone(), idx), (BASE.to(dev), idx.to(dev)), [op])


@pytest.mark.parametrize("fn", [
    lambda a, b: torch.addmm(a[:, :3], a, b),
    lambda a, b: torch.addmm(b.t()[:, :3].double(), a, b.float()),
    lambda a, b: torch.mv(a, b[:, 0]),
    lambda a, b: torch.nn.functional.linear(a, b.t()),
    lambda a, b: a[:, :3].clone().addmm_(a, b),
], ids=["addmm mat2", "addmm self", "mv", "linear", "addmm_"])
def test_matrix_products_of_two_dtypes_raise_like_cpu(path, dev, fn):
    a, b = BASE.clone(), BASE.t().double()
    check_like_cpu(fn, (a, b), (a.to(dev), b.to(dev)), ["addmm", "addmv", "aten.mm", "aten.mv"])



_INTS, _FLOATS, _BOOLS = torch.arange(6).reshape(2, 3), torch.rand(2, 3), torch.rand(2, 3) > 0.5
_COMPLEX = torch.randn(2, 3, dtype=torch.complex64)


@pytest.mark.parametrize("fn,args", [
    (lambda a, b: torch.hypot(a, b), (_INTS, _INTS)),
    (lambda a, b: a & b, (_FLOATS, _FLOATS)),
    (lambda a, b: a << b, (_FLOATS, _INTS)),
    (lambda a, b: a @ b.t(), (_BOOLS, _BOOLS)),
    (lambda a, b: torch.addcmul(a, a, b), (_BOOLS, _BOOLS)),
    (lambda a, b: torch.pow(a, b), (_BOOLS, _BOOLS)),
    (lambda a, b: torch.lerp(a, a, 0.5), (_INTS, _INTS)),
    (lambda a, b: a.clone().bitwise_xor_(b), (_FLOATS, _FLOATS)),
    (lambda a, b: torch.maximum(a, b), (_COMPLEX, _FLOATS)),
    (lambda a, b: torch.clamp(a, min=b), (_COMPLEX, _FLOATS)),
    (lambda a, b: torch.atan2(a, b), (_FLOATS, _COMPLEX)),
    (lambda a, b: a < b, (_COMPLEX, _COMPLEX)),
    (lambda a, b: torch.xlogy(a, b), (_COMPLEX, _FLOATS)),
], ids=["hypot int", "and float", "lshift float", "mm bool", "addcmul bool", "pow bool",
        "lerp int", "xor_ float", "maximum complex", "clamp complex", "atan2 complex",
        "lt complex", "xlogy complex"])
def test_dtypes_cpu_has_no_kernel_for_raise_at_the_op_like_cpu(path, dev, fn, args):
    """Meta kernels take every dtype and XLA computes most: the device would compute where CPU
    eager raises NotImplementedError (maximum of complex: a RuntimeError). It raises eager's
    error at the op (before any sync)."""
    expected = cpu_error(fn, *args)
    assert type(expected) in (NotImplementedError, RuntimeError)
    dev_args = [a.to(dev) for a in args]
    with pytest.raises(type(expected)) as err:
        fn(*dev_args)
    assert str(err.value).splitlines()[0] == str(expected).splitlines()[0]
    assert "xla_compat: raised by aten." in str(err.value)
    xc.sync()
    for a, b in zip(dev_args, args):
        assert torch.equal(a.cpu(), b)


@pytest.mark.parametrize("fn,args", [
    (lambda a, b: a - b, (_FLOATS, _BOOLS)),
    (lambda a, b: b - a, (_FLOATS, _BOOLS)),
    (lambda a, b: torch.rsub(b, a), (_FLOATS, _BOOLS)),
    (lambda a, b: b - 1, (_FLOATS, _BOOLS)),
    (lambda a, b: a.clone().sub_(b, alpha=2), (_FLOATS, _BOOLS)),
    (lambda a, b: a.masked_fill(b.float(), 1.0), (_FLOATS, _BOOLS)),
    (lambda a, b: torch.lerp(a, b.double(), 0.3), (_FLOATS, _BOOLS)),
    (lambda a, b: torch.lerp(a, a, b.half()), (_FLOATS, _BOOLS)),
    (lambda a, b: torch.dot(a[0], b[0].double()), (_FLOATS, _BOOLS)),
    (lambda a, b: b - b.flip(0), (_FLOATS, _BOOLS)),
    (lambda a, b: torch.sub(b, b[:1], alpha=1), (_FLOATS, _BOOLS)),
    (lambda a, b: b - True, (_FLOATS, _BOOLS)),
], ids=["float - bool", "bool - float", "rsub bool", "bool - 1", "sub_ bool",
        "masked_fill float mask", "lerp end double", "lerp weight half", "dot two dtypes",
        "bool - bool", "bool - bool broadcast", "bool - True"])
def test_refused_operands_raise_eagers_words(path, dev, fn, args):
    """Calls the meta kernels compute (or refuse in their own words) raise what CPU eager
    raises, in its words. ``bool - bool`` computed int8 differences on the functional path (its
    inner tensors take upstream's bool write-back that way; the wrappers now refuse a user's)."""
    expected = cpu_error(fn, *args)
    with pytest.raises(type(expected)) as err:
        fn(*[a.to(dev) for a in args])
    assert str(err.value).splitlines()[0] == str(expected).splitlines()[0]


_COMPLEX = torch.tensor([1 + 2j, -0.5j, 3.0])
_BOOL_ROWS = torch.tensor([[True, False, True], [False, False, True], [True, True, False]])
_FLOAT_ROWS = torch.tensor([[1.0, -2.0, 0.0], [3.0, 0.5, -1.0]])


@pytest.mark.parametrize("fn,arg", [
    (torch.sign, _COMPLEX), (torch.floor, _COMPLEX), (torch.ceil, _COMPLEX),
    (torch.trunc, _COMPLEX), (torch.relu, torch.tensor([True, False])),
    (lambda x: x.clone().relu_(), torch.tensor([True, False])),
    (lambda x: x.clone().abs_(), torch.tensor([True, False])),
    (lambda x: x.clone().sign_(), _COMPLEX),
    (lambda x: x.clone().floor_(), _COMPLEX),
    (lambda x: x.clone().abs_(), _COMPLEX),
    (lambda x: x.clone().frac_(), torch.tensor([True, False])),
    (lambda x: torch.copysign(x, 1j), torch.tensor([1.0, -2.0])),
    (lambda x: torch.copysign(x, x.real), _COMPLEX),
    (lambda x: x // x, torch.tensor([True, False])),
    (lambda x: torch.floor_divide(x, True), torch.tensor([True, False])),
    (lambda x: x.clone().floor_divide_(x), torch.tensor([True, False])),
    (lambda x: x.argmax(), _BOOL_ROWS),
    (lambda x: x.argmin(1), _BOOL_ROWS),
    (lambda x: x.int().var(1), _BOOL_ROWS),
    (lambda x: x.long().std(), _BOOL_ROWS),
    (lambda x: x.median(), _BOOL_ROWS),
    (lambda x: x.kthvalue(2, 1), _BOOL_ROWS),
    (lambda x: x.topk(2, 1), _BOOL_ROWS),
    (lambda x: x.trace(), _BOOL_ROWS),
    (lambda x: x.int().logcumsumexp(1), _BOOL_ROWS),
    (lambda x: x.amax(), _COMPLEX),
    (lambda x: x.max(0), _COMPLEX),
    (lambda x: x.sort(), _COMPLEX),
    (lambda x: x.topk(2), _COMPLEX),
    (lambda x: x.nansum(), _COMPLEX),
    (lambda x: x.cummax(0), _COMPLEX),
    (lambda x: x.mode(), _COMPLEX),
    (lambda x: x.scatter_reduce(0, torch.zeros(3, dtype=torch.long, device=x.device), x, "amax"),
     _COMPLEX),
    (lambda x: x.scatter_reduce(1, x.long(), x, "mean"), _BOOL_ROWS),
    (lambda x: torch.searchsorted(x[0], x[1]), _BOOL_ROWS),
    (lambda x: x.int().histc(4), _BOOL_ROWS),
    # (zeros of uint8 would stop at the widened bounds' overflow before the dtype refusal)
    (lambda x: x.byte().histc(4), _BOOL_ROWS),
    (lambda x: x[0].bincount(), _BOOL_ROWS),
    # operands of two dtypes where the kernel takes one
    (lambda x: torch.heaviside(x, x.long()), _FLOAT_ROWS),
    (lambda x: torch.linalg.cross(x, x.half()), _FLOAT_ROWS),
    (lambda x: torch.linalg.cross(x.int(), x), _FLOAT_ROWS),
    (lambda x: torch.complex(x.half(), x), _FLOAT_ROWS),
    (lambda x: torch.polar(x.abs().half(), x), _FLOAT_ROWS),
    (lambda x: torch.dist(x.bool(), x), _FLOAT_ROWS),
], ids=["sign complex", "floor complex", "ceil complex", "trunc complex", "relu bool",
        "relu_ bool", "abs_ bool", "sign_ complex", "floor_ complex", "abs_ complex",
        "frac_ bool", "copysign complex number", "copysign complex", "bool // bool",
        "floor_divide bool number", "floor_divide_ bool", "argmax bool", "argmin bool",
        "var int", "std int", "median bool", "kthvalue bool", "topk bool", "trace bool",
        "logcumsumexp int", "amax complex", "max dim complex", "sort complex", "topk complex",
        "nansum complex", "cummax complex", "mode complex", "scatter amax complex",
        "scatter mean bool", "searchsorted bool", "histc int", "histc uint8", "bincount bool",
        "heaviside float long", "cross float half", "cross int float",
        "complex half float", "polar half float", "dist bool float"])
def test_dtypes_eagers_kernel_refuses_are_refused_in_its_words(path, dev, fn, arg):
    """Eager's CPU kernels refuse these dtypes in their own words (sign of a complex: use sgn;
    rounding a complex; relu of a bool; in-place abs of a bool, whose in-place overload lacks the
    pointwise tag its functional form has; copysign of a complex, whose name holds "copy";
    floor division of bools, untagged; reductions, scans and sorts of bools, integers or complex
    values; heaviside, cross, complex, polar and dist of two dtypes); the device computed them (sign, relu, abs_, argmax, var, topk...), failed in jax's
    words (floor and copysign of a complex, max and argmax of a complex while compiling) or in a
    decomposition's (frac_ and floor_divide_ of a bool on the functional path: the in-place
    meta references)."""
    expected = cpu_error(fn, arg)
    with pytest.raises(type(expected)) as err:
        fn(arg.to(dev))
    assert str(err.value).splitlines()[0] == str(expected).splitlines()[0]


_IMAGE = torch.arange(2 * 3 * 4 * 4).reshape(2, 3, 4, 4) % 7


def _target(x):
    return torch.ones_like(x)


@pytest.mark.parametrize("fn,arg", [
    (lambda x: F.softmax(x, -1), _IMAGE.bool()),
    (lambda x: F.log_softmax(x, 1), _IMAGE),
    (lambda x: F.layer_norm(x, (4,)), _IMAGE.int()),
    (lambda x: F.layer_norm(x, (4,)), _IMAGE.cfloat()),
    (lambda x: F.group_norm(x, 3), _IMAGE.byte()),
    (lambda x: F.batch_norm(x, None, None, training=True), _IMAGE),
    (lambda x: F.instance_norm(x), _IMAGE.to(torch.int8)),
    (lambda x: F.avg_pool2d(x, 2), _IMAGE.bool()),
    (lambda x: F.avg_pool2d(x, 2), _IMAGE.int()),
    (lambda x: F.max_pool2d(x, 2), _IMAGE.cfloat()),
    (lambda x: F.max_pool2d(x, 2, return_indices=True), _IMAGE.bool()),
    (lambda x: F.adaptive_avg_pool2d(x, 3), _IMAGE),
    (lambda x: F.adaptive_max_pool2d(x, 3), _IMAGE.cfloat()),
    (lambda x: F.local_response_norm(x, 2), _IMAGE.half()),
    (lambda x: F.mse_loss(x, _target(x)), _IMAGE),
    (lambda x: F.smooth_l1_loss(x, _target(x)), _IMAGE.bool()),
    (lambda x: F.huber_loss(x, _target(x)), _IMAGE.int()),
    (lambda x: F.binary_cross_entropy(x, _target(x)), _IMAGE.byte()),
    (lambda x: F.binary_cross_entropy_with_logits(x, _target(x)), _IMAGE),
    (lambda x: F.soft_margin_loss(x, _target(x)), _IMAGE),
    (F.logsigmoid, _IMAGE.bool()),
    (F.hardswish, _IMAGE),
    (lambda x: F.prelu(x, torch.ones(1, dtype=x.dtype, device=x.device)), _IMAGE.int()),
    (lambda x: F.glu(x, -1), _IMAGE.byte()),
    (lambda x: F.interpolate(x, scale_factor=2), _IMAGE.int()),
    (lambda x: F.interpolate(x, scale_factor=2, mode="bilinear"), _IMAGE.to(torch.int8)),
    (lambda x: F.interpolate(x, scale_factor=2, mode="bicubic"), _IMAGE.cfloat()),
    (lambda x: F.unfold(x, 2), _IMAGE),
    (lambda x: F.grid_sample(x, torch.zeros(2, 3, 3, 2, device=x.device), align_corners=False),
     _IMAGE),
    (lambda x: F.pdist(x[0, 0]), _IMAGE.half()),
    (lambda x: torch.cdist(x[0], x[1]), _IMAGE.bfloat16()),
    (lambda x: F.rrelu(x, training=False), _IMAGE),
    (lambda x: F.rrelu(x, training=True), _IMAGE.half()),
    (torch.poisson, _IMAGE),
    (torch._standard_gamma, _IMAGE.half()),
    (lambda x: torch.multinomial(x[0, 0], 1), _IMAGE),
    (lambda x: torch.normal(x, 1.0), _IMAGE),
    (torch.rand_like, _IMAGE.bool()),
    (torch.randn_like, _IMAGE),
    (lambda x: torch.randint_like(x, 5), _IMAGE.bool()),
    (lambda x: torch.binomial(x, x), _IMAGE),
    (lambda x: x.clone().random_(0, 2), _IMAGE.cfloat()),
], ids=["softmax bool", "log_softmax int64", "layer_norm int32", "layer_norm complex",
        "group_norm uint8", "batch_norm int64", "instance_norm int8", "avg_pool2d bool",
        "avg_pool2d int32", "max_pool2d complex", "max_pool2d indices bool",
        "adaptive_avg_pool2d int64", "adaptive_max_pool2d complex", "local_response_norm half",
        "mse_loss int64", "smooth_l1_loss bool", "huber_loss int32", "bce uint8",
        "bce_with_logits int64", "soft_margin_loss int64", "logsigmoid bool",
        "hardswish int64", "prelu int32", "glu uint8", "nearest int32", "bilinear int8",
        "bicubic complex", "unfold int64", "grid_sample int64", "pdist half", "cdist bfloat16",
        "rrelu eval int64", "rrelu train half", "poisson int64", "standard_gamma half",
        "multinomial int64", "normal int64", "rand_like bool", "randn_like int64",
        "randint_like bool above 1", "binomial int64", "random_ complex"])
def test_nn_and_random_dtypes_eagers_kernel_refuses_are_refused_in_its_words(path, dev, fn, arg):
    """CPU eager's nn and random kernels refuse these dtypes: the device computed most of them
    (softmax of bools, pooling of integers, losses of integers, rand_like of integers...) or
    failed in a decomposition's or jax's words (layer_norm's mean of integers, max pooling of
    complex values while compiling). The nn kernels are asked with zeros of the real shape (they
    check windows and normalised shapes first), the random ones with a generator of their own."""
    expected = cpu_error(fn, arg)
    with pytest.raises(type(expected)) as err:
        fn(arg.to(dev))
        xc.sync()
    assert str(err.value).splitlines()[0] == str(expected).splitlines()[0]


_SQUARE = torch.tensor([[4.0, 1.0, 0.5], [1.0, 3.0, 0.2], [0.5, 0.2, 2.0]])


@pytest.mark.parametrize("fn,arg", [
    (torch.linalg.inv, _SQUARE.long()),
    (torch.linalg.det, _SQUARE.half()),
    (lambda x: torch.linalg.solve(x, x), _SQUARE.bfloat16()),
    (torch.linalg.cholesky, _SQUARE.half()),
    (torch.linalg.qr, _SQUARE.int()),
    (torch.linalg.svdvals, _SQUARE.half()),
    (torch.linalg.eigh, _SQUARE.long()),
    (torch.linalg.eigvals, _SQUARE.int()),
    (torch.linalg.lu, _SQUARE.bool()),
    (torch.linalg.lu_factor, _SQUARE.half()),
    (lambda x: torch.linalg.solve_triangular(x, x, upper=True), _SQUARE.half()),
    (lambda x: torch.linalg.householder_product(x, x[0, :2]), _SQUARE.byte()),
    (lambda x: torch.linalg.lstsq(x, x), _SQUARE.long()),
    (lambda x: torch.linalg.lstsq(x, x), _SQUARE.half()),
    (lambda x: torch.linalg.cross(x, x), _SQUARE.bool()),
    (lambda x: torch.stft(x.reshape(-1), 4, return_complex=True), _SQUARE.half()),
    (lambda x: torch.polar(x, x), _SQUARE.long()),
    (lambda x: torch.complex(x, x), _SQUARE.int()),
    (lambda x: torch.isin(x, x[0]), _SQUARE.bool()),
    (lambda x: torch.heaviside(x, x), _SQUARE.cfloat()),
    (lambda x: torch.addcdiv(x, x, x), _SQUARE.bool()),
    (lambda x: torch.mvlgamma(x, 1), _SQUARE.bool()),
    (lambda x: torch.histogram(x.reshape(-1), 4), _SQUARE.long()),
    (lambda x: torch.nn.functional.conv2d(x[None, None], x[None, None, :2, :2]), _SQUARE.bool()),
], ids=["inv int64", "det half", "solve bfloat16", "cholesky half", "qr int32", "svdvals half",
        "eigh int64", "eigvals int32", "lu bool", "lu_factor half", "solve_triangular half",
        "householder_product uint8", "lstsq int64", "lstsq half", "cross bool", "stft half",
        "polar int64", "complex int32", "isin bool", "heaviside complex", "addcdiv bool",
        "mvlgamma bool", "histogram int64", "conv2d bool"])
def test_linalg_fft_and_other_dtypes_eagers_kernel_refuses_are_refused_in_its_words(path, dev,
                                                                                     fn, arg):
    """CPU eager's LAPACK, FFT and a few composite kernels refuse these dtypes; the device
    failed in jax's words while lowering or compiling (lu of integers, svd in float16), computed
    (solve_triangular in float16, addcdiv of bools, mvlgamma of bools, histogram of integers,
    conv2d of bools) or raised another error type (polar of integers: an AssertionError)."""
    expected = cpu_error(fn, arg)
    with pytest.raises(type(expected)) as err:
        fn(arg.to(dev))
        xc.sync()
    assert str(err.value).splitlines()[0] == str(expected).splitlines()[0]


_GRID = torch.arange(12).reshape(3, 4)
_SOURCE = torch.ones(1, 4, dtype=torch.float64)


@pytest.mark.parametrize("fn,arg", [
    (lambda x: x.fill_(300), _GRID.byte()),
    (lambda x: x.fill_(1e40), _GRID.int()),
    (lambda x: x.fill_(1j), _GRID),
    (lambda x: x.fill_(1e40), _GRID.half()),
    (lambda x: x.fill_(-1e39), _GRID.bfloat16()),
    (lambda x: x.__setitem__(0, 1j), _GRID.int()),
    (lambda x: x.index_fill(0, torch.tensor([0], device=x.device), 1j), _GRID),
    (lambda x: x.index_copy(0, torch.tensor([0], device=x.device), _SOURCE.to(x.device)), _GRID),
    (lambda x: x.index_add(0, torch.tensor([0], device=x.device), _SOURCE.to(x.device)),
     _GRID.bool()),
    (lambda x: x.put_(torch.tensor([0], device=x.device), torch.tensor([2.5], device=x.device)),
     _GRID),
    (lambda x: torch.full((2,), 300, dtype=torch.int8, device=x.device), _GRID),
    (lambda x: torch.arange(4, dtype=torch.bool, device=x.device), _GRID),
    (lambda x: torch.arange(4, dtype=torch.complex64, device=x.device), _GRID),
    (lambda x: torch.hann_window(4, dtype=torch.complex64, device=x.device), _GRID),
    (lambda x: torch.kaiser_window(4, dtype=torch.complex64, device=x.device), _GRID),
    (lambda x: torch.linspace(0, 1, 3, dtype=torch.bool, device=x.device), _GRID),
    (lambda x: torch.logspace(0, 1, 3, dtype=torch.bool, device=x.device), _GRID),
    (lambda x: torch.randperm(3, dtype=torch.bool, device=x.device), _GRID),
    (lambda x: torch.tril_indices(3, 3, dtype=torch.float32, device=x.device), _GRID),
], ids=["fill_ 300 uint8", "fill_ 1e40 int32", "fill_ 1j int64", "fill_ 1e40 half",
        "fill_ -1e39 bfloat16", "setitem 1j int32", "index_fill 1j", "index_copy float64 source",
        "index_add float64 source into bool", "put_ float source", "full 300 int8",
        "arange bool", "arange complex", "hann_window complex", "kaiser_window complex",
        "linspace bool", "logspace bool", "randperm bool", "tril_indices float32"])
def test_values_sources_and_factory_dtypes_eager_refuses_are_refused_in_its_words(path, dev, fn,
                                                                                arg):
    """A fill value the dtype cannot hold, a source of another dtype for an index write, and the
    dtypes eager's factory kernels refuse: the device converted, wrapped or computed each."""
    expected = cpu_error(fn, arg.clone())
    with pytest.raises(type(expected)) as err:
        fn(arg.to(dev))
        xc.sync()
    assert str(err.value).splitlines()[0] == str(expected).splitlines()[0]


def test_fill_of_one_half_element_overflows_to_inf_as_eager_does(path, dev):
    """Eager fills a one-element tensor through its own path, which converts without a check:
    1e40 into one float16 element is inf there (and refused for two elements)."""
    want = torch.zeros(1, dtype=torch.float16).fill_(1e40)
    assert_same(torch.zeros(1, dtype=torch.float16, device=dev).fill_(1e40), want)


_IMAGES = torch.arange(2 * 3 * 6 * 6, dtype=torch.float32).reshape(2, 3, 6, 6) / 100


@pytest.mark.parametrize("fn", [
    lambda x: F.conv_transpose2d(x, torch.ones(2, 3, 2, 2, device=x.device)),
    lambda x: F.conv2d(x, torch.ones(4, 2, 2, 2, device=x.device)),
    lambda x: F.conv2d(x, torch.ones(4, 1, 2, 2, device=x.device), groups=2),
    lambda x: F.conv2d(x, torch.ones(4, 3, 2, 2, device=x.device), torch.ones(3, device=x.device)),
    lambda x: F.conv_transpose2d(x, torch.ones(3, 2, 2, 2, device=x.device),
                                 torch.ones(3, device=x.device)),
    lambda x: F.conv2d(x, torch.ones(4, 3, 2, device=x.device)),
    lambda x: F.conv2d(x, torch.ones(4, 3, 2, 2, device=x.device, dtype=torch.float64)),
    lambda x: F.conv2d(x, torch.ones(4, 3, 2, 2, device=x.device),
                       torch.ones(4, device=x.device, dtype=torch.float64)),
    lambda x: F.conv2d(x, torch.ones(4, 3, 7, 7, device=x.device)),
], ids=["transposed input channels", "input channels", "channels and groups", "bias size",
        "transposed bias size", "weight rank", "weight dtype", "bias dtype", "kernel too big"])
def test_convolution_operands_eager_refuses_raise_its_words(path, dev, fn):
    """Eager checks a convolution's channels (transposed too), bias, weight rank and dtypes
    before computing; the meta kernel says "Invalid channel dimensions", raises an IndexError for
    a weight of another rank and skips the bias, the transposed channels and the dtypes (which
    failed while lowering). The message quotes the real input's sizes."""
    expected = cpu_error(fn, _IMAGES)
    x = _IMAGES.to(dev)
    with pytest.raises(type(expected)) as err:
        fn(x)
        xc.sync()
    assert str(err.value).splitlines()[0] == str(expected).splitlines()[0]
    assert torch.equal(x.cpu(), _IMAGES)


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int64, torch.bool, torch.float32], ids=str)
def test_logit_of_integers_computes_in_the_float_result(path, dev, dtype):
    """``1 - x`` wrapped around for uint8 (logit(2) read logit(2/255)): the input is cast to the
    float result dtype first, as eager computes."""
    x = torch.tensor([0, 1, 2, 7, 100]).to(dtype)
    for eps in (None, 0.25):
        assert_same(torch.logit(x.to(dev), eps), torch.logit(x, eps))


@pytest.mark.parametrize("fn", [lambda i, b: i << b, lambda i, b: b << i,
                                lambda i, b: i.int() >> b, lambda i, b: b >> 1,
                                lambda i, b: 3 << b], ids=["int<<bool", "bool<<int",
                                                           "int32>>bool", "bool>>1", "3<<bool"])
def test_shifts_take_a_bool_operand_as_eager_does(path, dev, fn):
    """Eager shifts a bool operand as the promoted integer type; the meta kernels refused it."""
    want = fn(_INTS, _BOOLS)
    got = fn(_INTS.to(dev), _BOOLS.to(dev))
    assert got.dtype == want.dtype
    assert torch.equal(got.cpu(), want)


def test_asking_the_cpu_kernel_about_dtypes_leaves_the_cpu_generator_alone(path, dev):
    """The dtype check runs ops on CPU stand-ins, random draws among them: they draw from a
    fresh generator of their own (a generator argument is replaced; a ``*_like`` factory takes
    its generator overload), never from the user's or the default CPU one."""
    torch.manual_seed(3)
    want = torch.rand(4)
    mine = torch.Generator().manual_seed(5)
    want_mine = torch.rand(4, generator=mine)
    torch.manual_seed(3)
    mine.manual_seed(5)
    x = torch.ones(5, 7).to(dev)     # shapes no other test traces: each op misses the meta cache
    torch.nn.functional.dropout(x, 0.3, training=True)
    torch.bernoulli(x * 0.5)
    torch.randn_like(x)
    torch.multinomial(x, 2)
    torch.nn.functional.rrelu(x, training=True)
    torch.poisson(x)
    x.clone().uniform_(generator=mine)
    torch.bernoulli(x * 0.25, generator=mine)
    (x * 3 + 1).sin().sum()
    xc.sync()
    assert torch.equal(torch.rand(4), want)
    assert torch.equal(torch.rand(4, generator=mine), want_mine)



def test_tracing_leaves_no_reference_cycles(path, dev):
    """Tracing keeps nothing of a call alive once the call is done with it: a reference cycle
    holding a dead intermediate made it a pending tensor of the next sync (an extra output,
    another graph and a compile per call that saw it); found through a nested recursive helper
    of the CPU-kernel check. (Traced without a sync: compiling makes jax's own cycles.)"""
    x = torch.rand(3, 5).to(dev)
    ys = [torch.rand(n, 5).to(dev) for n in (2, 3, 4, 5)]
    xc.sync()

    def ops(y):
        return ((y * 0.5 + 1).sin() @ x.t()).hypot(y[:, :3]) - y[:, :3].abs()
    ops(ys.pop())                 # (first uses: caches that live as long as the process)

    def trace():
        while ys:                 # new shapes: every op misses the meta cache and is checked
            ops(ys.pop())
    found, kinds = cyclic_garbage(trace)
    xc.sync()
    assert found == 0, f"{found} objects in reference cycles: {kinds}"


def test_in_place_write_of_a_float_result_into_a_bool_tensor_raises_like_cpu(path, dev):
    flags = torch.tensor([True, False])
    check_like_cpu(lambda f: f.add_(0.5), (flags.clone(),), (flags.to(dev),), ["add"])


# -- out-of-range indices --------------------------------------------------------------------

INDEXERS = {
    "getitem": (lambda x, i: x[i], torch.tensor([0, 3])),
    "getitem 2-d": (lambda x, i: x[:, i], torch.tensor([[4]])),
    "index_put_": (lambda x, i: x.index_put_((i,), torch.tensor(9.).to(x.device)),
                   torch.tensor([-4])),
    "setitem": (lambda x, i: x.__setitem__(i, 1.0), torch.tensor([1, 5])),
    "gather": (lambda x, i: x.gather(1, i), torch.tensor([[0], [4], [1]])),
    "scatter_": (lambda x, i: x.scatter_(0, i, 2.0), torch.tensor([[3, 0, 0, 0]])),
    "scatter_add_": (lambda x, i: x.scatter_add_(1, i, torch.ones(1, 1).to(x.device)),
                     torch.tensor([[-5]])),
    "index_select": (lambda x, i: x.index_select(1, i), torch.tensor([1, 4])),
    "index_add_": (lambda x, i: x.index_add_(0, i, torch.ones(1, 4).to(x.device)),
                   torch.tensor([3])),
}


@pytest.mark.parametrize("where", ["cpu index", "materialised device index"])
@pytest.mark.parametrize("name", list(INDEXERS))
def test_out_of_range_index_raises_like_cpu_and_leaves_the_tensor_intact(path, dev, name, where):
    fn, idx = INDEXERS[name]
    if where == "materialised device index":
        idx = idx.to(dev)
        xc.sync()           # its values are known on the host: checked like CPU checks them
    expected = cpu_error(fn, BASE.clone(), idx.cpu())
    x = BASE.to(dev)
    with pytest.raises(type(expected)) as err:
        fn(x, idx)
        xc.sync()
    assert type(err.value) is type(expected)
    assert str(err.value).splitlines()[0] == str(expected).splitlines()[0]   # eager's own words
    xc.sync()
    assert torch.equal(x.cpu(), BASE)
    ok, cpu = idx.cpu().clamp(0, 2), BASE.clone()       # the same op with valid indices works
    out, expected_out = fn(x, ok.to(dev)), fn(cpu, ok)
    assert torch.equal(x.cpu(), cpu)
    if expected_out is not None:
        assert torch.equal(out.cpu(), expected_out)


# Class indices on the device (session 29's sweep: an out-of-range embedding index read NaN rows,
# an out-of-range target made cross_entropy NaN and nll_loss a garbage number, silently).
TARGETS = {
    "embedding": (lambda x, i: torch.nn.functional.embedding(i, x), torch.tensor([[1, 3]])),
    "cross_entropy": (lambda x, i: torch.nn.functional.cross_entropy(x, i),
                      torch.tensor([0, 4, 1])),
    "nll_loss ignore_index": (lambda x, i: torch.nn.functional.nll_loss(x, i),
                              torch.tensor([-100, -2, 3])),
    "cross_entropy 2-d": (lambda x, i: torch.nn.functional.cross_entropy(x.reshape(1, 3, 2, 2), i),
                          torch.tensor([[[0, 2], [3, -100]]])),
}


@pytest.mark.parametrize("name", list(TARGETS))
def test_an_out_of_range_class_index_on_the_device_raises_like_cpu(path, dev, name):
    fn, idx = TARGETS[name]
    expected = cpu_error(fn, BASE.clone(), idx)
    x, i = BASE.to(dev), idx.to(dev)
    xc.sync()                     # the indices' values are known on the host: checked there
    with pytest.raises(type(expected)) as err:
        fn(x, i)
    assert str(err.value).splitlines()[0] == str(expected).splitlines()[0]   # eager's own words
    valid = torch.where(idx == -100, idx, idx.clamp(0, 1))   # ignore_index itself is allowed
    assert torch.allclose(fn(x, valid.to(dev)).cpu(), fn(BASE.clone(), valid))


@pytest.mark.parametrize("in_place", [False, True], ids=["masked_scatter", "masked_scatter_"])
def test_masked_scatter_with_a_short_source_raises_like_cpu_and_leaves_the_tensor(path, dev,
                                                                                  in_place):
    # Session 29's sweep: the device repeated the source's last element instead of raising.
    mask = torch.tensor([True, False, True, True])          # broadcast over BASE's 3 rows: 9
    fn = (lambda x, m, s: x.masked_scatter_(m, s)) if in_place else torch.Tensor.masked_scatter
    expected = cpu_error(fn, BASE.clone(), mask, torch.ones(8))
    x, m = BASE.to(dev), mask.to(dev)
    xc.sync()                     # the mask's values are known on the host: checked there
    with pytest.raises(type(expected)) as err:
        fn(x, m, torch.ones(8).to(dev))
    assert str(err.value).splitlines()[0] == str(expected).splitlines()[0]
    assert torch.equal(x.cpu(), BASE)
    source = torch.arange(9.0)
    assert torch.equal(fn(x, m, source.to(dev)).cpu(), fn(BASE.clone(), mask, source))


INT_DIVISIONS = {
    "floor_divide": lambda x, d: x // d,
    "floor_divide_": lambda x, d: x.floor_divide_(d),
    "remainder": lambda x, d: x % d,
    "remainder_": lambda x, d: x.remainder_(d),
    "fmod": lambda x, d: torch.fmod(x, d),
    "fmod_": lambda x, d: x.fmod_(d),
    "div": lambda x, d: torch.div(x, d, rounding_mode="floor"),
    "div_": lambda x, d: x.div_(d, rounding_mode="trunc"),
}


@pytest.mark.parametrize("dtype", [torch.int64, torch.uint8], ids=["int64", "uint8"])
@pytest.mark.parametrize("name", list(INT_DIVISIONS))
def test_integer_division_by_a_zero_number_raises_like_cpu(path, dev, name, dtype):
    # Session 30's sweep: XLA gave -1 (quotients) or the dividend (remainders) without a word.
    fn = INT_DIVISIONS[name]
    x = torch.tensor([7, 3, 0], dtype=dtype)
    err = check_like_cpu(fn, (x.clone(), 0), (x.to(dev), 0), [f"aten.{name}."])
    assert str(err).splitlines()[0] == "ZeroDivisionError"
    # the same op with another divisor, and a float divisor of zero, still compute as eager does
    for d in (2, 0.0) if not name.endswith("_") else (2,):
        assert_same(fn(x.to(dev), d), fn(x.clone(), d))
    assert_same(fn(x[:0].to(dev), 0), fn(x[:0].clone(), 0))   # nothing to divide


@pytest.mark.parametrize("name", ["gather", "index_select"])
def test_out_of_range_index_error_names_the_op(path, dev, name):
    fn, idx = INDEXERS[name]
    with pytest.raises(Exception, match=name):
        fn(BASE.to(dev), idx)


# -- mixing devices and paths ----------------------------------------------------------------

@pytest.mark.parametrize("fn", [lambda x, c: x + c, lambda x, c: x.add_(c),
                                lambda x, c: torch.mm(x, c.t())], ids=["add", "add_", "mm"])
def test_mixing_a_cpu_tensor_into_a_device_op_raises_a_device_error(path, dev, fn):
    x, c = BASE.to(dev), torch.ones(3, 4)
    with pytest.raises(RuntimeError, match="same device.*hlo:0 and cpu"):
        fn(x, c)
    assert torch.equal(x.cpu(), BASE) and torch.equal(c, torch.ones(3, 4))


def test_a_zero_dim_cpu_tensor_mixes_with_a_device_tensor_like_a_scalar(path, dev):
    # Eager allows this for every device (it is how `loss * torch.tensor(0.5)` works on CUDA).
    x = BASE.to(dev)
    assert torch.equal((x * torch.tensor(0.5)).cpu(), BASE * 0.5)


@pytest.mark.parametrize("fn", [lambda a, b: a + b, lambda a, b: a.add_(b),
                                lambda a, b: a.copy_(b), lambda a, b: torch.stack([a, b])],
                         ids=["add", "add_", "copy_", "stack"])
def test_mixing_tensors_of_two_paths_raises_path_mix_error_naming_the_op(dev, fn):
    with xc.use_path("legacy"):
        a = BASE.to(dev)
    with xc.use_path("functional"):
        b = (BASE * 2).to(dev)
    for x, y in ((a, b), (b, a)):
        with pytest.raises(PathMixError, match=r"the (legacy|functional) and the (functional|legacy) path.*to_path") as err:
            fn(x, y)
        assert any(w in str(err.value) for w in ("add", "copy_", "stack")), str(err.value)
    assert torch.equal(a.cpu(), BASE) and torch.equal(b.cpu(), BASE * 2)
    assert torch.equal((a + xc.to_path(b, "legacy")).cpu(), BASE * 3)   # the documented fix


# -- an op without a lowering, fallback disabled ---------------------------------------------

def test_unsupported_in_place_op_with_fallback_disabled_raises_and_leaves_the_tensor(path, dev):
    before = registry._RULES.pop(aten.atan2.default)
    try:
        x, y = BASE.to(dev), (BASE + 1).to(dev)
        with settings.override(cpu_fallback="error"):
            with pytest.raises(xc.UnsupportedOpError, match=r"aten\.atan2.*XLA_CPU_FALLBACK") as e:
                x.atan2_(y)
                xc.sync()
        assert isinstance(e.value, NotImplementedError)
        xc.sync()
        assert torch.equal(x.cpu(), BASE) and torch.equal(y.cpu(), BASE + 1)
    finally:
        registry._RULES[aten.atan2.default] = before
    assert torch.allclose(x.atan2_(y).cpu(), torch.atan2(BASE, BASE + 1))   # works again


@pytest.mark.parametrize("name, fn", [
    ("transpose_", lambda t: t.transpose_(0, 5)),
    ("t_ of 3 dims", lambda t: t.t_()),
    ("swapdims_", lambda t: t.swapdims_(0, 4)),
    ("swapaxes_", lambda t: t.swapaxes_(-4, 0)),
    ("squeeze_ dim", lambda t: t.squeeze_(7)),
    ("squeeze_ dims", lambda t: t.squeeze_((0, 9))),
    ("unsqueeze_", lambda t: t.unsqueeze_(9)),
    ("as_strided_ past the storage", lambda t: t.as_strided_((3, 9), (0, 3), 0)),
    ("as_strided_ offset past the storage", lambda t: t.as_strided_((2,), (1,), 40)),
])
@pytest.mark.parametrize("on", ["base", "view"])
def test_a_failed_in_place_view_op_leaves_the_tensor_and_its_views_intact(path, dev, name, fn,
                                                                          on):
    """Eager's error type and words, then every tensor reads as eager's: the tensor itself, a
    view made before and views made after (the functional path kept upstream's half-made view:
    every later read raised again)."""
    def program(device):
        base = torch.arange(24.).reshape(2, 3, 4).to(device)
        t = base if on == "base" else base[1:]
        before = t[:, 1]
        with pytest.raises(Exception) as err:
            fn(t)
        after = [t.detach(), t.transpose(0, 2), t[0].unsqueeze(0)]
        t.mul_(2)
        got = [t, before, *after, base]
        return err.value, [(x.cpu().clone(), tuple(x.shape), x.stride(), x.storage_offset())
                           for x in got]
    want_err, want = program("cpu")
    got_err, got = program(dev)
    assert type(got_err) is type(want_err), (got_err, want_err)
    assert str(got_err).split(",")[0] == str(want_err).split(",")[0]      # eager's words
    for (g, *g_geo), (w, *w_geo) in zip(got, want):
        assert g_geo == w_geo
        assert torch.equal(g, w)


# -- malformed environment values ------------------------------------------------------------

@pytest.mark.parametrize("var,value", [
    ("XLA_CPU_FALLBACK", "sometimes"), ("XLA_IR_DEBUG", "maybe"),
    ("XLA_COMPILE_CACHE_SIZE", "lots"), ("XLA_COMPILE_CACHE_SIZE", "0"),
    ("XLA_DONATE_BUFFERS", "2"), ("XLA_DUAL_RUN", "always"), ("XLA_DUAL_RUN_RATE", "1.5"),
    ("XLA_DUAL_RUN_TOLERANCES", "float32=tight"), ("XLA_DUAL_RUN_TIMEOUT", "never"),
])
def test_malformed_core_setting_raises_setting_error_naming_the_variable(var, value):
    with pytest.raises(SettingError) as err:
        Settings.from_env({var: value})
    assert isinstance(err.value, ValueError)
    assert var in str(err.value) and repr(value) in str(err.value)


def test_malformed_dispatch_settings_never_raise_and_are_recorded_for_config_error():
    # The decision then takes the safe default with reason CONFIG_ERROR (tests/test_rollout.py).
    s = Settings.from_env({"XLA_USE_FUNCTIONALIZATION": "perhaps",
                           "XLA_ROLLOUT_PERCENTAGE": "half"})
    assert s.use_functionalization is None and s.rollout_percentage is None
    assert len(s.dispatch_errors) == 2
    assert any("XLA_ROLLOUT_PERCENTAGE" in e for e in s.dispatch_errors)


@pytest.mark.parametrize("fn,op", [
    (lambda x: x.half() + 1j, "aten.add.Tensor"),       # promotes to complex32
    (lambda x: x.to(torch.complex32), "aten._to_copy"),
    (lambda x: x.to(torch.float8_e4m3fn), "aten._to_copy"),
], ids=["promotes to complex32", "to complex32", "to float8"])
def test_a_dtype_the_device_lacks_raises_unsupported_dtype_naming_the_op(path, dev, fn, op):
    # Was a TypeError, which torch's binary operators turn into NotImplemented: Python then said
    # "unsupported operand type(s) for +: 'Tensor' and 'complex'", naming neither dtype nor op.
    x = BASE.to(dev)
    with pytest.raises(xc.UnsupportedDtypeError) as err:
        fn(x)
    assert isinstance(err.value, xc.UnsupportedOpError)
    message = str(err.value)
    assert op in message and "not supported on the hlo device" in message
    assert "convert to a supported dtype" in message
    assert torch.equal(x.cpu(), BASE)


@pytest.mark.parametrize("shape,dim", [((0,), 0), ((0, 3), 0), ((2, 0, 4), 1)])
def test_nanmedian_over_an_empty_dim_raises_like_cpu(path, dev, shape, dim):
    # Session 30's sweep: the device returned zeros and index 0 where eager raises IndexError.
    fn = lambda x: torch.nanmedian(x, dim)
    err = check_like_cpu(fn, (torch.ones(shape),), (torch.ones(shape).to(dev),), ["nanmedian"])
    assert "Expected reduction dim" in str(err)
    assert_same(torch.nanmedian(torch.ones(0, 3).to(dev), 1), torch.nanmedian(torch.ones(0, 3), 1))


def test_a_fill_value_is_checked_each_time_it_changes(path, dev):
    """The fill check runs once per signature, and a fill's float is part of the signature: a
    value that fits, then one that does not, on the same tensor, still raises eager's error."""
    x = torch.zeros(4, dtype=torch.uint8, device=dev)
    x.fill_(2.5)
    expected = cpu_error(lambda t: t.fill_(300.0), torch.zeros(4, dtype=torch.uint8))
    with pytest.raises(type(expected), match="without overflow"):
        x.fill_(300.0)
        xc.sync()
    assert torch.equal(x.cpu(), torch.full((4,), 2, dtype=torch.uint8))
