"""float16/bfloat16 F.grid_sample (grid_sampler_2d/3d) is the one eager computes, bit for bit.

Eager's CPU kernels compute a reduced-precision grid sample in the tensor's own dtype, rounding
after every operation (the unnormalised coordinate, each step of its reflection, the weights,
each product and partial sum); rounding the coordinate can move it across a pixel border, so a
float32 computation picks other pixels. The grids here mix random points, points exactly on
pixel borders and centres (for both ``align_corners``), the corners of [-1, 1] and points far
outside the image, so every padding mode's folding and clipping is exercised.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.conftest import PATHS
from tests.sampling import all_pairs

DTYPES = (torch.bfloat16, torch.float16)
PADDINGS = ("zeros", "border", "reflection")
SHAPES = {2: (2, 3, 5, 7), 3: (1, 2, 3, 4, 5)}
# a dim of one pixel: reflection with align_corners folds every coordinate onto it
SINGLE_ROW = {2: (1, 2, 1, 6), 3: (1, 1, 2, 1, 6)}


def _component(size: int, n: int, g: torch.Generator) -> torch.Tensor:
    """``n`` grid values for a dim of ``size`` pixels: random in [-1.6, 1.6], pixel borders and
    centres (k / (2 size) without align_corners, k / (2 (size - 1)) with), -1, 0, 1, and far
    outside (up to +-30), in random order."""
    k = torch.arange(-2 * size - 2, 2 * size + 3, dtype=torch.float32)
    special = torch.cat([k / (2 * size), k / (2 * max(size - 1, 1)),
                         torch.tensor([-1.0, 0.0, 1.0, -3.0, 2.5, 7.25, -29.5])])
    picks = special[torch.randint(len(special), (n,), generator=g)]
    rand = torch.rand(n, generator=g) * 3.2 - 1.6
    far = (torch.rand(n, generator=g) * 60 - 30)
    kind = torch.randint(3, (n,), generator=g)
    return torch.where(kind == 0, picks, torch.where(kind == 1, rand, far))


def _case(shape, dtype, seed):
    """A random input of ``shape`` and a grid of ``_component`` values for it."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g).to(dtype)
    nd = len(shape) - 2
    out_sp = (3, 4, 10) if nd == 3 else (6, 10)
    n = shape[0] * int(torch.tensor(out_sp).prod())
    # grid components are (x, y[, z]): the last input dim first
    comps = [_component(shape[-1 - d], n, g) for d in range(nd)]
    grid = torch.stack(comps, -1).reshape((shape[0],) + out_sp + (nd,)).to(dtype)
    return x, grid


def _check(dev, dtype, mode, shape, settings):
    """``F.grid_sample`` of a ``shape`` input with each (padding, align_corners) of
    ``settings``, all in one graph, compared bit for bit with eager."""
    x, grid = _case(shape, dtype, seed=len(shape))

    def sample(x, grid, padding, align_corners):
        return F.grid_sample(x, grid, mode=mode, padding_mode=padding,
                             align_corners=align_corners)
    expected = [sample(x, grid, *s) for s in settings]
    xd, gd = x.to(dev), grid.to(dev)
    actual = torch.cat([sample(xd, gd, *s).flatten() for s in settings]).cpu()
    for (padding, ac), a, e in zip(settings, actual.split([e.numel() for e in expected]),
                                   expected):
        a = a.reshape(e.shape)
        assert a.dtype == e.dtype
        differ = (a.view(torch.int16) != e.view(torch.int16)) & ~(a.isnan() & e.isnan())
        assert not differ.any(), (
            f"{padding}, align_corners={ac}: {int(differ.sum())}/{e.numel()} elements differ, "
            f"e.g. ours {a[differ][:4].tolist()} vs eager {e[differ][:4].tolist()}")


ALL_SETTINGS = [(p, ac) for p in PADDINGS for ac in (False, True)]


@pytest.mark.parametrize("path,dtype,mode", all_pairs(PATHS, DTYPES, ["bilinear", "nearest",
                                                                         "bicubic"]),
                         indirect=["path"])
def test_grid_sample_2d_half_matches_eager_bitwise(path, dev, dtype, mode):
    _check(dev, dtype, mode, SHAPES[2], ALL_SETTINGS)


@pytest.mark.parametrize("path,dtype,mode", all_pairs(PATHS, DTYPES, ["bilinear", "nearest"]),
                         indirect=["path"])
def test_grid_sample_3d_half_matches_eager_bitwise(path, dev, dtype, mode):
    _check(dev, dtype, mode, SHAPES[3], ALL_SETTINGS)


@pytest.mark.parametrize("path,dtype,nd_mode", all_pairs(
    PATHS, DTYPES, [(2, "bilinear"), (2, "bicubic"), (3, "nearest")]), indirect=["path"])
def test_grid_sample_half_on_a_single_row_matches_eager_bitwise(path, dev, dtype, nd_mode):
    nd, mode = nd_mode
    _check(dev, dtype, mode, SINGLE_ROW[nd], [("reflection", True), ("border", False)])


def test_grid_sample_half_picks_eagers_pixel(path, dev):
    # The bf16 coordinate of a point near a pixel border rounds across it: eager (and we) read
    # the other pixel; a float32 computation rounded once reads the nearer one.
    x = torch.arange(1.0, 21.0).reshape(1, 1, 1, 20).to(torch.bfloat16)
    grid = torch.tensor([[[[0.30078125, 0.0]]]], dtype=torch.bfloat16)  # index 12.5 in bf16
    expected = F.grid_sample(x, grid, mode="nearest", align_corners=False)
    wide = F.grid_sample(x.float(), grid.float(), mode="nearest", align_corners=False)
    assert not torch.equal(expected.float(), wide)                      # the case is real
    actual = F.grid_sample(x.to(dev), grid.to(dev), mode="nearest", align_corners=False)
    assert torch.equal(actual.cpu(), expected)
