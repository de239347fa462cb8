"""Step capture: trace a step once, then replay its compiled graph without tracing.

    step = xc.compile(train_step)        # or @xc.compile
    for x, y in batches:
        loss = step(x, y)                # first call per signature traces and records;
                                         # later calls replay the recorded executable

A captured call runs the step lazily as usual, syncs once at its end and records what that one
graph read and wrote: which state tensor (an argument, a module's parameter, buffer or ``.grad``,
an optimizer's state) fed each input and took each output, and which outputs the step returned.
A later call with the same **signature** skips the Python step entirely: it binds the state's
current device buffers to the inputs, gives each state tensor a pending output of ONE replay node
(through its path, so views and alias bookkeeping stay exact), and runs the recorded executable
for that node at once (``executor.run_recorded``: no graph walk, key or cache lookup; counted in
``StepCaptureDirectRun``). Where that cannot be done as the recording did it (a buffer the step
donates is still held by another tensor, dual-run lockstep, a mesh layout) it syncs in full
instead. A replay whose executable fails raises an error naming it and leaves the state as it
was before the call: state written in place keeps its values, and every place the step rebinds
or clears (``.grad``s, attributes, dict entries) holds the tensor it held before (where the step
donates that tensor's buffer, a new tensor of the same buffer and metadata: holding the tensor
itself through the run would have refused the donation).

The signature (the guards) is: the active path; every state tensor's shape, dtype and
requires_grad, and which state slots exist (``.grad`` set or None, optimizer state present);
non-tensor arguments by value; optimizer hyperparameters by value (an lr schedule that changes
lr re-traces: the value was baked into the trace as a run-time scalar); host tensors in optimizer
state by value (torch's Adam keeps ``step`` on the CPU unless ``capturable=True``, so without
that flag every Adam step re-traces); module train/eval flags; grad mode. A call whose signature
has no recording traces (and records); a recording whose inputs no longer match (a buffer laid
out differently, a state tensor with pending work that did not sync to the same shape) falls back
to tracing and counts ``StepCaptureGuardFailure``.

What a step must be: a function of its state's values. Python side effects other than tensor
writes (appending to a list, reading ``.item()``, data-dependent Python branches) are not
replayed; a step that syncs more than once (``.item()``, ``print``) or reads device data that is
not in its state (a tensor moved to the device inside the step) is never replayed: it runs traced
every time and the reason is in ``captured.reason`` and the ``StepCaptureRefused`` counter.
Returned tensors are values without autograd history.
"""
from __future__ import annotations

import collections
import functools
import threading
import types
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Optional

import jax
import torch

from . import executor, metrics, paths
from .lazy import rng
from .lazy.ir import DeviceData, Node, ScalarParam, Slot, Value

REPLAY_OP = "xla_compat.replay"


class CaptureRefused(Exception):
    """The step cannot be replayed (the message says why); it keeps running traced."""


# ----------------------------------------------------------------------------------------------
# State: every tensor a step can read or write, by a stable address.

class StateSlot:
    """One place a device tensor lives: ``get()`` reads it, ``put(t)`` rebinds it (or None when
    the place cannot be rebound, e.g. an argument: only written in place). Every call walks its
    state anew (the guards), so a slot is a plain object, not a (slower to make) dataclass."""

    __slots__ = ("address", "get", "put")

    def __init__(self, address: tuple, get: Callable[[], Any], put: Optional[Callable]):
        self.address, self.get, self.put = address, get, put

    def __repr__(self):
        return f"StateSlot({self.address!r})"


_HLO = "hlo"


def _is_device(t) -> bool:
    return isinstance(t, torch.Tensor) and t.device.type == _HLO


def _walk_args(value, address, slots: list, sig: list) -> None:
    if isinstance(value, torch.Tensor):
        if value.device.type == _HLO:
            slots.append(StateSlot(address, _constant(value), None))
        else:
            sig.append((address, "host", tuple(value.shape), value.dtype))
    elif isinstance(value, torch.nn.Module):
        _walk_module(value, address, slots, sig)
    elif isinstance(value, torch.optim.Optimizer):
        _walk_optimizer(value, address, slots, sig)
    elif isinstance(value, (list, tuple)):
        sig.append((address, type(value).__name__, len(value)))
        for i, v in enumerate(value):
            _walk_args(v, address + (i,), slots, sig)
    elif isinstance(value, dict):
        sig.append((address, "dict", tuple(value)))
        for k, v in value.items():
            _walk_args(v, address + (k,), slots, sig)
    elif isinstance(value, _Attributes):
        _walk_attributes(value.obj, address, slots, sig)
    else:
        try:
            hash(value)
            sig.append((address, "value", value))
        except TypeError:
            sig.append((address, "object", id(value)))


def _constant(value):
    return lambda: value


class _Attributes:
    """Walk this object's attributes (the ``self`` of a step that is a method)."""

    def __init__(self, obj):
        self.obj = obj


def _walk_attributes(obj, address, slots: list, sig: list) -> None:
    for name, v in sorted(vars(obj).items()):
        a = address + (name,)
        if _is_device(v) or v is None:
            slots.append(StateSlot(a, _attribute(obj, name), _setter(obj, name)))
        elif isinstance(v, (torch.nn.Module, torch.optim.Optimizer, torch.Tensor, list, tuple,
                            dict)):
            _walk_args(v, a, slots, sig)
        else:
            _walk_args(v, a, [], sig)     # plain values are guards, deeper objects by identity


def _attribute(obj, name):
    return lambda: getattr(obj, name, None)


def _setter(obj, name):
    def put(t):
        setattr(obj, name, t)
    return put


def _grad_of(p):
    return lambda: p.grad


def _walk_module(m: torch.nn.Module, address, slots: list, sig: list) -> None:
    """``named_modules`` and each one's own parameters and buffers, read from the modules'
    dicts (torch's generators cost more than the walk's own work, and this runs every call)."""
    for name, sub in _named_modules(m):
        sig.append((address, name, sub.training))
        seen = set()
        for pname, p in sub._parameters.items():
            if p is None or id(p) in seen:
                continue
            seen.add(id(p))
            a = address + (name, pname)
            slots.append(StateSlot(a + ("param",), _constant(p), None))
            slots.append(StateSlot(a + ("grad",), _grad_of(p), _setter(p, "grad")))
        for bname, b in sub._buffers.items():
            if b is not None and id(b) not in seen:
                seen.add(id(b))
                slots.append(StateSlot(address + (name, bname, "buffer"),
                                       _attribute(sub, bname), _setter(sub, bname)))


def _named_modules(m: torch.nn.Module, prefix: str = "", memo=None):
    """``m.named_modules()``: each distinct module once, depth first, with its dotted name."""
    if memo is None:
        memo = set()
    if id(m) in memo:
        return
    memo.add(id(m))
    yield prefix, m
    for name, sub in m._modules.items():
        if sub is not None:
            yield from _named_modules(sub, prefix + ("." if prefix else "") + name, memo)


def _walk_optimizer(o: torch.optim.Optimizer, address, slots: list, sig: list) -> None:
    state_of_param = o.state
    for gi, group in enumerate(o.param_groups):
        for k, v in group.items():
            if k != "params":
                sig.append((address, gi, k, _hashable(v)))
        for pi, p in enumerate(group["params"]):
            a = address + (gi, pi)
            slots.append(StateSlot(a + ("param",), _constant(p), None))
            slots.append(StateSlot(a + ("grad",), _grad_of(p), _setter(p, "grad")))
            state = state_of_param.get(p)
            if not state:
                sig.append((a, "no state"))
                continue
            for k, v in state.items():
                if _is_device(v):
                    slots.append(StateSlot(a + ("state", k), _entry(state, k),
                                           _entry_setter(state, k)))
                else:
                    sig.append((a, k, _hashable(v)))


def _entry(state: dict, k):
    return lambda: state.get(k)


def _entry_setter(state: dict, k):
    def put(t):
        state[k] = t
    return put


def _hashable(v):
    tv = type(v)
    if tv is float or tv is int or tv is bool or tv is str or v is None:
        return v
    if isinstance(v, torch.Tensor):      # a host tensor (Adam's step): its value is the guard
        return ("tensor", v.dtype, tuple(v.shape), tuple(v.detach().flatten().tolist())
                if v.numel() <= 16 else id(v))
    if isinstance(v, (list, tuple)):
        return tuple(_hashable(e) for e in v)
    try:
        hash(v)
        return v
    except TypeError:
        return id(v)


def _closure_state(fn) -> list:
    """Modules, optimizers and device tensors the step reaches through closures and globals."""
    found = []
    while isinstance(fn, functools.partial):
        found.extend(fn.args)
        found.extend(fn.keywords.values())
        fn = fn.func
    if isinstance(fn, types.MethodType):
        owner = fn.__self__
        found.append(owner if isinstance(owner, (torch.nn.Module, torch.optim.Optimizer))
                     else _Attributes(owner))
        fn = fn.__func__
    code = getattr(fn, "__code__", None)
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            found.append(cell.cell_contents)
        except ValueError:       # an empty cell
            pass
    if code is not None:
        g = getattr(fn, "__globals__", {})
        for name in code.co_names:
            v = g.get(name)
            if isinstance(v, (torch.nn.Module, torch.optim.Optimizer, torch.Tensor)):
                found.append(v)
    return [v for v in found if isinstance(v, (torch.nn.Module, torch.optim.Optimizer,
                                               _Attributes)) or _is_device(v)]


def state_of(fn, args, kwargs, extra) -> tuple[list, tuple]:
    """(slots, signature) of one call."""
    slots: list = []
    sig: list = [("path", paths.active().name), ("grad_mode", torch.is_grad_enabled())]
    _walk_args(tuple(args), ("arg",), slots, sig)
    _walk_args(dict(kwargs), ("kwarg",), slots, sig)
    for i, obj in enumerate(list(extra) + _closure_state(fn)):
        _walk_args(obj, ("state", i), slots, sig)
    put = sig.append
    for s in slots:
        t = s.get()
        put((s.address, None if t is None else
             (type(t), tuple(t.shape), t.dtype, t.requires_grad, t.stride())))
    return slots, tuple(sig)


# ----------------------------------------------------------------------------------------------
# The recording.

class _Constant(ScalarParam):
    """A number the recorded step baked in (the guards keep it unchanged), put on the device
    once: a Python number would be converted on every replay."""

    __slots__ = ()

    def __init__(self, scalar: ScalarParam):
        super().__init__(scalar.value)
        self.value = jax.device_put(scalar.value)


class ReplayRule:
    """The rule of a replay node: the recorded graph as a function of its inputs, with the
    executable compiled for it (``direct`` returns it when the replay graph passes the inputs
    in the recorded order and donates the same buffers)."""

    def __init__(self, graph, compiled, consts=None):
        self.fn = executor.build_function(graph)
        self.compiled = compiled
        self.donate = graph.donate
        self.mesh = graph.mesh
        self.n_inputs = len(graph.leaves)
        if consts:            # numbers compiled in: the node takes the other inputs
            self.fn, keep = executor.with_constants(self.fn, self.n_inputs, consts)
            position = {i: k for k, i in enumerate(keep)}
            self.donate = tuple(position[d] for d in graph.donate)
            self.n_inputs = len(keep)
        self.template = tuple(Slot(i) for i in range(self.n_inputs))   # the node's arguments

    def __call__(self, *ins):
        return self.fn(*ins)

    def direct(self, graph) -> Optional[Callable]:
        node = graph.nodes[0]
        if len(graph.leaves) != self.n_inputs or graph.donate != self.donate:
            return None
        if any(v.node is not leaf for v, leaf in zip(node.inputs, graph.leaves)):
            return None
        return self.compiled


@dataclass
class Recording:
    """What one captured call read and wrote."""

    rule: ReplayRule
    inputs: list          # per graph leaf: ("slot", address, signature) | ("rng",) | ("node", leaf)
    avals: tuple          # output avals of the replay node (the recorded graph's roots)
    writes: list          # (root index, address, "inplace" | "rebind", (shape, dtype, strides))
    clears: list          # addresses set to None by the step
    result: Any           # the returned value, tensors replaced by ("root"|"slot", ...) markers
    rng_out: Optional[int]


def _leaf_of(t) -> Optional[Node]:
    node = paths.inner_tensor(t)._value.node
    return node if type(node) is DeviceData else None


def _record(fn, args, kwargs, extra, slots):
    """Run the step traced (nothing is pending: the caller synced before ``slots`` were read),
    sync once, and return (result, Recording)."""
    foreign = [s.address for s in slots if s.get() is not None and paths.of(s.get()) is None]
    if foreign:      # dual-run lockstep's pair tensors: each op runs on two paths, no replay
        raise CaptureRefused(f"{foreign[0]} is not a tensor of one path (lockstep pair?); the "
                             f"step runs traced", fn(*args, **kwargs))
    # What each slot held, weakly: a tensor the step rebinds or clears dies with its last
    # reference, so the recorded sync may donate its buffer (as a traced step's sync does).
    before = {}
    for s in slots:
        t = s.get()
        if t is not None:
            before[s.address] = (weakref.ref(t), _leaf_of(t))
    by_leaf = {}
    for address, (t, leaf) in before.items():
        if leaf is not None:
            by_leaf.setdefault(id(leaf), address)
    rng_before = rng.state().node
    runs: list = []
    with executor.recording(runs):
        result = fn(*args, **kwargs)
    post_slots, _ = state_of(fn, args, kwargs, extra)

    def state_values():
        # A state tensor may be a view whose value is derived on read (a legacy gradient that
        # is a transposed mm): the recorded graph computes it too, so replay can bind it.
        for s in post_slots:
            t = s.get()
            if t is not None:
                yield paths.inner_tensor(t)._value

    with executor.recording(runs), executor.extra_roots(state_values):
        executor.sync_all()
    if len(runs) != 1:
        if not runs:
            raise CaptureRefused("the step computed nothing on the device", result)
        raise CaptureRefused(
            f"the step synced {len(runs)} times (a value read on the host inside it: .item(), "
            f"print, a data-dependent shape); only a step that syncs once can be replayed",
            result)
    graph, compiled, mapping = runs[0]
    root_of = {id(mapping[v].node): k for k, v in enumerate(graph.roots)}
    inputs = []
    for leaf in graph.leaves:
        if type(leaf) is ScalarParam:
            inputs.append(("node", _Constant(leaf)))
        elif leaf is rng_before:
            inputs.append(("rng",))
        elif id(leaf) in by_leaf:
            inputs.append(("slot", by_leaf[id(leaf)], leaf.signature()))
        else:
            raise CaptureRefused(
                f"the step read device data of shape {list(leaf.avals[0].shape)} that is not in "
                f"its arguments, modules or optimizers (moved to the device inside the step?); "
                f"pass it as an argument or in state=", result)
    post = [(s, t, _leaf_of(t) if t is not None else None)
            for s in post_slots for t in (s.get(),)]
    writes, clears, done = [], [], set()
    for s, t, leaf in post:
        old = before.get(s.address)
        if t is not None:
            if id(t) in done:       # one tensor at two addresses (a module's and an optimizer's)
                continue
            done.add(id(t))
        if t is None:
            if old is not None:
                if s.put is None:
                    raise CaptureRefused(f"the step cleared {s.address}", result)
                clears.append(s.address)
            continue
        if leaf is None:
            raise CaptureRefused(f"{s.address} is not materialised after the step", result)
        k = root_of.get(id(leaf))
        if k is None:
            if old is None or old[1] is not leaf:
                raise CaptureRefused(f"{s.address} took a value the step did not compute "
                                     f"(a tensor shared between two state slots?)", result)
            continue
        same = old is not None and old[0]() is t
        if not same and s.put is None:
            raise CaptureRefused(f"{s.address} was replaced by a new tensor object", result)
        writes.append((k, s.address, "inplace" if same else "rebind",
                       (tuple(t.shape), t.dtype, tuple(t.stride()))))
    rng_out = root_of.get(id(rng.state().node))
    slot_by_leaf = {id(leaf): s.address for s, _, leaf in post if leaf is not None}

    marked = _mark(result, result, slot_by_leaf, root_of)
    avals = tuple(v.aval for v in graph.roots)
    rule, inputs = _replay_rule(graph, compiled, inputs)
    return result, Recording(rule, inputs, avals, writes, clears, marked, rng_out)


def _mark(v, result, slot_by_leaf: dict, root_of: dict):
    """The recorded form of the step's result ``v``: each tensor as the root or the state slot
    that holds it, other values as constants (``_unmark`` reverses it). A module-level
    function: a nested recursive one would be a reference cycle holding the result."""
    if isinstance(v, torch.Tensor):
        if not _is_device(v):
            raise CaptureRefused("the step returned a host tensor", result)
        leaf = _leaf_of(v)
        if leaf is not None and id(leaf) in slot_by_leaf and root_of.get(id(leaf)) is None:
            return ("slot", slot_by_leaf[id(leaf)])
        k = root_of.get(id(leaf)) if leaf is not None else None
        if k is None:
            raise CaptureRefused("the step returned a tensor it did not compute", result)
        return ("root", k, tuple(v.shape), v.dtype, tuple(v.stride()))
    if isinstance(v, (list, tuple)):
        return type(v)(_mark(e, result, slot_by_leaf, root_of) for e in v)
    if isinstance(v, dict):
        return {k: _mark(e, result, slot_by_leaf, root_of) for k, e in v.items()}
    return ("const", v)


# What a replay pays for numbers it passes rather than has compiled in. They travel packed
# (packed_numbers.Packed): a replay passes the same numbers as the last call, which reuses that
# call's vectors after comparing each number, and the program takes each number out of its
# vector. Measured on W1's recorded step (15 numbers), call + wait, alternating: passed 142 us,
# compiled in 120 us (the JAX twin, literals in its code: 119 us). The recorded step's numbers
# are compiled in when that saves its compile time within BAKE_HORIZON replays, a fraction of
# the steps a captured training job replays: a short elementwise step, yes (W1 compiles in
# ~0.27 s, which a horizon of 10,000 replays put right at the line, so W1's replays took one
# executable or the other from run to run); a training step that compiles for seconds, no
# (W3's legacy step has 183 numbers: compiling them in took a second 3.9 s compile for
# ~0.05 ms per replay).
PACKED_CALL_NS = 20_000
PER_NUMBER_NS = 150
BAKE_HORIZON = 25_000


def bake_pays(n_numbers: int, compile_ns: Optional[int]) -> bool:
    """Whether compiling ``n_numbers`` numbers in saves a compile of ``compile_ns`` (None:
    unknown, assume it does) within BAKE_HORIZON replays."""
    if compile_ns is None:
        return True
    return (PACKED_CALL_NS + n_numbers * PER_NUMBER_NS) * BAKE_HORIZON > compile_ns


def _replay_rule(graph, compiled, inputs: list):
    """The replay rule, and the node's inputs: the recorded graph's numbers (the guards keep
    them unchanged) compiled in as constants where that pays, else passed as device scalars."""
    numbers = {i: leaf.value for i, leaf in enumerate(graph.leaves)
               if type(leaf) is ScalarParam}
    compile_ns = getattr(compiled, "xla_compat_compile_ns", None)
    if not numbers or graph.mesh is not None or not bake_pays(len(numbers), compile_ns):
        return ReplayRule(graph, compiled), inputs
    structs = [None if i in numbers else jax.ShapeDtypeStruct(leaf.avals[0].shape,
                                                              leaf.avals[0].dtype)
               for i, leaf in enumerate(graph.leaves)]
    baked = executor.compile_graph(graph, structs, baked=numbers)
    metrics.inc("CaptureConstantsCompiledIn", len(numbers))
    kept = [entry for i, entry in enumerate(inputs) if i not in numbers]
    return ReplayRule(graph, baked, consts=numbers), kept


# ----------------------------------------------------------------------------------------------
# Replay.

class GuardFailure(Exception):
    """The recording does not fit this call's state (the message says how)."""


def _replay(rec: Recording, slots: list):
    impl = paths.active()
    by_address = {s.address: s for s in slots}
    inputs = []
    for entry in rec.inputs:
        if entry[0] == "node":
            inputs.append(Value(entry[1], 0))
        elif entry[0] == "rng":
            inputs.append(rng.state())
        else:
            _, address, signature = entry
            slot = by_address.get(address)
            # (no local keeps the tensor: held through the sync, its buffer would not be donated)
            leaf = _slot_leaf(slot)
            if leaf is None or leaf.signature() != signature:
                raise GuardFailure(f"{address} holds no device buffer like the recorded one")
            inputs.append(Value(leaf, 0))
    node = Node(REPLAY_OP, rec.rule, rec.rule.template, (), tuple(inputs), rec.avals)
    metrics.inc("IrNodes")
    # What this call rebinds or clears is kept until the node has run, and put back if it fails
    # (the step then did not happen: state written in place rolls back in the executor). A
    # tensor whose buffer the node donates is not kept: holding it would refuse the donation.
    donated = {id(inputs[i].node) for i in rec.rule.donate}
    before = []
    written = []
    for k, address, how, (shape, dtype, stride) in rec.writes:
        slot = by_address[address]
        if how == "inplace":
            t = slot.get()
            impl.assign(t, Value(node, k))
        else:
            _keep(slot, before, donated)
            t = impl.wrap(impl.tensor_cls(Value(node, k), shape, dtype, stride))
            slot.put(t)
        written.append(t)
    for address in rec.clears:
        slot = by_address[address]
        _keep(slot, before, donated)
        slot.put(None)
    drew_from = None
    if rec.rng_out is not None:
        drew_from = rng.state()
        rng.advance(Value(node, rec.rng_out))

    result = _unmark(rec.result, node, impl, by_address)
    try:
        if _sync_hooks():
            executor.sync_all()
            return result
        # The written tensors' paths settle them as a sync would (functional: the storage lets
        # go of the value it held before, so that buffer can be donated), then the node runs.
        paths.before_sync(written)
        if not executor.run_recorded(node, rec.rule.compiled, rec.rule.donate, rec.rule.mesh):
            executor.sync_all()
        else:
            metrics.inc("StepCaptureDirectRun")
        return result
    except BaseException:
        for slot, t in before:
            slot.put(t if type(t) is not tuple else _remade(impl, *t))
        if drew_from is not None:
            rng.advance(drew_from)
        raise


def _keep(slot, before: list, donated: set) -> None:
    """Remember what ``slot`` holds: the tensor, or where the node donates its buffer (holding
    the tensor would refuse the donation), its leaf and metadata to remake it from."""
    t = slot.get()
    if t is None:
        return
    leaf = _leaf_of(t)
    if id(leaf) not in donated:
        before.append((slot, t))
    else:
        before.append((slot, (leaf, tuple(t.shape), t.dtype, t.stride(), t.requires_grad)))


def _remade(impl, leaf, shape, dtype, stride, requires_grad):
    """A tensor of ``leaf``'s buffer (None where the failed run consumed it)."""
    if leaf.array.is_deleted():
        return None
    t = impl.wrap(impl.tensor_cls(Value(leaf, 0), shape, dtype, stride))
    return t.requires_grad_(True) if requires_grad else t


def _unmark(m, node, impl, by_address):
    """The step's result from its recorded form: ("root", ...) markers become tensors of the
    replay node's outputs, ("slot", address) the tensor now at that address. (A module-level
    function: a nested recursive one would be a reference cycle holding the node and every
    slot, freed only by the cyclic collector.)"""
    if isinstance(m, tuple) and m and m[0] == "root":
        _, k, shape, dtype, stride = m
        return impl.wrap(impl.tensor_cls(Value(node, k), shape, dtype, stride))
    if isinstance(m, tuple) and m and m[0] == "slot":
        return by_address[m[1]].get()
    if isinstance(m, tuple) and m and m[0] == "const":
        return m[1]
    if isinstance(m, (list, tuple)):
        return type(m)(_unmark(e, node, impl, by_address) for e in m)
    if isinstance(m, dict):
        return {k: _unmark(e, node, impl, by_address) for k, e in m.items()}
    return m


def _sync_hooks() -> bool:
    """Is a sync hook of ``xla_compat`` engaged (dual-run lockstep)? A replay then syncs as
    ``xc.sync()`` does, through it."""
    from . import _sync_hooks as hooks
    return any(h.engaged() for h in hooks)


def _slot_leaf(slot) -> Optional[Node]:
    t = slot.get() if slot is not None else None
    return _leaf_of(t) if t is not None else None




def difference(old: tuple, new: tuple) -> str:
    """The first guard in which two signatures differ, for a person to read."""
    before = {e[:-1]: e[-1] for e in old if isinstance(e, tuple) and e}
    for e in new:
        if isinstance(e, tuple) and e and before.get(e[:-1], e[-1]) != e[-1]:
            return f"{_readable(e[:-1])} was {before[e[:-1]]!r}, now {e[-1]!r}"
    keys_old = {e[:-1] for e in old if isinstance(e, tuple) and e}
    keys_new = {e[:-1] for e in new if isinstance(e, tuple) and e}
    gone, came = sorted(map(repr, keys_old - keys_new)), sorted(map(repr, keys_new - keys_old))
    if came:
        return f"new state {came[0]}"
    if gone:
        return f"state {gone[0]} is gone"
    return "the signature changed"


def _readable(key: tuple) -> str:
    return "/".join(str(p) for part in key
                    for p in (part if isinstance(part, tuple) else (part,)))


# ----------------------------------------------------------------------------------------------
# The public wrapper.

class CapturedStep:
    """A step function with recordings per signature (``xc.compile(fn)``)."""

    def __init__(self, fn, state=(), max_recordings: int = 8):
        self.fn = fn
        self.state = tuple(state)
        self.max_recordings = max_recordings
        self.recordings: collections.OrderedDict = collections.OrderedDict()
        self._last_sig = None
        self.refused: dict = {}
        self.reason: Optional[str] = None
        self.stats = {"replays": 0, "recorded": 0, "traced": 0, "guard_failures": 0}
        self._lock = threading.RLock()
        functools.update_wrapper(self, fn)

    def __call__(self, *args, **kwargs):
        with self._lock:   # not the tracing lock: backward traces on autograd's device thread
            if not executor.quiet():      # IR was built since the last full sync
                executor.sync_all()
            slots, sig = state_of(self.fn, args, kwargs, self.state)
            rec = self.recordings.get(sig)
            if rec is not None:
                try:
                    out = _replay(rec, slots)
                    self._last_sig = sig
                    self.recordings.move_to_end(sig)
                    self.stats["replays"] += 1
                    metrics.inc("StepCaptureReplay")
                    return out
                except GuardFailure as e:
                    self.stats["guard_failures"] += 1
                    metrics.inc("StepCaptureGuardFailure")
                    self.reason = str(e)
                    del self.recordings[sig]
            if sig in self.refused:
                return self._traced(args, kwargs)
            if self._last_sig is not None and rec is None:
                # A guard failed: this call's signature differs from the recorded ones.
                self.stats["guard_failures"] += 1
                metrics.inc("StepCaptureGuardFailure")
                self.reason = "re-traced: " + difference(self._last_sig, sig)
            try:
                result, rec = _record(self.fn, args, kwargs, self.state, slots)
            except CaptureRefused as e:
                message, result = e.args
                self.refused[sig] = message
                self.reason = message
                self.stats["traced"] += 1
                metrics.inc("StepCaptureRefused")
                return result
            self.recordings[sig] = rec
            self._last_sig = sig
            while len(self.recordings) > self.max_recordings:      # least recently used
                self.recordings.pop(next(iter(self.recordings)))
            self.stats["recorded"] += 1
            metrics.inc("StepCaptureRecorded")
            return result

    def _traced(self, args, kwargs):
        self.stats["traced"] += 1
        return self.fn(*args, **kwargs)


def compile(fn=None, *, state=(), max_recordings: int = 8):  # noqa: A001 - xc.compile
    """Capture ``fn`` (a training or serving step) and replay it; see this module's doc.

    ``state``: modules, optimizers or device tensors the step uses that are neither arguments
    nor reachable through its closure or globals. Usable as ``@xc.compile`` or
    ``@xc.compile(state=(model, opt))``."""
    if fn is None:
        return lambda f: CapturedStep(f, state, max_recordings)
    return CapturedStep(fn, state, max_recordings)
