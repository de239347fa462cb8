"""LegacyTensor: the tensor users hold on the legacy path; a member of an Alias through a chain.

Invariants. ``_alias`` is the storage this tensor views and ``_chain`` the view steps from the
alias base to it (empty for the root). ``_v`` is its value, current when ``_gen`` equals the
alias generation. Reading ``_value`` (what the core tracer and executor read) re-derives a
stale member; assigning ``_value`` (what the core does for an in-place op) records a write on
the alias, so every core mutation path is alias-aware. LegacyTensors are not in the core's live
set: the path hands the executor alias bases instead (extra roots), so a sync materialises
storages, not views, and views re-derive lazily from device data afterwards.

An op's result starts without an Alias (``_a`` None, a "loose" tensor): its storage's only
member, so its ``_v`` is current, and a sync materialises ``_v`` itself. The first view, write,
metadata change or layout makes the Alias (``_alias``) from the tensor's value and layout.
Most results are never viewed or written, and an Alias each was a tenth of tracing an op.
"""
from __future__ import annotations

import torch

from xla_compat.lazy import tensor as _core_tensor
from xla_compat.lazy import tracer
from xla_compat import _jax, executor
from xla_compat.lazy.ir import Aval, Node, Value
from xla_compat.lazy.tensor import DEVICE, LazyTensor, lock
from xla_compat.lazy.weakreg import WeakRegistry

from . import alias as _alias_module
from .alias import Alias
from .views import Layout, injective

# Every live LegacyTensor (the executor never sees them; the path's sync hooks walk this).
_tensors = WeakRegistry()
_new_tuple = tuple.__new__
_wrapper = torch.Tensor._make_wrapper_subclass
_STRIDED = torch.strided
# The value a view holds before it is first read (never handed to the core: reads re-derive).
_UNREAD = Value(Node("legacy.unread", None, (), (), (), ()), 0)

@_core_tensor.guard_mixed_mutations
class LegacyTensor(LazyTensor):
    """A device tensor on the legacy path: views alias, in-place ops write through."""

    path_name = "legacy"
    _a = None                 # the Alias, once made (see ``_alias``)
    _chain = ()
    _core_registry = False    # the path's own registry (_tensors) lists them

    @staticmethod
    def __new__(cls, value, shape, dtype, strides=None, storage_offset=None,
                requires_grad=False, *, alias=None, chain=()):
        # LazyTensor.__new__, inline (its ``_value`` assignment is ``_v`` here): every traced
        # op's result is made here, and the call and the property setter cost a fifth of it.
        if strides is None:
            storage_offset = None
        if alias is None:          # a new storage: its Alias is made when first needed
            t = _wrapper(cls, shape, strides, storage_offset, None, dtype, _STRIDED, DEVICE, False,
                         requires_grad)
            t._last_data = value if value.node.rule is None else None
        else:                      # a view: its storage is the alias's, as large as eager's
            t = _wrapper(cls, shape, strides, storage_offset, None, dtype, _STRIDED, DEVICE, False,
                         requires_grad, storage_size=alias.nbytes)
            t._gen = -1
            t._last_data = None
            t._a = alias
            t._chain = chain if type(chain) is tuple else tuple(chain)
        t._v = value
        _tensors.add(id(t), t)
        return t

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        planned = _plan_of(id(func), False)          # the path's own plans (legacy/fast.py)
        if planned is False:
            planned = _plans(func)
        if planned is None:
            out = tracer.replay(cls, func, args, False, kwargs)   # traced before, this geometry
        else:
            out = planned(func, args, kwargs)
        if out is not None:
            return None if out is _fast_done else out
        if len(types) > 1:
            tracer.check_paths(types, func)
        return _ops.dispatch(func, args, kwargs or {})

    @classmethod
    def plans_ok(cls, func) -> bool:
        """Views and in-place metadata ops keep the path's own handlers (``ops.py``)."""
        from . import ops
        return func not in ops.VIEWS and func not in ops.RESTRIDES

    # -- the value, as the core sees it ----------------------------------------------------------
    @property
    def _value(self) -> Value:
        a = self._a
        if a is not None and self._gen != a.gen:
            self._refresh()
        return self._v

    @_value.setter
    def _value(self, value: Value) -> None:
        chain = self._chain
        self._gen = self._alias.record(chain, value)
        self._v = value
        if chain and not injective(chain):
            # Elements of an overlapping view (``expand``) share storage: the write-back kept
            # only the elements the op changed, so the view now reads them back from the base
            # (``x.expand(3).index_put_([2], v)`` reads [v, v, v], as eager does).
            self._gen = -1

    @property
    def _alias(self) -> Alias:
        """The storage this tensor views, made on first need for an op's result (its layout is
        the tensor's: every metadata change takes the alias first, ``ops.restride``)."""
        a = self._a
        if a is None:
            with lock:            # (its value: not one another thread's sync is rebinding)
                a = self._a
                if a is None:
                    a = self._a = Alias(self._v, _new_tuple(Layout, (
                        tuple(self.shape), tuple(self.stride()), self.storage_offset())))
                    self._gen = a.gen
        return a

    def _refresh(self) -> None:
        aval = Aval(tuple(self.shape), _jax.to_jax_dtype(self.dtype))
        with lock:
            self._v = self._alias.read(self._chain, aval)
            self._gen = self._alias.gen

    def _join(self, other: "LegacyTensor") -> None:
        """Share ``other``'s storage and chain (after ``.data =`` or ``set_``)."""
        self._a = other._alias
        self._chain = other._chain
        self._gen = other._gen
        self._v = other._v
        self._last_data = getattr(other, "_last_data", None)

    # -- SPMD: the layout belongs to the storage (the alias), set through its root ----------------
    @property
    def _sharding(self):
        a = self._a
        return a.sharding if a is not None and not self._chain else None

    @_sharding.setter
    def _sharding(self, spec) -> None:
        if self._chain:
            raise ValueError(
                "xla_compat: mark_sharding on a view lays out its storage; mark the base tensor "
                "the view was taken from instead")
        self._alias.sharding = spec

    # -- .data shares storage, as in eager -------------------------------------------------------
    @property
    def data(self):
        return self.detach()

    @data.setter
    def data(self, new):
        if not isinstance(new, LegacyTensor):
            raise TypeError(
                f"xla_compat: cannot assign a {type(new).__name__} to .data of a legacy-path "
                f"tensor; move it with xc.to_path(tensor, 'legacy') (or .to('hlo') inside "
                f"xc.use_path('legacy')) first")
        _core_tensor.take_geometry(self, new)
        self._join(new)

@executor.per_sync
def legacy_tensors() -> list:
    """Every live LegacyTensor (once per sync: the path's sync hooks share the walk)."""
    return _tensors.values()


_alias_module.bind_members(legacy_tensors)


_ops = None       # legacy.ops and legacy.fast.handler, set when those modules are imported
_plans = None
_plan_of = None    # the plans decided so far (id(func) -> handler or None), read inline
_fast_done = None  # what a plan returns for an op that returns nothing (fast.DONE)


def bind_ops(module) -> None:
    global _ops
    _ops = module


def bind_plans(handler, done, decided: dict) -> None:
    """``handler(func)``: the path's plan handler for an op (``fast.view``/``fast.write``/
    ``fast.write_many``) or None (the tracer's own plans may replay it); a handler returns
    ``done`` for an op it ran that returns nothing. ``decided`` caches ``handler`` by
    ``id(func)`` (read inline: a call per traced op saved)."""
    global _plans, _fast_done, _plan_of
    _plans, _fast_done, _plan_of = handler, done, decided.get
