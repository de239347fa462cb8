"""Shared fixtures: every behaviour test runs on both paths, against torch on CPU."""
from __future__ import annotations

import importlib
import os

import pytest
import torch

# Most of the suite's time is XLA compiling its thousands of small distinct graphs. XLA:CPU's
# older (non-MLIR) fusion emitters compile those ~30% faster (the suite: 1,130 -> 800 s on 2
# cores) and give the same results: the whole suite, its bit-for-bit half-precision tests among
# them, passes under both. The library keeps XLA's default: on large training steps the older
# emitters compile and run slower (W3's JAX twin: 3.2 against 2.3 s to compile, 268 against
# 248 ms a step). Worker processes and the subprocesses they start inherit the flag; make
# conformance, make conformance-grads, make bench and the demo's tests keep XLA's default, and
# XLA_COMPAT_TEST_XLA_DEFAULT=1 runs the suite under it too. (XLA aborts on a flag it does not
# know: this one is checked against the jaxlib pinned in constraints.txt.)
TEST_XLA_FLAGS = "--xla_cpu_use_fusion_emitters=false"
if os.environ.get("XLA_COMPAT_TEST_XLA_DEFAULT", "") != "1" \
        and TEST_XLA_FLAGS not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {TEST_XLA_FLAGS}".strip()

import xla_compat as xc
from xla_compat import _jax as xla_compat_jax, executor, paths
from xla_compat.lazy import tracer

# Every test also checks that no device tensor's metadata changed behind the trace plans' back
# (a stale cached geometry raises instead of replaying a wrong plan).
tracer.CHECK_GEOMETRY = True
# ... and that every graph output is the shape, dtype and placement its value said (a sync makes
# the output's leaf from the value's word: ir.output_leaf).
executor.CHECK_OUTPUTS = True

# The two paths users migrate between. A path package registers itself when imported.
# XLA_COMPAT_TEST_PATHS=core,... narrows the set while developing.
PATHS = tuple(os.environ.get("XLA_COMPAT_TEST_PATHS", "legacy,functional").split(","))
# Property tests draw the same examples on every run (a red build is the code's fault, not the
# draw's); XLA_COMPAT_FUZZ_RANDOM=1 explores fresh ones, as ``make fuzz`` does.
RANDOM_DRAWS = os.environ.get("XLA_COMPAT_FUZZ_RANDOM", "") == "1"


def _load(name: str) -> bool:
    try:
        importlib.import_module(f"xla_compat.{name}")
    except ImportError:
        return False
    return name in paths.names()


@pytest.fixture(params=PATHS)
def path(request):
    """Run the test with new device tensors created on this path."""
    name = request.param
    if name != "core" and not _load(name):
        pytest.fail(f"path {name!r} is not importable/registered")
    with paths.activated(name):
        yield name


@pytest.fixture
def dev():
    return xc.device()


@pytest.fixture(autouse=True)
def _fresh_metrics():
    xc.metrics.reset()
    yield


def cyclic_garbage(fn) -> tuple[int, list]:
    """Run ``fn()`` with the cyclic collector off; (objects that only it could free, their type
    names). Tensors and nodes held in a reference cycle outlive their use until it runs (a dead
    intermediate then becomes an extra output of the next sync)."""
    import gc
    gc.collect()
    enabled = gc.isenabled()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        fn()
        found = gc.collect()
        return found, sorted({type(o).__name__ for o in gc.garbage})
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        if enabled:
            gc.enable()


def _device_tensors(x):
    if isinstance(x, torch.Tensor):
        if x.device.type == "hlo":
            yield x
    elif isinstance(x, (list, tuple)):
        for e in x:
            yield from _device_tensors(e)


# The backend the suite runs on (CI: "cpu"). XLA:TPU's float32 is not XLA:CPU's: its
# transcendentals agree with a float64 reference to four or five digits (KINDS.md), so a few
# training steps land 1e-5 to 4e-5 from eager (session 31 measured the 20 such cases of a TPU
# run). There, tolerances written for XLA:CPU take this floor (torch_xla's tests carry per-device
# precision overrides for the same reason); on the CPU they stand as written.
PLATFORM = xla_compat_jax.platform()
PLATFORM_TOLERANCE = {"tpu": (1e-3, 1e-4)}


def tolerance(rtol: float, atol: float) -> dict:
    """``rtol=, atol=`` (for ``torch.testing.assert_close``) comparing floating results with
    eager's on this platform."""
    floor = PLATFORM_TOLERANCE.get(PLATFORM)
    if floor is not None:
        rtol, atol = max(rtol, floor[0]), max(atol, floor[1])
    return {"rtol": rtol, "atol": atol}


def assert_same(actual, expected, rtol=1.3e-6, atol=1e-5, msg=""):
    """Compare a device tensor (or nested structure) with a CPU reference.

    The device tensors of a structure are synced together first: read one by one, each would
    run (and compile) a graph of its own."""
    if isinstance(expected, (list, tuple)):
        assert len(actual) == len(expected), msg
        pending = list(_device_tensors(actual))
        if len(pending) > 1:
            try:
                xc.sync(pending)
            except Exception:    # noqa: BLE001 - each read below raises its own error
                pass
        for a, e in zip(actual, expected):
            assert_same(a, e, rtol, atol, msg)
        return
    if isinstance(expected, torch.Tensor):
        a = actual.detach().cpu() if isinstance(actual, torch.Tensor) else torch.as_tensor(actual)
        assert a.dtype == expected.dtype, f"{msg} dtype {a.dtype} != {expected.dtype}"
        assert a.shape == expected.shape, f"{msg} shape {tuple(a.shape)} != {tuple(expected.shape)}"
        if expected.is_floating_point() or expected.is_complex():
            rtol, atol = tolerance(rtol, atol).values()
        torch.testing.assert_close(a, expected.detach(), rtol=rtol, atol=atol, equal_nan=True,
                                   msg=(lambda m: f"{msg}: {m}") if msg else None)
        return
    assert actual == expected, msg


def pytest_collection_modifyitems(config, items):
    """Tests of code the paths share run each case on one path in ``make test``, the paths
    taking turns (``sampling.alternate_paths``): the op families' lowering rules
    (``tests/lowering``) and modules that set ``ALTERNATE_PATHS = True``; cases a module lists
    in ``SLOW_CASES`` run in ``make test-slow`` only."""
    from tests.sampling import alternate_paths
    lowering = os.path.join(os.path.dirname(__file__), "lowering") + os.sep
    alternate_paths([item for item in items if str(item.path).startswith(lowering)
                     or getattr(getattr(item, "module", None), "ALTERNATE_PATHS", False)])
    # A module's SLOW_CASES (test ids) go to make test-slow: one path's run of a long case whose
    # subject make test covers on that path elsewhere (each names where).
    for item in items:
        if item.name in getattr(getattr(item, "module", None), "SLOW_CASES", ()):
            item.add_marker(pytest.mark.slow)
