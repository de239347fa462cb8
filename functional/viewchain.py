"""Writes through chains of views as ONE update of the root value (issue 8), functional path.

Functionalization writes ``cache.transpose(3, 4)[..., t] += 0.5`` back as
``transpose_copy(select_scatter(transpose_copy(cache), new, 4, t))``: the whole cache transposed
there and back for a one-slice write. Here each view copy remembers its chain of view steps from
the root value it reads, a scatter through a chain becomes one ``WriteThrough`` node on the root
(the chain composed into one box of the root: a dynamic_update_slice, or one scatter for strided
slices), and the inverse view that ends the write-back pops the chain instead of transposing.
Three rewrites keep repeated writes of one place cheap: a read of exactly the box a write just
wrote is that write's source, re-laid out; a write over exactly the box of the write below it
replaces it; writing back what is already there is no write.

Handled: transpose/permute/t, select and slice (their ``*_copy`` and ``*_scatter`` ops); a
``copy(dst, src)`` of equal shape and dtype is seen through (it is ``src``). Anything else is
traced as before; a chain containing another kind of view is simply not known here.

Cost: functionalization regenerates views after every write (W4: ~23 of these ops per position),
so each is made cheap: an op's argument geometry maps to its memoised ``_Info`` (one plan key,
one lookup), chains are interned ``Chain`` objects that remember their box, nodes and the chain
each next op leads to, and ``replay`` serves a key traced before ahead of the path's handlers.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch

from xla_compat import _jax
from xla_compat.lazy import ir, tracer
from xla_compat.lazy.ir import Aval, Slot, Value
from xla_compat.lazy.tensor import LazyTensor, lock
from xla_compat.lowering import registry
from xla_compat.lowering.boxes import Box, Permute, Select, Slice, compose

from . import strides

aten = torch.ops.aten


# ----------------------------------------------------------------------------------------------
# View steps (Permute, Select, Slice) and their composition into one Box of the root live in the
# core (``lowering/boxes.py``), shared with the legacy path.

def undoes(last, step) -> bool:
    """Does ``step`` applied after ``last`` give back the tensor ``last`` applied to?"""
    return (type(last) is Permute and type(step) is Permute and len(last.dims) == len(step.dims)
            and all(last.dims[q] == i for i, q in enumerate(step.dims)))


# ----------------------------------------------------------------------------------------------
# IR rules (frozen, hashable: they are part of the compile-cache key).

@dataclass(frozen=True)
class ViewRead:
    """The view ``box`` of the root (a lax.slice, then a reshape and transpose of the slice)."""

    box: Box

    def __call__(self, root):
        return self.box.read(root)


@dataclass(frozen=True)
class WriteThrough:
    """The root with ``src`` written where ``box`` views it: one update of the root."""

    box: Box

    def __call__(self, root, src):
        return self.box.write(root, src)


@dataclass(frozen=True)
class Relayout:
    """The values a write of ``src`` through ``wrote`` put where ``read`` views them."""

    wrote: Box
    read: Box

    def __call__(self, src):
        return self.read.from_box_layout(self.wrote.to_box_layout(src))


# What a node of this module is, kept in its ``note`` (it dies with the node): a read is
# (_READ, root, chain), a write (_WRITE, root, src, chain), ``chain`` a ``Chain`` of the root.
# Both name only the node's inputs.
_READ, _WRITE = "functional.viewchain.read", "functional.viewchain.write"


class Chain:
    """Steps of views from a root of one ``aval``, interned (one object per aval and steps), with
    what a loop asks of it again and again computed once: its ``box`` (interned too, so equal
    boxes are one object), the node reading it, the node writing through it, and the chain each
    later view copy or scatter leads to (``after``, keyed by the op's ``_Info``)."""

    __slots__ = ("aval", "steps", "box", "parent", "after", "_read", "_write", "relayouts",
                 "last")

    def __init__(self, aval: Aval, steps: tuple, parent):
        self.aval, self.steps, self.parent = aval, steps, parent
        self.box = _interned_box(compose(aval.shape, steps))
        self.after = {}           # _Info -> (chain or None for the root itself)
        self._read = self._write = None
        self.relayouts = {}       # the chain a write went through -> [rule, aval, last made]
        self.last = None          # (root node, its index, read node), weakly: the last read

    def read(self) -> tuple:
        """(op, rule, template, aval, sig) of the node reading this chain from its root: the
        view copy itself for one step (as the op would trace), else one ``ViewRead``."""
        made = self._read
        if made is None:
            aval = Aval(self.box.shape, self.aval.dtype)
            one = _one_step(self.steps, False)
            op, rule, template = one if one else ("functional.view_read", ViewRead(self.box),
                                                  _SLOTS[0])
            made = self._read = (op, rule, template, aval,
                                 ir.sig_id((op, rule, template, (), (aval,))))
        return made

    def write(self) -> tuple:
        """(op, rule, template, sig) of the node writing a value through this chain into its
        root: the scatter itself for one select or slice, else one ``WriteThrough``."""
        made = self._write
        if made is None:
            one = _one_step(self.steps, True)
            op, rule, template = one if one else ("functional.write_through",
                                                  WriteThrough(self.box), _SLOTS[1])
            made = self._write = (op, rule, template,
                                  ir.sig_id((op, rule, template, (), (self.aval,))))
        return made

    def then(self, info):
        """The chain (None: the root itself) that ``info``'s view step leads to from here."""
        nxt = self.after.get(info, self)
        if nxt is self:
            step = info.step
            if self.steps and undoes(self.steps[-1], step):
                nxt = self.parent
            else:
                nxt = _chain(self.aval, self.steps + (step,), self)
            tracer.keep(self.after, info, nxt, 256)
        return nxt

    def __repr__(self):
        return f"Chain({self.aval.shape}, {self.steps})"


def chain(aval: Aval, steps: tuple) -> Chain:
    """The interned chain of view ``steps`` from a root of ``aval``."""
    return _chain(aval, steps)


def _chain(aval: Aval, steps: tuple, parent=None) -> Chain:
    key = (aval, steps)
    c = _CHAINS.get(key)
    if c is None:
        if parent is None and len(steps) > 1:
            parent = _chain(aval, steps[:-1])
        c = tracer.keep(_CHAINS, key, Chain(aval, steps, parent), _MEMO_LIMIT)
    return c


def _interned_box(box: Box) -> Box:
    return _BOXES.setdefault(box, box) if len(_BOXES) < _MEMO_LIMIT else box


def first(root: Value, info):
    """The chain ``info``'s view step makes from a root (which ``info``'s key determines)."""
    c = info.first
    if c is None:
        c = info.first = _chain(root.aval, (info.step,))
    return c


def chain_of(v: Value) -> tuple:
    """(root value, Chain or None) with ``v`` = the chain applied to the root."""
    note = v.node.note
    if note is not None and v.index == 0 and note[0] is _READ:
        return note[1], note[2]
    return v, None


def write_of(v: Value):
    """(root, src, chain) where ``v`` is the root with ``src`` written through ``chain``."""
    note = v.node.note
    if note is not None and v.index == 0 and note[0] is _WRITE:
        return note[1:]
    return None


def same_box(a: Box, b: Box) -> bool:
    return a is b or a == b       # (interned: equal is identical but across a memo reset)


_SLOTS = (Slot(0),), (Slot(0), Slot(1))
_POISONED = ir.Poisoned


def _node(op: str, rule, inputs: tuple, aval: Aval, sig=None) -> Value:
    return Value(tracer.traced_node(op, rule, _SLOTS[len(inputs) - 1], inputs, (aval,), sig), 0)


# Memos: the same few chains and boxes come back on every step of a loop (cleared with the
# trace plans: tracer.forget_plans).
_CHAINS: dict = {}       # (root aval, steps) -> Chain
_BOXES: dict = {}        # Box -> the same Box (interned)
_MEMO_LIMIT = 65536


def read_value(root: Value, c) -> Value:
    if c is None:
        return root
    v = _last_read(root, c)
    if v is not None:
        return v
    op, rule, template, aval, sig = c.read()
    v = Value(tracer.traced_node(op, rule, template, (root,), (aval,), sig), 0)
    _noted_read(v, root, c)
    return v


def _last_read(root: Value, c: Chain):
    """The read of ``c`` from ``root`` made last, while its node lives (a view born from the
    root and then read again by a write through it: one node, not two), else None."""
    last = c.last
    if last is not None and last[0]() is root.node and last[1] == root.index:
        node = last[2]()
        if node is not None:
            return Value(node, 0)
    return None


def _noted_read(v: Value, root: Value, c: Chain) -> None:
    """Mark ``v`` as the read of ``c`` from ``root`` (its note; the chain's last read)."""
    v.node.note = (_READ, root, c)
    c.last = (_ref(root.node), root.index, _ref(v.node))


_ref = weakref.ref


def write_value(root: Value, src: Value, c: Chain) -> Value:
    op, rule, template, sig = c.write()
    v = Value(tracer.traced_node(op, rule, template, (root, src), (root.aval,), sig), 0)
    v.node.note = (_WRITE, root, src, c)
    return v


def _one_step(steps: tuple, scatter: bool):
    """(op name, rule, template) of the aten view copy (or scatter) that is this one-step chain,
    or None (several steps; a permutation's write). Where a chain is one step, its node is that
    op's, as the view copy or scatter would trace (and any rule planted for it applies)."""
    if len(steps) != 1:
        return None
    step = steps[0]
    slots = _SLOTS[1] if scatter else _SLOTS[0]
    if type(step) is Select:
        func, args = (aten.select_scatter.default if scatter else aten.select_copy.int), \
            (step.dim, step.index)
    elif type(step) is Slice:
        func, args = (aten.slice_scatter.default if scatter else aten.slice_copy.Tensor), \
            (step.dim, step.start, step.end, step.step)
    elif type(step) is Permute and not scatter:
        func, args = aten.permute_copy.default, (step.dims,)
    else:
        return None
    rule = registry.lookup(func)
    return (tracer.op_name(func), rule, slots + args) if rule is not None else None


# ----------------------------------------------------------------------------------------------
# The ops.

def _norm_dim(d: int, ndim: int) -> int:
    return d % max(ndim, 1) if d < 0 else d


def _step(func, a: dict, shape: tuple):
    """The view step ``func`` (a view copy or a scatter) takes with bound arguments ``a``."""
    nd = len(shape)
    if func in (aten.transpose_copy.int,):
        if nd < 2:
            return None
        d0, d1 = _norm_dim(a["dim0"], nd), _norm_dim(a["dim1"], nd)
        dims = list(range(nd))
        dims[d0], dims[d1] = dims[d1], dims[d0]
        return Permute(tuple(dims))
    if func is aten.t_copy.default:
        return Permute((1, 0)) if nd == 2 else None
    if func is aten.permute_copy.default:
        return Permute(tuple(_norm_dim(d, nd) for d in a["dims"])) if nd else None
    if nd == 0:
        return None
    d = _norm_dim(a.get("dim", 0), nd)
    if func in (aten.select_copy.int, aten.select_scatter.default):
        i = a["index"]
        i = i + shape[d] if i < 0 else i
        return Select(d, i) if 0 <= i < shape[d] else None
    step = a.get("step", 1)
    if step is None or step <= 0:
        return None
    size = shape[d]
    start = 0 if a.get("start") is None else a["start"]
    end = size if a.get("end") is None else a["end"]
    start = start + size if start < 0 else start
    end = end + size if end < 0 else end
    start = min(max(start, 0), size)
    end = min(max(end, start), size)
    return Slice(d, start, end, step)


_VIEWS = frozenset({aten.transpose_copy.int, aten.t_copy.default, aten.permute_copy.default,
                    aten.select_copy.int, aten.slice_copy.Tensor})
_SCATTERS = frozenset({aten.select_scatter.default, aten.slice_scatter.default})
OPS = _VIEWS | _SCATTERS
OP_IDS = frozenset(map(id, OPS))        # (an OpOverload hashes in Python)
_SCATTER_IDS = frozenset(map(id, _SCATTERS))


def trace(cls, func, args, kwargs):
    """The inner tensor ``func`` gives (with eager's strides for a view), or NotImplemented
    where the ordinary tracer should run."""
    if id(func) not in OP_IDS:
        return NotImplemented
    x = args[0] if args else None
    if not isinstance(x, LazyTensor):
        return NotImplemented
    scatter = id(func) in _SCATTER_IDS
    src = (args[1] if len(args) > 1 else kwargs.get("src")) if scatter else None
    if scatter and not isinstance(src, LazyTensor):
        return NotImplemented
    # The trace-plan key where it applies (tensor geometries cached on the tensors).
    planned = None if kwargs else tracer._plan_key(cls, func, args)
    key = planned if planned is not None else _signature(func, x, src, args, kwargs)
    info = _INFO.get(key) if key is not None else None
    if info is None:
        info = _info(func, x, args, kwargs)     # raises eager's error where eager would
        if key is not None:
            tracer.keep(_INFO, key, info, _MEMO_LIMIT)
    if info.step is None:
        return NotImplemented
    if planned is not None:
        info.direct = True        # the path's handlers left this key to us: replay may skip them
    return _made(cls, func, args, kwargs, x, src, info)


def replay(cls, func, args):
    """``trace(cls, func, args, {})`` for a key ``trace`` handled before (None otherwise): the
    first thing the inner tensor's dispatch does for these ops, before its handlers, which
    declined this key then and decide on what the key holds (``plan_safe``)."""
    key = _plan_key(cls, func, args)
    if key is None:
        return None
    info = _INFO.get(key)
    if info is None or not info.direct:
        return None
    with lock:
        if info.scatter:
            value = _scatter(func, args, None, args[0], args[1], info)
        else:
            value = _view(func, args, None, args[0], info)
    t = cls(value, *info.made)
    t._geo = info.geo
    return t


_plan_key = tracer._plan_key


def _made(cls, func, args, kwargs, x, src, info):
    with lock:
        if src is not None:
            value = _scatter(func, args, kwargs, x, src, info)
        else:
            value = _view(func, args, kwargs, x, info)
    t = cls(value, *info.made)
    t._geo = info.geo
    return t


class _Info:
    """What one view copy or scatter with one argument geometry does: its view ``step``, its
    output (eager's layout) and, for a keyword-free call, the node ``_plain`` records.
    ``direct``: the path's handlers left this key to ``trace`` (``replay`` may serve it)."""

    __slots__ = ("step", "out", "geo", "plain", "direct", "scatter", "made", "first")

    def __init__(self, step, out, plain=None, scatter=False):
        self.step, self.out, self.plain, self.direct = step, out, plain, False
        self.scatter, self.first = scatter, None       # (first: the chain of step from a root)
        self.geo = (None if out is None else
                    (tuple(out.shape), tuple(out.stride), out.dtype, out.offset))
        self.made = (None if out is None else (out.shape, out.dtype, out.stride, out.offset))


# (op, input geometries, static arguments) -> _Info
_INFO: dict = {}
tracer.plan_memos.extend((_INFO, _CHAINS, _BOXES))


def _signature(func, x, src, args, kwargs):
    parts = [func, x.shape, x.stride(), x.storage_offset(), x.dtype]
    if src is not None:
        parts += [src.shape, src.stride(), src.storage_offset(), src.dtype]
    for a in args[2 if src is not None else 1:]:
        parts.append(tuple(a) if type(a) is list else a)
    if kwargs:
        for k, v in sorted(kwargs.items()):
            if k != "src":
                parts.append((k, tuple(v) if type(v) is list else v))
    key = tuple(parts)
    try:
        hash(key)
    except TypeError:
        return None
    return key


def _info(func, x, args, kwargs) -> _Info:
    step = _step(func, tracer.bind(func, args, kwargs), tuple(x.shape))
    if step is None:
        return _Info(None, None)
    out, _ = tracer.meta(func, args, kwargs)
    geometry = strides.eager_geometry(func, args, kwargs)
    if geometry:
        (stride, offset), = geometry
        out = out._replace(stride=tuple(stride), offset=offset)
    plain = None
    if not kwargs:
        n = 2 if func in _SCATTERS else 1
        op, rule = tracer.op_name(func), registry.lookup(func)
        template = _SLOTS[n - 1] + tuple(tuple(a) if type(a) is list else a for a in args[n:])
        avals = (Aval(tuple(out.shape), _jax.to_jax_dtype(out.dtype)),)
        plain = (op, rule, template, avals, n, ir.sig_id((op, rule, template, (), avals)))
    return _Info(step, out, plain, func in _SCATTERS)


def _copied(v: Value) -> Value:
    """``v`` without a ``copy(dst, src)`` of equal shape and dtype on top (that is ``src``)."""
    node = v.node
    if node.op == "aten.copy.default" and len(node.inputs) == 2:
        dst, src = node.inputs
        if dst.aval == src.aval:
            return src
    return v


def _view(func, args, kwargs, x, info) -> Value:
    root = x._value
    note = root.node.note
    if note is not None and root.index == 0 and note[0] is _READ:     # (chain_of, inlined)
        root, c = note[1], note[2]
        n = len(c.steps)
        c = c.then(info)
        if c is None or len(c.steps) < n:
            return read_value(root, c)           # the step undid the chain's last one
    else:
        c = info.first or first(root, info)
    written = _read_written(root, c)
    if written is not None:
        return written
    if len(c.steps) > 1:
        return read_value(root, c)               # one node reads the whole chain from the root
    value = _last_read(root, c)
    if value is None:
        value = _plain(func, args, kwargs, info)
        _noted_read(value, root, c)
    return value


def read(root: Value, c: Chain) -> Value:
    """The view ``c`` of ``root``: the source of a write of exactly these elements (re-laid out
    if it went through another chain), else one node reading the chain. Called with the tracer
    lock held."""
    written = _read_written(root, c)
    return written if written is not None else read_value(root, c)


def _read_written(root: Value, c: Chain):
    """Where ``root`` is a write of exactly the elements ``c`` views, what was written there (a
    relayout where the write went through another chain); None otherwise."""
    note = root.node.note
    if note is None or root.index != 0 or note[0] is not _WRITE:
        return None
    wrote, box = note[3], c.box
    if box.positions != wrote.box.positions:
        return None
    src = _copied(note[2])
    if src.aval.dtype != root.aval.dtype:
        return None                              # (the write cast it: read the root)
    if same_box(box, wrote.box):
        return src
    made = c.relayouts.get(wrote)
    if made is None:
        made = tracer.keep(c.relayouts, wrote,
                           [Relayout(wrote.box, box), Aval(box.shape, root.aval.dtype), None], 256)
    last = made[2]                               # the last relayout of a source, weakly
    if last is not None and last[0]() is src.node and last[1] == src.index:
        node = last[2]()
        if node is not None:
            return Value(node, 0)                # (the same source re-laid out: one node)
    v = _node("functional.relayout", made[0], (src,), made[1])
    made[2] = (_ref(src.node), src.index, _ref(v.node))
    return v


def write(root: Value, src: Value, c: Chain) -> Value:
    """``root`` with ``src`` written through ``c``: one update of the root, none where it writes
    back what is there or repeats the write below it, replacing a write below of the same
    elements. Called with the tracer lock held."""
    below = write_of(root)
    box = c.box
    value = _copied(src)
    s_root, s_chain = chain_of(value)
    if s_root == root and s_chain is not None and same_box(s_chain.box, box):
        return root                              # writing back what is there
    if below is not None and same_box(below[2].box, box) and _copied(below[1]) == value:
        return root                              # the same write again
    if below is not None and below[2].box.positions == box.positions:
        return write_value(below[0], src, c)     # overwrites the write below
    return write_value(root, src, c)


def _plain(func, args, kwargs, info) -> Value:
    """The op as the ordinary tracer records it (its own aten node, same template)."""
    if info.plain is None:
        return Value(tracer.make_node(func, registry.lookup(func), args, kwargs, [info.out]), 0)
    op, rule, template, avals, n, sig = info.plain
    inputs = (args[0]._value,) if n == 1 else (args[0]._value, args[1]._value)
    for v in inputs:
        if type(v.node) is _POISONED:
            raise v.node.error
    return Value(tracer.traced_node(op, rule, template, inputs, avals, sig), 0)


def _scatter(func, args, kwargs, y, src, info) -> Value:
    root, c = chain_of(y._value)
    below = write_of(root)
    c = (info.first or first(root, info)) if c is None else c.then(info)   # (undoes nothing)
    if len(c.steps) == 1 and below is None:
        value = _plain(func, args, kwargs, info)
        value.node.note = (_WRITE, root, src._value, c)
        return value
    return read_value(write(root, src._value, c), c.parent)
