"""Running the shadow path's pending graph on its own, so that its failure cannot reach the caller.

A shared sync compiles and runs one graph for both paths: a shadow node that XLA cannot compile
or run would fail the authoritative values with it, and the executor's failure handling (roll
every pending tensor and every alias storage back) would undo authoritative work. Here the
shadow's roots are compiled and run as a graph of their own, without donation and outside the
device lock (in a worker thread when a timeout is set, so a hang is abandoned at the deadline).
Only when it succeeds are the shadow's tensors rebound to the results, exactly as a sync rebinds
them; a failure or a timeout changes nothing and is returned to the caller as a finding.
"""
from __future__ import annotations

import bisect
import contextlib
import threading
from dataclasses import dataclass
from typing import Iterable, Optional

import jax

from .. import executor
from ..lazy import ir
from ..lazy.ir import DeviceData, Poisoned, Value
from ..lazy.tensor import live_tensors, lock
from ..lazy.tracer import LoweringError


class ShadowTimeout(TimeoutError):
    """The shadow's graph did not compile and run within the dual-run timeout."""


class ShadowGraphError(RuntimeError):
    """XLA failed to compile or run the shadow's graph (the error it raised is the cause)."""


@dataclass
class Spans:
    """Node id ranges created while the shadow path ran: a node inside one is the shadow's."""

    starts: list
    ends: list

    @classmethod
    def empty(cls) -> "Spans":
        return cls([], [])

    def open(self) -> int:
        return next(ir._ids)

    def close(self, start: int) -> None:
        self.starts.append(start)
        self.ends.append(next(ir._ids))

    def owns(self, node_id: int) -> bool:
        i = bisect.bisect_right(self.starts, node_id) - 1
        return i >= 0 and node_id < self.ends[i]

    def clear(self) -> None:
        self.starts.clear()
        self.ends.clear()


class Owned:
    """Ids of the nodes one thread created while recording (``recording``): a function-level
    shadow run's own nodes. Node ids interleave with other threads' (the authoritative thread
    goes on when a shadow is abandoned), so spans of ids cannot say whose a node is."""

    def __init__(self):
        self.ids: set = set()

    def owns(self, node_id: int) -> bool:
        return node_id in self.ids


_recorders: dict = {}          # thread id -> Owned
_recorders_lock = threading.Lock()


def _on_create(node) -> None:
    owned = _recorders.get(threading.get_ident())
    if owned is not None:
        owned.ids.add(node.id)


@contextlib.contextmanager
def recording(owned: Owned):
    """Nodes this thread creates inside the block are ``owned``'s."""
    me = threading.get_ident()
    with _recorders_lock:
        _recorders[me] = owned
        ir.on_create = _on_create
    try:
        yield owned
    finally:
        with _recorders_lock:
            _recorders.pop(me, None)
            if not _recorders:
                ir.on_create = None


def shadow_roots(candidates: Iterable[Value], spans: Spans) -> list[Value]:
    """The pending ``candidates`` whose graph reaches a node the shadow created. The two paths
    never feed each other (lockstep isolates the RNG per op), so the rest is the authoritative
    path's work, or work both share (made before the pair existed), and stays in the main sync."""
    memo: dict = {}
    out, seen = [], set()
    for v in candidates:
        if v.node.is_leaf or v in seen:
            continue
        seen.add(v)
        if _reaches(v.node, spans, memo):
            out.append(v)
    return out


def _reaches(root, spans: Spans, memo: dict) -> bool:
    """Does ``root``'s graph hold a shadow node? (post-order walk, memoised by node id)"""
    stack = [(root, False)]
    while stack:
        n, done = stack.pop()
        key = id(n)
        if done:
            memo[key] = spans.owns(n.id) or any(memo[id(v.node)] for v in n.inputs)
            continue
        if key in memo:
            continue
        memo[key] = False                 # provisional; a DAG has no cycles
        stack.append((n, True))
        for v in n.inputs:
            if id(v.node) not in memo:
                stack.append((v.node, False))
    return memo[id(root)]


# Shadow graphs keep executables of their own: in the shared cache they would push the
# authoritative path's executables out (LRU) and make it compile again.
cache = executor.CompileCache()


def _compile_and_run(graph, params):
    doing = "compiling"
    try:
        compiled = cache.get(graph.key)
        if compiled is None:
            compiled = executor.compile_graph(graph, params)
            cache.put(graph.key, compiled)
        doing = "running"
        before = getattr(executor, "_before_execute", None)   # where tests plant execution faults
        if before is not None:
            before(graph)
        outputs = compiled(*params)
        jax.block_until_ready(outputs)
        return outputs
    except LoweringError:
        raise                     # names its node already
    except Exception as e:
        raise ShadowGraphError(f"{doing} the shadow's graph of {len(graph.nodes)} ops failed: "
                               f"{type(e).__name__}: {_gist(e)}") from e


def _gist(e: BaseException) -> str:
    """One line of ``e``: XLA wraps a host callback's error as a whole traceback, whose last
    line is the error itself."""
    lines = [ln.strip() for ln in str(e).strip().splitlines() if ln.strip()]
    if len(lines) <= 1:
        return lines[0] if lines else ""
    return f"{lines[0]} ... {lines[-1]}"


class _InFlight:
    """Leaves of shadow graphs still running (an abandoned hang included): never donate them."""

    def __init__(self):
        self._lock = threading.Lock()
        self._graphs: dict = {}

    def add(self, graph) -> int:
        with self._lock:
            self._graphs[id(graph)] = [Value(leaf, 0) for leaf in graph.leaves
                                       if type(leaf) is DeviceData]
            return id(graph)

    def remove(self, key: int) -> None:
        with self._lock:
            self._graphs.pop(key, None)

    def values(self) -> list:
        with self._lock:
            return [v for vs in self._graphs.values() for v in vs]


in_flight = _InFlight()
executor.register_value_holder(in_flight.values)


def run(roots: list[Value], timeout_s: Optional[float] = None, *, rebind: bool = True):
    """Compile and run the graph of ``roots`` on its own (no donation), outside the device lock;
    with ``timeout_s`` in a daemon worker, abandoned at the deadline (``ShadowTimeout``). On
    success the tensors (and path storages) holding ``roots`` are rebound as a sync rebinds them,
    unless ``rebind`` is False (a trial run). Any failure propagates with nothing changed."""
    with lock:
        graph = executor.collect(roots)
        params = executor._params(graph)
    key = in_flight.add(graph)
    box: list = []

    def work():
        try:
            box.append(("ok", _compile_and_run(graph, params)))
        except BaseException as e:  # handed to the waiting thread
            box.append(("error", e))
        finally:
            in_flight.remove(key)

    if timeout_s is None:
        work()
    else:
        worker = threading.Thread(target=work, name="xla_compat-lockstep-shadow", daemon=True)
        worker.start()
        worker.join(timeout_s)
        if not box:
            raise ShadowTimeout(f"the shadow's graph ({len(graph.nodes)} ops) did not compile and "
                                f"run within {timeout_s:g} s and was abandoned (raise "
                                f"XLA_DUAL_RUN_TIMEOUT if it is just slow)")
    status, value = box[0]
    if status == "error":
        raise value
    if rebind:
        _rebind(graph, value)


def _rebind(graph, outputs) -> None:
    mapping = {v: ir.leaf(arr) for v, arr in zip(graph.roots, outputs)}
    with lock:
        for t in live_tensors():
            new = mapping.get(t._value)
            if new is not None:
                t._value = new
                t._last_data = new
        for fn in executor._rebinders:       # path storages (legacy alias bases)
            fn(mapping)


def close(owned, tensors, timeout_s: Optional[float] = None) -> None:
    """A function-level shadow run's closing sync: materialise only the pending work that
    reaches a node the shadow ``owned`` (``tensors``, the shadow's own, have their alias
    updates applied first; path storages holding its writes included), as a graph of its own
    (``run``). Never a full sync: that would take in whatever the authoritative thread has
    pending by then, and roll it back if the shadow's part failed. On failure the shadow's
    pending tensors and storages go back to their last values (``discard``) and the error
    propagates; nothing else is touched."""
    from .. import paths
    shadow_tensors = list(tensors)
    with lock:
        by_path: dict = {}
        for t in shadow_tensors:
            name = paths.of(t)
            if name is not None:
                by_path.setdefault(name, []).append(t)
        for name, ts in by_path.items():
            paths.get(name).before_sync(ts)
        values = [t._value for t in live_tensors()] + executor._extra_roots()
        roots = shadow_roots(values, owned)
    if not roots:
        return
    try:
        run(roots, timeout_s)
    except BaseException as e:
        discard(roots, e)
        raise


def discard(roots: list[Value], error: BaseException) -> None:
    """After the shadow's graph of ``roots`` failed: tensors pending one of ``roots`` return to
    their last materialised value (poisoned without one), and path storages that graph computed
    roll back (the executor's failure hooks, scoped to ``roots``), so that no later sync of the
    authoritative path takes the failing work in."""
    pending = set(roots)
    with lock:
        for t in live_tensors():
            if t._value not in pending:
                continue
            last = getattr(t, "_last_data", None)
            if last is not None and not last.node.array.is_deleted():
                t._value = last
            else:
                t._value = Value(Poisoned(t._value.node.avals, executor.poison_error(error)),
                                 t._value.index)
        for fn in executor._failure_hooks:
            fn(error, list(roots))


def first_failing(groups: list[list[Value]], timeout_s: Optional[float] = None) -> Optional[int]:
    """The index of the first group whose values (with every earlier group's) fail to compile
    or run, by bisection over prefixes; None when even all of them run (a flaky failure)."""
    def fails(k: int) -> bool:
        roots = list(dict.fromkeys(v for g in groups[:k] for v in g if not v.node.is_leaf))
        if not roots:
            return False
        try:
            run(roots, timeout_s, rebind=False)
        except Exception:
            return True
        return False

    lo, hi = 0, len(groups)          # invariant: prefix lo runs, prefix hi fails
    if hi == 0 or not fails(hi):
        return None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fails(mid):
            hi = mid
        else:
            lo = mid
    return hi - 1
