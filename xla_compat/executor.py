"""The executor: cut the pending graph, look it up in the compile cache, run it, rebind outputs.

A graph is keyed by its structure (ops, rules, static arguments, shapes and dtypes, which leaf
feeds which input, which inputs are donated); device data and changing Python scalars are
parameters, never constants. A miss builds a jax function from the lowering rules and compiles
it with ``jax.jit``. A failure anywhere leaves every tensor with the value it had before.
"""
from __future__ import annotations

import collections
import contextlib
import functools
import hashlib
import threading
import time
import weakref
from dataclasses import dataclass

import jax
import numpy as np

from . import autograd_thread, metrics, packed_numbers, persistent_cache, settings, sharding
from .lazy import ir, rng
from .lazy import tensor as _tensor
from .lazy.ir import DeviceData, Node, Poisoned, ScalarParam, Value
from .lazy.tensor import LazyTensor, live_tensors, lock
from .lazy.tracer import LoweringError, fill
from .lowering import opmath
from .lowering.registry import Rule

# Extra holders of Values outside LazyTensor._value (the legacy alias bases register here);
# a buffer any holder still points at is never donated.
_holders: list = []


def register_value_holder(fn) -> None:
    """``fn()`` yields Values kept alive outside tensors; their buffers are never donated."""
    _holders.append(fn)


_rebinders: list = []
_failure_hooks: list = []


def register_failure_hook(fn) -> None:
    """``fn(error, roots)`` is called after a failed sync, once the core has rolled its tensors
    back; a path puts state the core cannot see (legacy alias bases) back to its last value.
    ``roots``: the Values the failed sync computed, or None for a full sync (everything pending
    was in it). Only state those roots depend on may be rolled back: a failed read of one
    tensor must not drop another tensor's pending writes."""
    _failure_hooks.append(fn)


def register_rebinder(fn) -> None:
    """``fn(mapping)`` is called after a sync with {id(old Node): {index: new Value}}."""
    _rebinders.append(fn)


# ----------------------------------------------------------------------------------------------
# Graph collection.

@dataclass
class Graph:
    """The nodes computing ``roots`` in topological order, and its cache key."""

    nodes: list           # non-leaf nodes, inputs first
    leaves: list          # leaf nodes (DeviceData / ScalarParam), in parameter order
    roots: list           # root Values, in output order
    slot: dict            # node -> position (leaves: ~parameter index; nodes: env index)
    donate: tuple         # parameter indices donated
    key: tuple
    mesh: object = None   # SPMD: the jax Mesh the graph is partitioned over (None: one device)


def collect(roots: list[Value], donatable=frozenset(), predecessor=None) -> Graph:
    """The graph computing ``roots``; ``predecessor`` maps a root to id() of the leaf it replaces
    (the value its tensor held before), so outputs can be ordered to meet their donated inputs.

    ``donatable``: ids of leaves whose buffers may be donated, or a callable taking the graph's
    leaves and returning them (so one walk finds both). The key is a flat tuple of ints: each
    node's interned signature (``Node.sig_id``) and where its inputs come from.

    Nodes are in depth-first post-order from the roots, inputs in argument order: a function of
    the graph and its roots alone, so the same computation has the same key however its nodes
    came to be created (a trace plan that creates a view's node earlier in the third step than
    in the first two must not compile again). Leaves are numbered in order of first use."""
    nodes: list[Node] = []
    seen: set = set()
    stack = [v.node for v in reversed(roots)]
    pop, push, add, keep = stack.pop, stack.append, seen.add, nodes.append
    while stack:
        node = pop()
        if type(node) is tuple:            # every input of node[0] is placed: place it
            keep(node[0])
            continue
        if node in seen:
            continue
        add(node)
        if node.rule is not None:
            push((node,))
            for v in reversed(node.inputs):
                push(v[0])
    # node -> ~parameter index (leaves) or env index (nodes)
    slot: dict = dict(zip(nodes, range(len(nodes))))
    leaves: list[Node] = []
    body: list = []
    put = body.append
    for node in nodes:
        s = node.sig
        put(s if s is not None else node.sig_id())
        for n, index in node.inputs:
            where = slot.get(n)
            put(where if where is not None else _add_leaf(n, slot, leaves))
            put(index)
    for v in roots:
        if v.node not in slot:
            _add_leaf(v.node, slot, leaves)
    if callable(donatable):
        donatable = donatable(leaves)
    if donatable and sharding.any_marked():
        donatable = _unshared(leaves, donatable)
    donate = []
    if donatable:
        # Donate a buffer only where an output of the same shape and dtype can reuse it.
        free = collections.Counter(v.aval for v in roots)
        for i, leaf in enumerate(leaves):
            if type(leaf) is DeviceData and id(leaf) in donatable and free[leaf.avals[0]] > 0:
                free[leaf.avals[0]] -= 1
                donate.append(i)
    roots = _donation_order(roots, leaves, donate, predecessor)
    parts = [len(leaves), len(nodes), len(roots)]
    donated = set(donate)
    spread = []           # SPMD: leaves laid out over several devices, constraint nodes
    for i, leaf in enumerate(leaves):
        parts.append(leaf.sig_id())
        parts.append(i in donated)
        if type(leaf) is DeviceData and leaf.placement is not None:
            spread.append(leaf.array.sharding)
    constraint = sharding.CONSTRAINT_OP
    for node in nodes:
        if node.op == constraint:
            spread.append(node.rule.spec.named())
    parts += body
    for v in roots:
        parts.append(slot[v.node])
        parts.append(v.index)
    mesh = _mesh_of(spread) if spread else None
    return Graph(nodes, leaves, list(roots), slot, tuple(donate), tuple(parts), mesh)


def _add_leaf(node: Node, slot: dict, leaves: list) -> int:
    if type(node) is Poisoned:
        raise node.error
    where = slot[node] = ~len(leaves)
    leaves.append(node)
    return where


def _unshared(leaves: list, donatable) -> set:
    """``donatable`` less leaves whose buffer another leaf of the graph also holds: laying a
    buffer out on a one-device mesh (device_put) returns the same buffer, and a buffer donated
    twice is an error (once, and the other leaf reads freed memory)."""
    owners: dict = collections.defaultdict(set)     # buffer address -> leaves holding it
    donatable = set(donatable)
    for leaf in leaves:
        if type(leaf) is DeviceData:
            try:
                for shard in leaf.array.addressable_shards:
                    owners[(shard.device, shard.data.unsafe_buffer_pointer())].add(id(leaf))
            except Exception:  # noqa: BLE001 - a buffer we cannot inspect is not donated
                donatable.discard(id(leaf))
    for ids in owners.values():
        if len(ids) > 1:
            donatable -= ids
    return donatable


def _donation_order(roots: list, leaves: list, donate: list, predecessor) -> list:
    """``roots`` reordered so each new value meets the donated buffer it replaces.

    jax pairs the k-th donated input of a shape and dtype with the k-th output of that shape and
    dtype. Paired by chance (a weight's buffer with its gradient), XLA must copy the weight to
    keep it while the gradient is written over it. So per shape and dtype, the outputs follow the
    donated inputs: each input's successor (``predecessor`` maps a root to id() of the leaf it
    replaces) in its place, the rest after; a group with an input of unknown successor keeps
    its order."""
    if not predecessor or not donate:
        return list(roots)
    successor = {leaf: root for root, leaf in predecessor.items()}
    by_aval: dict = collections.defaultdict(list)
    for v in roots:
        by_aval[v.aval].append(v)
    order: list = []
    for aval, group in by_aval.items():
        first = [successor.get(id(leaves[i])) for i in donate if leaves[i].avals[0] == aval]
        chosen = set(first)
        if None in chosen or not chosen <= set(group):
            order.extend(group)    # a buffer whose successor is unknown: keep the order we had
            continue
        order += first + [v for v in group if v not in chosen]
    return order


def _mesh_of(shardings) -> jax.sharding.Mesh:
    """The mesh an SPMD graph runs on: the first named sharding's (all must share devices)."""
    for s in shardings:
        if isinstance(s, jax.sharding.NamedSharding):
            mesh = s.mesh
            break
    else:
        import numpy as np
        devices = sorted(shardings[0].device_set, key=lambda d: d.id)
        mesh = jax.sharding.Mesh(np.array(devices, dtype=object), ("devices",))
    want = set(mesh.devices.flat)
    for s in shardings:
        if set(s.device_set) != want:
            raise RuntimeError(
                f"xla_compat: one graph mixes tensors sharded over different device sets "
                f"({sorted(d.id for d in want)} and {sorted(d.id for d in s.device_set)}); "
                f"mark_sharding every tensor of a step with meshes over the same devices")
    return mesh


# ----------------------------------------------------------------------------------------------
# Building the jax function.

def _call_rule(node: Node, ins: list):
    rule = node.rule
    args = fill(node.args, ins)
    kwargs = {k: fill(v, ins) for k, v in node.kwargs}
    if isinstance(rule, Rule):
        n_out = len(node.avals)
        if rule.random:
            *args, state = args
            key = jax.random.wrap_key_data(state)
            nxt, sub = jax.random.split(key)
            kwargs["key"] = sub
            n_out -= 1
        if rule.meta:
            structs = tuple(jax.ShapeDtypeStruct(a.shape, a.dtype) for a in node.avals[:n_out])
            kwargs["aval"] = structs[0] if n_out == 1 else structs
        out = opmath.call(rule, node, args, kwargs)
        # None stands for an undefined tensor output (e.g. a gradient not asked for).
        out = [o for o in out if o is not None] if isinstance(out, (list, tuple)) else [out]
        if rule.random:
            out.append(jax.random.key_data(nxt))
    else:
        out = rule(*args, **kwargs)
        out = list(out) if isinstance(out, (list, tuple)) else [out]
    return out


def _check_outputs(node: Node, out: list) -> list:
    from .lowering._helpers import cast
    if len(out) != len(node.avals):
        raise LoweringError(f"rule returned {len(out)} outputs, PyTorch expects "
                            f"{len(node.avals)}")
    fixed = []
    for o, aval in zip(out, node.avals):
        if tuple(o.shape) != tuple(aval.shape):
            raise LoweringError(f"rule produced shape {tuple(o.shape)}, PyTorch expects "
                                f"{tuple(aval.shape)}")
        fixed.append(o if o.dtype == aval.dtype else cast(o, aval.dtype))
    return fixed


def _describe_inputs(node: Node) -> str:
    return ", ".join(f"{v.aval.dtype}{list(v.aval.shape)}" for v in node.inputs
                     if type(v.node) is not ScalarParam) or "no tensors"


def build_function(graph: Graph):
    """A Python function of the leaves computing the roots (what jax.jit traces)."""
    nodes, slot, roots = graph.nodes, graph.slot, graph.roots

    def run(*params):
        env: list = [None] * len(nodes)

        def get(v: Value):
            s = slot[v.node]
            return params[~s] if s < 0 else env[s][v.index]

        for i, node in enumerate(nodes):
            ins = [get(v) for v in node.inputs]
            try:
                env[i] = _check_outputs(node, _call_rule(node, ins))
            except LoweringError as e:
                if getattr(e, "xla_compat_node", None) is None:
                    raise _lowering_error(node, e) from e
                raise
            except Exception as e:
                raise _lowering_error(node, e) from e
        return [get(v) for v in roots]

    return run


def _lowering_error(node: Node, e: BaseException) -> LoweringError:
    err = LoweringError(
        f"xla_compat: lowering {node.op} failed: {type(e).__name__}: {e}\n"
        f"  inputs: {_describe_inputs(node)}\n"
        f"  created at {node.where()}")
    err.xla_compat_node = node
    return err


# ----------------------------------------------------------------------------------------------
# The compile cache.

class CompileCache:
    """An LRU map from graph keys to compiled executables, bounded by their number and by the
    memory mappings they hold.

    Each executable keeps its JIT-compiled code in memory mappings of its own: tens for a small
    graph, hundreds for a large one. A job that keeps making new graphs (an L-BFGS history that
    grows every iteration) would otherwise reach the kernel's ``vm.max_map_count`` with a
    thousand graphs cached, where LLVM fails to map the next one and the process dies. An
    entry's cost is the mappings its compile added (``_MapsMeter``)."""

    def __init__(self):
        self._entries: collections.OrderedDict = collections.OrderedDict()
        self._lock = threading.Lock()
        self._maps = 0
        # digest of a cached executable's program -> the key of the entry holding it: two graph
        # keys can lower to the same program (the functional path's t_copy, transpose_copy and
        # permute_copy nodes of one transpose), which then compiles once (``same_module``)
        self._by_module: dict = {}

    def get(self, key):
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            self._entries.move_to_end(key)
            return entry[0]

    def same_module(self, digest):
        """(the jax executable a cached entry compiled from the module of this digest, the
        mappings charged to it), or None."""
        with self._lock:
            key = self._by_module.get(digest)
            entry = self._entries.get(key) if key is not None else None
            if entry is None:
                return None
            compiled = entry[0]
            raw = compiled.executable if type(compiled) is packed_numbers.Packed else compiled
            return raw, entry[1]

    def put(self, key, compiled) -> None:
        limit = settings.get().compile_cache_size
        budget = maps_budget()
        cost = getattr(compiled, "xla_compat_maps", 1)
        module = getattr(compiled, "xla_compat_module", None)
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._maps -= old[1]
                self._unindex(key, old[0])
            self._entries[key] = (compiled, cost)
            self._maps += cost
            if module is not None:
                self._by_module.setdefault(module, key)
            while len(self._entries) > limit or (self._maps > budget and len(self._entries) > 1):
                gone, (dropped, freed) = self._entries.popitem(last=False)
                self._maps -= freed
                self._unindex(gone, dropped)
                metrics.inc("CompileCacheEviction")

    def _unindex(self, key, compiled) -> None:
        module = getattr(compiled, "xla_compat_module", None)
        if module is not None and self._by_module.get(module) == key:
            del self._by_module[module]

    def maps_held(self) -> int:
        """The memory mappings the cached executables added when they were compiled."""
        return self._maps

    def __len__(self):
        return len(self._entries)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._by_module.clear()
            self._maps = 0


def maps_in_use() -> int | None:
    """This process's memory mappings now (None where /proc is not there)."""
    try:
        with open("/proc/self/maps", "rb") as f:
            return f.read().count(b"\n")
    except OSError:
        return None


class _MapsMeter:
    """The memory mappings each compile adds, measured on a sample of compiles.

    Reading ``/proc/self/maps`` costs 1-2 ms once a process holds tens of thousands of mappings
    (a long test run's or a job's with a full cache), more than a small graph's compile. The
    first compiles and every ``EVERY``-th after them are measured (the count before and after);
    the others are charged the mean of the measured ones: the cache's total stays close to the
    truth, which is all its budget needs."""

    FIRST, EVERY = 4, 8

    def __init__(self):
        self._lock = threading.Lock()
        self._compiles = 0
        self._measured = 0
        self._total = 0

    def compile(self, lowered):
        """``lowered.compile()``, and the mappings charged to it."""
        with self._lock:
            n = self._compiles
            self._compiles += 1
        before = maps_in_use() if n < self.FIRST or n % self.EVERY == 0 else None
        compiled = lowered.compile()
        if before is None:
            with self._lock:
                return compiled, max(1, round(self._total / self._measured)) if self._measured else 1
        after = maps_in_use()
        cost = max(1, after - before)
        with self._lock:
            self._measured += 1
            self._total += cost
        return compiled, cost


_maps_meter = _MapsMeter()


@functools.lru_cache(maxsize=None)
def _max_map_count() -> int:
    try:
        with open("/proc/sys/vm/max_map_count") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 65530                       # (Linux's default)


def maps_budget() -> int:
    """How many mappings the compile cache may hold (``compile_cache_maps``)."""
    return settings.get().compile_cache_maps or _max_map_count() // 2


cache = CompileCache()


def _params(graph: Graph) -> list:
    if graph.mesh is not None:
        _place_on_mesh(graph)
    return [leaf.array if type(leaf) is DeviceData else leaf.value for leaf in graph.leaves]


def _place_on_mesh(graph: Graph) -> None:
    """SPMD: device data still on one device is replicated over the graph's mesh, once (the leaf
    keeps the replicated array, so later graphs find it there)."""
    rep = jax.sharding.NamedSharding(graph.mesh, jax.sharding.PartitionSpec())
    for leaf in graph.leaves:
        if type(leaf) is DeviceData and leaf.placement is None:
            leaf.set_array(jax.device_put(leaf.array, rep))


def _jit(graph: Graph, fn, donate=None):
    """jax.jit of the graph's function; SPMD graphs state their input and output layouts: inputs
    as the buffers lie, marked roots as marked, other outputs as XLA's propagation picks."""
    if graph.mesh is None:
        return jax.jit(fn, donate_argnums=graph.donate if donate is None else donate)
    rep = jax.sharding.NamedSharding(graph.mesh, jax.sharding.PartitionSpec())
    ins = tuple(leaf.array.sharding if type(leaf) is DeviceData else rep for leaf in graph.leaves)
    outs = []
    for v in graph.roots:
        spec = sharding.spec_of_value(v)
        outs.append(spec.named() if spec is not None else None)
    return jax.jit(fn, donate_argnums=graph.donate, in_shardings=ins, out_shardings=outs)


def compile_graph(graph: Graph, params: list, baked: dict | None = None):
    """The graph compiled for ``params`` (arrays, or jax.ShapeDtypeStructs: only their shapes
    and dtypes matter). ``baked`` ({parameter position: number}) compiles those parameters in
    as constants; the executable then takes the other parameters, in order. The executable
    remembers its compile time (``xla_compat_compile_ns``)."""
    fn = build_function(graph)
    start = time.perf_counter_ns()
    if baked:
        fn, params, graph = _bake(graph, fn, params, baked)
    plan = packed_numbers.layout(params) if graph.mesh is None else None
    donate = None
    if plan is not None:          # the numbers travel as one vector per kind
        fn, donate = packed_numbers.pack(fn, len(params), plan, graph.donate)
        params = packed_numbers.host_params(params, plan)
    lowered = _jit(graph, fn, donate).lower(*params)
    # A program the cache already holds an executable for (another graph key lowered to it:
    # ``_module_digest``) is not compiled again. SPMD graphs always compile: their executables
    # also carry a device assignment.
    digest = _module_digest(lowered) if graph.mesh is None else None
    found = cache.same_module(digest) if digest is not None else None
    if found is not None:
        # (charged the mappings of the entry it shares: whichever entry outlives the other
        # keeps them alive)
        executable, maps = found
        metrics.inc("CompileSameModuleReused")
    else:
        persistent_cache.from_settings()
        with persistent_cache.compiling():
            executable, maps = _maps_meter.compile(lowered)
    compiled = executable
    if plan is not None:
        compiled = packed_numbers.Packed(executable, plan)
    elapsed = time.perf_counter_ns() - start
    if found is None:
        metrics.sample("CompileTime", elapsed)
    compiled.xla_compat_compile_ns = elapsed
    compiled.xla_compat_maps = maps
    compiled.xla_compat_module = digest
    dump = settings.get().dump_path
    if dump:
        _dump(dump, graph, lowered)
    return compiled


def _module_digest(lowered) -> bytes | None:
    """A digest of the lowered program: its module's text (StableHLO without locations) and its
    argument and result structure, equal for two graphs exactly when one's executable runs the
    other; None where the lowering holds more than its text says, so it never shares: constants
    jax passes as hidden arguments (their values are not in the text), or arguments the module
    does not use (jax drops them, and which were dropped is not in the text either)."""
    lowering = getattr(lowered, "_lowering", None)
    const_args = getattr(lowering, "const_args", None)
    kept = getattr(lowering, "compile_args", {}).get("kept_var_idx")
    if const_args is None or len(const_args) or kept is None:
        return None
    if set(kept) != set(range(len(jax.tree.leaves(lowered.args_info)))):
        return None
    h = hashlib.sha256(lowered.as_text().encode())
    h.update(f"{lowered.in_tree}|{lowered.out_tree}".encode())
    return h.digest()


def _bake(graph: Graph, fn, params: list, baked: dict):
    """``fn`` with the ``baked`` parameters as constants, the remaining parameters, and a graph
    whose donated positions count only those."""
    import dataclasses
    specialised, keep = with_constants(fn, len(params), baked)
    position = {i: k for k, i in enumerate(keep)}
    donate = tuple(position[d] for d in graph.donate)
    return specialised, [params[i] for i in keep], dataclasses.replace(graph, donate=donate)


def with_constants(fn, n: int, consts: dict):
    """(``fn`` of its ``n`` parameters with ``consts`` ({position: number}) filled in, taking the
    others in order; the positions it takes)."""
    import jax.numpy as jnp
    keep = [i for i in range(n) if i not in consts]

    def specialised(*kept):
        full = [None] * n
        for i, x in zip(keep, kept):
            full[i] = x
        for p, c in consts.items():
            # a Python number becomes a literal of the program, weakly typed like the parameter
            full[p] = jnp.asarray(c)
        return fn(*full)
    return specialised, keep


def _dump(path: str, graph: Graph, lowered) -> None:
    with open(path, "a") as f:
        f.write(f"## graph with {len(graph.nodes)} nodes, {len(graph.leaves)} parameters, "
                f"donated {list(graph.donate)}\n")
        f.write(ir_text(graph))
        f.write("\n## StableHLO\n")
        f.write(lowered.as_text())
        f.write("\n\n")


def ir_text(graph: Graph) -> str:
    lines = []
    for i, leaf in enumerate(graph.leaves):
        a = leaf.avals[0]
        kind = "data" if type(leaf) is DeviceData else "scalar"
        lines.append(f"  %p{i} = {kind} {a.dtype}{list(a.shape)}")
    for i, node in enumerate(graph.nodes):
        ins = ", ".join(
            (f"%p{~graph.slot[v.node]}" if v.node.is_leaf else f"%{graph.slot[v.node]}")
            + (f".{v.index}" if len(v.node.avals) > 1 else "") for v in node.inputs)
        outs = ", ".join(f"{a.dtype}{list(a.shape)}" for a in node.avals)
        where = f"  # {node.source[0]}:{node.source[1]}" if node.source else ""
        lines.append(f"  %{i} = {node.op}({ins}) -> {outs}{where}")
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------------------------
# Sync.

def _held_leaf_ids(exclude: set) -> set:
    held = set()
    for t in live_tensors():
        if id(t) not in exclude:
            held.add(id(t._value.node))
    for fn in _holders:
        for v in fn():
            held.add(id(v.node))
    return held


# A full sync that leaves nothing pending takes an IR id right after it (``_quiet_at``); while no
# node has been made since (the next id follows it), nothing can be pending: every op, write,
# draw and transfer makes a node. ``quiet()`` answers that in one id, so ``xc.sync()`` after a
# replayed step (or twice in a row) does not walk every live tensor, alias and wrapper again.
_quiet_at = -2


def quiet() -> bool:
    """Has no IR node been made since the last full sync finished (and no tensor has a layout
    over a mesh, which a sync applies)? Then a full sync has nothing to do."""
    global _quiet_at
    with lock:
        n = next(ir._ids)
        if n != _quiet_at + 1 or sharding.any_marked():
            return False
        _quiet_at = n
        return True


def touch() -> None:
    """Something is pending that made no IR node (a legacy write of an existing value through
    a view): the next full sync must run."""
    global _quiet_at
    _quiet_at = -2


def touch_for(value: Value) -> None:
    """A tensor's storage now holds ``value`` and nothing else is pending on it: ``touch()``
    unless a quiet test already sees it, as device data (nothing to run) or as a node made since
    the last full sync. A replayed step's whole-tensor writes leave the executor quiet."""
    node = value.node
    if type(node) is not DeviceData and node.id <= _quiet_at:
        touch()


def _mark_quiet() -> None:
    global _quiet_at
    _quiet_at = next(ir._ids)


# The running sync's memo (``per_sync``): (thread id, {fn: result}), None outside a sync.
_sync_memo = None


def per_sync(fn):
    """``fn()`` computed once per sync: inside ``sync_tensors`` (its thread, the lock held) the
    first call's result is returned again, so the walks a path makes from several hooks (its
    extra roots, held values, predecessors, rebinding) share one; outside a sync every call
    computes. The result must not be changed by its callers."""
    @functools.wraps(fn)
    def memoised():
        scope = _sync_memo
        if scope is None or scope[0] != threading.get_ident():
            return fn()
        memo = scope[1]
        out = memo.get(fn)
        if out is None:
            out = memo[fn] = fn()
        return out
    return memoised


def sync_tensors(tensors=None, *, mark_step: bool = False) -> None:
    """Materialise ``tensors`` (all live tensors with pending IR when None)."""
    global _sync_memo
    autograd_thread.claim()
    with lock:
        outer, _sync_memo = _sync_memo, (threading.get_ident(), {})
        try:
            _sync_tensors(tensors, mark_step)
        finally:
            _sync_memo = outer


def _sync_tensors(tensors, mark_step: bool) -> None:
    """``sync_tensors``' work, the lock held and the sync's memo set."""
    global _quiet_at
    _quiet_at = -2
    sharding.apply_all()     # marked tensors' current values take their layout
    full = tensors is None
    if full:
        tensors = live_tensors()
        _tensor.settle_mix_guard(tensors)
    pending = [t for t in tensors if not t._value.node.is_leaf]
    roots: list[Value] = []
    seen = set()
    for t in pending:
        if t._value not in seen:
            seen.add(t._value)
            roots.append(t._value)
    extra = _extra_roots() if full else []
    for v in extra:
        if v not in seen:
            seen.add(v)
            roots.append(v)
    if mark_step:
        metrics.inc("MarkStep")
    if not roots:
        if full:
            _mark_quiet()
        return
    # A drawn key is materialised by every sync that runs a graph, a partial one (``.cpu()``,
    # ``.item()``) included: left pending, the next graph would take the whole chain of
    # earlier draws as its input, growing and compiling anew at every draw.
    rng_state = rng.pending()
    if rng_state is not None and rng_state not in seen:
        roots.append(rng_state)
    donatable = frozenset()
    predecessor = None
    if full and settings.get().donate:
        held = _held_leaf_ids(exclude={id(t) for t in pending})

        def donatable(leaves):
            return {id(n) for n in leaves if type(n) is DeviceData and id(n) not in held}
        predecessor = _predecessors(pending)
    mapping: dict = {}
    roots = _without_empty(roots, mapping)
    if not roots:                 # every result holds no element: nothing to compile or run
        _bind(mapping)
        if full:
            _mark_quiet()
        return
    try:
        graph, compiled, outputs = _execute(roots, donatable, predecessor)
    except BaseException as e:
        _rollback(pending, e, None if full else roots)
        if rng_state is not None:
            rng.restore(rng_state)
        raise
    if graph.mesh is None:
        make = ir.output_leaf     # (a root that is itself a leaf, rare, as it always was)
        for v, arr in zip(graph.roots, outputs):
            mapping[v] = make(arr, v.aval) if v.node.rule is not None else ir.leaf(arr)
        if CHECK_OUTPUTS:
            _check_output_leaves(graph.roots, outputs)
    else:
        for v, arr in zip(graph.roots, outputs):
            mapping[v] = ir.leaf(arr)
    for runs in _recorders:
        runs.append((graph, compiled, mapping))
    if rng_state is not None:
        rng.set_materialized(rng_state, mapping[rng_state])
    _bind(mapping)
    if full:
        _mark_quiet()


def _without_empty(roots: list, mapping: dict) -> list:
    """``roots`` less those holding no element, whose arrays go into ``mapping`` as they are
    (empty arrays of their shapes and dtypes: a graph of zero-size results would compile for
    nothing). Kept in the graph while a step is recorded (capture replays only its graph's
    outputs) or a value belongs to an SPMD mesh."""
    if _recorders or sharding.any_marked():
        return roots
    kept = []
    for v in roots:
        shape = v.aval.shape
        if 0 in shape and v.node.rule is not None:
            mapping[v] = ir.output_leaf(jax.device_put(np.zeros(shape, v.aval.dtype)), v.aval)
            metrics.inc("EmptyOutputsNotCompiled")
        else:
            kept.append(v)
    return kept


def _bind(mapping: dict) -> None:
    """After an execution: every tensor (and, through the rebinders, every path's storage)
    holding a computed value takes its device data."""
    for t in live_tensors():
        new = mapping.get(t._value)
        if new is not None:
            t._value = new
            t._last_data = new
    for fn in _rebinders:
        fn(mapping)


# With CHECK_OUTPUTS (on in the test suite) every sync compares each output array's shape,
# dtype and placement with what its value said (``ir.output_leaf`` takes the value's word).
CHECK_OUTPUTS = False


def _check_output_leaves(roots, outputs) -> None:
    for k, (v, arr) in enumerate(zip(roots, outputs)):
        said, got = v.aval, ir.DeviceData(arr)
        if got.avals[0] != said or got.placement is not None:
            raise AssertionError(
                f"xla_compat: output {k} of a graph ({v.node.op}) is {got.avals[0]} on "
                f"{got.placement}, its value said {said} on one device")


# ----------------------------------------------------------------------------------------------
# A replayed step (capture.py): one node whose executable is known, run without a general sync.

def run_recorded(node: Node, compiled, donate: tuple, mesh=None) -> bool:
    """Run a replay node now with the executable recorded for it and bind its outputs, or
    return False (having changed nothing) where the general sync must run it instead.

    A replay node's graph is known without collecting it: the node alone, its inputs (device
    data and numbers) its parameters in order, ``donate`` the positions the recorded graph
    donated (``mesh``: the recorded graph's, if any: such a replay syncs in full). What a full
    sync does besides, this skips: the paths' pre-sync walks, the scan for
    pending tensors and extra roots, the graph walk and its key, the cache lookup, donation
    order. It still refuses a buffer to donation while anything else holds it (falling back),
    binds outputs through the same rebinders, rolls back on failure, and counts what a sync
    counts. Nothing else pending is run: a value made alongside the node (a legacy write
    through a view of a written tensor) waits for the next sync, which reads the node's outputs
    as device data. When nothing was made since the last full sync but the node, the executor
    is quiet afterwards, as after a full sync."""
    global _quiet_at
    with lock:
        if (mesh is not None or _recorders or _fault_hooks or ir.on_create is not None
                or sharding.any_marked() or (donate and not settings.get().donate)):
            return False
        leaves = [v.node for v in node.inputs]
        ids = {id(n) for n in leaves}
        if len(ids) != len(leaves) or any(
                type(n) is not DeviceData and not isinstance(n, ScalarParam) for n in leaves):
            return False
        if donate:
            held = _held_leaf_ids(set())
            if any(type(leaves[i]) is not DeviceData or id(leaves[i]) in held for i in donate):
                return False
        alone = _quiet_at == node.id - 1 and next(ir._ids) == node.id + 1
        params = [n.array if type(n) is DeviceData else n.value for n in leaves]
        metrics.inc("MarkStep")
        metrics.inc("CachedCompile")
        metrics.sample("IrGraphSize", 1, unit=" nodes")
        _quiet_at = -2
        start = time.perf_counter_ns()
        try:
            outputs = compiled(*params)
        except BaseException as e:
            pending = [t for t in live_tensors() if not t._value.node.is_leaf]
            _rollback(pending, e, [Value(node, k) for k in range(len(node.avals))])
            if isinstance(e, Exception):
                raise _node_error(node, e) from e
            raise
        metrics.sample("ExecuteTime", time.perf_counter_ns() - start)
        _note_dispatched(outputs)
        if donate:
            metrics.inc("InputOutputAliasCount", len(donate))
        make = ir.output_leaf
        mapping = {_new_value(Value, (node, k)): make(arr, aval)
                   for k, (arr, aval) in enumerate(zip(outputs, node.avals))}
        if CHECK_OUTPUTS:
            _check_output_leaves(list(mapping), outputs)
        drawn = rng.pending()
        if drawn is not None and drawn.node is node:     # the step drew random numbers
            rng.set_materialized(drawn, mapping[drawn])
        _bind(mapping)
        if alone:
            _mark_quiet()
        return True


_new_value = tuple.__new__


def _node_error(node: Node, e: BaseException) -> "GraphError":
    return GraphError(
        f"xla_compat: executing a replayed step ({node.op}, {len(node.inputs)} inputs, "
        f"{len(node.avals)} outputs) failed: {type(e).__name__}: {e}\n"
        f"  State the step writes in place keeps the value it had before this call; tensors the "
        f"step makes anew read as this error until the next call. A memory error means the step "
        f"needs less memory (smaller batch).")


_predecessor_fns: list = []


def register_predecessors(fn) -> None:
    """``fn()`` yields (pending Value, the leaf Value it replaces) for values outside tensors
    (legacy alias bases), so their outputs meet their donated buffers (``_donation_order``)."""
    _predecessor_fns.append(fn)


def _predecessors(pending) -> dict:
    """{pending root: id of the leaf it replaces}, one root per leaf, same shape and dtype.

    A tensor's own last value comes first; a root of a tensor with none (an optimizer's state
    on the functional path: upstream makes its wrapper, which no boundary sees) pairs with the
    leaf its update chain starts from (``_updated_leaf``), if no root claimed that leaf."""
    pairs = [(t._value, t._last_data) for t in pending]
    for fn in _predecessor_fns:
        pairs.extend(fn())
    out, taken = {}, set()
    for value, last in pairs:
        if (last is None or value in out or id(last.node) in taken
                or value.aval != last.aval):
            continue
        out[value] = id(last.node)
        taken.add(id(last.node))
    for t in pending:
        value = t._value
        if t._last_data is None and value not in out:
            leaf = _updated_leaf(value)
            if leaf is not None and id(leaf) not in taken:
                out[value] = id(leaf)
                taken.add(id(leaf))
    return out


def _updated_leaf(value: Value, limit: int = 8):
    """The device-data node an in-place update chain ending in ``value`` started from, or None.

    ``x.mul_(a).add_(b)`` traces as ``add(mul(x, a), b)``: each step's updated operand is its
    first input, and a foreach op's k-th output updates its k-th input. Only a guess of which
    buffer ``value`` replaces, so only an ordering hint (``_donation_order``): a wrong one costs
    XLA a copy, never a wrong result."""
    aval = value.aval
    for _ in range(limit):
        node = value.node
        if node.rule is None:
            return node if type(node) is DeviceData else None
        if value.index >= len(node.inputs) or "_like." in node.op:
            return None        # (``zeros_like(p)`` takes only p's shape: a new tensor)
        value = node.inputs[value.index]
        if value.aval != aval:
            return None
    return None


_extra_root_fns: list = []


def register_extra_roots(fn) -> None:
    """``fn()`` yields pending Values that a full sync must also materialise."""
    _extra_root_fns.append(fn)


@contextlib.contextmanager
def extra_roots(fn):
    """Inside the block, full syncs also materialise the Values ``fn()`` yields."""
    _extra_root_fns.append(fn)
    try:
        yield
    finally:
        _extra_root_fns.remove(fn)


def _extra_roots() -> list:
    out = []
    for fn in _extra_root_fns:
        out.extend(v for v in fn() if not v.node.is_leaf)
    return out


def _execute(roots: list[Value], donatable: set, predecessor=None):
    """(graph, executable, output arrays in ``graph.roots`` order) of running ``roots``."""
    global _last_compiled
    graph = collect(roots, donatable, predecessor)
    params = _params(graph)
    metrics.sample("IrGraphSize", len(graph.nodes), unit=" nodes")
    direct = _direct(graph)       # a replayed step (capture.py) brings its recorded executable
    compiled = direct if direct is not None else cache.get(graph.key)
    backups = None
    if compiled is None:
        metrics.inc("UncachedCompile")
        try:
            compiled = compile_graph(graph, params)
        except LoweringError:
            raise
        except Exception as e:
            raise _graph_error("compiling", graph, e) from e
        cache.put(graph.key, compiled)
        backups = _backups(graph)     # a new executable's first run may fail after donation
    else:
        metrics.inc("CachedCompile")
    _last_compiled = compiled
    _before_execute(graph)
    start = time.perf_counter_ns()
    try:
        outputs = compiled(*params)
    except BaseException as e:
        _restore(backups)
        if isinstance(e, Exception):
            raise _graph_error("executing", graph, e) from e
        raise
    metrics.sample("ExecuteTime", time.perf_counter_ns() - start)
    _note_dispatched(outputs)
    if graph.donate:
        metrics.inc("InputOutputAliasCount", len(graph.donate))
    if direct is not None:        # the node's outputs, in root order
        outputs = [outputs[v.index] for v in graph.roots]
    return graph, compiled, outputs


class GraphError(RuntimeError):
    """XLA failed to compile or execute a graph; names the graph's ops and where they came from."""


def _graph_error(doing: str, graph: Graph, e: BaseException) -> GraphError:
    counts = collections.Counter(node.op for node in graph.nodes)
    ops = ", ".join(f"{op} x{n}" if n > 1 else op for op, n in counts.most_common(8))
    if len(counts) > 8:
        ops += f", ... ({len(counts) - 8} more kinds)"
    lines = []
    for node in graph.nodes:
        if node.source and node.where() not in lines:
            lines.append(node.where())
        if len(lines) == 3:
            break
    where = ("created at " + "; ".join(lines)) if lines else ir.NO_SOURCE
    return GraphError(
        f"xla_compat: {doing} a graph of {len(graph.nodes)} ops failed: {type(e).__name__}: {e}\n"
        f"  ops: {ops}\n  {where}\n"
        f"  Every tensor keeps the value it had before this sync. A memory error means the step "
        f"needs less memory (smaller batch, or sync more often to cut the graph).")


def _backups(graph: Graph):
    """Host copies of the buffers a new executable's first run will take over (donation): if that
    run fails, the tensors get their values back (``_restore``). Later runs of an executable that
    ran once do not pay for this."""
    if not graph.donate:
        return None
    import numpy as np
    out = []
    for i in graph.donate:
        leaf = graph.leaves[i]
        out.append((leaf, np.asarray(leaf.array), leaf.array.sharding))
    return out


def _restore(backups) -> None:
    for leaf, host, where in backups or ():
        if leaf.array.is_deleted():
            leaf.set_array(jax.device_put(host, where))


def _direct(graph: Graph):
    """The executable a one-node graph's rule brings along (a replayed step), if it fits."""
    if len(graph.nodes) != 1:
        return None
    direct = getattr(graph.nodes[0].rule, "direct", None)
    return direct(graph) if direct is not None else None


# Lists that each successful sync appends (graph, executable, {root: new leaf}) to (capture.py).
_recorders: list = []


@contextlib.contextmanager
def recording(runs: list):
    """Append every sync inside the block to ``runs``."""
    _recorders.append(runs)
    try:
        yield runs
    finally:
        # by identity: a nested recording's list may hold the same runs, and so compare equal
        del _recorders[next(i for i, r in enumerate(_recorders) if r is runs)]


def sync_all() -> None:
    """A full sync as ``xc.sync()`` does it (paths apply pending alias updates first)."""
    from . import sync
    sync()


_fault_hooks: list = []


def _before_execute(graph: Graph) -> None:
    """Test hook point: planted execution faults raise here, before buffers are consumed."""
    for hook in _fault_hooks:
        hook(graph)


def _rollback(pending: list, error: BaseException, roots=None) -> None:
    """After a failed sync: every pending tensor returns to its last materialised value."""
    metrics.inc("FailedSync")
    for t in pending:
        t._value = restored(t._value, getattr(t, "_last_data", None), error)
    for fn in _failure_hooks:
        fn(error, roots)


def restored(value: Value, last, error: BaseException) -> Value:
    """What a tensor that held ``value`` holds after a failed sync: ``last``, its last
    materialised value, where that buffer still lives; else ``value`` poisoned with the error.
    A tensor resized since (``resize_``, an out= op) keeps its new size: ``last`` resized."""
    if last is not None and not last.node.array.is_deleted():
        if last.aval == value.aval or last.aval.dtype != value.aval.dtype:
            return last
        return Value(Node("resized", Resized(tuple(value.aval.shape)), (ir.Slot(0),), (),
                          (last,), (value.aval,)), 0)
    return Value(Poisoned(value.node.avals, poison_error(error)), value.index)


@dataclass(frozen=True)
class Resized:
    """IR rule: a value resized as ``resize_`` resizes a contiguous tensor (the first elements in
    row-major order keep their values; new ones are uninitialised in eager, 0 here)."""

    shape: tuple

    def __call__(self, x):
        from .lowering.views import resize       # the functional resize's own lowering
        return resize(x, self.shape, aval=jax.ShapeDtypeStruct(self.shape, x.dtype))


def poison_error(error: BaseException) -> RuntimeError:
    return RuntimeError(
        "xla_compat: this tensor was computed by a graph whose sync failed, and it has no "
        f"earlier value to return to. The failure was:\n  {type(error).__name__}: {error}")


def hlo_text(tensors) -> str:
    """StableHLO text of the graph that computes ``tensors`` (nothing is executed)."""
    with lock:
        roots = [t._value for t in tensors]
        graph = collect(roots)
        return _jit(graph, build_function(graph)).lower(*_params(graph)).as_text()


_last_compiled = None


def compiled_text() -> str:
    """The optimised HLO of the executable the last sync ran (after XLA's passes, so SPMD
    collectives such as all-reduce are visible); '' before any sync."""
    return _last_compiled.as_text() if _last_compiled is not None else ""


# Outputs of executions dispatched since the last wait (weak: a dropped output needs no wait).
# Live tensors alone miss buffers only a path holds (legacy alias bases), whose graphs would
# otherwise still run after wait_device_ops returned.
_dispatched: list = []
_compact_at = 4096        # the list's length that prompts dropping dead references


def _note_dispatched(outputs) -> None:
    global _compact_at
    _dispatched.extend(map(weakref.ref, outputs))
    if len(_dispatched) > _compact_at:
        _dispatched[:] = [r for r in _dispatched if r() is not None]
        # A job that never waits keeps its state's buffers listed (all alive): compacting again
        # only once the list has doubled keeps the cost per output constant.
        _compact_at = max(4096, 2 * len(_dispatched))


def wait_device_ops() -> None:
    """Block until every dispatched execution has finished (torch_xla's wait_device_ops)."""
    pending, _dispatched[:] = list(_dispatched), []
    arrays = []
    for ref in pending:
        arr = ref()
        if arr is not None and not arr.is_deleted():
            arrays.append(arr)
    for t in live_tensors():      # device data from transfers (device_put runs asynchronously)
        node = t._value.node
        if type(node) is DeviceData and not node.array.is_deleted():
            arrays.append(node.array)
    if arrays:
        jax.block_until_ready(arrays)


def clear_cache() -> None:
    cache.clear()
