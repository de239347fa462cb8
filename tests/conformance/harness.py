"""Run one OpInfo's samples on the hlo device under one path and compare them with CPU eager.

``run_op`` is the unit of work: it generates each dtype's samples on the CPU, picks up to ``cap``
of them (every distinct kind of sample first), runs the op (and its in-place variant) on the CPU
and on ``hlo`` under ``paths.activated(path)``, and tallies passed / failed / passed only through
CPU fallback / skipped per (variant, dtype). A sample never takes the run down: its error becomes
the tally's first error line and the device is settled (synced, pending IR dropped) before the next.
"""
from __future__ import annotations

import collections
import contextlib
import gc
import importlib
import math
import signal
import sys
import threading
import time
import unittest
import warnings
import zlib
from dataclasses import asdict, dataclass, field

import torch

import xla_compat as xc
from xla_compat import paths

from . import skips

# complex64 since session 25 (its sweep found 8 ops wrong: norms, variances, vdot,
# logcumsumexp's branch, complex uniform_, LDL, power rounding)
DTYPES = (torch.float32, torch.int64, torch.bool, torch.bfloat16, torch.complex64)
DEVICE = "hlo"
SAMPLE_TIMEOUT_S = 60


# -- OpInfo sample generation without a source read per iterator ------------------------------------
def _test_fn_from_frames():
    """torch's ``common_utils.extract_test_fn`` without ``inspect.stack()``: the same walk for a
    ``unittest.TestCase`` method up the stack, on raw frames. ``inspect.stack()`` reads every
    frame's source and scans ``sys.modules`` per frame; every OpInfo sample iterator calls it
    (``TrackedInputIter``), which under pytest cost ~0.1 s per iterator (60 s to list the out=
    sweep's first samples). Our tests are not TestCases, so the walk finds nothing either way."""
    frame = sys._getframe(1)
    while frame is not None:
        self_val = frame.f_locals.get("self")
        if isinstance(self_val, unittest.TestCase):
            *_, cls_name, test_name = self_val.id().rsplit(".", 2)
            if cls_name == type(self_val).__name__ and test_name.startswith("test"):
                return getattr(self_val, test_name).__func__
        frame = frame.f_back
    return None


def _cheap_sample_tracking() -> None:
    from torch.testing._internal import common_utils
    common_utils.extract_test_fn = _test_fn_from_frames


_cheap_sample_tracking()


# -- which paths exist ------------------------------------------------------------------------------
def load_paths(names) -> dict[str, str | None]:
    """Import each path's package; name -> None if registered, else why it is not."""
    out = {}
    for name in names:
        if name != "core":
            try:
                importlib.import_module(f"xla_compat.{name}")
            except Exception as e:  # a path being built may not import yet
                out[name] = f"xla_compat.{name} does not import: {first_line(e)}"
                continue
        out[name] = None if name in paths.names() else (
            f"path {name!r} is not registered (registered: {', '.join(paths.names())})")
    return out


# -- tallies ------------------------------------------------------------------------------------
@dataclass
class Tally:
    """Outcome of one (op, variant, dtype) on one path."""

    op: str
    variant: str            # "" (the op itself) or "inplace"
    dtype: str
    path: str
    passed: int = 0
    failed: int = 0
    fallback: int = 0       # matched CPU, but only because an op ran through CPU fallback
    skipped: int = 0
    samples_total: int = 0  # samples the OpInfo generates before the cap
    first_error: str = ""
    skip_reason: str = ""
    fallback_ops: dict = field(default_factory=dict)
    seconds: float = 0.0

    def as_dict(self) -> dict:
        return asdict(self)


def full_name(op) -> str:
    return f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name


def first_line(e: BaseException, limit: int = 240) -> str:
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    text = lines[0] if lines else ""
    # assert_close puts the numbers on later lines; keep the worst one.
    extra = [ln for ln in lines[1:] if ln.startswith(("Greatest absolute", "Mismatched elements"))]
    if extra:
        text += " (" + "; ".join(extra[:2]) + ")"
    return f"{type(e).__name__}: {text}"[:limit]


def dtype_name(dt: torch.dtype) -> str:
    return str(dt).removeprefix("torch.")


# -- choosing samples ---------------------------------------------------------------------------
def _kind(x):
    if isinstance(x, torch.Tensor):
        if x.layout != torch.strided:
            return ("T", str(x.layout), x.dim())
        return ("T", x.dim(), x.numel() == 0, x.is_contiguous())
    if isinstance(x, (list, tuple)):
        return (type(x).__name__, tuple(_kind(y) for y in x[:4]), len(x) > 4)
    if isinstance(x, dict):
        return tuple(sorted((k, _kind(v)) for k, v in x.items()))
    return type(x).__name__


def sample_kind(sample) -> tuple:
    """What distinguishes samples structurally: ranks, emptiness, layout, argument kinds."""
    return (_kind(sample.input), _kind(tuple(sample.args)), _kind(dict(sample.kwargs)))


def select(samples: list, cap: int) -> list:
    """Up to ``cap`` samples: round-robin over kinds, each kind's picks spread over its samples."""
    if cap <= 0 or len(samples) <= cap:
        return samples
    groups: dict = collections.defaultdict(list)
    for i, s in enumerate(samples):
        groups[sample_kind(s)].append(i)
    # each kind's members in an order whose every prefix spreads over the kind's range
    order = [[g[k] for k in _spread_indices(len(g))] for g in groups.values()]
    chosen = []
    rnd = 0
    while len(chosen) < cap:
        progressed = False
        for g in order:
            if rnd < len(g) and len(chosen) < cap:
                chosen.append(g[rnd])
                progressed = True
        if not progressed:
            break
        rnd += 1
    return [samples[i] for i in sorted(chosen)]


def _spread_indices(n: int) -> list[int]:
    """0, n-1, n/2, n/4, 3n/4, ...: a prefix of any length covers the range evenly."""
    out, seen = [], set()
    for k in [0, n - 1]:
        if k not in seen and 0 <= k < n:
            seen.add(k)
            out.append(k)
    step = n
    while len(out) < n:
        step = max(step // 2, 1)
        for k in range(0, n, step):
            if k not in seen:
                seen.add(k)
                out.append(k)
    return out


# -- moving samples -------------------------------------------------------------------------------
def with_storage(x: torch.Tensor, dev=DEVICE) -> torch.Tensor:
    """``x`` on ``dev`` as the same view of a copy of its whole storage (``.to`` would copy only
    the view's elements, and ops like as_strided on a partial view read outside them)."""
    n = x.untyped_storage().nbytes() // x.element_size()
    storage = torch.as_strided(x, (n,), (1,), 0)
    return storage.to(dev).as_strided(x.shape, x.stride(), x.storage_offset())


def to_device(x, dev=DEVICE):
    """Every tensor to ``dev``; ``device="cpu"`` arguments (factories) become ``dev``."""
    if isinstance(x, torch.Tensor):
        return x.to(dev)
    if isinstance(x, torch.device):
        return torch.device(dev) if x.type == "cpu" else x
    if isinstance(x, str) and x == "cpu":
        return dev
    if isinstance(x, tuple) and hasattr(x, "_fields"):
        return type(x)(*(to_device(y, dev) for y in x))
    if isinstance(x, (list, tuple)):
        return type(x)(to_device(y, dev) for y in x)
    if isinstance(x, dict):
        return {k: to_device(v, dev) for k, v in x.items()}
    return x


def to_cpu(x):
    if isinstance(x, torch.Tensor):
        return x.detach().cpu() if x.device.type != "cpu" else x.detach()
    if isinstance(x, (list, tuple)):
        return [to_cpu(y) for y in x]
    if isinstance(x, dict):
        return {k: to_cpu(v) for k, v in x.items()}
    return x


def clone(x):
    if isinstance(x, torch.Tensor):
        return x.clone()
    if isinstance(x, (list, tuple)):
        return type(x)(clone(y) for y in x)
    return x


# -- comparing ----------------------------------------------------------------------------------
def tolerance(op, out_dtype: torch.dtype, sample_dtype: torch.dtype | None = None
              ) -> tuple[float, float]:
    """(rtol, atol) for an output of ``out_dtype``: exact unless floating; else the dtype's
    default, loosened by op_db's own overrides (for the output's or the sample's dtype) and by
    ``skips.TOLERANCES``."""
    if not (out_dtype.is_floating_point or out_dtype.is_complex):
        return 0.0, 0.0
    rtol, atol = skips.DEFAULT_TOLERANCES.get(out_dtype, (1.3e-6, 1e-5))
    keys = {out_dtype, sample_dtype or out_dtype}
    for deco in _cpu_decorators(op):
        for d in getattr(deco, "decorators", [deco]):
            tols = getattr(d, "d", None)
            if not isinstance(tols, dict):
                continue
            for dt in keys & set(tols):
                t = tols[dt]
                if hasattr(t, "rtol"):
                    rtol, atol = max(rtol, t.rtol), max(atol, t.atol)
                elif isinstance(t, (int, float)):   # precisionOverride: an absolute tolerance
                    atol = max(atol, float(t))
    extra = skips.TOLERANCES.get(full_name(op))
    for dt in keys & set(extra[0] if extra else ()):
        r, a = extra[0][dt]
        rtol, atol = max(rtol, r), max(atol, a)
    return rtol, atol


def _cpu_decorators(op):
    for deco in getattr(op, "decorators", ()) or ():
        if getattr(deco, "device_type", None) not in (None, "cpu"):
            continue
        if getattr(deco, "active_if", True) is False:
            continue
        dts = getattr(deco, "dtypes", None)
        yield deco if dts is None else _DtypeFiltered(deco, dts)


class _DtypeFiltered:
    """A DecorateInfo restricted to some dtypes: its overrides only count for those."""

    def __init__(self, deco, dtypes):
        self.decorators = [_Restricted(d, dtypes) for d in deco.decorators]


class _Restricted:
    def __init__(self, d, dtypes):
        src = getattr(d, "d", None)
        self.d = {k: v for k, v in src.items() if k in dtypes} if isinstance(src, dict) else None


def compare(actual, expected, tol, where="output") -> None:
    """Raise AssertionError unless ``actual`` (on the CPU) matches ``expected``.

    ``tol(dtype) -> (rtol, atol)`` gives each output tensor's tolerance by its dtype."""
    if isinstance(expected, torch.Tensor):
        if not isinstance(actual, torch.Tensor):
            raise AssertionError(f"{where}: expected a tensor, got {type(actual).__name__}")
        if actual.dtype != expected.dtype:
            raise AssertionError(f"{where}: dtype {actual.dtype} != eager {expected.dtype}")
        if actual.shape != expected.shape:
            raise AssertionError(f"{where}: shape {tuple(actual.shape)} != eager "
                                 f"{tuple(expected.shape)}")
        rtol, atol = tol(expected.dtype)
        torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol, equal_nan=True,
                                   check_device=False, msg=None)
        return
    if isinstance(expected, (list, tuple)):
        if not isinstance(actual, (list, tuple)) or len(actual) != len(expected):
            raise AssertionError(f"{where}: structure differs from eager")
        for i, (a, e) in enumerate(zip(actual, expected)):
            compare(a, e, tol, f"{where}[{i}]")
        return
    if isinstance(expected, float) and isinstance(actual, (int, float)):
        rtol, atol = tol(torch.float32)  # a Python float usually comes from a float32 result
        if not (math.isclose(actual, expected, rel_tol=max(rtol, 1e-12), abs_tol=atol)
                or (math.isnan(actual) and math.isnan(expected))):
            raise AssertionError(f"{where}: {actual} != eager {expected}")
        return
    if actual != expected:
        raise AssertionError(f"{where}: {actual!r} != eager {expected!r}")


def _wide(x):
    """``x`` with float and complex tensors in float64/complex128 (for an exact reference)."""
    if isinstance(x, torch.Tensor):
        if x.is_complex():
            return x.to(torch.complex128)
        return x.to(torch.float64) if x.is_floating_point() else x
    if isinstance(x, (list, tuple)):
        return type(x)(_wide(e) for e in x)
    if isinstance(x, dict):
        return {k: _wide(v) for k, v in x.items()}
    return x


def compare_accuracy(actual, expected, exact, tol, where="output") -> None:
    """Raise AssertionError unless every element of ``actual`` equals eager's ``expected`` or is
    no farther from ``exact`` (the op in double precision) than twice eager's own distance from
    it, plus the dtype's tolerance (``skips.ACCURACY_JUDGED``)."""
    if isinstance(expected, (list, tuple)):
        for i, (a, e, x) in enumerate(zip(actual, expected, exact)):
            compare_accuracy(a, e, x, tol, f"{where}[{i}]")
        return
    if not isinstance(expected, torch.Tensor) or not (expected.is_floating_point()
                                                     or expected.is_complex()):
        return compare(actual, expected, tol, where)
    if actual.dtype != expected.dtype or actual.shape != expected.shape:
        return compare(actual, expected, tol, where)     # (raises, saying how)
    rtol, atol = tol(expected.dtype)
    wide = exact.dtype
    a, e = actual.to(wide), expected.to(wide)
    bound = 2 * (e - exact).abs() + atol + rtol * exact.abs()
    ok = (a == e) | (a.isnan() & e.isnan()) | ((a - exact).abs() <= bound)
    if not bool(ok.all()):
        bad = (~ok).nonzero()[0].tolist()
        raise AssertionError(
            f"{where}: {int((~ok).sum())} of {ok.numel()} elements farther from the "
            f"double-precision result than twice eager's error plus the tolerance; at {bad}: "
            f"device {actual[tuple(bad)].item()}, eager {expected[tuple(bad)].item()}, exact "
            f"{exact[tuple(bad)].item()}")


def compare_metadata(actual, expected, where="output") -> None:
    if isinstance(expected, torch.Tensor):
        if not isinstance(actual, torch.Tensor) or actual.dtype != expected.dtype \
                or actual.shape != expected.shape:
            raise AssertionError(f"{where}: {_meta(actual)} != eager {_meta(expected)}")
        return
    if isinstance(expected, (list, tuple)):
        if not isinstance(actual, (list, tuple)) or len(actual) != len(expected):
            raise AssertionError(f"{where}: structure differs from eager")
        for i, (a, e) in enumerate(zip(actual, expected)):
            compare_metadata(a, e, f"{where}[{i}]")


def compare_random(actual, expected, where="output") -> None:
    """Shape and dtype exactly; for 100+ elements, mean/std or quantiles agree with eager's."""
    compare_metadata(actual, expected, where)
    if isinstance(expected, (list, tuple)):
        for i, (a, e) in enumerate(zip(actual, expected)):
            compare_random(a, e, f"{where}[{i}]")
        return
    if not isinstance(expected, torch.Tensor) or expected.numel() == 0:
        return
    a, e = actual.double().flatten(), expected.double().flatten()
    if bool(torch.isfinite(e).all()) and not bool(torch.isfinite(a).all()):
        raise AssertionError(f"{where}: non-finite values where eager has none")
    if e.numel() < 100:
        return
    if _moments_agree(a, e) or _quantiles_agree(a, e):
        return
    raise AssertionError(f"{where}: statistics differ: mean {a.mean():.4g} vs eager {e.mean():.4g}, "
                         f"std {a.std():.4g} vs {e.std():.4g}, median {a.median():.4g} vs "
                         f"{e.median():.4g}")


def _moments_agree(a, e) -> bool:
    sd_a, sd_e = float(a.std()), float(e.std())
    if not (math.isfinite(sd_a) and math.isfinite(sd_e)):
        return False
    slack = 0.2 * sd_e + 4 * sd_e * math.sqrt(2.0 / e.numel()) + 1e-6
    if abs(float(a.mean()) - float(e.mean())) > slack:
        return False
    return sd_e < 1e-6 and sd_a < 1e-3 or 0.6 <= sd_a / max(sd_e, 1e-12) <= 1.67


def _quantiles_agree(a, e) -> bool:
    q = torch.tensor([0.1, 0.5, 0.9], dtype=torch.float64)
    qa, qe = torch.quantile(a, q), torch.quantile(e, q)
    spread = float(qe[2] - qe[0]) + 1e-6
    return bool(((qa - qe).abs() <= 0.25 * spread).all())


def _meta(x):
    return f"{x.dtype}{list(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__


def describe(sample) -> str:
    def d(x):
        if isinstance(x, torch.Tensor):
            return _meta(x).replace("torch.", "")
        if isinstance(x, (list, tuple)):
            inner = ", ".join(d(y) for y in x[:3])
            return f"[{inner}{', ...' if len(x) > 3 else ''}]"
        return repr(x)[:30]
    parts = [d(sample.input)] + [d(a) for a in sample.args[:3]]
    parts += [f"{k}={d(v)}" for k, v in list(sample.kwargs.items())[:3]]
    return ", ".join(parts)[:120]


# -- running --------------------------------------------------------------------------------------
class SampleTimeout(Exception):
    pass


@contextlib.contextmanager
def time_limit(seconds: float):
    """SIGALRM guard against a sample that hangs in Python; the run.py watchdog covers the rest."""
    if seconds <= 0 or threading.current_thread() is not threading.main_thread() \
            or signal.getitimer(signal.ITIMER_REAL)[0] > 0:   # off thread, or an outer guard
        yield
        return

    def on_alarm(signum, frame):
        raise SampleTimeout(f"sample took longer than {seconds:.0f}s")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _fallbacks() -> dict[str, int]:
    """CPU-fallback counters: ``aten::<op>`` (``<namespace>::<op>`` for non-aten ops)."""
    return {k: v for k, v in xc.metrics.counters().items() if "::" in k}


def settle() -> str | None:
    """Sync whatever a sample left pending; if that fails, drop it so it cannot poison the next."""
    try:
        xc.sync()
        return None
    except Exception as e:
        err = first_line(e)
    gc.collect()
    _drop_pending()
    try:
        xc.sync()
    except Exception:
        _drop_pending()
    return err


def _drop_pending() -> None:
    import jax.numpy as jnp
    from xla_compat.lazy import ir, rng
    from xla_compat.lazy.tensor import live_tensors
    for t in live_tensors():
        try:
            v = t.__dict__.get("_value") or t._value
            if not v.node.is_leaf:
                aval = v.node.avals[v.index]
                t._value = ir.leaf(jnp.zeros(aval.shape, aval.dtype))
                t._last_data = t._value
        except Exception:  # a path's tensor that manages its value itself
            pass
    if rng.pending() is not None:
        rng.manual_seed(0)


@dataclass
class _Case:
    """One sample made ready: its eager result and its device arguments."""

    sample: object
    expected: object
    expected_alias: bool
    cpu_in: object
    dev_in: object = None
    dev_args: tuple = ()
    dev_kwargs: dict = field(default_factory=dict)
    out: object = None


def _prepare(op, fn, sample, inplace: bool):
    """A ``_Case``, or ("skip" | "fail", message) when the sample cannot run."""
    seed = zlib.crc32(full_name(op).encode())
    cpu_in = clone(sample.input) if inplace else sample.input
    try:
        with time_limit(SAMPLE_TIMEOUT_S):
            if op.variant_test_name == "partial_views" and not inplace:
                dev_in = with_storage(sample.input)   # the variant is about the storage around the view
            else:
                dev_in = to_device(clone(sample.input) if inplace else sample.input)
            dev_args, dev_kwargs = to_device(tuple(sample.args)), to_device(dict(sample.kwargs))
    except Exception as e:
        settle()
        return "fail", f"moving the sample to hlo: {first_line(e)} [{describe(sample)}]"
    torch.manual_seed(seed)
    try:
        expected = fn(cpu_in, *sample.args, **sample.kwargs)
    except Exception as e:
        return "skip", f"eager raises: {first_line(e, 120)}"
    torch.manual_seed(seed)
    case = _Case(sample, None, inplace and expected is cpu_in, cpu_in, dev_in, dev_args, dev_kwargs)
    case.expected = to_cpu(expected)
    return case


def _check(op, case: _Case, dtype, mode: str, inplace: bool) -> None:
    """Compare a case whose device output is in ``case.out``; raise AssertionError if it differs."""
    def tol(out_dtype):
        return tolerance(op, out_dtype, dtype)

    check = (compare_random if mode == "random" else
             compare_metadata if mode == "metadata" else
             lambda a, e, where="output": compare(a, e, tol, where))
    actual = to_cpu(case.out)
    if full_name(op) in skips.SIGN_ALIGNED:
        actual = skips.align_signs(full_name(op), actual, case.expected)
    if full_name(op) in skips.TIE_ALIGNED:
        actual = skips.align_ties(full_name(op), case.sample, actual, case.expected)
    try:
        check(actual, case.expected)
    except AssertionError:
        if inplace or mode != "exact" or not skips.accuracy_judged(full_name(op), dtype):
            raise
        s = case.sample
        exact = op(_wide(s.input), *_wide(tuple(s.args)), **_wide(dict(s.kwargs)))
        compare_accuracy(actual, case.expected, exact, tol)
    if inplace:
        check(to_cpu(case.dev_in), to_cpu(case.cpu_in), "mutated input")
        if case.expected_alias and case.out is not case.dev_in:
            raise AssertionError("in-place variant did not return its input")


def run_sample(op, fn, sample, dtype, mode: str, inplace: bool) -> tuple[str, str, dict]:
    """One sample alone: ("pass" | "fail" | "fallback" | "skip", message, fallback counters)."""
    before = _fallbacks()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        case = _prepare(op, fn, sample, inplace)
        if not isinstance(case, _Case):
            return case[0], case[1], {}
        try:
            with time_limit(SAMPLE_TIMEOUT_S):
                case.out = fn(case.dev_in, *case.dev_args, **case.dev_kwargs)
                _check(op, case, dtype, mode, inplace)
            error = None
        except Exception as e:
            error = first_line(e)
        del case
        late = settle()
    if error is None and late is not None:
        error = f"sync after the sample failed: {late}"
    used = {k: v - before.get(k, 0) for k, v in _fallbacks().items() if v > before.get(k, 0)}
    if error is not None:
        return "fail", f"{error} [{describe(sample)}]", used
    return ("fallback" if used else "pass"), "", used


def run_batch(op, fn, samples, dtype, mode: str, inplace: bool) -> list:
    """Fast path: trace every sample, sync ONCE (one compile), compare.

    Returns one result per sample, or None for samples to rerun alone: any sample whose trace
    raised or whose output differs, and all of them if the shared sync fails or any op fell back
    to the CPU (fallback counts are attributed per sample only when run alone).
    """
    results: list = [None] * len(samples)
    cases: dict[int, _Case] = {}
    before = _fallbacks()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            with time_limit(SAMPLE_TIMEOUT_S * max(4, len(samples)) / 4):
                for i, sample in enumerate(samples):
                    case = _prepare(op, fn, sample, inplace)
                    if not isinstance(case, _Case):
                        results[i] = (case[0], case[1], {})
                        continue
                    try:
                        case.out = fn(case.dev_in, *case.dev_args, **case.dev_kwargs)
                        cases[i] = case
                    except Exception:
                        pass  # rerun alone for its own error line
                xc.sync()
        except Exception:
            cases.clear()
            settle()
            return [r if r is not None and r[0] == "skip" else None for r in results]
        if _fallbacks() != before:
            cases.clear()
            settle()
            return [r if r is not None and r[0] == "skip" else None for r in results]
        for i, case in cases.items():
            try:
                _check(op, case, dtype, mode, inplace)
                results[i] = ("pass", "", {})
            except Exception:
                pass
        cases.clear()
        settle()
    return results


def op_dtypes(op, wanted=None) -> list[torch.dtype]:
    """The dtypes of ``wanted`` (default: the harness's DTYPES) the op supports on CPU; by
    default, float64 for ops that support none of them."""
    dts = [dt for dt in (wanted or DTYPES) if op.supports_dtype(dt, "cpu")]
    if not dts and wanted is None and op.supports_dtype(torch.float64, "cpu"):
        dts = [torch.float64]
    return dts


def mode_of(name: str) -> str:
    if name in skips.RANDOM_OPS:
        return "random"
    if name in skips.METADATA_ONLY:
        return "metadata"
    return "exact"


def run_op(op, path: str, cap: int = 24, dtypes=None, variants=("", "inplace"),
           max_samples: int | None = None, batched: bool = True) -> list[Tally]:
    """Every (variant, dtype) tally of one OpInfo on one path.

    ``batched``: try all of a (variant, dtype)'s samples in one graph first (``run_batch``);
    samples that do not pass there run alone, and only their lone result counts.
    """
    name = full_name(op)
    mode = mode_of(name)
    out: list[Tally] = []
    if name in skips.SKIP_OPS:
        return [Tally(name, "", "-", path, skipped=1, skip_reason=skips.SKIP_OPS[name])]
    supported = op_dtypes(op, dtypes)
    asked = "/".join(map(dtype_name, dtypes or (*DTYPES, torch.float64)))
    if not supported:
        return [Tally(name, "", "-", path, skipped=1,
                      skip_reason=f"supports none of {asked} on CPU")]
    for dtype in supported:
        # bfloat16: half the cap; a cap of 0 means every sample for every dtype
        dcap = cap if dtype != torch.bfloat16 or cap == 0 else max(cap // 2, 1)
        try:
            torch.manual_seed(zlib.crc32(f"{name}/{dtype}".encode()))
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                samples = list(op.sample_inputs("cpu", dtype, requires_grad=False))
        except Exception as e:
            out.append(Tally(name, "", dtype_name(dtype), path, failed=1,
                             first_error=f"generating samples: {first_line(e)}"))
            continue
        chosen = select(samples, dcap)
        if max_samples is not None:
            chosen = chosen[:max_samples]
        for variant in variants:
            fn = op if variant == "" else op.inplace_variant
            if fn is None:
                continue
            tally = Tally(name, variant, dtype_name(dtype), path, samples_total=len(samples))
            start = time.perf_counter()
            inplace = variant != ""
            with paths.activated(path):
                reasons = [skips.skip_sample(name, variant, dtype, s) for s in chosen]
                runnable = [s for s, r in zip(chosen, reasons) if r is None]
                for r in reasons:
                    if r is not None:
                        _count(tally, "skip", r, {})
                batch = run_batch(op, fn, runnable, dtype, mode, inplace) if batched else \
                    [None] * len(runnable)
                for sample, res in zip(runnable, batch):
                    if res is None:
                        res = run_sample(op, fn, sample, dtype, mode, inplace)
                    _count(tally, *res)
            tally.seconds = round(time.perf_counter() - start, 3)
            out.append(tally)
    return out


def _count(tally: Tally, status: str, msg: str, used: dict) -> None:
    if status == "pass":
        tally.passed += 1
    elif status == "fallback":
        tally.fallback += 1
    elif status == "skip":
        tally.skipped += 1
        tally.skip_reason = tally.skip_reason or msg
    else:
        tally.failed += 1
        tally.first_error = tally.first_error or msg
    for k, v in used.items():
        tally.fallback_ops[k] = tally.fallback_ops.get(k, 0) + v
