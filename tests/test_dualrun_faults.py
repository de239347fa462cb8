"""Dual run under planted shadow faults, in every mode (issue 10 item 6).

The shadow path's own implementation of ``addmm`` (every ``nn.Linear``) misbehaves: it raises
while tracing, or it routes its result through a node whose lowering raises, whose HLO XLA cannot
compile (a custom call nobody registered), whose execution raises or hangs (a host callback), or
that returns NaN. Whatever the mode (lockstep as a block or process-wide with the decorator,
strict and sample decorators, the ``dual_run`` function), the authoritative training run must be
bit for bit the run with dual-run off, the fault must be reported, and later steps must work.
"""
from __future__ import annotations

import contextlib
import copy
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import xla_compat as xc
from xla_compat import metrics, paths, settings
from xla_compat.dualrun import pairs
from xla_compat.lowering import registry
from tests.conftest import PATHS, assert_same
from tests.sampling import all_pairs
from tests.models import MLP

aten = torch.ops.aten
STEPS = 3
FAULTS = ("trace", "lowering", "compile", "execute", "hang", "nan")
MODES = ("lockstep", "lockstep-decorator", "strict", "sample", "function")
TIMEOUT_S = 1.0                      # the shadow's budget where it hangs
PATIENT_S = 60.0                     # ... and where it does not: a slow machine is no timeout
HANG_S = 60.0                        # how long a planted hang lasts unless released
release = threading.Event()          # a hanging shadow waits on this; released at teardown


def _planted_rule(fault: str):
    """The lowering of the node the shadow's addmm routes its result through."""
    def rule(x, **_):
        if fault == "lowering":
            raise RuntimeError("planted lowering fault")
        if fault == "compile":       # valid to trace and lower, rejected by XLA's compiler
            return jax.ffi.ffi_call("xla_compat_planted_missing_target",
                                    jax.ShapeDtypeStruct(x.shape, x.dtype))(x)
        if fault in ("execute", "hang"):
            def host(a):
                if fault == "execute":
                    raise RuntimeError("planted execution fault")
                release.wait(HANG_S)
                return np.asarray(a)
            return jax.pure_callback(host, jax.ShapeDtypeStruct(x.shape, x.dtype), x)
        if fault == "nan":
            return x * jnp.nan
        return x
    return rule


@contextlib.contextmanager
def shadow_fault(shadow: str, fault: str):
    """The ``shadow`` path's addmm misbehaves as ``fault`` says; the other path is untouched."""
    cls = paths.get(shadow).tensor_cls
    original = cls.__torch_dispatch__.__func__

    def dispatch(klass, func, types, args=(), kwargs=None):
        if func is not aten.addmm.default:
            return original(klass, func, types, args, kwargs)
        if fault == "trace":
            raise RuntimeError("planted trace fault")
        return aten.sinc.default(original(klass, func, types, args, kwargs))

    undo = registry.override(aten.sinc.default, _planted_rule(fault))
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(cls, "__torch_dispatch__", classmethod(dispatch))
            yield
    finally:
        undo()


@pytest.fixture(autouse=True)
def _release_hanging_shadows():
    release.clear()
    yield
    release.set()
    for t in threading.enumerate():      # abandoned shadows finish here, not in the next test
        if t.name.startswith(("xla_compat-lockstep-shadow", "xla_compat-dual-run-shadow")):
            t.join(60)
    if pairs.active() is not None:
        pairs.stop()


def _step(model, opt, x, y):
    opt.zero_grad()
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    return loss.detach()


def _train(dev, call, steps=STEPS):
    """(losses, parameters) of ``steps`` SGD steps, each through ``call(step, *args)``."""
    torch.manual_seed(0)
    model = MLP(d_in=8, hidden=16, d_out=3)
    x, y = torch.randn(12, 8), torch.randint(0, 3, (12,))
    model = copy.deepcopy(model).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, y = x.to(dev), y.to(dev)
    losses = []
    for _ in range(steps):
        losses.append(call(_step, model, opt, x, y).cpu())
    return losses, [p.detach().cpu() for p in model.parameters()]


def _plain(step, *args):
    out = step(*args)
    xc.sync()
    return out


def _strict(step, *args):
    try:
        return xc.dual_run_step(mode="strict")(step)(*args)
    except xc.MismatchError as e:          # strict raises, carrying the authoritative value
        return e.result.value


@contextlib.contextmanager
def _mode(mode: str, timeout: float = TIMEOUT_S):
    """(call, results()) for ``mode``: how a step is called and the comparisons it made."""
    with settings.override(dual_run_timeout=timeout):
        if mode == "lockstep":
            with xc.lockstep() as ls:
                yield _plain, lambda: ls.results
        elif mode == "lockstep-decorator":       # XLA_DUAL_RUN=lockstep, decorated step
            with settings.override(dual_run="lockstep"):
                xc.dualrun.autostart()
                ls = pairs.active()
                try:
                    yield (lambda step, *a: _plain(xc.dual_run_step(step), *a)), \
                        lambda: ls.results
                finally:
                    pairs.stop()
        else:
            seen = []

            def call(step, *args):
                if mode == "function":
                    out = xc.dual_run(step, *args).value
                elif mode == "strict":
                    out = _strict(step, *args)
                else:
                    out = xc.dual_run_step(mode="sample", rate=1.0)(step)(*args)
                seen.append(xc.dualrun.last_result())
                return out
            yield call, lambda: seen


_PLAIN: dict = {}


def _plain_run(path, dev):
    if path not in _PLAIN:
        _PLAIN[path] = _train(dev, _plain)
    return _PLAIN[path]


def _valid(path, mode, fault):
    # an execution hang of a function-level shadow: the xfail below
    return fault != "hang" or mode.startswith("lockstep")


@pytest.mark.parametrize("path,mode,fault", all_pairs(PATHS, MODES, FAULTS, valid=_valid),
                         indirect=["path"])
def test_a_faulty_shadow_leaves_the_authoritative_run_bit_identical(path, dev, mode, fault):
    shadow = "functional" if path == "legacy" else "legacy"
    plain_losses, plain_params = _plain_run(path, dev)
    start = time.perf_counter()
    timeout = TIMEOUT_S if fault == "hang" else PATIENT_S
    with shadow_fault(shadow, fault), _mode(mode, timeout) as (call, results):
        losses, params = _train(dev, call)
        found = [m for r in results() for m in r.mismatches]
        first = next((r for r in results() if not r.match), None)
    elapsed = time.perf_counter() - start

    for i, (a, b) in enumerate(zip(losses, plain_losses)):
        assert torch.equal(a, b), f"loss at step {i}: {a} != {b}"
    for i, (a, b) in enumerate(zip(params, plain_params)):
        assert torch.equal(a, b), f"parameter {i}"
    assert first is not None and first.authoritative == path and first.shadow == shadow
    kinds = {m.kind for m in found}
    if fault == "nan":
        assert "nan" in kinds
    elif fault == "hang":
        assert "timeout" in kinds
        assert elapsed < 30, f"waited {elapsed:.0f} s for a hanging shadow"
    else:
        assert "exception" in kinds
        text = first.shadow_exception or ""
        expected = {"trace": "planted trace fault", "lowering": "planted lowering fault",
                    "compile": "xla_compat_planted_missing_target",
                    "execute": "planted execution fault"}[fault]
        assert expected in text, text
    if mode.startswith("lockstep"):
        fd = first.first_divergence
        if fault != "hang":        # a hang is abandoned, not bisected: no op to name
            assert fd["op"] == "aten.addmm.default", fd
    assert metrics.counter("DualRunMismatch") >= 1
    # The next step works, with dual-run off.
    more, _ = _train(dev, _plain, steps=1)
    assert torch.equal(more[0], plain_losses[0])


def test_a_shadow_execution_failure_under_lockstep_names_the_op_and_line(path, dev):
    shadow = "functional" if path == "legacy" else "legacy"
    lin = torch.nn.Linear(3, 2)
    x_cpu = torch.arange(6.).reshape(2, 3)
    with shadow_fault(shadow, "execute"), xc.lockstep() as ls:
        layer = copy.deepcopy(lin).to(dev)
        x = x_cpu.to(dev)
        y = layer(x)
        z = (y * 2).sum()
        xc.sync()
    assert_same(z, (lin(x_cpu) * 2).sum().detach())
    (result,) = [r for r in ls.results if not r.match]
    assert "planted execution fault" in result.shadow_exception
    fd = ls.first_divergence
    assert fd["op"] == "aten.addmm.default" and fd["mismatch"]["kind"] == "exception"
    assert "failed at sync" in fd["mismatch"]["detail"]
    assert ls.shadow_failure is not None
    w = layer(x).sum()                         # later ops run on the authoritative path alone
    xc.sync()
    assert_same(w, lin(x_cpu).sum().detach())


def test_strict_lockstep_raises_mismatch_error_for_a_shadow_compile_failure(path, dev):
    shadow = "functional" if path == "legacy" else "legacy"
    lin = torch.nn.Linear(3, 2)
    with pytest.raises(xc.MismatchError, match="failed at sync"):
        with shadow_fault(shadow, "compile"), xc.lockstep(strict=True):
            layer = copy.deepcopy(lin).to(dev)
            x = torch.ones(2, 3).to(dev)
            y = layer(x)
            xc.sync()
    assert_same(y, lin(torch.ones(2, 3)).detach())


def test_lockstep_twins_of_a_random_op_draw_the_authoritative_numbers(path, dev):
    def sample():
        xc.manual_seed(7)
        a = torch.ones(64, 64).to(dev)
        b = F.dropout(a, 0.5) + torch.rand(64, 64, device=dev)
        c = torch.randn(8, device=dev)
        xc.sync()
        return b.cpu(), c.cpu()
    plain = sample()
    with xc.lockstep() as ls:
        twinned = sample()
    assert all(torch.equal(p, q) for p, q in zip(plain, twinned))
    assert ls.results and all(r.match for r in ls.results), [r.mismatches for r in ls.results]


@pytest.mark.xfail(strict=True, reason=(
    "function-level modes (strict, sample, dual_run share run_both): the shadow's closing sync "
    "now runs its graph outside the device lock (detached.close) and the first step returns at "
    "the timeout, but the authoritative path's next execution still waits until the hung XLA "
    "execution (a host callback) ends: two steps with a 60 s hang took 183 s. A hang in the "
    "step's own code is abandoned: test_reliability_dualrun_faults"))
@pytest.mark.parametrize("path", ["legacy", pytest.param("functional", marks=pytest.mark.slow)],
                         indirect=True)
def test_a_function_level_shadow_hanging_in_execution_is_abandoned_at_the_timeout(
        path, dev):
    shadow = "functional" if path == "legacy" else "legacy"
    global HANG_S
    # Long enough that a step which waits for the hang (about 3 hangs in all, as measured) ends
    # well past the bound below; short, because the xfail pays for every hang.
    saved, HANG_S = HANG_S, 2.5 * TIMEOUT_S
    try:
        start = time.perf_counter()
        with shadow_fault(shadow, "hang"), _mode("function") as (call, results):
            _train(dev, call, steps=2)
        elapsed = time.perf_counter() - start
    finally:
        HANG_S = saved
    assert [m.kind for r in results() for m in r.mismatches] == ["timeout", "timeout"]
    assert elapsed < 4 * TIMEOUT_S, f"the authoritative steps waited {elapsed:.1f} s"
