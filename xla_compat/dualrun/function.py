"""Function-level dual run: run a step on the authoritative and the shadow path, compare, report.

The shape of GitHub's Scientist for tensors. The authoritative path is the one the step's
device tensors live on (else the dispatch decision); the shadow is the other one. Arguments are
cloned onto the shadow (``clone.py``) before anything runs; both runs start from the same CPU,
device, ``random`` and numpy RNG states, and the authoritative RNG state is put back afterwards,
so the program continues exactly as if the shadow had never run. Each run ends with a sync
(``xc.sync()``, what a training step ends with anyway) so wall times include execution.
"""
from __future__ import annotations

import contextlib
import functools
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np
import torch
import wrapt

from .. import dispatch, executor, metrics, paths, settings
from ..lazy import rng as device_rng
from . import clone, detached, modes, report
from .compare import IgnoreRules, Mismatch, compare_exceptions, compare_values

PATHS = ("legacy", "functional")


class MismatchError(AssertionError):
    """Strict dual-run mode: the shadow path disagreed with the authoritative one."""

    def __init__(self, result):
        self.result = result
        lines = [f"xla_compat: dual run of {result.name} (step {result.step}) found "
                 f"{len(result.mismatches)} mismatch(es) between the {result.authoritative} "
                 f"(authoritative) and the {result.shadow} (shadow) path:"]
        lines += [f"  {m}" for m in result.mismatches[:10]]
        fd = result.first_divergence
        if fd and fd.get("level") == "op":
            lines.append(f"  first divergent op: {fd.get('op')} at {fd.get('source')}")
        lines.append("  Run the step under `with xc.lockstep():` (or XLA_DUAL_RUN=lockstep) to "
                     "find the first op that differs; ignore known differences with "
                     "XLA_DUAL_RUN_IGNORE=name:<glob>.")
        super().__init__("\n".join(lines))


@dataclass(frozen=True)
class DualRunResult:
    """The authoritative result of one dual run, and how the shadow path compared."""

    value: Any
    match: bool
    mismatches: tuple[Mismatch, ...]
    ignored: tuple[Mismatch, ...]
    authoritative: str
    shadow: str
    name: str
    step: Optional[int]
    mode: str
    wall_s: dict = field(default_factory=dict)          # path -> seconds (trace + sync)
    graph_nodes: dict = field(default_factory=dict)     # path -> IR nodes traced
    authoritative_exception: Optional[str] = None
    shadow_exception: Optional[str] = None
    first_divergence: Optional[dict] = None

    def record(self) -> dict:
        """The JSON report line (with the dispatch decision)."""
        decision = dispatch.explain()
        return {"time": time.time(), "name": self.name, "step": self.step, "mode": self.mode,
                "match": self.match, "authoritative": self.authoritative,
                "shadow": self.shadow, "wall_s": self.wall_s, "graph_nodes": self.graph_nodes,
                "mismatches": [m.as_dict() for m in self.mismatches],
                "ignored": [m.as_dict() for m in self.ignored],
                "authoritative_exception": self.authoritative_exception,
                "shadow_exception": self.shadow_exception,
                "first_divergence": self.first_divergence,
                "decision": decision.as_dict() if decision is not None else None}


# -- keeping RNG states and their buffers ------------------------------------------------------

_protected: list = []          # device values a dual run will reuse: never donate their buffers
_local = threading.local()


def _protected_values():
    return list(_protected)


executor.register_value_holder(_protected_values)


@dataclass(frozen=True)
class _RngState:
    """Every RNG a step may draw from."""

    cpu: torch.Tensor
    device: Any
    py: Any
    np: Any

    @classmethod
    def take(cls) -> "_RngState":
        return cls(torch.get_rng_state(), device_rng.state(), random.getstate(),
                   np.random.get_state())

    def restore(self) -> None:
        torch.set_rng_state(self.cpu)
        device_rng.advance(self.device)
        random.setstate(self.py)
        np.random.set_state(self.np)


# -- running one side --------------------------------------------------------------------------

@dataclass
class _Run:
    out: Any = None
    error: Optional[BaseException] = None
    wall_s: float = 0.0
    nodes: int = 0


def _sync() -> None:
    import xla_compat
    xla_compat.sync()


def _run(step, args, kwargs, path: str) -> _Run:
    r = _Run()
    nodes0 = metrics.counter("IrNodes")
    start = time.perf_counter()
    with dispatch.use_path(path):
        try:
            r.out = step(*args, **kwargs)
            _sync()
        except Exception as e:  # recorded; the authoritative one is re-raised by the caller
            r.error = e
    r.wall_s = time.perf_counter() - start
    r.nodes = metrics.counter("IrNodes") - nodes0
    return r


def _run_shadow_here(step, args, kwargs, path: str, rng_start) -> _Run:
    """The shadow run on this thread. Its device random numbers come from a stream of its own
    starting at ``rng_start`` (``rng.private``), the nodes it creates are recorded, and its
    closing sync materialises only pending work that reaches them (``detached.close``), as a
    graph of its own, outside the device lock, without donation: never a full sync, which would
    take in whatever the authoritative thread has pending by then and roll it back if the
    shadow's part failed."""
    r = _Run()
    nodes0 = metrics.counter("IrNodes")
    start = time.perf_counter()
    owned = detached.Owned()
    _protected.append(rng_start)         # the stream's first state: never donated under it
    try:
        with dispatch.use_path(path), device_rng.private(rng_start):
            try:
                with detached.recording(owned):
                    r.out = step(*args, **kwargs)
                mine = [t for t in clone.named_state(args, kwargs).values()
                        if isinstance(t, torch.Tensor)]
                mine += [t for _, t in _named_outputs(r.out)]
                detached.close(owned, mine)
            except Exception as e:  # recorded; a shadow's error is a finding
                r.error = e
    finally:
        _protected.remove(rng_start)
    r.wall_s = time.perf_counter() - start
    r.nodes = metrics.counter("IrNodes") - nodes0
    return r


def _run_shadow(step, args, kwargs, path: str, timeout_s: Optional[float],
                rng_start) -> Optional[_Run]:
    """The shadow run, or None when it took longer than ``timeout_s`` and was abandoned.

    With a timeout the shadow runs in a daemon worker thread and the caller stops waiting at the
    deadline. The thread cannot be killed: it may finish later. It only ever holds the cloned
    arguments, so it cannot write authoritative tensors; its closing sync computes only its own
    work, outside the device lock (a graph that hangs in XLA is abandoned like a hang in the
    step's code); device random numbers it draws late come from its own stream. Draws from the
    CPU generators (torch, ``random``, numpy) are process-wide: a late one advances them.
    """
    if timeout_s is None:
        return _run_shadow_here(step, args, kwargs, path, rng_start)
    _abandoned[:] = [t for t in _abandoned if t.is_alive()]
    if _abandoned:       # a hung XLA execution holds a device thread: do not start another
        metrics.inc("DualRunShadowTimeout")
        return None
    box: list[_Run] = []
    worker = threading.Thread(
        target=lambda: box.append(_run_shadow_here(step, args, kwargs, path, rng_start)),
        name=f"xla_compat-dual-run-shadow-{path}", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive() or not box:
        _abandoned.append(worker)
        metrics.inc("DualRunShadowTimeout")
        return None
    return box[0]


_abandoned: list = []      # shadow threads abandoned at the timeout and still running


def _first_path(x) -> Optional[str]:
    if isinstance(x, torch.Tensor):
        return paths.of(x)
    if isinstance(x, torch.nn.Module):
        for t in list(x.parameters()) + list(x.buffers()):
            p = paths.of(t)
            if p is not None:
                return p
        return None
    if isinstance(x, dict):
        x = list(x.values())
    if isinstance(x, (list, tuple)):
        for v in x:
            p = _first_path(v)
            if p is not None:
                return p
    return None


def authoritative_path(args=(), kwargs=None) -> str:
    """The path the arguments live on, else the path new tensors get (the dispatch decision)."""
    p = _first_path((args, kwargs or {}))
    return p if p is not None else dispatch.path()


def shadow_of(auth: str) -> str:
    if auth not in PATHS:
        raise ValueError(f"xla_compat: dual run needs the legacy or the functional path as the "
                         f"authoritative one, got {auth!r}; pick one with xc.use_path(...)")
    return PATHS[1 - PATHS.index(auth)]


def _error_text(e: Optional[BaseException]) -> Optional[str]:
    if e is None:
        return None
    text = str(e)
    if len(text) > 2000:      # XLA quotes a host callback's whole traceback: keep its last line
        root = e
        while root.__cause__ is not None:
            root = root.__cause__
        last = (str(root).strip().splitlines() or [""])[-1].strip()
        text = f"{text[:1500]} ... {last[:400]}"
    return f"{type(e).__name__}: {text}"


# -- the dual run ----------------------------------------------------------------------------

def run_both(step, args: tuple, kwargs: dict, *, name: str, step_no: Optional[int] = None,
             mode: str = "full", strict: bool = False,
             ignore: IgnoreRules | None = None,
             timeout_s: Optional[float] = None) -> DualRunResult:
    """Run ``step`` on both paths from identical state; record, and return the comparison.

    ``timeout_s`` (default XLA_DUAL_RUN_TIMEOUT, else none) bounds the shadow run: past it the
    shadow is abandoned (see ``_run_shadow``) and recorded as a "shadow timed out" mismatch."""
    if timeout_s is None:
        timeout_s = settings.get().dual_run_timeout
    auth = authoritative_path(args, kwargs)
    shadow = shadow_of(auth)
    ignore = (ignore or IgnoreRules()) + IgnoreRules.from_settings()
    rng0 = _RngState.take()
    _protected.append(rng0.device)
    pending_rng = not rng0.device.node.is_leaf
    try:
        cloner = clone.Cloner(shadow)
        s_args, s_kwargs = cloner.clone_all(args, kwargs)
        a_state, s_state = clone.named_state(args, kwargs), clone.named_state(s_args, s_kwargs)
        a_before, s_before = clone.versions(a_state), clone.versions(s_state)
        # A pending RNG state's graph leaves are not protected by the holder: no donation then.
        with settings.override(donate=False) if pending_rng else contextlib.nullcontext():
            a = _run(step, args, kwargs, auth)
        rng1 = _RngState.take()
        rng0.restore()
        s = _run_shadow(step, s_args, s_kwargs, shadow, timeout_s, rng0.device)
        rng1.restore()
    finally:
        _protected.remove(rng0.device)

    found: list[Mismatch] = []
    timed_out = s is None
    if timed_out:
        found.append(Mismatch("shadow", "timeout", f"shadow timed out: the {shadow} path took "
                              f"longer than {timeout_s:g} s and was abandoned, or an earlier "
                              f"abandoned shadow still runs and none was started (raise "
                              f"XLA_DUAL_RUN_TIMEOUT if the step is just slow)"))
        s = _Run(wall_s=float(timeout_s))
    exc = None if timed_out else compare_exceptions(a.error, s.error, (auth, shadow))
    if exc is not None:
        found.append(exc)
    if a.error is None and s.error is None and not timed_out:
        found += _compare_outputs(a.out, s.out, a_state, s_state)
        found += _compare_mutations(args, kwargs, s_args, s_kwargs, a_before, s_before)
    mismatches = tuple(m for m in found if not ignore.ignores_name(m.name))
    ignored = tuple(m for m in found if ignore.ignores_name(m.name))
    first = None
    if mismatches:
        first = {"level": "function", **mismatches[0].as_dict()}
    result = DualRunResult(
        value=a.out, match=not mismatches, mismatches=mismatches, ignored=ignored,
        authoritative=auth, shadow=shadow, name=name, step=step_no, mode=mode,
        wall_s={auth: a.wall_s, shadow: s.wall_s}, graph_nodes={auth: a.nodes, shadow: s.nodes},
        authoritative_exception=_error_text(a.error), shadow_exception=_error_text(s.error),
        first_divergence=first)
    finish(result)
    if a.error is not None:
        raise a.error
    if strict and not result.match:
        raise MismatchError(result)
    return result


def finish(result: DualRunResult) -> None:
    """Count, report, and remember ``result`` (lockstep uses this too)."""
    metrics.inc("DualRunMatch" if result.match else "DualRunMismatch")
    if result.ignored:
        metrics.inc("DualRunIgnored", len(result.ignored))
    report.append(result.record())
    _local.last = result


def last_result() -> Optional[DualRunResult]:
    """The most recent dual run's result in this thread (what a decorated step compared)."""
    return getattr(_local, "last", None)


def _named_outputs(x, prefix="output"):
    if isinstance(x, torch.Tensor):
        yield prefix, x
    elif isinstance(x, dict):
        for k, v in x.items():
            yield from _named_outputs(v, f"{prefix}[{k!r}]")
    elif isinstance(x, (list, tuple)):
        for i, v in enumerate(x):
            yield from _named_outputs(v, f"{prefix}[{i}]")


def _aliases(out: torch.Tensor, state: dict) -> list[str]:
    key = clone.alias_key(out)
    return sorted(n for n, t in state.items()
                  if t is not None and not n.endswith(".grad") and clone.alias_key(t) == key)


def _compare_outputs(a_out, s_out, a_state, s_state) -> list[Mismatch]:
    found = compare_values("output", a_out, s_out)
    s_named = dict(_named_outputs(s_out))
    for name, t in _named_outputs(a_out):
        other = s_named.get(name)
        if other is None:
            continue
        a_alias, s_alias = _aliases(t, a_state), _aliases(other, s_state)
        if a_alias != s_alias:
            found.append(Mismatch(name, "alias", f"aliases {a_alias or 'no input'} on the "
                                  f"authoritative path but {s_alias or 'no input'} on the shadow"))
    return found


def _compare_mutations(args, kwargs, s_args, s_kwargs, a_before, s_before) -> list[Mismatch]:
    a_after = clone.named_state(args, kwargs)
    s_after = clone.named_state(s_args, s_kwargs)
    a_ver, s_ver = clone.versions(a_after), clone.versions(s_after)
    found = []
    for n in sorted(set(a_after) | set(s_after) | set(a_before) | set(s_before)):
        changed = a_ver.get(n) != a_before.get(n) or s_ver.get(n) != s_before.get(n)
        if not changed:
            continue
        a, s = a_after.get(n), s_after.get(n)
        label = f"input {n}"
        if a is None or s is None:
            if a is not s:
                found.append(Mismatch(label, "missing", f"{'None' if a is None else 'a tensor'} "
                                      f"on the authoritative path, {'None' if s is None else 'a tensor'} "
                                      f"on the shadow"))
            continue
        found += compare_values(label, a, s)
    return found


# -- the public entry points -----------------------------------------------------------------

def _step_name(fn) -> str:
    fn = getattr(fn, "__wrapped__", fn)
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


def dual_run(step, *args, **kwargs) -> DualRunResult:
    """Run ``step(*args, **kwargs)`` on both paths and compare; ``.value`` is the authoritative
    result. Raises ``MismatchError`` on a mismatch when XLA_DUAL_RUN=strict."""
    name = _step_name(step)
    mode = modes.current()
    return run_both(step, args, kwargs, name=name, step_no=modes.steps.next(name),
                    mode="explicit", strict=mode.strict)


def dual_run_step(fn=None, *, mode: str | None = None, rate: float | None = None,
                  name: str | None = None, ignore: tuple[str, ...] = (),
                  timeout_s: float | None = None):
    """Decorator: the step dual-runs as the mode says (XLA_DUAL_RUN, or ``mode=``) and returns
    the authoritative result unchanged; ``last_result()`` holds the comparison.

    off: run once. sample: dual-run a ``rate`` fraction of calls, chosen by call number, the
    same calls on every rerun. strict: dual-run every call, raise MismatchError on a mismatch.
    lockstep: run once; the process-wide lockstep (XLA_DUAL_RUN=lockstep) compares op by op.
    ``timeout_s`` (default XLA_DUAL_RUN_TIMEOUT) abandons a shadow run that takes longer.
    """
    if fn is None:
        return functools.partial(dual_run_step, mode=mode, rate=rate, name=name, ignore=ignore,
                                 timeout_s=timeout_s)
    rules = IgnoreRules.parse(ignore)
    step_name = name or _step_name(fn)

    @wrapt.decorator
    def wrapper(wrapped, instance, args, kwargs):
        m = modes.current(mode, rate)
        if m.name == "off":
            return wrapped(*args, **kwargs)
        n = modes.steps.next(step_name)
        if not m.runs_both(step_name, n):
            if m.name == "sample":
                metrics.inc("DualRunSkipped")
            return wrapped(*args, **kwargs)
        return run_both(wrapped, args, kwargs, name=step_name, step_no=n, mode=m.name,
                        strict=m.strict, ignore=rules, timeout_s=timeout_s).value

    return wrapper(fn)
