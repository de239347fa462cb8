"""The dispatch layer over the real legacy and functional paths."""
from __future__ import annotations

import gc
import operator
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import xla_compat as xc
from xla_compat import dispatch, paths
from xla_compat.lazy.tracer import PathMixError
from xla_compat.rollout import Reason
from xla_compat.settings import Settings

from .conftest import PATHS, assert_same


@pytest.fixture(autouse=True)
def _real_paths():
    dispatch.load_paths()
    missing = [p for p in PATHS if p not in paths.names()]
    assert not missing, f"paths not registered: {missing}; {dispatch.import_errors}"


def test_both_paths_register_and_this_torch_supports_them():
    support = dispatch.supported()
    assert support["legacy"] is None and support["functional"] is None
    assert xc.explain().path in PATHS


def test_decision_over_the_real_registry_follows_the_flag():
    for flag, name in ((False, "legacy"), (True, "functional")):
        d = dispatch.decide(Settings(use_functionalization=flag, job_id="j"))
        assert (d.path, d.reason) == (name, Reason.EXPLICIT_FLAG)
        assert d.path_version == paths.get(name).version


def test_faked_old_torch_gates_the_real_functional_path_off():
    d = dispatch.decide(Settings(use_functionalization=True, torch_version="2.10.0", job_id="j"))
    assert d.reason is Reason.VERSION_GATE and d.path != "functional"
    assert "2.10.0" in d.message


def test_use_path_gives_tensors_of_that_path(path, dev):
    assert xc.path() == path
    t = torch.ones(2, 3, device=dev)
    assert paths.of(t) == paths.of(t.t()) == paths.of(t * 2) == path


@pytest.mark.parametrize("op", [
    lambda a, b: a + b,
    lambda a, b: b * a,
    lambda a, b: a.t() @ b,
    lambda a, b: a.add_(b),
    lambda a, b: a[0].copy_(b[1]),
    lambda a, b: torch.cat([a, b]),
    lambda a, b: operator.setitem(a, 0, b[1]),
    lambda a, b: torch.add(b, b, out=a),
    lambda a, b: b.mul_(a),
], ids=["add", "mul", "view_matmul", "inplace", "view_copy_", "cat", "setitem", "out", "inplace_rev"])
def test_mixing_legacy_and_functional_names_both_and_says_how_to_move(dev, op):
    with xc.use_path("legacy"):
        a = torch.ones(3, 3, device=dev)
    with xc.use_path("functional"):
        b = torch.arange(9.0).reshape(3, 3).to(dev)
    with pytest.raises(PathMixError) as info:
        op(a, b)
    text = str(info.value)
    assert "legacy" in text and "functional" in text and "xc.to_path(" in text


@pytest.mark.parametrize("source, target", [("legacy", "functional"), ("functional", "legacy")])
def test_to_path_moves_values_across_including_views(dev, source, target):
    base = torch.arange(12.0).reshape(3, 4)
    with xc.use_path(source):
        x = base.to(dev)
        x.t()[1].mul_(10)              # pending write through a view
        v = x[:, 1:3]
    with xc.use_path(target):
        y = torch.ones(3, 2, device=dev)
    moved = xc.to_path(v, target)
    assert paths.of(moved) == target and paths.of(v) == source
    expected = base.clone()
    expected.t()[1].mul_(10)
    assert_same(moved + y, expected[:, 1:3] + 1)
    assert xc.to_path(moved, target) is moved


def test_a_training_step_under_each_path_matches_cpu(path, dev):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    x, y = torch.randn(8, 4), torch.randn(8, 2)
    dmodel = torch.nn.Linear(4, 2).to(dev)
    dmodel.load_state_dict({k: v.to(dev) for k, v in model.state_dict().items()})
    for m, xx, yy in ((model, x, y), (dmodel, x.to(dev), y.to(dev))):
        opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
        for _ in range(2):
            opt.zero_grad()
            torch.nn.functional.mse_loss(m(xx), yy).backward()
            opt.step()
    xc.sync()
    assert all(paths.of(p) == path for p in dmodel.parameters())
    assert_same(list(dmodel.parameters()), [p.detach() for p in model.parameters()])



def _legacy_checks_mutations() -> bool:
    from xla_compat.legacy.tensor import LegacyTensor
    return "__torch_function__" in LegacyTensor.__dict__


def test_the_mix_guard_stays_while_a_functional_tensor_lives(dev):
    with xc.use_path("legacy"):
        a = torch.ones(3, 3, device=dev)
    with xc.use_path("functional"):
        b = torch.arange(9.0).reshape(3, 3).to(dev)
        c = b * 2                      # a wrapper made by an op, not by a factory
    del b
    gc.collect()
    xc.sync()
    assert _legacy_checks_mutations()           # c still lives: legacy tensors may meet it
    with pytest.raises(PathMixError):
        a.add_(c)
    assert_same(a, torch.ones(3, 3))


_GUARD_GOES = """
import gc, torch
import xla_compat as xc
from xla_compat.legacy.tensor import LegacyTensor
from xla_compat.lazy.tracer import PathMixError
checks = lambda: "__torch_function__" in LegacyTensor.__dict__
dev = xc.device()
with xc.use_path("legacy"):
    a = torch.ones(3, 3, device=dev)
assert not checks()                         # one path only: no Python call per torch function
with xc.use_path("functional"):
    c = torch.arange(9.0).reshape(3, 3).to(dev) * 2
assert checks()
del c
gc.collect()
xc.sync()
assert not checks(), "no functional tensor left, the check should be off"
a.add_(1)
with xc.use_path("functional"):
    d = torch.ones(3, 3, device=dev)        # a new wrapper turns the check back on
assert checks()
try:
    a.add_(d)
except PathMixError:
    pass
else:
    raise AssertionError("mixing paths after the guard came back did not raise")
assert torch.equal(a.cpu(), torch.full((3, 3), 2.0))
print("ok")
"""


def test_the_mix_guard_goes_with_the_last_functional_tensor_and_comes_back_with_the_next():
    # A process of its own: other tests leave functional tensors alive in this one.
    proc = subprocess.run([sys.executable, "-c", _GUARD_GOES], capture_output=True, text=True,
                          timeout=300, cwd=Path(__file__).resolve().parent.parent)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]
