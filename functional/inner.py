"""The LazyTensor under every functional wrapper, and what it adds to the core tracer.

Functionalization hands this tensor only functional ops, ``*_copy`` views and ``*_scatter``
write-backs. On top of the core it: gives view copies eager strides (``strides.py``), turns
``copy(dst, cpu_src)`` (the host-to-device half of ``cpu.to("hlo")``) into device data, reads and
writes ``as_strided`` by storage position and keeps the gaps of ``unfold`` write-backs
(``writes.py``). Factories called while it traces return bare inner tensors, never wrappers.
"""
from __future__ import annotations

import threading
import weakref

import torch

from xla_compat import _jax, metrics
from xla_compat.lazy import ir, tracer
from xla_compat.lazy.tensor import LazyTensor

from . import overlap, strides, viewchain, writes

aten = torch.ops.aten
_state = threading.local()
_LIFT_FRESH = aten.lift_fresh.default
_DETACH_COPY = aten.detach_copy.default


def tracing() -> bool:
    """True while an inner op is being traced in this thread (new tensors must stay bare)."""
    return getattr(_state, "depth", 0) > 0


class FunctionalInner(LazyTensor):
    """A LazyTensor owned by a FunctionalTensorWrapper; ``_alias_id`` names its buffer lineage."""

    path_name = "functional"

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        if func is _DETACH_COPY and type(args[0]) is cls:   # autograd detaches every gradient
            x = args[0]
            return cls(x._value, x.shape, x.dtype, x.stride(), x.storage_offset())
        if id(func) in viewchain.OP_IDS:         # view copies and scatters: their own memo
            ok = not kwargs and _VIEW_REPLAY.get(id(func))
            if ok is None:
                ok = _view_replay_ok(func)
            if ok:
                out = viewchain.replay(cls, func, args)
                if out is not None:
                    return out
        elif getattr(_state, "pending", None) is None:
            out = tracer.replay(cls, func, args, False, kwargs)   # traced before, this geometry
            if out is not None:
                return out
        kwargs = kwargs or {}
        if len(types) > 1:
            tracer.check_paths(types, func)
        if func is _LIFT_FRESH and not tracing():
            # torch.tensor(data, device=hlo) / as_tensor: the fresh tensor is made below the
            # Functionalize key, so it is bare; lifting it makes it a user tensor (a wrapper).
            from .wrap import wrap
            return wrap(args[0], lifting=True)
        _state.depth = getattr(_state, "depth", 0) + 1
        try:
            handler = _HANDLERS.get(func)
            if handler is not None:
                out = handler(cls, func, args, kwargs)
                if out is not NotImplemented:
                    return out
            out = viewchain.trace(cls, func, args, kwargs)
            if out is not NotImplemented:
                return out                          # with eager's strides already
            out = tracer.trace(cls, func, args, kwargs)
            geometry = strides.eager_geometry(func, args, kwargs)
            if not geometry:
                return out
            out = _restride(cls, out, geometry)
            if handler is None and func not in viewchain.OPS:
                _remember_restrided(cls, func, args, kwargs, out)
            return out
        finally:
            _state.depth -= 1


    @classmethod
    def plans_ok(cls, func) -> bool:
        """Plans replay only what the core tracer does: not for the ops this path handles
        itself, composes into view chains or restrides."""
        if getattr(_state, "unplanned", False):
            return False
        ok = _PLAIN.get(func)
        if ok is None:
            handler = _HANDLERS.get(func)
            ok = _PLAIN[func] = ((handler is None or getattr(handler, "plan_safe", False))
                                 and func not in viewchain.OPS
                                 and strides.view_op_of(func) is None)
        return ok


_PLAIN: dict = {}
# id(view copy or scatter) -> may viewchain.replay serve it before this path's handlers?
_VIEW_REPLAY: dict = {}


def _view_replay_ok(func) -> bool:
    """Only where no handler, or one that declines on what a plan key holds (``plan_safe``),
    comes before viewchain: a key viewchain traced once, the handler declined."""
    handler = _HANDLERS.get(func)
    ok = _VIEW_REPLAY[id(func)] = handler is None or getattr(handler, "plan_safe", False)
    return ok


def forget_plans() -> None:
    """The handlers changed: decide again which ops plans may replay."""
    _PLAIN.clear()
    _VIEW_REPLAY.clear()
    tracer.forget_plans()


def _remember_restrided(cls, func, args, kwargs, out) -> None:
    """A view copy the tracer alone traced (no handler here, not viewchain's): its plan becomes
    what trace and _restride gave (``tracer.restrided_plan``), replayed first thing next time.
    view_copy, expand_copy, split_copy, unbind_copy... are in every step of a model (a
    transformer's heads, an LSTM's time steps)."""
    if getattr(_state, "unplanned", False) or getattr(_state, "pending", None) is not None:
        return
    key = tracer._plan_key(cls, func, args, kwargs)
    plan = tracer._PLANS.get(key) if key is not None else None
    if plan is None:
        return
    outs = list(out) if isinstance(out, (list, tuple)) else [out]
    if not all(type(t) is cls for t in outs):
        return
    planned = tracer.restrided_plan(plan, outs)
    if planned is not None:
        tracer.keep(tracer._PLANS, key, planned, tracer._PLAN_LIMIT)


def _restride(cls, out, geometry):
    """The same values with the strides and storage offset eager's view would have."""
    flat = list(out) if isinstance(out, (list, tuple)) else [out]
    fixed = []
    for t, (stride, offset) in zip(flat, geometry):
        if t.stride() == tuple(stride) and t.storage_offset() == offset:
            fixed.append(t)
        else:
            fixed.append(cls(t._value, t.shape, t.dtype, stride, offset))
    if isinstance(out, (list, tuple)):
        return type(out)(fixed)
    return fixed[0]


_HANDLERS: dict = {}
handles = tracer.op_table(_HANDLERS)


@handles(aten.detach_copy.default, aten.alias_copy.default)
def _same_value(cls, func, args, kwargs):
    """``detach``/``alias`` copies share the input's IR value: no node, and after a sync the two
    tensors hold one buffer (a node would make the graph output the same data twice)."""
    x = args[0]
    if not isinstance(x, LazyTensor):
        return NotImplemented
    return cls(x._value, x.shape, x.dtype, x.stride(), x.storage_offset())


@handles(aten.copy.default)
def _copy_from_host(cls, func, args, kwargs):
    """``copy(dst, src)`` with a host ``src``: the functional half of ``cpu_tensor.to("hlo")``."""
    dst, src = args[0], args[1]
    if isinstance(src, LazyTensor) or src.dim() == 0:
        return NotImplemented
    tracer.run_meta(aten.copy.default, (dst, src), {})
    metrics.inc("TransferToDevice")
    # A private copy: device_put of host memory can alias it, and the caller may write `src` later.
    host = src.detach().to(dst.dtype).expand(dst.shape).clone(memory_format=torch.contiguous_format)
    out = cls(ir.leaf(_jax.from_torch(host)), tuple(dst.shape), dst.dtype)
    aid = getattr(dst, "_alias_id", None)
    if aid is not None:       # the wrapper's value if its first sync fails (see wrap.roll_back)
        from .wrap import remember
        remember(aid, out._value)
    return out


@handles(aten.as_strided_copy.default)
def _as_strided(cls, func, args, kwargs):
    x, size, stride, *rest = args
    offset = kwargs.get("storage_offset", rest[0] if rest else None)
    if writes.is_plain(x):
        _check_within(x, tuple(size), tuple(stride), 0 if offset is None else offset)
        return NotImplemented
    tracer.run_meta(func, args, kwargs)
    out = writes.as_strided_read(cls, x, tuple(size), tuple(stride), offset)
    # eager's result has the strides and offset asked for (a wrapper's are its inner tensor's:
    # x.as_strided_(...) of a view kept contiguous strides)
    return _restride(cls, out, [(tuple(stride), x.storage_offset() if offset is None else offset)])


def _check_within(x, size, stride, offset) -> None:
    """Eager's ``setStorage`` bounds check, against the elements ``x`` holds.

    The inner tensor of a view holds only the view's elements, so where the wrapper is a view of
    a larger base eager would read the base: that is the functional path's limit, said so."""
    if any(n == 0 for n in size):
        return                  # eager: a tensor without elements may sit anywhere in storage
    need = strides.storage_extent(size, stride, offset)
    if need > x.numel():
        raise writes.FunctionalizationLimit(
            f"setStorage: sizes {list(size)}, strides {list(stride)}, storage offset {offset} "
            f"require a storage of {need} elements, out of bounds for the {x.numel()} elements "
            f"of the tensor as_strided was called on. (xla_compat, functional path: if that "
            f"tensor is a view of a larger base, call as_strided on the base instead.)")


@handles(aten.as_strided_scatter.default)
def _as_strided_scatter(cls, func, args, kwargs):
    """Where the view's elements overlap, ``src`` is first made what eager's element walk leaves
    (``overlap.py``: an in-place op compounds, an out= keeps the last write); a base whose logical
    order is not its storage order is written by storage position (``writes.py``)."""
    base, src, size, stride, *rest = args
    offset = kwargs.get("storage_offset", rest[0] if rest else None)
    if isinstance(src, LazyTensor) and isinstance(base, LazyTensor):
        walked = overlap.as_strided_walk(cls, base, src, tuple(size), tuple(stride), offset)
        if walked is not None:
            src, args = walked, (base, walked, *args[2:])
            if writes.is_plain(base):
                return tracer.trace(cls, func, args, kwargs)
    if writes.is_plain(base):
        return NotImplemented
    tracer.run_meta(func, args, kwargs)
    return writes.as_strided_write(cls, base, src, tuple(size), tuple(stride), offset)


@handles(aten.sub.Tensor)
def _bool_write_back_delta(cls, func, args, kwargs):
    """Upstream writes an expanded view back as ``base + sum_to(new - base)``; for bool tensors
    ``sub`` is an error (a bool write through one piece of an expanded view raises upstream).
    The difference is taken in int8 (-1/0/1) so the sum and add that follow give eager's result.
    The inner tensor cannot tell this call from a user's bool subtraction, which eager rejects:
    that one is refused at the wrappers, before it gets here (``checks._sub_functionalize``)."""
    a, b = args[0], args[1]
    if not (isinstance(a, LazyTensor) and isinstance(b, LazyTensor)
            and a.dtype is torch.bool and b.dtype is torch.bool
            and kwargs.get("alpha", args[2] if len(args) > 2 else 1) == 1):
        return NotImplemented
    out = aten.sub.Tensor(a.to(torch.int8), b.to(torch.int8))
    _BOOL_DELTAS.add(out._value.node)
    return out


# It declines on dtypes and alpha alone, which a plan's key holds: safe to replay around.
_bool_write_back_delta.plan_safe = True

# Nodes of the int8 differences above; the write-back's ``base + sum_to(delta)`` must stay bool.
_BOOL_DELTAS: "weakref.WeakSet[ir.Node]" = weakref.WeakSet()
# What upstream's ``sum_to`` puts between the difference and the add (names as nodes record them).
_SUM_TO = frozenset({"aten.sum.dim_IntList", "aten.sum.default", "aten.view_copy.default",
                     "aten._unsafe_view.default", "aten.squeeze_copy.dims", "aten.clone.default"})


def _from_bool_delta(v) -> bool:
    node = v.node
    for _ in range(4):
        if node in _BOOL_DELTAS:
            return True
        if node.op not in _SUM_TO or not node.inputs:
            return False
        node = node.inputs[0].node
    return False


@handles(aten.add.Tensor)
def _bool_plus_number(cls, func, args, kwargs):
    """``bool + integer/float tensor``. Upstream's write-back of a bool expanded view adds the
    summed int8 difference to the bool base; the sum is -1, 0 or 1 where one piece was written,
    so the base takes back ``!= 0`` of it, a bool (eager writes the bool base). Any other such add
    is traced as usual but never replayed from a plan, so every call comes here."""
    a, b = args[0], args[1]
    if not (isinstance(a, LazyTensor) and isinstance(b, LazyTensor)
            and a.dtype is torch.bool and b.dtype is not torch.bool):
        return NotImplemented
    if len(args) == 2 and not kwargs and _from_bool_delta(b._value):
        return aten.ne.Scalar(aten.add.Tensor(a.to(b.dtype), b), 0)
    _state.unplanned = True     # no plan for this key: the next call must come here again
    try:
        return tracer.trace(cls, func, args, kwargs)
    finally:
        _state.unplanned = False


_bool_plus_number.plan_safe = True


@handles(aten.unfold_backward.default)
def _unfold_backward(cls, func, args, kwargs):
    grad, sizes, dim, size, step = args
    if not isinstance(grad, LazyTensor):
        return NotImplemented
    out = writes.unfold_write_back(cls, grad, sizes, dim, size, step)
    return NotImplemented if out is None else out
