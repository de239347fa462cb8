"""``torch.compile`` on device tensors (found in session 27). There is no dynamo backend for hlo:
``xc.compile`` (step capture) is this library's compiled step. What torch.compile does today:

- legacy: dynamo breaks the graph at the path's tensor subclass and runs the module as written,
  which traces lazily as any eager code here does: eager's values, no CPU fallback;
- functional: dynamo's fake-tensor conversion treats a FunctionalTensorWrapper on any device but
  "xla" and "lazy" as torch.compile's own functional tensor (``torch/_subclasses/meta_utils.py``)
  and fails on a parameter's autograd metadata (``assert_eq(m1.is_leaf, m2.is_leaf)``)."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn

import xla_compat as xc
from tests.conftest import assert_same


def test_torch_compile_of_a_module_runs_it_as_written(path, dev, request):
    if path == "functional":
        request.applymarker(pytest.mark.xfail(
            strict=True, raises=Exception,
            reason="dynamo fakifies a functional wrapper on device 'hlo' as its own functional "
                   "tensor (only 'xla' and 'lazy' are special-cased) and fails on a parameter's "
                   "is_leaf; use xc.compile"))
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    x = torch.randn(3, 4)
    compiled = torch.compile(copy.deepcopy(model).to(dev), backend="eager")
    got = [compiled(x.to(dev)), compiled(x.to(dev) * 2)]
    assert_same(got, [model(x).detach(), model(x * 2).detach()], rtol=1e-5, atol=1e-6)
    assert xc.metrics.fallback_ops() == []
