"""Alias: the storage that a base tensor and all its views share, as an IR value plus pending writes.

Invariants. ``base`` is the value of the root tensor (the one with an empty chain) in its own
shape, as of the last flush. ``pending`` are writes not yet folded into ``base``, in order, each
(chain of the member written, its new value). ``gen`` counts writes: a member whose ``_gen``
equals it holds a current ``_v``; any other member re-derives from ``base`` through its chain
(after a flush) when read. Nothing here builds IR until a member is read or a sync comes.
"""
from __future__ import annotations

import itertools
from operator import attrgetter

import numpy as np

from xla_compat import executor, metrics, sharding
from xla_compat.executor import touch as _touch, touch_for as _touch_for
from xla_compat.lazy.ir import Aval, DeviceData, Node, Poisoned, Slot, Value

from . import views
from .views import Layout

# Aliases number themselves in creation order, so a sync lists their bases in the same order
# every step. They are not registered: the live ones are those live legacy tensors view
# (``live_aliases``), since a registry entry (a weak reference and its callback) was a tenth of
# tracing an op's result, and nearly every result is a storage no view or write ever touches.
_serial = itertools.count()

class Alias:
    """One storage: the base value, writes pending on it, and a generation counter."""

    __slots__ = ("base", "pending", "gen", "root", "_nbytes", "_dtype", "sharding", "last",
                 "serial", "grown", "__weakref__")

    def __init__(self, base: Value, root: Layout):
        self.base = base
        self.pending: list = []
        self.gen = 0
        self.root = root          # the root tensor's layout over the storage (for as_strided)
        self._nbytes = None       # the storage's size in bytes, worked out when first asked
        self._dtype = base.aval.dtype
        self.sharding = None      # SPMD: the storage's layout over a mesh (xc.mark_sharding)
        self.last = base if type(base.node) is DeviceData else None   # last materialised base
        self.serial = next(_serial)
        self.grown = None         # (the storage it grew from, the rule) until its next sync

    @property
    def nbytes(self) -> int:
        """The storage's size in bytes, as eager allocated it (every op's result is a new storage:
        most are never asked, so it is worked out on first use)."""
        n = self._nbytes
        if n is None:
            n = self._nbytes = self.root.storage_size * np.dtype(self._dtype).itemsize
        return n

    def roll_back(self, error: BaseException) -> None:
        """After a failed sync: drop writes since the last materialised base (poisoned if none);
        every member re-derives when next read. A storage grown by ``resize_`` since its last
        sync goes back to the smaller storage's last value, grown again."""
        if self.grown is not None:
            smaller, rule = self.grown
            smaller.roll_back(error)
            self.base = _node("legacy.grow", rule, (smaller.base,), self.base.aval)
            self.pending.clear()
            self.gen += 1
            return
        last = self.last
        if last is not None and last.node.array.is_deleted():
            last = None
        if last is None and (self.pending or not self.base.node.is_leaf):
            from xla_compat.executor import poison_error
            last = Value(Poisoned((self.base.aval,), poison_error(error)), 0)
        if last is not None and (last is not self.base or self.pending):
            self.base = last
            self.pending.clear()
            self.gen += 1

    def flush(self) -> Value:
        """Fold pending writes into ``base`` (one node per write) and return it."""
        base = self.base
        for chain, value in self.pending:
            base = _node("legacy.write", views.WriteChain(chain), (base, value), base.aval)
        self.pending.clear()
        # SPMD: the storage keeps its layout through writes of its views and host copies into
        # it; members holding the value before the layout was applied re-derive (gen bump).
        if self.sharding is not None:
            laid_out = sharding.constrain(base, self.sharding)
            if laid_out is not base:
                base = laid_out
                self.gen += 1
        self.base = base
        return base

    def read(self, chain: tuple, aval: Aval) -> Value:
        """The current value of the member reached through ``chain``."""
        base = self.flush() if self.pending or self.sharding is not None else self.base
        if not chain:
            return base
        just = self._just_written(chain)
        if just is not None and just.aval == aval:
            return just                   # a read of what was just written there: that value
        moved = self._written_elsewhere(chain, aval)
        if moved is not None:
            return moved
        return _node("legacy.view", views.ReadChain(chain), (base,), aval)

    def _written_elsewhere(self, chain: tuple, aval: Aval):
        """A read through ``chain`` of exactly the elements the base's newest write put through
        another chain (``x[:, t:t+1] = v`` then ``x.transpose(1, 2)[..., t]``): that value,
        rearranged, without reading the base (whose update then need not finish first)."""
        node = self.base.node
        if node.op != "legacy.write":
            return None
        pair = views.same_elements(self.base.aval.shape, node.rule.chain, chain)
        if pair is None:
            return None
        written = node.inputs[1]
        if (written.aval.dtype != aval.dtype or tuple(written.aval.shape) != pair[0].shape
                or tuple(aval.shape) != pair[1].shape):
            return None
        return _node("legacy.rebox", views.Rebox(*pair), (written,), aval)

    def _overwritten_base(self, chain: tuple):
        """The base before its newest write, when a write through ``chain`` covers every element
        that write changed (so it is dead: one update of the base instead of two); else None."""
        node = self.base.node
        if (node.op == "legacy.write" and self.sharding is None
                and views.same_elements(self.base.aval.shape, node.rule.chain, chain)):
            return node.inputs[0]
        return None

    def _just_written(self, chain: tuple):
        """The value the base's last write put through ``chain`` (an injective one), when that
        write is the base's newest node; else None."""
        node = self.base.node
        if (node.op == "legacy.write" and node.rule.chain == chain
                and views.injective(chain)):
            return node.inputs[1]
        return None

    def record(self, chain: tuple, value: Value) -> int:
        """A member reached through ``chain`` now holds ``value``; returns the new generation."""
        if chain and not self.pending and self._just_written(chain) == value:
            return self.gen               # writing back what is there (``v += 1`` then ``x[i] = v``)
        if (self.pending and self.pending[-1][1] == value and self.pending[-1][0] == chain
                and views.injective(chain)):
            return self.gen               # the same, before the last write was folded in
        if not chain:                      # the whole storage is overwritten
            self.pending.clear()
            self.base = value
            if type(value.node) is DeviceData:
                self.last = value
        elif self.pending and (self.pending[-1][0] == chain and views.injective(chain)
                               or views.same_elements(self.base.aval.shape,
                                                      self.pending[-1][0], chain)):
            # Consecutive writes through one chain (or two chains of the same elements)
            # collapse (not through an overlapping view: its write-back counts the elements
            # each write changed).
            self.pending[-1] = (chain, value)
        else:
            earlier = None if self.pending else self._overwritten_base(chain)
            if earlier is not None:
                self.base = earlier       # the base's newest write is overwritten whole
            self.pending.append((chain, value))
        self.gen += 1
        if chain or self.pending:
            _touch()      # (the value may be an existing one: no new node says it is pending)
        else:
            _touch_for(value)     # the whole storage: pending only if the value itself is
        return self.gen

    def values(self):
        yield self.base
        for _, v in self.pending:
            yield v

_SLOTS = [tuple(Slot(i) for i in range(n)) for n in range(3)]


def _node(op: str, rule, inputs: tuple, aval: Aval) -> Value:
    metrics.inc("IrNodes")
    n = len(inputs)
    args = _SLOTS[n] if n < 3 else tuple(Slot(i) for i in range(n))
    return Value(Node(op, rule, args, (), tuple(inputs), (aval,)), 0)

_members = None     # legacy.tensor.legacy_tensors, bound when that module is imported
_by_serial = attrgetter("serial")


def bind_members(fn) -> None:
    global _members
    _members = fn


@executor.per_sync
def live_aliases() -> list:
    """The storages live legacy tensors view, in creation order (an alias no tensor reaches is
    no storage a program can read: nothing materialises it). Tensors whose storage has no
    Alias yet are ``loose_tensors``."""
    found = {}
    for t in _members():
        a = t._a
        if a is not None:
            found[id(a)] = a
    out = list(found.values())
    if len(out) > 1:
        out.sort(key=_by_serial)
    return out


@executor.per_sync
def loose_tensors() -> list:
    """Live legacy tensors whose storage has no Alias yet (an op's result nothing has viewed or
    written): each is its storage's only member, and its ``_v`` is current."""
    return [t for t in _members() if t._a is None]


def flush_all() -> None:
    for a in live_aliases():
        a.flush()
