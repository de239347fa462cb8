"""Trace plans for the legacy path's own ops: views, in-place ops and ``copy_`` (a decode loop's
writes into a KV cache), replayed without the full handlers of ``ops.py`` and the tracer.

A plan is keyed by everything that decides what the full path does and which of eager's checks
it raises: the op, each tensor argument's geometry (sizes, strides, dtype, offset), which tensor
arguments share the written tensor's storage, the size of that storage, whether the written
view's chain is injective, and the static arguments. A plan is recorded only after the full path
ran with that key, passed every check and took its plain route (no overlap walk, no dtype
conversion, no resize); a key never seen, or one whose full path took another route, takes the
full path again. ``handler(func)`` says which ops have a plan handler here.
"""
from __future__ import annotations

import torch

from xla_compat import _jax, write_checks
from xla_compat.lazy import ir, tracer
from xla_compat.lazy.ir import Node, ScalarParam, Slot, Value
from xla_compat.lazy.tensor import lock
from xla_compat.lowering import registry

from . import ops, views
from . import tensor as _tensor
from .tensor import _UNREAD, LegacyTensor

aten = torch.ops.aten

_LIMIT = 65536
# key -> (VMeta, chain suffix, True) or (VMetas, chain suffixes, False) for multi-output views
_VIEW_PLANS: dict = {}
_WRITE_PLANS: dict = {}   # key -> _WritePlan, or _COPY for a copy_ that binds its source
_COPY = object()
tracer.plan_memos.extend([_VIEW_PLANS, _WRITE_PLANS])

_NUMBER = (int, float, bool)     # the numbers a write plan lifts (see _kinds)
_TENSOR, _SCALAR = tracer._TENSOR, tracer._SCALAR   # write-plan argument kinds (0: static)
_TENSORS, _SCALARS = tracer._TENSORS, tracer._SCALARS   # (lists of each: foreach ops)


def _static(func, x, parts: list) -> bool:
    """Append a non-tensor argument's key as the tracer's plans hold it; False for one no plan
    may hold."""
    k = tracer.arg_key(func, x)
    if k is tracer.NO_KEY:
        return False
    parts.append(k)
    return True


# ----------------------------------------------------------------------------------------------
# Views: the metadata the meta kernel gave and the steps the handler appended to the chain.

def view(func, args, kwargs=None):
    """``func(*args)`` (a view op) from its plan; None where the full path must run."""
    x = args[0]
    if type(x) is not LegacyTensor or kwargs:
        return None
    parts = [id(func), tracer.geometry(x), x._alias.nbytes]
    for a in args[1:]:
        if not _static(func, a, parts):
            return None
    key = tuple(parts)
    plan = _VIEW_PLANS.get(key)
    if plan is None:
        steps: list = []
        with lock:
            out = ops.make_view(func, ops.VIEWS[func], args, {}, steps)
        _remember_view(key, x, out, steps[0] if steps else None)
        return out
    alias, chain = x._alias, x._chain
    if plan[2]:
        return _member(alias, chain + plan[1], plan[0])
    return [_member(alias, chain + s, m) for m, s in zip(plan[0], plan[1])]


def same(func, args, kwargs=None):
    """``detach`` and ``alias``: a tensor of the argument's storage, chain and geometry (what the
    full path's ``ops._same`` makes) without a plan key: autograd detaches every gradient it
    accumulates and every ``loss.detach()``, W2 13 times a step."""
    x = args[0] if len(args) == 1 else None
    if type(x) is not LegacyTensor or kwargs:
        return None
    g = tracer.geometry(x)
    t = LegacyTensor(_UNREAD, g[0], g[2], g[1], g[3], alias=x._alias, chain=x._chain)
    t._geo = g
    return t


def _member(alias, chain, m) -> LegacyTensor:
    if len(chain) > 1 or chain and type(chain[0]) is views.Reshape:
        chain = views.fold(chain, alias.root.shape)
    t = LegacyTensor(_UNREAD, m.shape, m.dtype, m.stride, m.offset, alias=alias, chain=chain)
    t._geo = (m.shape, m.stride, m.dtype, m.offset)   # (a plan key's geometry, _geometry_of)
    return t


def _suffix(x, t, chain):
    """The steps the view op appended to ``x``'s chain to make ``t`` (``chain``: the handler's,
    before folding), or None where ``t`` is not an extension of ``x``."""
    n = len(x._chain)
    if t._alias is not x._alias or type(chain) is not tuple or chain[:n] != x._chain:
        return None
    return chain[n:]


def _remember_view(key, x, out, chains) -> None:
    if isinstance(out, LegacyTensor):
        s = _suffix(x, out, chains)
        if s is not None:
            tracer.keep(_VIEW_PLANS, key, (_vmeta(out), s, True), _LIMIT)
        return
    if not isinstance(out, (list, tuple)) or not isinstance(chains, (list, tuple)) \
            or len(chains) != len(out):
        return
    suffixes = tuple(_suffix(x, t, c) for t, c in zip(out, chains))
    if any(s is None for s in suffixes):
        return
    tracer.keep(_VIEW_PLANS, key, (tuple(_vmeta(t) for t in out), suffixes, False), _LIMIT)


def _vmeta(t) -> "ops.VMeta":
    return ops.VMeta(tuple(t.shape), t.dtype, tuple(t.stride()), t.storage_offset())


# ----------------------------------------------------------------------------------------------
# Writes: an in-place op's node, or a copy_ that makes the source's value the view's.

class _WritePlan:
    """The node the full path built for one in-place op and key, to be built again."""

    __slots__ = ("op", "rule", "args", "kwargs", "kinds", "tensors_at", "avals", "sig")

    def __init__(self, node: Node, kinds: tuple):
        self.op, self.rule, self.args, self.kwargs = node.op, node.rule, node.args, node.kwargs
        self.kinds, self.avals, self.sig = kinds, node.avals, node.sig_id()
        self.tensors_at = tracer.tensors_at(kinds)


def _write_key(func, dst, args, kwargs):
    """The key of a write into ``dst`` = ``args[0]``, or None where no plan may hold it."""
    alias = dst._alias
    if alias.sharding is not None:
        return None
    parts = [id(func), views.injective(dst._chain), bool(dst._chain), alias.nbytes]
    if kwargs:
        parts.append(tuple(sorted(kwargs)))
    for a in tracer.call_values(args, kwargs):
        if type(a) is LegacyTensor:
            # (its geometry; is it the written tensor, or another view of its storage?)
            parts.append((tracer.geometry(a), 2 if a is dst else a._a is alias))
        elif not _static(func, a, parts):
            return None
    return tuple(parts)


def write(func, args, kwargs=None):
    """``func(*args, **kwargs)`` (an in-place op or copy_ writing ``args[0]``) from its plan;
    None where the full path must run (it runs here on a plan's first sight, and records the
    plan)."""
    dst = args[0]
    if type(dst) is not LegacyTensor or (kwargs and func is aten.copy_.default):
        return None
    key = _write_key(func, dst, args, kwargs)
    if key is None:
        return None
    plan = _WRITE_PLANS.get(key)
    if plan is _COPY:
        with lock:
            return _bind_source(dst, args[1])
    if plan is not None:
        return _replay_write(plan, dst, tracer.call_values(args, kwargs))
    if func is aten.copy_.default:
        return _first_copy(key, dst, args)
    return _first_write(key, func, dst, args, kwargs or {})


def _replay_write(plan: _WritePlan, dst, values):
    with lock:
        dst._value = Value(tracer.plan_node(plan, values), 0)
    return dst


def _first_copy(key, dst, args):
    """copy_ into a view or a whole tensor from a tensor of its shape and dtype: the full path's
    checks (overlap, then the meta kernel's), then the written tensor takes the source's value
    itself (what the copy node computes) -- the same graph the plan builds later, so a loop
    compiles once. The two tensors then share a value, and a buffer after a sync, as ``detach``
    does (a later write to either rebinds only that one)."""
    src = args[1]
    if type(src) is not LegacyTensor or src is dst or not key[1]:
        return None
    g, h = tracer.geometry(dst), tracer.geometry(src)
    if g[0] != h[0] or g[2] != h[2]:
        return None
    with lock:
        ops.check_overlapping_write(aten.copy_.default, args, {})
        tracer.run_meta(aten.copy_.default, args, {})
        tracer.keep(_WRITE_PLANS, key, _COPY, _LIMIT)
        return _bind_source(dst, src)


def _bind_source(dst, src):
    v = src._value
    if type(v.node) is ir.Poisoned:
        raise v.node.error
    dst._value = v
    return dst


def _first_write(key, func, dst, args, kwargs):
    """An in-place op through the full path; its plan is recorded where that path built one
    node of the op (or its functional variant) on these arguments and rebound ``dst`` to it."""
    with lock:
        values = tracer.call_values(args, kwargs)
        before = [a._value if type(a) is LegacyTensor else None for a in values]
        out = ops.dispatch(func, args, kwargs)
        if out is dst and key[1] and dst._gen == dst._alias.gen:
            kinds = _kinds(func, dst, args, kwargs, before)
            if kinds is not None and tracer.free_float_kinds_ok(func, args, kwargs, kinds):
                tracer.keep(_WRITE_PLANS, key, _WritePlan(dst._v.node, kinds), _LIMIT)
    return out


def _kinds(func, dst, args, kwargs, before):
    """Each argument's place in the node ``dst`` now holds (tensor, lifted number or static),
    or None where that node is not the plain out-of-place op on ``args`` and ``kwargs``."""
    v = dst._v
    node = v.node
    rule = _rule_of(func)
    if (v.index != 0 or node.rule is None or node.rule is not rule or rule.random
            or len(node.avals) != 1 or len(node.args) != len(args)
            or tuple(n for n, _ in node.kwargs) != tuple(sorted(kwargs))
            or node.avals[0] != ir.Aval(tuple(dst.shape), _jax.to_jax_dtype(dst.dtype))):
        return None
    kinds = []
    templates = (*node.args, *(t for _, t in node.kwargs))
    for x, t, b in zip(tracer.call_values(args, kwargs), templates, before):
        kind = _arg_kind(node, x, t, b)
        if kind is None or kind == _TENSORS or kind == _SCALARS:   # (lists: write_many's)
            return None
        kinds.append(kind)
    return tuple(kinds)


def _rule_of(func):
    """The lowering rule of in-place ``func``: its own, else its functional variant's."""
    functional = tracer.mutation_info(func)[2]
    return registry.lookup(func) or (registry.lookup(functional) if functional else None)


def _holds_slot(t) -> bool:
    return type(t) is tuple and any(type(e) is Slot or _holds_slot(e) for e in t)


# ----------------------------------------------------------------------------------------------
# Writes into lists: an in-place foreach op (``_foreach_add_(params, bufs, alpha=-lr)``, an
# optimizer's multi-tensor step) writes output i of one node into ``self[i]``.

_MANY_PLANS: dict = {}    # key -> _WritePlan of the functional foreach node
tracer.plan_memos.append(_MANY_PLANS)
DONE = object()           # a plan handled an op that returns nothing (the dispatch returns None)
_LISTS = (list, tuple)


def _many_key(func, args, kwargs):
    """The tracer's plan key of the call (each tensor's geometry, the static values, the type
    of a free float) and, over its tensors in call order, which storage and which tensor object
    each is (first-seen numbering), and for a view its chain's injectivity and its storage's
    size: what the full path's overlap checks decide on. None where no plan may hold the call.
    Runs per optimizer op over every parameter, so in comprehensions."""
    base = tracer._plan_key(LegacyTensor, func, args, kwargs)
    if base is None:
        return None
    flat = []
    for x in tracer.call_values(args, kwargs):
        if type(x) is LegacyTensor:
            flat.append(x)
        elif type(x) in _LISTS and x and type(x[0]) is LegacyTensor:
            flat.extend(x)
    aliases = [t._alias for t in flat]
    first = {a: i for i, a in enumerate(dict.fromkeys(aliases))}     # (by identity)
    if any(a.sharding is not None for a in first):
        return None
    objects = [id(t) for t in flat]
    seen = {k: i for i, k in enumerate(dict.fromkeys(objects))}
    chains = [t._chain for t in flat]
    views_of = (tuple([(views.injective(c), a.nbytes) if c else None
                       for c, a in zip(chains, aliases)]) if any(chains) else None)
    return (base, tuple([first[a] for a in aliases]), tuple([seen[k] for k in objects]),
            views_of)


def write_many(func, args, kwargs=None):
    """In-place foreach ``func`` from its plan (``DONE``); None where the full path must run
    (it runs here on a plan's first sight, and records the plan)."""
    dsts = args[0] if args else None
    if type(dsts) not in _LISTS or not dsts or type(dsts[0]) is not LegacyTensor:
        return None
    key = _many_key(func, args, kwargs)
    if key is None:
        return None
    plan = _MANY_PLANS.get(key)
    if plan is None:
        return _first_many(key, func, dsts, args, kwargs or {})
    with lock:
        node = tracer.plan_node(plan, tracer.call_values(args, kwargs))
        for i, t in enumerate(dsts):
            t._value = tracer._value_of(node, i)     # records the write on its storage
    return DONE



def _first_many(key, func, dsts, args, kwargs):
    with lock:
        values = tracer.call_values(args, kwargs)
        before = [_values_of(x) for x in values]
        ops.dispatch(func, args, kwargs)
        plan = _many_plan(func, dsts, values, kwargs, before)
        if plan is not None:
            tracer.keep(_MANY_PLANS, key, plan, _LIMIT)
    return DONE


def _values_of(x):
    if type(x) is LegacyTensor:
        return x._value
    if type(x) in _LISTS and x and type(x[0]) is LegacyTensor:
        return tuple(t._value for t in x)
    return None


def _many_plan(func, dsts, values, kwargs, before):
    """The plan of what the full path just did, or None where it did anything but build one
    node of the functional foreach op on the arguments' values and write its outputs, in order
    and uncast, into ``self``'s tensors (a call run position by position builds several)."""
    node = dsts[0]._v.node
    for i, t in enumerate(dsts):
        if t._v.node is not node or t._v.index != i or t._gen != t._alias.gen:
            return None
    rule = _rule_of(func)     # (write_many's ops write self alone: _foreach_in_place)
    if (node.rule is None or node.rule is not rule or rule.random
            or len(node.avals) != len(dsts) or len(node.args) + len(node.kwargs) != len(values)
            or tuple(n for n, _ in node.kwargs) != tuple(sorted(kwargs))):
        return None
    for t, aval in zip(dsts, node.avals):
        if aval != ir.Aval(tuple(t.shape), _jax.to_jax_dtype(t.dtype)):
            return None
    kinds, slots = [], []
    templates = (*node.args, *(t for _, t in node.kwargs))
    for x, t, b in zip(values, templates, before):
        kind = _arg_kind(node, x, t, b)
        if kind is None:
            return None
        kinds.append(kind)
        if kind:
            slots.extend(e.k for e in (t if type(t) is tuple else (t,)))
    if slots != list(range(len(node.inputs))) or not tracer.free_float_kinds_ok(
            func, values, {}, kinds):
        return None
    return _WritePlan(node, tuple(kinds))


def _arg_kind(node, x, t, b):
    """One argument's plan kind (``plan_node``'s) for a write plan (``b``: the argument's value(s)
    before the write, None for a non-tensor), or None where the node does not hold it as the
    plain call would: a tensor (list) as its current value(s), a number (list) lifted."""
    if type(t) is Slot:
        got = node.inputs[t.k]
        if b is not None and type(b) is not tuple:
            return _TENSOR if got is b else None
        if type(x) in _NUMBER and type(got.node) is ScalarParam and got.node.value == x:
            return _SCALAR
        return None
    if type(t) is tuple and t and all(type(e) is Slot for e in t):
        got = [node.inputs[e.k] for e in t]
        if type(b) is tuple:
            return _TENSORS if len(b) == len(got) and all(
                g is w for g, w in zip(got, b)) else None
        if type(x) in _LISTS and len(x) == len(got) and all(
                type(e) in _NUMBER and type(g.node) is ScalarParam and g.node.value == e
                for e, g in zip(x, got)):
            return _SCALARS
        return None
    if isinstance(t, torch.Tensor) or _holds_slot(t) or t != x:
        return None
    return 0


# ----------------------------------------------------------------------------------------------
# Which ops have a plan handler here (decided once per op).

_HANDLERS: dict = {}


def handler(func):
    """``view`` or ``write`` for an op this module plans, else None (cached per op)."""
    h = _HANDLERS.get(id(func), False)
    if h is False:
        h = _HANDLERS[id(func)] = _classify(func)
    return h


def _classify(func):
    if func is aten.detach.default or func is aten.alias.default:
        return same
    if func in ops.VIEWS:
        return None if func is aten.as_strided.default else view
    if func is aten.copy_.default:
        return write
    schema = func._schema
    if _foreach_in_place(func):
        return write_many
    if (not schema.is_mutable or func in ops.RESTRIDES or func in tracer._SPECIAL
            or func is aten.index_put_.default or len(schema.returns) != 1):
        return None
    names, fresh, _ = tracer.mutation_info(func)
    if names != ("self",) or fresh or schema.arguments[0].name != "self":
        return None
    r = schema.returns[0]
    if r.alias_info is None or not r.alias_info.is_write:
        return None
    rule = _rule_of(func)
    return write if rule is not None and not rule.random else None


def _foreach_in_place(func) -> bool:
    """A ``_foreach_*_`` op that writes its ``self`` list and returns nothing, with a
    non-random rule for it or its functional variant."""
    if not write_checks.foreach_write(func) or func in tracer._SPECIAL:
        return False
    names, fresh, _ = tracer.mutation_info(func)
    if names != ("self",) or fresh:
        return False
    rule = _rule_of(func)
    return rule is not None and not rule.random


_tensor.bind_plans(handler, DONE, _HANDLERS)
