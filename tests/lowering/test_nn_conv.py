"""Convolutions on hlo match CPU eager, forward and backward, in every configuration nn uses."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from xla_compat.lowering import registry
from xla_compat.lowering.registry import aten

from ._nn_check import check as _check



@pytest.fixture(autouse=True)
def _seed_each_test():
    torch.manual_seed(0)     # inputs do not depend on which tests ran before


def check(fn, *inputs):
    # Weight gradients sum N*H*W products; oneDNN/gemm on CPU and XLA add them in different
    # orders, so float32 rounding differs by a few ulps of the (much larger) partial sums.
    return _check(fn, *inputs, grad_atol=1e-5)


def test_conv_ops_have_rules():
    for op in (aten.convolution.default, aten.convolution_backward.default,
               aten._convolution.default, aten.im2col.default, aten.col2im.default):
        assert registry.lookup(op) is not None, op


@pytest.mark.parametrize("kw", [
    {},
    {"stride": 2},
    {"padding": 1},
    {"padding": 2, "dilation": 2},
    {"stride": 3, "padding": 1, "bias": False},
    {"groups": 2},
])
def test_conv1d(kw):
    bias = kw.pop("bias", True)
    x, w = torch.randn(2, 4, 11), torch.randn(6, 4 // kw.get("groups", 1), 3)
    b = torch.randn(6) if bias else None
    check(lambda x, w, b: F.conv1d(x, w, b, **kw), x, w, b)


@pytest.mark.parametrize("kw", [
    {},
    {"stride": (2, 1), "padding": (1, 0)},
    {"padding": 1, "dilation": (2, 1)},
    {"groups": 3},
    {"groups": 6, "padding": 1},      # depthwise
    {"padding": "same"},
    {"padding": "same", "dilation": 2},
])
def test_conv2d(kw):
    g = kw.get("groups", 1)
    x, w, b = torch.randn(2, 6, 7, 8), torch.randn(6, 6 // g, 3, 2), torch.randn(6)
    check(lambda x, w, b: F.conv2d(x, w, b, **kw), x, w, b)


def test_conv2d_unbatched_input():
    check(lambda x, w: F.conv2d(x, w, padding=1), torch.randn(3, 5, 5), torch.randn(4, 3, 3, 3))


def test_conv3d():
    x, w, b = torch.randn(2, 2, 5, 6, 4), torch.randn(4, 2, 3, 3, 2), torch.randn(4)
    check(lambda x, w, b: F.conv3d(x, w, b, stride=(1, 2, 1), padding=1), x, w, b)


@pytest.mark.parametrize("kw", [
    {},
    {"stride": 2},
    {"stride": 2, "padding": 1, "output_padding": 1},
    {"stride": 3, "padding": 2, "output_padding": 2, "dilation": 2},
    {"groups": 2, "stride": 2},
    {"padding": 3, "stride": 2, "output_padding": 1},  # padding beyond the kernel reach crops
])
def test_conv_transpose2d(kw):
    g = kw.get("groups", 1)
    x, w, b = torch.randn(2, 4, 5, 6), torch.randn(4, 6 // g, 3, 3), torch.randn(6)
    check(lambda x, w, b: F.conv_transpose2d(x, w, b, **kw), x, w, b)


def test_conv_transpose1d_and_3d():
    check(lambda x, w: F.conv_transpose1d(x, w, stride=2, padding=1, output_padding=1),
          torch.randn(2, 3, 7), torch.randn(3, 5, 4))
    check(lambda x, w: F.conv_transpose3d(x, w, stride=(2, 1, 2), groups=2),
          torch.randn(1, 4, 3, 4, 3), torch.randn(4, 1, 2, 3, 2))


# Configurations whose kernel outnumbers the input: XLA swaps such a convolution's operands,
# and the swap of the base-dilated window a stride makes used to abort the whole process
# ("Window dimensions do not match RHS shape"). Found by a random sweep; (input spatial size,
# kernel, stride, padding, output_padding, dilation).
@pytest.mark.parametrize("size,k,stride,padding,output_padding,dilation", [
    ((1, 6), (2, 2), 2, (0, 2), (0, 1), (2, 1)),
    ((1, 3), (3, 2), (1, 2), (1, 2), (0, 1), 1),
    ((5, 1), (2, 3), 2, (1, 2), (0, 1), (1, 2)),
    ((2, 5), (3, 2), (3, 2), (0, 2), 0, (2, 1)),
    ((5, 2), (2, 3), 2, (2, 1), 0, (1, 2)),
    ((1, 4), (3, 2), (1, 2), (1, 2), (0, 1), (2, 1)),
    ((5, 4, 2), (2, 3, 3), (2, 2, 1), (2, 2, 1), 0, (1, 2, 2)),
    ((2, 3, 2), (2, 2, 3), (2, 2, 3), (0, 2, 0), (0, 0, 2), (2, 1, 1)),
])
def test_conv_transpose_with_a_kernel_larger_than_its_input(size, k, stride, padding,
                                                             output_padding, dilation):
    x, w = torch.randn(2, 3, *size), torch.randn(3, 2, *k)
    conv = F.conv_transpose3d if len(size) == 3 else F.conv_transpose2d
    check(lambda x, w: conv(x, w, stride=stride, padding=padding, output_padding=output_padding,
                            dilation=dilation), x, w)
    # unbatched, the shape the bug was first seen with
    check(lambda x, w: conv(x, w, stride=stride, padding=padding, output_padding=output_padding,
                            dilation=dilation), x[0], w)


# CPU eager returns the empty output of a batched transposed convolution whose computed size is
# exactly 0 (torch's meta kernel calls it "too small"; the random sweep found it at seed 73).
@pytest.mark.parametrize("size,k,stride,padding,output_padding,dilation,bias", [
    ((1, 1), (2, 4), (2, 3), (1, 4), (0, 1), (1, 2), False),    # both dims empty
    ((3, 1), (2, 4), (2, 3), (1, 4), (0, 1), (1, 2), True),     # one dim empty
    ((1,), (2,), 1, 1, 0, 1, True),
    ((2, 1, 2), (1, 2, 1), 1, (0, 1, 0), 0, 1, True),
])
def test_transposed_conv_with_an_empty_output_is_empty_as_in_eager(size, k, stride, padding,
                                                                  output_padding, dilation,
                                                                  bias):
    import xla_compat as xc
    conv = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}[len(size)]
    x, w, b = torch.randn(2, 3, *size), torch.randn(3, 2, *k), torch.randn(2) if bias else None

    def fn(x, w, b=None):
        return conv(x, w, b, stride=stride, padding=padding, output_padding=output_padding,
                    dilation=dilation)
    want = check(fn, x, w, *([b] if bias else []))
    assert 0 in want[0].shape
    got = fn(x.to(xc.device()), w.to(xc.device()))
    assert got.shape == want[0].shape and got.stride() == fn(x, w).stride()


# A strided convolution's input gradient is a transposed convolution of the (small) output's
# gradient: jax's own vjp handed XLA the base-dilated window its operand swap aborts on.
@pytest.mark.parametrize("stride", [(3, 2), (2, 2)])
def test_strided_conv_whose_output_is_smaller_than_its_kernel_has_a_gradient(stride):
    x, w = torch.randn(1, 2, 5, 4), torch.randn(1, 2, 2, 2)
    check(lambda x, w: F.conv2d(x, w, stride=stride, padding=(0, 1), dilation=(2, 1)), x, w)


def test_conv_gradient_of_input_only():
    w = torch.randn(4, 3, 3, 3)
    check(lambda x: F.conv2d(x, w.to(x.device)), torch.randn(2, 3, 6, 6))


def test_unfold_and_fold():
    check(lambda x: F.unfold(x, (2, 3), dilation=(1, 2), padding=1, stride=(2, 1)),
          torch.randn(2, 3, 6, 7))
    check(lambda c: F.fold(c, (5, 6), (2, 2), padding=1, stride=2), torch.randn(2, 12, 12))
    check(lambda x: F.unfold(x, 2), torch.randn(3, 4, 4))


@pytest.mark.parametrize("path", ["legacy", "functional"])
def test_an_empty_transposed_conv_output_on_both_paths(path):
    """The same empty output, gradients and strides as eager through each path's tensors."""
    import importlib
    import xla_compat as xc
    from xla_compat import paths
    importlib.import_module(f"xla_compat.{path}")      # (registers the path)
    x, w, b = torch.randn(2, 3, 1, 1), torch.randn(3, 2, 2, 4), torch.randn(2)
    kw = dict(stride=(2, 3), padding=(1, 4), output_padding=(0, 1), dilation=(1, 2))
    cpu = [t.clone().requires_grad_() for t in (x, w, b)]
    want = F.conv_transpose2d(*cpu, **kw)
    want.sum().backward()
    with paths.activated(path):
        dev = [t.to(xc.device()).requires_grad_() for t in (x, w, b)]
        got = F.conv_transpose2d(*dev, **kw)
        got.sum().backward()
        assert got.shape == want.shape == (2, 2, 0, 0) and got.stride() == want.stride()
        for d, c in zip(dev, cpu):
            assert torch.equal(d.grad.cpu(), c.grad)
