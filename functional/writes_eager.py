"""Eager's errors for writes (in-place and out= ops) that functionalization does not raise on hlo.

A Functionalize kernel runs the *functional* op on the inner tensors and then swaps the written
wrapper's inner tensor, so the inner tensor never sees the original op. Where it can still tell:

* ``replace_`` casts the functional result to the written tensor's dtype with exactly
  ``_to_copy(result, dtype=, layout=)`` (a user's ``.to()`` passes no layout). A pointwise result
  that eager could not cast (``int_t.mul_(0.5)``) raises eager's error here, and the result takes
  back the written tensor's old value (the op's ``self``), so the wrapper keeps its value. For
  an out= op whose out is another tensor than its first input that value is not known here: the
  out tensor keeps the cast result (an open limit; its regression test is a strict xfail).
* ``copy(dst, src)`` is the functional half of ``copy_``: a source that partially overlaps the
  destination in one storage (``x.t().copy_(x)``) raises as eager does. Two inner tensors share a
  storage when their values come from one value through view copies only.
* For an in-place op, the Functionalize kernel first runs the *original* op's meta kernel on
  meta twins of the wrappers (its "meta reference"). Where that kernel is Python (``add_``,
  ``mul_``, ``masked_fill_``, ... see ``_META_HOOKED``; ``copy_``'s is C++) it is wrapped: inside a
  meta reference (Functionalize and Python keys excluded) its errors name the op, a write into
  an internally overlapping view raises as eager does (checked by running the op on CPU zeros
  of the same layout; where eager allows it, e.g. ``fill_``, a ``FunctionalizationLimit``,
  since upstream writes such a view back as the sum of every element's change), and the written tensor's layout is handed to the functional op that
  follows, whose result takes it (an in-place op never changes strides in eager). Elsewhere the
  wrapped kernel is the original.
* ``polygamma_`` has no functionalization kernel upstream (its functional op takes ``n`` first):
  one is registered here, as ``self.copy_(polygamma(n, self))``.
"""
from __future__ import annotations

import functools

import torch
from torch._decomp import global_decomposition_table

from xla_compat import _jax, write_checks
from xla_compat.lazy import tensor as _core_tensor
from xla_compat.lazy import tracer
from xla_compat.lazy.ir import Slot
from xla_compat.lazy.tensor import LazyTensor

from .inner import _HANDLERS, _state, forget_plans, handles
from .overrides import override
from .strides import view_op_of

aten = torch.ops.aten


_overload = tracer.overload_named


def _is_pointwise(name: str) -> bool:
    op = _overload(name)
    return op is not None and torch.Tag.pointwise in op.tags


def _self_value(x: LazyTensor, dtype):
    """The value of the op's first tensor argument, if it can be what ``x`` was written over."""
    node = x._value.node
    first = node.args[0] if node.args else None
    if type(first) is not Slot:
        return None
    v = node.inputs[first.k]
    from xla_compat import _jax
    if tuple(v.aval.shape) != tuple(x.shape) or v.aval.dtype != _jax.to_jax_dtype(dtype):
        return None
    return v


def _written_cast(cls, func, args, kwargs):
    dtype = kwargs.get("dtype")
    x = args[0] if args else None
    if (len(kwargs) != 2 or "layout" not in kwargs or dtype is None
            or not isinstance(x, LazyTensor) or torch.can_cast(x.dtype, dtype)
            or not _is_pointwise(x._value.node.op)):
        return NotImplemented
    op, result = x._value.node.op, x.dtype
    old = _self_value(x, dtype)
    if old is not None and not getattr(x, "_in_place", False) and _held_by_a_wrapper(x, old):
        old = None        # an out= op whose out is not its first input: that value is not out's
    # The written wrapper already holds ``x``: give it back its old value (in place: ``self``;
    # out= of another tensor: unknown here, so the cast result, as the write would have left it).
    value = old if old is not None else tracer.convert(x._value, _jax.to_jax_dtype(dtype),
                                                       tuple(x.shape))
    _core_tensor.take_geometry(
        x, cls(value, tuple(x.shape), dtype, x.stride(), x.storage_offset()))
    x._value = value
    raise RuntimeError(
        f"result type {tracer.type_name(result)} can't be cast to the desired output type "
        f"{tracer.type_name(dtype)}\n  (xla_compat: raised by the in-place/out= form of {op} "
        f"on the functional path)")


# It declines wherever ``torch.can_cast`` allows the cast (decided by what a plan key holds), and
# the tracer plans no other cast (``tracer._to_copy``).
_written_cast.plan_safe = True


def _held_by_a_wrapper(x, value) -> bool:
    """Is ``value`` the current value of a live functional wrapper (other than the one holding
    ``x``)? Searched in the heap: only on this error path."""
    import gc
    for o in gc.get_objects():
        if type(o) is torch.Tensor and torch._is_functional_tensor(o):
            held = torch._from_functional_tensor(o)
            if held is not x and getattr(held, "_value", None) is value:
                return True
    return False


def _root(value):
    """The value ``value`` views (through view copies only): its storage."""
    for _ in range(64):
        node = value.node
        op = _overload(node.op) if isinstance(getattr(node, "op", None), str) else None
        if op is None or view_op_of(op) is None or not node.inputs:
            return value
        value = node.inputs[0]
    return value


def _geometry(t):
    return tuple(t.shape), tuple(t.stride()), t.storage_offset()


_copy_next = _HANDLERS.get(aten.copy.default)


def _copy(cls, func, args, kwargs):
    dst, src = args[0], args[1]
    if isinstance(dst, LazyTensor) and isinstance(src, LazyTensor) and dst is not src:
        key = (tracer.geometry(dst), tracer.geometry(src))
        facts = _COPY_FACTS.get(key)
        if facts is None:
            facts = tracer.keep(_COPY_FACTS, key, _copy_facts(dst, src), 4096)
        partial, overlapping = facts
        if partial and _root(dst._value) is _root(src._value):
            raise RuntimeError(tracer.PARTIAL_OVERLAP + tracer.raised_by("aten.copy_", args))
        if overlapping and not kwargs and len(args) == 2:
            from .overlap import copy_walk
            out = copy_walk(cls, dst, src)
            if out is not None:
                return out
        elif not kwargs:
            # Checked: what follows (the host copy handler declines a device source, no view
            # chain, no restriding) is the tracer alone, so its plan for this key may replay.
            out = tracer.replay(cls, func, args, handled=True)
            if out is not None:
                return out
    return _copy_next(cls, func, args, kwargs) if _copy_next is not None else NotImplemented


# (dst geometry, src geometry) -> (could they partially overlap in one storage, may dst's own
# elements overlap): every copy_ asks, a loop asks about the same few layouts.
_COPY_FACTS: dict = {}


def _copy_facts(dst, src) -> tuple:
    from xla_compat.lowering.views import surely_distinct
    partial = (dst.element_size() == src.element_size()
               and tracer.partial_overlap(_geometry(dst), _geometry(src)))
    return partial, not surely_distinct(tuple(dst.shape), dst.stride())


# In-place ops whose meta kernel is Python (the others' meta kernels are C++ and stay as they are).
_META_HOOKED = tuple(getattr(getattr(aten, n), o) for n, o in (
    ("add_", "Tensor"), ("add_", "Scalar"), ("sub_", "Tensor"), ("sub_", "Scalar"),
    ("mul_", "Tensor"), ("mul_", "Scalar"), ("div_", "Tensor"), ("div_", "Scalar"),
    ("addcmul_", "default"), ("addcdiv_", "default"), ("lerp_", "Scalar"), ("lerp_", "Tensor"),
    ("fill_", "Scalar"), ("fill_", "Tensor"), ("zero_", "default"),
    ("masked_fill_", "Scalar"), ("masked_scatter_", "default"), ("index_put_", "default"),
    ("relu_", "default"), ("logical_and_", "default"), ("logical_or_", "default"),
    ("logical_xor_", "default"), ("logical_not_", "default"), ("scatter_", "src"),
    ("scatter_", "value"), ("scatter_add_", "default")))
_FUNCTIONALIZE = torch._C.DispatchKey.Functionalize
_PYTHON = torch._C.DispatchKey.Python


def _in_meta_reference() -> bool:
    excluded = torch._C._dispatch_tls_is_dispatch_key_excluded
    return excluded(_FUNCTIONALIZE) and excluded(_PYTHON)


def _cpu_zeros_like(x):
    """CPU zeros laid out as ``x`` (a meta twin), anything else as it is."""
    if isinstance(x, torch.Tensor):
        from .strides import storage_extent
        n = max(storage_extent(tuple(x.shape), x.stride(), x.storage_offset()), 1)
        return torch.zeros(n, dtype=x.dtype).as_strided(x.shape, x.stride(), x.storage_offset())
    return x


def _overlap_probe(op, args, kwargs) -> None:
    """Run ``op`` on CPU zeros laid out as the meta twins; re-raise an overlap error."""
    try:
        op(*tracer.map_nested(args, _cpu_zeros_like),
           **{k: tracer.map_nested(v, _cpu_zeros_like) for k, v in kwargs.items()})
    except RuntimeError as e:
        if "unsupported operation" in str(e):
            tracer._reraise(e, op, (args, list(kwargs.values())))


def _sums_changes(op, args, kwargs) -> bool:
    """Is eager's result of this write into overlapping elements the sum of every element's
    change (what functionalization's write-back of an expanded view computes)? True for an
    accumulating ``index_put_``: each value is added into the memory its index reaches."""
    if op is not aten.index_put_.default:
        return False
    return bool(args[3] if len(args) > 3 else kwargs.get("accumulate", False))


_NUMBER_DTYPES = {torch.float64: 0.5, torch.complex128: 0.5j}


def _numbers(args) -> tuple:
    """The meta twins lose the wrapped-number flag of a Python number (``x.add_(0.5)`` reaches
    the meta reference as a 0-dim float64 tensor), which changes the result dtype eager names in
    its cast error (Float, not Double): such a 0-dim input other than ``self`` is taken for a
    number. (A real 0-dim float64 device tensor is named Float in that one message.)"""
    return args[:1] + tuple(
        _NUMBER_DTYPES[a.dtype] if (isinstance(a, torch.Tensor) and a.dim() == 0
                                    and a.dtype in _NUMBER_DTYPES) else a for a in args[1:])


# (op, meta twins' geometries, numbers and other arguments) of a meta reference that passed:
# its outcome depends on nothing else, and W4 asks once per position (~25 us of Python each).
_PASSED: dict = {}
tracer.plan_memos.append(_PASSED)


def _meta_hook(op, original):
    functional = tracer.mutation_info(op)[2]

    def meta_reference(*args, **kwargs):
        if not _in_meta_reference() or getattr(_state, "in_reference", False):
            # (an op the outer op's meta function runs, as index_fill_'s runs index_copy_: the
            # outer op's checks are eager's, and eager may allow what the inner op refuses)
            return original(*args, **kwargs)
        _state.pending = None
        self = args[0]
        # (a foreach step asks once per tensor of the list; a step size that changes every
        # step is a free float there)
        key = tracer.meta_key(op, args, kwargs)
        if key is not None:
            if key in _PASSED:
                if functional is not None:
                    _state.pending = (functional, tuple(self.shape), self.dtype,
                                      tuple(self.stride()))
                return self
        first = tracer._EAGER_FIRST_CHECKS.get(op)   # eager's checks before its meta function's
        if first is not None:
            first(op, tracer.bind(op, args, kwargs))
        overlapping = write_checks.internal_overlap(self) == 1
        if overlapping:               # eager checks the written tensor before the dtypes
            _overlap_probe(op, args, kwargs)
        _state.in_reference = True
        try:
            call_args, call_kwargs = tracer.meta_args(op, args, kwargs)
            out = original(*call_args, **call_kwargs)
        except Exception as e:        # eager's error and words, naming the op
            tracer.every_op_checks(op, args, kwargs)     # eager's own refusal first, if any
            tracer._reraise(tracer.eager_cast_error(op, _numbers(args), kwargs, e) or e, op,
                            (args, list(kwargs.values())))
        finally:
            _state.in_reference = False
        check = tracer._EAGER_CHECKS.get(op)     # eager's checks the meta kernel skips
        if check is not None:
            check(op, tracer.bind(op, args, kwargs))
        tracer.every_op_checks(op, args, kwargs)
        if (overlapping and not _sums_changes(op, args, kwargs)
                and not getattr(_state, "shared_ok", False)):
            from .writes import FunctionalizationLimit
            raise FunctionalizationLimit(   # eager allows it; upstream would sum the writes
                f"xla_compat: {op} writes into a view whose elements overlap (size "
                f"{list(self.shape)}, stride {list(self.stride())}, e.g. from expand). Eager "
                f"writes the shared elements once; functionalization writes such a view back "
                f"as the sum of every element's change, which is wrong, so the functional "
                f"path refuses it. Write into the base tensor instead, or .clone() the view.")
        if key is not None and out is self and not overlapping:
            # (an overlapping write passes only where shared_writes takes it: not remembered)
            tracer.keep(_PASSED, key, True, 4096)
        if functional is not None:    # (the meta twin has the strides, not the offset)
            _state.pending = (functional, tuple(self.shape), self.dtype, tuple(self.stride()))
        return out
    return meta_reference


def allow_shared_writes(on: bool) -> None:
    """While on, a meta reference lets a write into a view whose elements overlap pass (the
    caller, ``shared_writes``, writes it as eager does); eager's other checks still run."""
    _state.shared_ok = on


def _keep_written_layout(next_handler):
    """A handler for a functional op: after an in-place op's meta reference, its result takes
    the written tensor's strides (eager's in-place op keeps them)."""
    def handler(cls, func, args, kwargs):
        pending = getattr(_state, "pending", None)
        if pending is None:
            return next_handler(cls, func, args, kwargs) if next_handler else NotImplemented
        _state.pending = None
        f, shape, dtype, stride = pending
        x = args[0] if args else None
        if f is not func or not isinstance(x, LazyTensor):
            return next_handler(cls, func, args, kwargs) if next_handler else NotImplemented
        g = tracer.geometry(x)
        if g[0] != shape or g[2] != dtype or g[1] != stride:
            return next_handler(cls, func, args, kwargs) if next_handler else NotImplemented
        pointwise = _POINTWISE.get(func)
        if pointwise is None:
            pointwise = _POINTWISE[func] = torch.Tag.pointwise in func.tags
        if pointwise and (kwargs or any(isinstance(a, (torch.Tensor, list, tuple))
                                        for a in args[1:])):
            _check_partial_overlap(func, x, args, kwargs)   # eager's TensorIterator check
        out = next_handler(cls, func, args, kwargs) if next_handler else NotImplemented
        if out is NotImplemented:
            # (``trace`` would replay the plan of a keyword-free call first: a plan exists only
            # where the tracer's lowering alone made the node)
            out = None if kwargs else tracer.replay(cls, func, args, handled=True)
            if out is None:
                out = tracer.trace(cls, func, args, kwargs)
        offset = g[3]
        if isinstance(out, LazyTensor):
            out._in_place = True      # its first input is the written tensor (see _written_cast)
        if (isinstance(out, LazyTensor) and tuple(out.shape) == shape
                and (tuple(out.stride()), out.storage_offset()) != (stride, offset)):
            out = cls(out._value, shape, out.dtype, stride, offset)
        return out
    # Without a pending write it is the next handler (or the tracer): the inner tensor replays
    # plans only while no write is pending (see FunctionalInner.__torch_dispatch__).
    handler.plan_safe = next_handler is None or getattr(next_handler, "plan_safe", False)
    return handler


_POINTWISE: dict = {}       # op -> does it carry torch.Tag.pointwise


def _check_partial_overlap(func, written, args, kwargs) -> None:
    """An input partially overlapping the written tensor in its storage: eager's error."""
    for t in tracer._flat_tensors((args[1:], list(kwargs.values()))):
        if (isinstance(t, LazyTensor) and t is not written
                and t.element_size() == written.element_size()
                and tracer.partial_overlap(_geometry(written), _geometry(t))
                and _root(t._value) is _root(written._value)):
            raise RuntimeError(tracer.PARTIAL_OVERLAP + tracer.raised_by(
                f"the in-place form of {func}", args))


def _polygamma_(self, n):
    return self.copy_(torch.polygamma(n, self))


_lib = None


def install() -> None:
    """Register the handlers on the inner tensor and polygamma_'s Functionalize kernel (once)."""
    global _lib
    if _lib is not None:
        return
    handles(aten._to_copy.default)(_written_cast)
    handles(aten.copy.default, wraps=True)(_copy)         # (calls _copy_next)
    _lib = torch.library.Library("aten", "IMPL")
    _lib.impl("polygamma_", _polygamma_, "Functionalize")
    meta_kernels = global_decomposition_table["meta"]
    for op in _META_HOOKED:
        original = meta_kernels.get(op)
        if original is None:
            continue
        override(_lib, op, _meta_hook(op, original), "Meta")
        functional = tracer.mutation_info(op)[2]
        if functional is not None:
            handles(functional, wraps=True)(_keep_written_layout(_HANDLERS.get(functional)))
    forget_plans()
