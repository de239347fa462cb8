"""``torch.func`` transforms and higher-order autograd on device tensors match CPU eager on both
paths. ``hessian`` (forward over reverse) failed on the device before session 25: autograd's zero
tensors (``_efficientzerotensor``) had no hlo kernel."""
from __future__ import annotations

import pytest
import torch

import xla_compat as xc
from tests.conftest import assert_same


def f(r):
    return (r ** 3).sum() + (r[0] * r[1]).sin()


TRANSFORMS = {
    "vmap": lambda x: torch.func.vmap(lambda r: r.sin() * 2 + r.sum())(x.reshape(3, 1)),
    "grad": lambda x: torch.func.grad(f)(x),
    "jacrev": lambda x: torch.func.jacrev(lambda r: r.sin() * r[0])(x),
    "jacfwd": lambda x: torch.func.jacfwd(lambda r: r.sin() * r[0])(x),
    "jvp": lambda x: torch.func.jvp(lambda r: r.sin() * r[1], (x,), (torch.ones_like(x),))[1],
    "hessian": lambda x: torch.func.hessian(f)(x),
    "vmap of grad": lambda x: torch.func.vmap(torch.func.grad(lambda r: (r ** 2).sin().sum()))(
        x.reshape(3, 1) * torch.ones(3, 2, device=x.device)),
    "double backward": lambda x: torch.autograd.grad(
        torch.autograd.grad(f(x.requires_grad_()), x, create_graph=True)[0].sum(), x)[0],
}



@pytest.mark.parametrize("name", sorted(TRANSFORMS))
def test_func_transforms_match_eager(path, dev, name):
    x = torch.tensor([0.5, 1.0, 2.0])
    want = TRANSFORMS[name](x.clone())
    got = TRANSFORMS[name](x.clone().to(dev))
    assert got.device == dev
    assert_same(got, want, rtol=1e-5, atol=1e-6)
    assert xc.metrics.fallback_ops() == []      # (forward AD's storage-size check too)
