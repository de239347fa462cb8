"""Eager's checks of a write (out= and in-place ops) on the functional path, made before it writes.

**out= ops.** Upstream's Functionalize kernel for an out= op runs the functional variant on the
inner tensors and swaps the out tensor's value, so eager's out= checks never run and the inner
tensors cannot tell out from the inputs. A Python kernel at ``AutogradPrivateUse1`` (only hlo
tensors reach it; it runs before ADInplaceOrView and Functionalize) makes them on the wrappers,
which carry eager's sizes, strides, storage offsets and shared storages, and then calls the op
below autograd, as autograd's own out= kernel does. It replaces that kernel, so it makes its one
check too: ``functions with out=... arguments don't support automatic differentiation`` (decided
by autograd's kernel itself, run once on meta twins). On functional wrappers:

* the result dtype (the functional variant on meta twins, cached on dtypes and number types) is
  compared with each out's dtype, and out's storage with the inputs' and its own;
* where they differ, where out overlaps itself (an expanded view) or shares memory with an
  input, or where no meta kernel gives the result dtype (``masked_select.out``), the op runs on
  CPU zeros laid out like the wrappers, one buffer per storage: eager's own error about dtypes
  or memory overlap is raised (first line unchanged), nothing having been written. Such a dry
  run is remembered per geometry, so a loop pays it once.

**In-place ops.** Their autograd kernels record the op, so they keep them. The Functionalize
kernel first runs the in-place op's meta kernel on meta twins of the wrappers (its "meta
reference", ``writes_eager.py``); ``writes_eager`` hooks the Python meta kernels of a list of ops
(``add_``, ``mul_``, ...). Here the hook is installed for every other in-place op whose meta
kernel is Python (``clamp_``, ``pow_``, ``atan2_``, ... ): a write into an expanded view raises
eager's error (checked before the dtype, as eager does), an uncastable result raises eager's
message, and a partially overlapping source raises at the functional op (writes_eager). A meta
reference that passed is remembered per geometry and numbers (``clamp_``'s meta kernel alone
cost ~0.6 ms a call).

**Operands sharing memory with the written tensor.** Upstream checks overlap on the inner
tensors, which a sync or an earlier write separates (``v = t.unsqueeze(-1); v.mul_(-1); sync;
v.atan2_(t)``), and which never alias for the index ops. Every in-place op with a Tensor operand
whose Functionalize kernel is upstream's gets one here (``_in_place_overlap_kernel``) that checks
the wrappers first: a TensorIterator op (``write_checks.iterator_op``) raises eager's error where
an operand partially overlaps the written tensor; for the others (``index_copy_``, ``scatter_``,
``put_``, ``index_put_``, ...), which refuse even a full overlap of some operands, an operand
sharing an element with it makes eager decide on CPU zeros (``write_checks.probe_in_place``, as
legacy does). Cost: one Python call per such op (~2-3 us); the probe only where memory is shared.

**copy_.** ``dst.copy_(src)`` of two views of one storage that partially overlap raises eager's
error at the Functionalize key, from the wrappers' storage and geometry (writes_eager's check on
the inner tensors loses the shared storage after a sync or an earlier write). A copy of equal
shape and dtype into a destination without self-overlap is then functionalized here, as
upstream does it but without syncing the destination first: copy does not read it, and a fresh
view is born a generation behind its base, so that sync regenerated every view ``copy_`` wrote;
nor afterwards (the result takes the view's layout; the next use of the view syncs it).

Cost (2,000 calls, tracing only, this machine): an out= op on the functional path ~9 -> ~16 us
(~4 us of it is the Python kernel's own dispatch), copy_ ~18 -> ~20.5 us, ``x.add_(1)``
unchanged, ``clamp_`` ~710 -> ~20 us.

Not covered: ops called in ``torch.inference_mode()`` (no autograd key: nothing reaches the
kernel), forward-mode AD's out= error, in-place ops whose meta kernel is C++ (``random_``,
``put_``, ``bernoulli_.Tensor``), but for ``put_`` into a tensor overlapping itself (refused
here from the wrapper's sizes and strides, ``_SELF_OVERLAP_REFUSED``).
"""
from __future__ import annotations

import re
import warnings

import torch
from torch._decomp import global_decomposition_table

from xla_compat import write_checks
from xla_compat.lazy import tracer
from xla_compat.lowering import eager_checks
from xla_compat.lowering.views import expanded, surely_distinct
from xla_compat.write_checks import OutOp, meta_twins as _twins, tensors as _tensors

from . import direct, writes_eager
from .inner import _HANDLERS, FunctionalInner, _state, forget_plans, handles
from .strides import storage_extent, storage_id as _storage_id

aten = torch.ops.aten
_BELOW_AUTOGRAD = torch._C._AutoDispatchBelowAutograd
_NO_SUBCLASS_FUNCTIONS = torch._C.DisableTorchFunctionSubclass
_is_functional = torch._is_functional_tensor
_from = torch._from_functional_tensor
_CACHE_LIMIT = write_checks.CACHE_LIMIT
_AUTOGRAD_OUT = "don't support automatic differentiation"
# The functional path's device tensors: wrappers, sharing memory as their storages say.
STORAGES = write_checks.Storages(
    "functional", _is_functional, _storage_id,
    lambda t: storage_extent(tuple(t.shape), t.stride(), t.storage_offset()))


def _kernel(spec: OutOp):
    op, first = spec.op, spec.outs[0]

    def out_kernel(*args, **kwargs):
        # (torch functions of tensor subclasses already ran, for the call that got here)
        with _NO_SUBCLASS_FUNCTIONS():
            if torch.is_grad_enabled() and (_requires_grad(args) or
                                            _requires_grad(kwargs.values())):
                _check_autograd(op, args, kwargs)
            out = kwargs.get(first)
            if isinstance(out, (list, tuple)):
                out = out[0] if out else None
            if out is None or not _is_functional(out):
                with _BELOW_AUTOGRAD():
                    return op(*args, **kwargs)
            in_place = write_checks.in_place_form(spec, args, kwargs, STORAGES)
            if in_place is not None:   # out= its own overlapping input: eager's in-place walk
                with _BELOW_AUTOGRAD():
                    return in_place[0](*args, **in_place[1])
            write_checks.check_out(spec, args, kwargs, STORAGES)
            if len(spec.outs) == 1 and out._base is not None:
                done = _out_through_copy(op, first, out, args, kwargs)
                if done is not None:
                    return done
            before = (tuple(out.shape), out.stride(), out.storage_offset())
            with _BELOW_AUTOGRAD():
                result = op(*args, **kwargs)
            if len(spec.outs) == 1:
                _keep_layout(out, before)
                _count_storage(out)
            return result
    out_kernel.__name__ = f"checked_{op._schema.name.split('::')[1]}_{op._overloadname}"
    return out_kernel


def _count_storage(out) -> None:
    """An out= op that resized its out tensor leaves upstream's count of the storage's size at the
    old one (``replace_`` sets sizes only: ``untyped_storage().nbytes()`` read 0 after
    ``torch.add(..., out=torch.empty(0))``). Where it falls short and the tensor is no view,
    upstream's ``resize_`` to the same shape gives it a storage of its size. (Factories that write
    through their out= overload below autograd, ``torch.arange`` and ``torch.eye``, keep the
    stale count; ``view_checks._storage_bytes`` reads past it.)"""
    need = (out.storage_offset() + out.numel()) * out.element_size() if out.numel() else 0
    if need > torch._functionalize_get_storage_size(out, False) and not direct._metas(out):
        with _BELOW_AUTOGRAD():
            out.resize_(out.shape)


def _keep_layout(out, before) -> None:
    """Eager writes an out= result into an out tensor of the result's shape without touching
    its strides or storage offset; upstream's kernel gives the wrapper the functional result's
    (``replace_``), contiguous for most ops. Where they moved, the wrapper takes back its own:
    the same inner value, laid out as before, committed again (the base regenerates from its
    newest update, whose layout its views' strides then follow: ``x.mT`` written by out= left
    ``x.expand(...)`` with the strides of a transposed x)."""
    shape, stride, offset = before
    if tuple(out.shape) != shape or (out.stride() == stride and out.storage_offset() == offset):
        return                        # resized (eager lays a resized out afresh), or unmoved
    inner = _from(out)
    if type(inner) is not FunctionalInner:
        return
    fixed = FunctionalInner(inner._value, shape, out.dtype, stride, offset)
    fixed._geo = (shape, stride, out.dtype, offset)
    torch._functionalize_replace(out, fixed)
    torch._functionalize_commit_update(out)


def _out_through_copy(op, name, out, args, kwargs):
    """``op(..., out=view)`` as eager writes it: the result into a fresh tensor, then copied into
    the view. A copy keeps the view's layout (upstream's out= kernel would give it the result's,
    and its base a layout taken back through the view's steps) and reads the view, so the
    write-back of a view through ``unfold`` keeps the elements between the windows and eager's
    order for shared ones (upstream writes such a view back from its new value alone).

    Where the result is not the view's shape, eager resizes the view within its storage: None
    (upstream's kernel runs) for an empty view or one through slices only (``eager_resize``
    writes it back as eager does); any other view raises, as the functional path cannot give a
    view new view steps."""
    fresh = torch.empty(0, dtype=out.dtype, device=out.device)
    with _BELOW_AUTOGRAD(), warnings.catch_warnings():
        warnings.simplefilter("ignore")        # (resizing an empty out= tensor: no warning)
        op(*args, **{**kwargs, name: fresh})
    if tuple(fresh.shape) == tuple(out.shape):
        with _BELOW_AUTOGRAD():
            out.copy_(fresh)
        return out
    if out.numel() == 0 or all(type(m).__name__ == "slice_Tensor_ViewMeta"
                               for m in direct._metas(out)):
        return None
    from .writes import FunctionalizationLimit
    raise FunctionalizationLimit(
        f"xla_compat: {op} would resize its out= tensor, a view of shape {list(out.shape)} "
        f"(strides {list(out.stride())}), to the result's shape {list(fresh.shape)}. Eager "
        f"resizes such a view within its storage (deprecated in PyTorch); the functional path "
        f"cannot give a view another shape through its view steps and refuses it. Pass an out "
        f"tensor of shape {list(fresh.shape)}, or out.resize_(0) first. Nothing was written.")


def _through_unfold(t) -> bool:
    """Is ``t`` a view taken through ``unfold``? Functionalization writes such a view back from
    its new value alone (``unfold_backward``), which keeps neither the elements between the
    windows nor eager's order for shared ones unless the new value read the view."""
    return any(type(m).__name__ == "unfold_ViewMeta" for m in direct._metas(t))


def _requires_grad(args) -> bool:
    for a in args:
        if isinstance(a, torch.Tensor):
            if a.requires_grad:
                return True
        elif isinstance(a, (list, tuple)) and _requires_grad(a):
            return True
    return False


# -- autograd's own check ---------------------------------------------------------------------------

_AUTOGRAD: dict = {}


def _check_autograd(op, args, kwargs) -> None:
    """Autograd's out= kernel refuses inputs that require grad for differentiable ops only
    (``add`` raises, ``eq`` does not): ask that kernel, on meta twins, once per pattern."""
    flags = tuple(t.requires_grad for t in _tensors((args, list(kwargs.values())), []))
    key = (op, flags)
    message = _AUTOGRAD.get(key, _AUTOGRAD)
    if message is _AUTOGRAD:
        message = None
        try:
            with torch.enable_grad(), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                op(*_twins(args, True), **{k: _twins(v, True) for k, v in kwargs.items()})
        except RuntimeError as e:
            if _AUTOGRAD_OUT in str(e):
                message = str(e)
        except Exception:   # noqa: BLE001 - any other failure is not autograd's verdict
            pass
        _AUTOGRAD[key] = message
    if message is not None:
        raise RuntimeError(message)


# -- in-place ops: the meta reference ---------------------------------------------------------------

_REFERENCES: dict = {}


def _in_place_reference(op, original):
    """``original`` (``op``'s Python meta kernel) with writes_eager's meta-reference hook (eager's
    order of checks and words) and a memo of the geometries and numbers that passed."""
    hooked = writes_eager._meta_hook(op, original)
    functional = tracer.mutation_info(op)[2]

    def meta_reference(*args, **kwargs):
        if not writes_eager._in_meta_reference():
            return original(*args, **kwargs)
        self = args[0]
        key = tracer.call_key([op], args, kwargs)
        if key is not None:
            if key in _REFERENCES:
                if functional is not None:     # what the hook leaves for the functional op
                    _state.pending = (functional, tuple(self.shape), self.dtype,
                                      tuple(self.stride()))
                return self
        out = hooked(*args, **kwargs)
        if key is not None:
            tracer.keep(_REFERENCES, key, True, _CACHE_LIMIT)
        return out
    return meta_reference


def _python_meta(op):
    """The Python meta kernel torch._meta_registrations registered for ``op``, or None."""
    dump = torch._C._dispatch_dump(op.name())
    if not re.search(r"^Meta: registered at .*_meta_registrations\.py", dump, re.MULTILINE):
        return None         # C++ (copy_ ...), or none: torch left it out of activate_meta()
    for kind in ("meta", "post_autograd", "pre_autograd"):
        fn = global_decomposition_table[kind].get(op)
        if fn is not None:
            return fn
    return None


# -- copy_ ------------------------------------------------------------------------------------------

_copy_upstream = None


def _copy_functionalize(keyset, self, src, non_blocking=False):
    """``dst.copy_(src)`` of two views of one storage that partially overlap: eager's error.

    writes_eager checks this on the inner tensors, where a shared storage is two values derived
    from one through view copies, which a sync or an earlier write ends; the wrappers keep
    eager's storage. (copy_'s ``src`` is always a tensor, so upstream's kernel is called boxed.)
    A copy of the same elements (``x[i] += 1`` stores its view back) changes nothing: eager
    returns before any check there, and so does this kernel."""
    done = direct.planned_copy(self, src)     # a memo of this path's verdict, where it holds
    if done is not None:
        return done
    shared = direct.shares_storage(self, src)
    if shared and direct.same_elements(self, src):
        return self
    if shared:
        direct.raise_on_partial_overlap(aten.copy_.default, self, src)
    if _is_functional(self) and expanded(self.shape, self.stride()):
        # eager's internal-overlap check of the written tensor (an expanded view)
        raise RuntimeError(f"{write_checks._INTERNAL_OVERLAP}\n  (xla_compat: raised by "
                           f"aten.copy_ on the functional path; nothing was written)")
    if not _is_functional(src) and _is_functional(self):
        # A host source: upstream's kernel gives ``self`` the layout of the copy it makes of it
        # (``w = x.t(); w.copy_(host)`` made w's strides contiguous); ``self`` takes its own back.
        before = (tuple(self.shape), self.stride(), self.storage_offset())
        _copy_upstream.call_boxed(keyset, self, src, non_blocking)
        _keep_layout(self, before)
        return self
    if (type(src) is torch.Tensor and _is_functional(src) and _is_functional(self)
            and src.shape == self.shape and src.dtype == self.dtype and src.device == self.device
            and _distinct(self)):
        done = direct.copy(self, src)     # through the root, where it can (direct.py)
        if done is not None:
            return done
        if not _through_unfold(self):
            return _copy_of_equal_shape(self, src, non_blocking)
        # An unfold write-back keeps the gaps between windows from the view's value, which
        # upstream's first sync brings up to date (skipped, a base write since the view was
        # made came back undone in the gaps: fuzz, seed 2030).
    return _copy_upstream.call_boxed(keyset, self, src, non_blocking)


_DISTINCT: dict = {}        # (size, stride) -> surely no two elements share a position


def _distinct(t) -> bool:
    key = (t.shape, t.stride())
    ok = _DISTINCT.get(key)
    if ok is None:
        ok = tracer.keep(_DISTINCT, key, surely_distinct(tuple(t.shape), t.stride()),
                         _CACHE_LIMIT)
    return ok


_sync, _from, _replace = torch._sync, torch._from_functional_tensor, torch._functionalize_replace
_commit = torch._functionalize_commit_update
_COPY = aten.copy.default


def _copy_of_equal_shape(self, src, non_blocking):
    """Upstream's kernel without its two syncs of ``self``. The first: the copy's result does
    not read ``self``'s values, and a view is made out of date (its generation is not its
    base's), so it regenerated every fresh view written by ``copy_`` (a view copy per write in a
    loop like ``cache[..., t:t + 1] = kv[..., t:t + 1]``). The last regenerated ``self`` from
    its base only to give it the view's layout, which the result takes here; ``self`` stays out
    of date, so its next use applies the storage's pending writes, this one after those queued
    before it, and regenerates it (a temporary view, as ``__setitem__``'s, never pays that)."""
    _sync(src)
    out = _COPY(_from(self), _from(src), non_blocking)
    stride, offset = self.stride(), self.storage_offset()
    if out.stride() != stride or out.storage_offset() != offset:
        out = type(out)(out._value, tuple(out.shape), out.dtype, stride, offset)
    _replace(self, out)       # (the wrapper takes ``out``'s layout: the one it has)
    _commit(self)
    return self


# -- which ops ------------------------------------------------------------------------------------

def _aten_overloads():
    for name in torch._C._dispatch_get_all_op_names():
        if not name.startswith("aten::"):
            continue
        base, _, overload = name[len("aten::"):].partition(".")
        packet = getattr(aten, base, None)
        if packet is not None and (overload or "default") in packet.overloads():
            yield getattr(packet, overload or "default")


def _checked_ops():
    """(out= overloads that get the kernel, [(in-place overload, its Python meta kernel)])."""
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    hooked = set(writes_eager._META_HOOKED) | {aten.addbmm_.default}   # (eager_resize.py)
    outs, in_place = [], []
    for op in _aten_overloads():
        schema = op._schema
        if not schema.is_mutable:
            continue
        name = op.name()
        if any(a.is_out for a in schema.arguments):
            # Composite ops decompose into ops that are checked; autograd's kernel is replaced.
            if (has(name, "Autograd") and has(name, "Functionalize")
                    and not has(name, "CompositeImplicitAutograd")):
                outs.append(op)
        elif (schema.name.endswith("_") and not schema.name.startswith("aten::_")
              and schema.arguments and schema.arguments[0].alias_info is not None
              and schema.arguments[0].alias_info.is_write and op not in hooked):
            meta = _python_meta(op)
            if meta is not None:
                in_place.append((op, meta))
    return outs, in_place


# -- bool - bool ---------------------------------------------------------------------------------

_sub_upstream = None
_SUB = aten.sub.Tensor


def _sub_functionalize(keyset, self, other, *, alpha=1):
    """``aten.sub.Tensor`` at the Functionalize key: a user's ``bool - bool`` raises eager's
    error here. The inner tensor takes upstream's expand write-back ``base + sum_to(new - base)``
    of bool tensors in int8 (``inner._bool_write_back_delta``) and cannot tell a user's call from
    it; upstream makes its call on inner tensors, which never reach this key."""
    if not isinstance(other, torch.Tensor):
        # A number reaches a Python kernel unwrapped and a boxed call takes none for a Tensor:
        # the fallback's steps (sync, unwrap, the op on the inner tensor, wrap) with the number.
        if not direct._is_functional(self):
            with direct._exclude(direct._SKIP_FUNCTIONALIZE):
                return _SUB(self, other, alpha=alpha)
        direct._sync(self)
        kwargs = {"alpha": alpha} if alpha != 1 else None
        return torch._to_functional_tensor(direct._run(_SUB, (direct._from(self), other), kwargs))
    if self.dtype is torch.bool and other.dtype is torch.bool:
        eager_checks._no_bool_subtraction(_SUB, tracer.bind(_SUB, (self, other), {"alpha": alpha}))
    return _sub_upstream.call_boxed(keyset, self, other, alpha=alpha)


# -- in-place ops: an operand sharing memory with the written tensor ------------------------------

# In-place ops with Tensor operands that write no values of them (or have a kernel here already).
_NOT_WRITES = ("copy_", "set_", "resize_as_", "copy_sparse_to_sparse_", "resize_as_sparse_")


def _in_place_ops_with_operands(has) -> list:
    """In-place ops with a Tensor operand whose Functionalize kernel is upstream's (add_, sub_,
    mul_ and div_ have direct.py's, copy_ this module's)."""
    found = []
    for op in _aten_overloads():
        schema, name = op._schema, op._schema.name.split("::")[1]
        if (name.endswith("_") and not name.startswith("_") and name not in _NOT_WRITES
                and op not in direct._IN_PLACE and schema.arguments
                and schema.arguments[0].alias_info is not None
                and schema.arguments[0].alias_info.is_write
                and has(op.name(), "Functionalize")
                and not has(op.name(), "CompositeImplicitAutograd")
                and any(_tensor_typed(a) for a in schema.arguments[1:])):
            found.append(op)
    return found


def _tensor_typed(arg) -> bool:
    """A ``Tensor`` or ``Tensor?`` argument of a schema."""
    t = arg.type
    if isinstance(t, torch.OptionalType):
        t = t.getElementType()
    return isinstance(t, torch.TensorType)


# In-place ops whose meta kernel is C++ (no meta reference runs) and whose eager kernel refuses a
# written tensor that overlaps itself (``x.expand(2).put_(...)``); the rest check in their meta
# references (writes_eager) or allow it (shared_writes).
_SELF_OVERLAP_REFUSED = frozenset({aten.put_.default})


def _in_place_overlap_kernel(op):
    """``op``'s Functionalize kernel: eager's overlap errors from the wrappers, then upstream's
    kernel (which checks on the inner tensors: separate values after a sync, and never
    aliased for ops outside TensorIterator). A TensorIterator op refuses an operand partially
    overlapping the written tensor; for the others (``index_copy_``, ``scatter_``, ...) an
    operand sharing any element with it makes eager decide on CPU zeros laid out alike."""
    upstream = torch.library.get_kernel(op, "Functionalize")
    slots = tuple(i for i, a in enumerate(op._schema.arguments[1:]) if _tensor_typed(a))
    functional = tracer.mutation_info(op)[2]
    iterator = write_checks.iterator_op(op)

    refuse_self_overlap = op in _SELF_OVERLAP_REFUSED

    def kernel(keyset, self, *args, **kwargs):
        if refuse_self_overlap and write_checks.internal_overlap(self) == 1:
            raise RuntimeError(f"{write_checks._INTERNAL_OVERLAP}\n  (xla_compat: raised by {op}, "
                               f"functional path, written tensor of shape {list(self.shape)} and "
                               f"strides {list(self.stride())})")
        for v in (*args, *kwargs.values()):
            if type(v) is list or type(v) is tuple:     # index_put_'s indices
                if iterator or not any(direct.shares_storage(self, e) for e in v):
                    continue
            elif not direct.shares_storage(self, v):
                continue
            elif iterator:
                direct.raise_on_partial_overlap(op, self, v)
                continue
            elif not write_checks.shares_elements(self, v):
                continue
            write_checks.probe_in_place(op, (self, *args), kwargs, STORAGES)
            break
        if functional is not None and any(i < len(args) and not isinstance(args[i], torch.Tensor)
                                          and args[i] is not None for i in slots):
            # a number in a Tensor slot (``x.floor_divide_(2)``): a boxed call takes none
            return direct._with_number(op, functional, self, args[0], args[1:], kwargs)
        return upstream.call_boxed(keyset, self, *args, **kwargs)
    kernel.__name__ = f"overlap_checked_{op._schema.name.split('::')[1]}_{op._overloadname}"
    return kernel


def _foreach_writes(has) -> list:
    return [op for op in _aten_overloads()
            if write_checks.foreach_write(op) and has(op.name(), "Functionalize")]


def _foreach_kernel(op):
    """``op``'s Functionalize kernel (an in-place foreach op): eager's error where an operand
    partially overlaps the tensor written at its position (``_foreach_add_([c[1:]], [c[:-1]])``),
    then upstream's kernel, position by position where a written tensor shares memory with
    another position's (eager's CPU order, ``write_checks.foreach_sharing``; upstream's runs the
    functional op on all positions at once). Cost: one storage lookup per tensor (~0.1 us).

    A call like one upstream's kernel already accepted (``_foreach_key``: every tensor's layout,
    dtype and device, the numbers) skips upstream's meta check, which runs the in-place op on
    meta copies of every tensor, one per position through our Python meta reference (W2's SGD
    step: three calls of six tensors, ~0.8 ms of a 1.2 ms ``opt.step()``), and does the rest of
    what upstream's kernel does: the functional op on the synced inner tensors, each written
    wrapper replaced by its result and the update committed (``_functional_foreach``)."""
    upstream = torch.library.get_kernel(op, "Functionalize")
    functional = tracer.mutation_info(op)[2]

    def kernel(keyset, self, *args, **kwargs):
        call = (self, *args)
        crosses, pairs = write_checks.foreach_sharing(call, kwargs, STORAGES)
        for t, o in pairs:            # upstream checks overlap on the inner tensors
            direct.raise_on_partial_overlap(op, t, o)
        if crosses:
            for a, k in write_checks.foreach_one_by_one(call, kwargs):
                upstream.call_boxed(keyset, *a, **k)
            return None
        key = _foreach_key(op, call, kwargs) if functional is not None else None
        if key is not None and key in _FOREACH_PASSED and _functional_foreach(
                functional, self, args, kwargs):
            return None
        out = upstream.call_boxed(keyset, self, *args, **kwargs)
        if key is not None:
            tracer.keep(_FOREACH_PASSED, key, True, _CACHE_LIMIT)
        return out
    kernel.__name__ = f"one_by_one_{op._schema.name.split('::')[1]}_{op._overloadname}"
    return kernel


# Keys of in-place foreach calls upstream's kernel (its meta check included) has accepted.
_FOREACH_PASSED: dict = {}


def _foreach_key(op, call, kwargs):
    """What upstream's meta check of a foreach call depends on: each tensor's shape, strides,
    offset, dtype and whether it is on the CPU (a 0-dim CPU operand is allowed), each number's
    type, and its value too unless the op's floats are free (``tracer.free_floats``: a step size
    that changes every step keeps one key); None for an argument of another kind. (A flat
    loop, not ``tracer.key_parts``' recursion: that costs 15 us against 9 on W2's 12-tensor
    call, made three times a step.)"""
    parts = [id(op)]
    free = tracer.free_floats(op)
    for x in (*call, *(kwargs[n] for n in sorted(kwargs))):
        for e in (x if type(x) is list or type(x) is tuple else (x,)):
            te = type(e)
            if te is float:
                parts.append(float if free else (float, e))
            elif te is int or te is bool or te is complex:
                parts.append((te, e))
            elif isinstance(e, torch.Tensor):
                parts.append((tuple(e.shape), e.stride(), e.storage_offset(), e.dtype, e.is_cpu))
            elif e is None or te is torch.dtype or te is str:
                parts.append(e)
            else:
                return None
        parts.append(len(x) if type(x) is list or type(x) is tuple else -1)
    parts.append(tuple(sorted(kwargs)))
    return tuple(parts)


_sync, _unwrap = torch._functionalize_sync, torch._from_functional_tensor
_replace, _commit = torch._functionalize_replace, torch._functionalize_commit_update


def _functional_foreach(functional, self, args, kwargs) -> bool:
    """Upstream's in-place foreach kernel past its meta check: the functional op on the inner
    tensors (each wrapper synced first), each written wrapper takes its result and commits the
    update. False (nothing done) unless every written tensor is a functional wrapper."""
    for w in self:
        if not _is_functional(w):
            return False

    outs = functional(_synced_inner(self), *(_synced_inner(a) for a in args),
                      **{k: _synced_inner(v) for k, v in kwargs.items()})
    for w, o in zip(self, outs):
        _replace(w, o)
        _commit(w)
    return True


def _synced_inner(x):
    """The inner tensor of each functional wrapper in ``x`` (lists and tuples as lists), synced
    first. (Module-level: a nested function calling itself is a reference cycle.)"""
    if type(x) is list or type(x) is tuple:
        return [_synced_inner(e) for e in x]
    if isinstance(x, torch.Tensor) and _is_functional(x):
        _sync(x)
        return _unwrap(x)
    return x


_lib = None


def install() -> None:
    """Register the out= kernels and the in-place meta references (once)."""
    global _lib
    if _lib is not None:
        return
    _lib = torch.library.Library("aten", "IMPL")
    outs, in_place = _checked_ops()
    layouts = {tracer.mutation_info(op)[2] for op in writes_eager._META_HOOKED}
    with warnings.catch_warnings():   # "overriding a previously registered kernel": meant
        warnings.simplefilter("ignore")
        for op in outs:
            _lib.impl(op, _kernel(OutOp.of(op)), "AutogradPrivateUse1")
        global _copy_upstream
        _copy_upstream = torch.library.get_kernel(aten.copy_.default, "Functionalize")
        _lib.impl(aten.copy_.default, _copy_functionalize, "Functionalize", with_keyset=True)
        global _sub_upstream
        _sub_upstream = torch.library.get_kernel(_SUB, "Functionalize")
        _lib.impl(_SUB, _sub_functionalize, "Functionalize", with_keyset=True)
        for op in _in_place_ops_with_operands(torch._C._dispatch_has_kernel_for_dispatch_key):
            _lib.impl(op, _in_place_overlap_kernel(op), "Functionalize", with_keyset=True)
        for op in _foreach_writes(torch._C._dispatch_has_kernel_for_dispatch_key):
            _lib.impl(op, _foreach_kernel(op), "Functionalize", with_keyset=True)
        for op, meta in in_place:
            _lib.impl(op, _in_place_reference(op, meta), "Meta")
            functional = tracer.mutation_info(op)[2]
            if functional is not None and functional not in layouts:
                layouts.add(functional)
                handles(functional)(writes_eager._keep_written_layout(_HANDLERS.get(functional)))
    forget_plans()
