"""Upsampling, padding and shuffles on hlo match CPU eager, forward and backward."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.sampling import all_pairs
from xla_compat.lowering import registry
from xla_compat.lowering.registry import aten

from ._nn_check import check



@pytest.fixture(autouse=True)
def _seed_each_test():
    torch.manual_seed(0)     # inputs do not depend on which tests ran before


def test_resample_ops_have_rules():
    names = [f"upsample_nearest{n}d" for n in (1, 2, 3)] + \
            [f"_upsample_nearest_exact{n}d" for n in (1, 2, 3)] + \
            ["upsample_linear1d", "upsample_bilinear2d", "upsample_trilinear3d",
             "upsample_bicubic2d", "_upsample_bilinear2d_aa", "_upsample_bicubic2d_aa"] + \
            [f"{k}_pad{n}d" for k in ("reflection", "replication") for n in (1, 2, 3)]
    for name in names:
        for op in (getattr(aten, name).default, getattr(aten, name + "_backward").default):
            assert registry.lookup(op) is not None, op
    for op in (aten.pixel_shuffle.default, aten.pixel_unshuffle.default,
               aten.channel_shuffle.default):
        assert registry.lookup(op) is not None, op


@pytest.mark.parametrize("mode", ["nearest", "nearest-exact"])
@pytest.mark.parametrize("kw", [
    {"scale_factor": 2},
    {"scale_factor": 3},
    {"size": (5, 7)},
    {"size": (3, 2)},          # downsampling
    {"scale_factor": (1.7, 0.6)},
    {"scale_factor": 1.3, "recompute_scale_factor": True},
])
def test_upsample_nearest2d(mode, kw):
    check(lambda x: F.interpolate(x, mode=mode, **kw), torch.randn(2, 3, 4, 5))


@pytest.mark.parametrize("mode", ["nearest", "nearest-exact"])
def test_upsample_nearest_1d_and_3d(mode):
    check(lambda x: F.interpolate(x, scale_factor=2.5, mode=mode), torch.randn(2, 3, 5))
    check(lambda x: F.interpolate(x, size=(3, 5, 2), mode=mode), torch.randn(1, 2, 2, 3, 4))


@pytest.mark.parametrize("align_corners", [False, True])
@pytest.mark.parametrize("kw", [
    {"scale_factor": 2},
    {"size": (7, 3)},
    {"scale_factor": (1.5, 0.5)},
    {"size": (1, 1)},
])
def test_upsample_bilinear2d_and_bicubic2d(align_corners, kw):
    x = torch.randn(2, 3, 4, 5)
    check(lambda x: F.interpolate(x, mode="bilinear", align_corners=align_corners, **kw), x)
    # Bicubic sums four taps with weights as large as 1.2 and of both signs: CPU eager itself is
    # ~2e-6 from the float64 result on these inputs (checked), so it gets atol 5e-6.
    check(lambda x: F.interpolate(x, mode="bicubic", align_corners=align_corners, **kw), x,
          atol=5e-6, grad_atol=1e-5)


@pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
@pytest.mark.parametrize("shape,kw", [
    ((2, 3, 10, 12), {"size": (4, 5)}),                  # downsampling: the filter widens
    ((1, 2, 5, 7), {"size": (11, 13)}),                  # upsampling: plain taps
    ((1, 1, 9, 9), {"scale_factor": 0.37}),
    ((1, 1, 9, 9), {"scale_factor": (2.3, 0.4)}),        # up in one dim, down in the other
    ((1, 2, 6, 8), {"size": (3, 3), "align_corners": True}),
    ((1, 1, 1, 5), {"size": (1, 1)}),
])
def test_antialiased_interpolation_averages_what_each_output_covers(mode, shape, kw):
    check(lambda x: F.interpolate(x, mode=mode, antialias=True, **kw), torch.randn(*shape),
          grad_rtol=1e-5, grad_atol=1e-5)


@pytest.mark.parametrize("align_corners", [False, True])
def test_upsample_linear1d_and_trilinear3d(align_corners):
    check(lambda x: F.interpolate(x, scale_factor=2.5, mode="linear", align_corners=align_corners),
          torch.randn(2, 3, 5))
    check(lambda x: F.interpolate(x, size=(3, 5, 2), mode="trilinear",
                                  align_corners=align_corners), torch.randn(1, 2, 2, 3, 4))


@pytest.mark.parametrize("mode", ["reflect", "replicate"])
@pytest.mark.parametrize("pad,shape", [
    ((1, 2), (2, 3, 5)),
    ((2, 1), (3, 5)),
    ((1, 2, 2, 0), (2, 3, 4, 5)),
    ((0, -1, 1, -2), (2, 3, 4, 5)),      # negative padding crops
    ((1, 1, 2, 0, 1, 2), (1, 2, 3, 4, 5)),
])
def test_reflection_and_replication_pad(mode, pad, shape):
    check(lambda x: F.pad(x, pad, mode=mode), torch.randn(shape))


def test_pixel_shuffle_unshuffle_and_channel_shuffle():
    check(lambda x: F.pixel_shuffle(x, 2), torch.randn(2, 8, 3, 4))
    check(lambda x: F.pixel_shuffle(x, 3), torch.randn(9, 2, 3))
    check(lambda x: F.pixel_unshuffle(x, 2), torch.randn(2, 3, 4, 6))
    check(lambda x: F.channel_shuffle(x, 3), torch.randn(2, 6, 2, 3))


@pytest.mark.parametrize("mode,padding_mode,align_corners", all_pairs(
    ["bilinear", "nearest", "bicubic"], ["zeros", "border", "reflection"], [False, True]))
def test_grid_sample_2d(mode, padding_mode, align_corners):
    x = torch.randn(2, 3, 5, 6)
    grid = torch.rand(2, 4, 7, 2) * 2.6 - 1.3        # some points fall outside [-1, 1]
    # Bicubic grid gradients sum 16 taps' cubic derivatives scaled by size/2 (values up to ~20);
    # eager and XLA round differently, both ~1e-5 from the float64 result (checked).
    tol = {"grad_atol": 2e-5} if mode == "bicubic" else {}
    check(lambda x, g: F.grid_sample(x, g, mode=mode, padding_mode=padding_mode,
                                     align_corners=align_corners), x, grid, **tol)


@pytest.mark.parametrize("mode", ["bilinear", "nearest"])
@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
def test_grid_sample_3d(mode, padding_mode):
    x = torch.randn(2, 2, 4, 5, 3)
    grid = torch.rand(2, 3, 2, 4, 3) * 2.6 - 1.3
    check(lambda x, g: F.grid_sample(x, g, mode=mode, padding_mode=padding_mode,
                                     align_corners=False), x, grid)


@pytest.mark.parametrize("mode,antialias", [("bilinear", False), ("bicubic", False),
                                            ("bilinear", True), ("bicubic", True)])
@pytest.mark.parametrize("channels", [1, 3, 5])
def test_uint8_images_resample_in_eagers_fixed_point(path, dev, mode, antialias, channels):
    """CPU eager resamples uint8 images in integers (int16 weights, a rounding shift and a clamp
    per pass, the last dim first; its AVX kernel for up to 4 channels and its generic one agree);
    the device computed in uint8 arithmetic and was up to 10 off. Every value equals eager's."""
    g = torch.Generator().manual_seed(channels)
    x = torch.randint(0, 256, (2, channels, 6, 9), generator=g, dtype=torch.uint8)
    cases = [{"scale_factor": 2}, {"size": (4, 5)}, {"size": (11, 7)},
             {"scale_factor": (1.7, 0.6)}, {"size": (6, 4)}]
    if not antialias:
        cases += [{"size": (11, 7), "align_corners": True}, {"size": (3, 4), "align_corners": True}]
    for kw in cases:
        def fn(t):
            return F.interpolate(t, mode=mode, antialias=antialias, **kw)
        got = fn(x.to(dev)).cpu()
        assert got.dtype == torch.uint8
        assert torch.equal(got, fn(x)), kw
