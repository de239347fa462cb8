"""Lockstep dual run: every aten op runs on a legacy twin and a functional twin, side by side.

Inside ``with xc.lockstep():`` (or everywhere under XLA_DUAL_RUN=lockstep) new device tensors
are ``PairTensor``s. Autograd sees only the pair; each aten op reaching the pair runs on both
twins, each under its own path. After every op the values the op produced or wrote (its outputs,
mutated arguments and the tensors those view) are snapshotted as probe tensors, which the next
sync materialises with everything else. After the sync the probes are compared in op order: the
first op whose values differ is the first divergence, with its Python line and shapes. Then the
IR nodes that op created on each path are each checked against PyTorch on the CPU (same inputs,
same aten op) to name the lowering that is wrong, with the line that created it.

Lockstep is a debugging mode: every op's values become graph outputs, and buffers a probe's
graph reads are not donated until the probe has been compared.

A shadow path that fails never reaches the caller. Before each sync the shadow's pending work
(every pending value whose graph holds a node the shadow created) is compiled and run as a graph
of its own, outside the device lock (``detached.py``); only then does the sync run, with the
authoritative work alone. A shadow lowering, XLA compile or execution that raises, or that takes
longer than XLA_DUAL_RUN_TIMEOUT, changes no tensor: it is recorded as a mismatch naming the op
that created the failing node (found by bisecting the op log when XLA does not say), the shadow
twins are dropped, and the session goes on with the authoritative path alone. The twins of a
random op draw the same numbers, from the RNG state the authoritative path would have used.
(A shadow that hangs inside tracing an op holds the device lock in the caller's thread: no
timeout can end that.)
"""
from __future__ import annotations

import contextlib
import gc
import sys
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Optional

import jax
import numpy as np
import torch

from .. import device as _device, dispatch, executor, metrics, paths, settings
from ..lazy import ir
from ..lazy.ir import DeviceData, Value
from ..lazy import rng as device_rng
from ..lazy.tensor import DEVICE, LazyTensor, live_tensors, lock
from . import detached, oracle
from .compare import IgnoreRules, Mismatch, compare_arrays, compare_values
from .function import PATHS, DualRunResult, MismatchError, finish, shadow_of
from .oracle import flat as _flat, tree_map as _map, where as _where

aten = torch.ops.aten
_local = threading.local()          # depth > 0 while a twin runs an op (factories stay plain)


def _inside() -> bool:
    return getattr(_local, "depth", 0) > 0


_FUNCTIONALIZE = torch._C.DispatchKeySet(torch._C.DispatchKey.Functionalize)


@contextlib.contextmanager
def _twin(path: str):
    """Run an op on ``path``'s twin. Inside ``__torch_dispatch__`` PyTorch excludes the keys
    above Python, Functionalize among them; the functional twin needs it back."""
    _local.depth = getattr(_local, "depth", 0) + 1
    include = torch._C._dispatch_tls_local_include_set()
    exclude = torch._C._dispatch_tls_local_exclude_set() - _FUNCTIONALIZE
    try:
        with torch._C._ForceDispatchKeyGuard(include, exclude), paths.activated(path):
            yield
    finally:
        _local.depth -= 1


def _user_source() -> Optional[tuple]:
    f = sys._getframe(2)
    while f is not None:
        name = f.f_code.co_filename
        if not name.startswith(ir._SKIP) and not name.startswith("<"):
            return (name, f.f_lineno, f.f_code.co_name)
        f = f.f_back
    return None


def _describe(x) -> str:
    if isinstance(x, torch.Tensor):
        return f"{str(x.dtype).replace('torch.', '')}{list(x.shape)}"
    return repr(x)


# -- the pair tensor ---------------------------------------------------------------------------

class PairTensor(torch.Tensor):
    """A device tensor with a legacy twin and a functional twin; ops run on both."""

    __torch_function__ = torch._C._disabled_torch_function_impl

    @staticmethod
    def __new__(cls, twins: dict, session: "Lockstep"):
        a = twins[session.auth]
        t = torch.Tensor._make_wrapper_subclass(
            cls, a.shape, strides=a.stride(), storage_offset=a.storage_offset(), dtype=a.dtype,
            device=DEVICE, requires_grad=False)
        t._twins = twins
        t._session = session
        t._view_of = None
        session.pairs.add(t)
        return t

    def __init__(self, *args, **kwargs):
        pass

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        session = next(a._session for a in _flat((args, kwargs)) if isinstance(a, PairTensor))
        return session.run_op(func, args, kwargs or {})

    def twin(self, path: str):
        """This tensor on ``path`` (None if that path failed earlier)."""
        return self._twins.get(path)

    def __repr__(self, *, tensor_contents=None):
        a = self._twins[self._session.auth]
        return f"PairTensor(auth={self._session.auth}, {a!r})"


class _Missing(Exception):
    """A shadow twin is missing (the shadow failed earlier): skip the shadow for this op."""


def _value_of(t, path: str) -> Value:
    """The IR value a twin holds now (applies pending alias updates on its path)."""
    return paths.get(path).inner(t)._value


# -- records -----------------------------------------------------------------------------------

@dataclass
class OpRecord:
    """One op run on both paths: where it came from and the probes of the values it produced."""

    index: int
    op: str
    source: Optional[tuple]
    inputs: list
    outputs: list
    first_node: int
    last_node: int
    checks: list = field(default_factory=list)    # (label, torch dtype, {path: probe LazyTensor})
    values: dict = field(default_factory=dict)    # path -> [Value] as snapshotted (pre-sync)
    problem: Optional[Mismatch] = None            # raised/returned differently at trace time
    culprit: Optional[dict] = None                # the shadow node whose sync failed, if any


class Lockstep:
    """One lockstep session: the pair factory, the op log since the last sync, the comparisons."""

    def __init__(self, strict: bool = False, ignore: tuple[str, ...] = (), name: str = "lockstep",
                 timeout_s: Optional[float] = None):
        self.auth = dispatch.path()
        self.shadow = shadow_of(self.auth)
        self.strict = strict
        self.ignore = IgnoreRules.parse(ignore) + IgnoreRules.from_settings()
        self.name = name
        self.records: list[OpRecord] = []
        self.pairs: weakref.WeakSet = weakref.WeakSet()     # every pair made in this session
        self.shadow_failure: Optional[str] = None   # set when the shadow failed: auth runs alone
        self._shadow_errors: list[str] = []          # shadow exceptions since the last check
        self.spans = detached.Spans.empty()          # node ids the shadow created
        self.timeout_s = settings.get().dual_run_timeout if timeout_s is None else timeout_s
        self.results: list[DualRunResult] = []
        self.first_divergence: Optional[dict] = None
        self.ops = 0
        self.syncs = 0
        self.wall_s = {p: 0.0 for p in PATHS}
        self.nodes = {p: 0 for p in PATHS}

    # -- factories -----------------------------------------------------------------------------
    def _paths(self) -> tuple:
        return (self.auth,) if self.shadow_failure else (self.auth, self.shadow)

    def pair_from_core(self, t: LazyTensor) -> PairTensor:
        twins = {}
        for p in self._paths():
            impl = paths.get(p)
            twins[p] = impl.wrap(impl.tensor_cls(t._value, tuple(t.shape), t.dtype))
        return PairTensor(twins, self)

    def pair_from(self, t: torch.Tensor) -> PairTensor:
        """A pair holding copies of device tensor ``t`` (of any path) on both paths."""
        twins = {p: dispatch.to_path(t.detach(), p) for p in self._paths()}
        return PairTensor(twins, self)

    # -- one op --------------------------------------------------------------------------------
    def run_op(self, func, args, kwargs):
        with lock:
            return self._run_op(func, args, kwargs)

    def _run_op(self, func, args, kwargs):
        if func in (aten._copy_from.default, aten._copy_from_and_resize.default):
            # Reached from a CPU tensor's copy_ into a pair: the twins take it as copy_.
            func, args, kwargs = aten.copy_.default, (args[1], args[0]), {}
        source = _user_source()
        first = next(ir._ids)
        outs, errors = {}, {}
        rng_before = rng_after = device_rng.state()
        for p in (self.auth, self.shadow):
            try:
                a, k = self._unwrap(args, p), self._unwrap(kwargs, p)
            except _Missing:
                continue
            start, nodes0 = time.perf_counter(), metrics.counter("IrNodes")
            if p == self.shadow:     # the shadow draws what the authoritative path drew
                rng_after = device_rng.state()
                device_rng.advance(rng_before)
                span = self.spans.open()
            try:
                with _twin(p):
                    outs[p] = func(*a, **k)
            except Exception as e:  # compared below; the authoritative error is re-raised
                errors[p] = e
            finally:
                if p == self.shadow:
                    self.spans.close(span)
                    device_rng.advance(rng_after)
            self.wall_s[p] += time.perf_counter() - start
            self.nodes[p] += metrics.counter("IrNodes") - nodes0
        rec = OpRecord(self.ops, str(func), source, [_describe(x) for x in _flat((args, kwargs))
                                                      if isinstance(x, torch.Tensor)],
                       [], first, 0)
        self.ops += 1
        if self.auth in errors:
            s_err = errors.get(self.shadow)
            if s_err is None or type(s_err) is not type(errors[self.auth]):
                rec.problem = Mismatch(f"op {rec.op}", "exception", f"the authoritative path "
                                       f"raised {type(errors[self.auth]).__name__}, the shadow "
                                       f"{'returned normally' if s_err is None else type(s_err).__name__}")
                self._log(rec)
            raise errors[self.auth]
        if self.shadow in errors:
            e = errors[self.shadow]
            rec.problem = Mismatch(f"op {rec.op}", "exception",
                                   f"the shadow path raised {type(e).__name__}: {str(e)[:500]}")
            self._shadow_errors.append(f"{type(e).__name__}: {str(e)[:2000]}")
        result = self._wrap(func, args, kwargs, outs, rec)
        rec.last_node = next(ir._ids)
        self._log(rec)
        return result

    def _log(self, rec: OpRecord) -> None:
        if rec.last_node == 0:
            rec.last_node = next(ir._ids)
        self.records.append(rec)

    def _unwrap(self, x, path):
        def one(e):
            if isinstance(e, PairTensor):
                t = e._twins.get(path)
                if t is None:
                    raise _Missing()
                return t
            if isinstance(e, torch.Tensor) and e.device.type == DEVICE.type:
                return dispatch.to_path(e, path)      # a device tensor made outside lockstep
            return e
        return _map(x, one)

    def _wrap(self, func, args, kwargs, outs, rec: OpRecord):
        auth_out = outs[self.auth]
        shadow_out = outs.get(self.shadow)
        in_pairs = [e for e in _flat((args, kwargs)) if isinstance(e, PairTensor)]
        by_auth_twin = {id(p._twins[self.auth]): p for p in in_pairs}
        schema = func._schema
        is_view = any(r.alias_info is not None and not r.alias_info.is_write
                      for r in schema.returns)
        view_of = None
        if is_view and in_pairs:
            base = in_pairs[0]._view_of
            view_of = base if base is not None else in_pairs[0]
        a_flat = list(_flat(auth_out)) if isinstance(auth_out, (list, tuple)) else [auth_out]
        s_flat = ((list(_flat(shadow_out)) if isinstance(shadow_out, (list, tuple))
                   else [shadow_out]) if self.shadow in outs else [None] * len(a_flat))
        if len(s_flat) != len(a_flat):
            rec.problem = Mismatch(f"op {rec.op}", "type", f"{len(a_flat)} outputs on the "
                                   f"authoritative path, {len(s_flat)} on the shadow")
            s_flat = [None] * len(a_flat)
        mapped, checked = [], []
        for i, (a, s) in enumerate(zip(a_flat, s_flat)):
            if isinstance(a, torch.Tensor) and a.device.type == DEVICE.type:
                pair = by_auth_twin.get(id(a))
                if pair is None:
                    twins = {self.auth: a}
                    if isinstance(s, torch.Tensor):
                        twins[self.shadow] = s
                    pair = PairTensor(twins, self)
                    if view_of is not None:
                        pair._view_of = view_of
                mapped.append(pair)
                checked.append((f"output {i}", pair))
            else:
                if self.shadow in outs and rec.problem is None:
                    found = compare_values(f"op {rec.op} output {i}", a, s)
                    if found:
                        rec.problem = found[0]
                mapped.append(a)
        # Values the op wrote: mutated arguments, and the tensors they are views of.
        for j, arg in enumerate(schema.arguments):
            if arg.alias_info is None or not arg.alias_info.is_write:
                continue
            v = args[j] if j < len(args) and not arg.kwarg_only else kwargs.get(arg.name)
            for e in _flat(v):
                if isinstance(e, PairTensor):
                    checked.append((f"written {arg.name}", e))
        for label, pair in list(checked):
            if pair._view_of is not None:
                checked.append((f"{label} (its base)", pair._view_of))
        rec.outputs = [_describe(p) for _, p in checked]
        self._probe(rec, checked)
        if isinstance(auth_out, (list, tuple)):
            it = iter(mapped)
            return _map(auth_out, lambda e: next(it))
        return mapped[0]

    def _probe(self, rec: OpRecord, checked) -> None:
        seen = set()
        for label, pair in checked:
            if id(pair) in seen or len(pair._twins) < 2:
                continue
            seen.add(id(pair))
            probes = {}
            for p, twin in pair._twins.items():
                span = self.spans.open() if p == self.shadow else None
                with _twin(p):
                    v = _value_of(twin, p)
                if span is not None:
                    self.spans.close(span)
                probes[p] = LazyTensor(v, v.aval.shape, twin.dtype)
                rec.values.setdefault(p, []).append(v)
            rec.checks.append((label, pair.dtype, probes))

    # -- at a sync ---------------------------------------------------------------------------
    def probes(self) -> list:
        return [t for r in self.records for _, _, pr in r.checks for t in pr.values()]

    def sync_shadow(self, tensors=None) -> None:
        """Before a sync of ``tensors`` (a full sync when None): materialise the shadow's pending
        work in a graph of its own (``detached.run``). A failure or a timeout is recorded and the
        shadow dropped (``_drop_shadow``), so the sync that follows runs the authoritative work
        alone and the shadow's error never reaches the caller."""
        if self.shadow_failure:
            return
        with lock:
            roots = self._shadow_work(tensors)
        if not roots:
            return
        try:
            detached.run(roots, self.timeout_s)
        except Exception as e:  # the shadow's failure is a finding, not the caller's error
            self._drop_shadow(e)

    def _shadow_work(self, tensors) -> list:
        pairs = list(self.pairs) if tensors is None else [t for t in tensors
                                                          if isinstance(t, PairTensor)]
        twins = [p._twins[self.shadow] for p in pairs if self.shadow in p._twins]
        span = self.spans.open()
        try:
            with _twin(self.shadow):
                paths.before_sync(twins)
                values = [t._value for t in paths.inner_tensors(twins)]
        finally:
            self.spans.close(span)
        values += [pr[self.shadow]._value for r in self.records for _, _, pr in r.checks
                   if self.shadow in pr]
        if tensors is None:      # a full sync: whatever else holds shadow work (path storages)
            values += [t._value for t in live_tensors()]
            values += executor._extra_roots()
        return detached.shadow_roots(values, self.spans)

    def _drop_shadow(self, error: Exception) -> None:
        """Record a shadow sync failure on the op that created the failing node (the first op
        whose shadow values fail, when XLA names no node), then forget the shadow twins: from
        here on the session runs the authoritative path alone."""
        text = f"{type(error).__name__}: {str(error)[:2000]}"
        self.shadow_failure = text
        self._shadow_errors.append(text)
        node = getattr(error, "xla_compat_node", None)
        timed_out = isinstance(error, detached.ShadowTimeout)
        rec = None
        if node is not None:
            rec = next((r for r in self.records if r.first_node < node.id < r.last_node), None)
        elif not timed_out:
            i = detached.first_failing([r.values.get(self.shadow, []) for r in self.records],
                                       self.timeout_s)
            rec = self.records[i] if i is not None else None
        if rec is None:          # not created by a recorded op (or no node known): a sync record
            rec = OpRecord(self.ops, node.op if node is not None else "sync",
                           node.source if node is not None else None, [], [], 0, 0)
            self.ops += 1
            self._log(rec)
        first_line = str(error).splitlines()[0] if str(error) else type(error).__name__
        if timed_out:
            rec.problem = Mismatch(f"op {rec.op}", "timeout", f"shadow timed out: {first_line}")
        else:
            rec.problem = Mismatch(f"op {rec.op}", "exception",
                                   f"the shadow ({self.shadow}) path failed at sync: "
                                   f"{type(error).__name__}: {first_line[:500]}")
        if node is not None:
            rec.culprit = oracle.culprit(self.shadow, node, f"sync failed: {text[:500]}")
        for pair in list(self.pairs):
            pair._twins.pop(self.shadow, None)
        for r in self.records:
            r.checks = [(label, dtype, {p: t for p, t in pr.items() if p != self.shadow})
                        for label, dtype, pr in r.checks]
            r.values.pop(self.shadow, None)
        gc.collect()     # the shadow's tensors (pending the failing graph) must not outlive this

    def protected(self):
        """Leaves under the pending op log (the CPU check re-evaluates nodes from them)."""
        under = ir.reaches(v for r in self.records for vs in r.values.values() for v in vs)
        for n in under:
            if type(n) is DeviceData:
                yield Value(n, 0)

    def check(self) -> Optional[DualRunResult]:
        """Compare the op log since the last check (its probes must be materialised)."""
        records, self.records = self.records, []
        if not records:
            return None
        pending = [t for r in records for _, _, pr in r.checks for t in pr.values()
                   if not t._value.node.is_leaf]
        if pending:
            executor.sync_tensors(pending)
        self.syncs += 1
        mismatches, ignored, first = [], [], None
        for rec in records:
            found = [rec.problem] if rec.problem else []
            for label, dtype, pr in rec.checks:
                if self.shadow not in pr:       # the shadow failed at this sync: nothing to compare
                    continue
                a, s = (np.asarray(pr[p]._value.node.array) for p in (self.auth, self.shadow))
                m = compare_arrays(f"op {rec.index} {rec.op} {label}", a, s, dtype)
                if m is not None:
                    found.append(m)
            if not found:
                continue
            if self.ignore.ignores_op(rec.op):
                ignored += found
                continue
            mismatches += found
            if first is None:
                first = self._divergence(rec, found[0])
        if first is not None and self.first_divergence is None:
            self.first_divergence = first
        result = DualRunResult(
            value=None, match=not mismatches, mismatches=tuple(mismatches[:50]),
            ignored=tuple(ignored[:50]), authoritative=self.auth, shadow=self.shadow,
            name=self.name, step=self.syncs - 1, mode="lockstep", wall_s=dict(self.wall_s),
            graph_nodes=dict(self.nodes), first_divergence=first,
            shadow_exception=self._shadow_errors[0] if self._shadow_errors else None)
        self._shadow_errors = []
        self.wall_s = {p: 0.0 for p in PATHS}
        self.nodes = {p: 0 for p in PATHS}
        self.results.append(result)
        finish(result)
        if self.strict and mismatches:
            raise MismatchError(result)
        return result

    def _divergence(self, rec: OpRecord, m: Mismatch) -> dict:
        culprits = [rec.culprit] if rec.culprit else []
        for p in (self.auth, self.shadow):
            culprits += oracle.check(p, rec.values.get(p, []), rec.first_node, rec.last_node)
        nodes = {p: [n.op for n in oracle.window_nodes(rec.values.get(p, []), rec.first_node,
                                                       rec.last_node)] for p in PATHS}
        return {"level": "op", "index": rec.index, "op": rec.op, "source": _where(rec.source),
                "function": rec.source[2] if rec.source else None, "inputs": rec.inputs,
                "outputs": rec.outputs, "mismatch": m.as_dict(), "nodes": nodes,
                "culprit": culprits[0] if culprits else None, "culprits": culprits}


# -- activation ------------------------------------------------------------------------------

_active: Optional[Lockstep] = None
_previous_factory = None


def active() -> Optional[Lockstep]:
    return _active


def _factory():
    if _active is not None and not _inside():
        return LazyTensor, _active.pair_from_core
    return _previous_factory()


def _install_factory() -> None:
    global _previous_factory
    if _previous_factory is None:
        _previous_factory = _device._factory_provider
        _device.set_factory_provider(_factory)


def _expand(tensors):
    out = []
    for t in tensors:
        if isinstance(t, PairTensor):
            out += [tw for tw in t._twins.values()]
        else:
            out.append(t)
    return out


class _SyncHook:
    """Registered with ``xla_compat.sync``: pairs sync as their twins; compare after a sync."""

    @staticmethod
    def engaged() -> bool:
        """Is lockstep on (the hook stays registered once installed)?"""
        return _active is not None

    @staticmethod
    def before(tensors):
        if _active is not None and not _inside():
            _active.sync_shadow(tensors)
        if tensors is None:
            return None
        if _active is not None:
            tensors = list(tensors) + _active.probes()
        return _expand(tensors)

    @staticmethod
    def after(tensors):
        if _active is not None and not _inside():
            if tensors is None:      # every pending value is device data now
                _active.spans.clear()
            _active.check()


_hook_installed = False


def _install_hooks() -> None:
    global _hook_installed
    if _hook_installed:
        return
    _hook_installed = True
    import xla_compat
    xla_compat._sync_hooks.append(_SyncHook)
    executor.register_value_holder(
        lambda: list(_active.protected()) if _active is not None else [])


def start(strict: bool = False, ignore: tuple[str, ...] = (), name: str = "lockstep",
          timeout_s: Optional[float] = None) -> Lockstep:
    """Turn lockstep on for the process (XLA_DUAL_RUN=lockstep does this at first device use)."""
    global _active
    if _active is not None:
        raise RuntimeError("xla_compat: lockstep is already on; nest no second `xc.lockstep()`")
    _install_factory()
    _install_hooks()
    _active = Lockstep(strict=strict, ignore=ignore, name=name, timeout_s=timeout_s)
    return _active


def stop() -> Optional[Lockstep]:
    """Turn lockstep off (pairs made so far keep running both paths); returns the session."""
    global _active
    session, _active = _active, None
    return session


@contextlib.contextmanager
def lockstep(strict: bool = False, ignore: tuple[str, ...] = (), timeout_s: Optional[float] = None):
    """New device tensors in the block run every op on both paths; syncs compare them.

    Yields the session: ``.first_divergence`` (the first op whose values differed, with its
    line, shapes and the lowering PyTorch on the CPU disagrees with), ``.results`` (one
    DualRunResult per sync). Leaving the block syncs and compares what is still pending.
    ``timeout_s`` (default XLA_DUAL_RUN_TIMEOUT, else none) abandons a shadow graph that takes
    longer to compile and run; the shadow is then dropped and recorded as timed out.
    """
    session = start(strict=strict, ignore=ignore, timeout_s=timeout_s)
    try:
        yield session
        if session.records:
            import xla_compat
            xla_compat.sync()
    finally:
        stop()
