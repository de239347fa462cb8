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

**copy_.** ``dst.copy_(src)`` of two views of one storage that partially overlap raises eager's
error at the Functionalize key, from the wrappers' storage and geometry (writes_eager's check on
the inner tensors loses the shared storage after a sync or an earlier write).

Cost (2,000 calls, tracing only, this machine): an out= op on the functional path ~9 -> ~16 us
(~4 us of it is the Python kernel's own dispatch), copy_ ~18 -> ~20.5 us, ``x.add_(1)``
unchanged, ``clamp_`` ~710 -> ~20 us.

Not covered: ops called in ``torch.inference_mode()`` (no autograd key: nothing reaches the
kernel), forward-mode AD's out= error, in-place ops whose meta kernel is C++ (``random_``,
``put_``, ``bernoulli_.Tensor``).
"""
from __future__ import annotations

import re
import warnings
from dataclasses import dataclass
from typing import Optional

import torch
from torch._decomp import global_decomposition_table

from xla_compat.lazy import tracer

from . import writes_eager
from .inner import _HANDLERS, _state, forget_plans, handles
from .strides import storage_extent

aten = torch.ops.aten
_BELOW_AUTOGRAD = torch._C._AutoDispatchBelowAutograd
_NO_SUBCLASS_FUNCTIONS = torch._C.DisableTorchFunctionSubclass
_is_functional = torch._is_functional_tensor
_NUMBER = (int, float, bool, complex)
_CACHE_LIMIT = 65536
# A dry run allocates the storages it reproduces; past this many bytes it is skipped.
DRY_RUN_BYTES = 1 << 28
# The errors of a dry run that are eager's verdict on the write itself, not on the zeros in it.
_EAGER_VERDICT = re.compile(r"type|cast|unsupported operation", re.IGNORECASE)
_AUTOGRAD_OUT = "don't support automatic differentiation"


# -- what the checks know about one out= overload -------------------------------------------------

@dataclass(frozen=True)
class OutOp:
    """One out= overload: its out arguments (keyword-only) and functional variant."""

    op: torch._ops.OpOverload
    outs: tuple
    functional: Optional[torch._ops.OpOverload]
    pointwise: bool

    @staticmethod
    def of(op) -> "OutOp":
        outs = tuple(a.name for a in op._schema.arguments if a.is_out)
        return OutOp(op, outs, tracer.mutation_info(op)[2], torch.Tag.pointwise in op.tags)


def _tensors(x, into: list) -> list:
    """The tensors in ``x`` (a tensor, or a list/tuple of arguments), appended to ``into``."""
    if isinstance(x, torch.Tensor):
        into.append(x)
    elif isinstance(x, (list, tuple)):
        for e in x:
            _tensors(e, into)
    return into


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
            if out is not None and _is_functional(out):
                check_out(spec, args, kwargs)
            with _BELOW_AUTOGRAD():
                return op(*args, **kwargs)
    out_kernel.__name__ = f"checked_{op._schema.name.split('::')[1]}_{op._overloadname}"
    return out_kernel


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


def _meta_twin(t: torch.Tensor, grad: bool) -> torch.Tensor:
    twin = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")
    return twin.requires_grad_() if grad and t.requires_grad else twin


def _twins(x, grad: bool = False):
    if isinstance(x, torch.Tensor):
        return _meta_twin(x, grad)
    if isinstance(x, (list, tuple)):
        return type(x)(_twins(e, grad) for e in x)
    return x


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


# -- the checks on functional wrappers --------------------------------------------------------------

def check_out(spec: OutOp, args, kwargs) -> None:
    """Raise eager's error for writing ``op``'s result into its outs; write nothing."""
    if len(kwargs) == 1 and _plainly_fine(spec, args, kwargs[spec.outs[0]]):
        return
    outs = _tensors([kwargs.get(n) for n in spec.outs], [])
    inputs = _tensors(args, [])
    if len(kwargs) > len(spec.outs):
        _tensors([v for k, v in kwargs.items() if k not in spec.outs], inputs)
    results = _result_dtypes(spec, args, kwargs)
    if (results is None or len(results) != len(outs)
            or any(r != o.dtype for r, o in zip(results, outs))
            or _may_overlap(spec.pointwise, outs, inputs)):
        _dry_run(spec, args, kwargs, outs, inputs, results)


def _plainly_fine(spec: OutOp, args, out) -> bool:
    """The common case in one pass: one out tensor of the remembered result dtype, sharing no
    storage with the inputs (other than being one of them, for a pointwise op), not expanded.
    Builds ``_result_dtypes``' key for positional tensors and numbers; False: look closer."""
    if type(out) is not torch.Tensor:
        return False
    storage = out.untyped_storage()._cdata
    key = [spec.op, len(args)]
    for a in args:
        if isinstance(a, torch.Tensor):
            key.append(a.dtype)
            key.append(a.dim() == 0)
            if a is out:
                if not spec.pointwise:
                    return False
            elif _is_functional(a) and a.untyped_storage()._cdata == storage:
                return False
        elif type(a) in _NUMBER:
            key.append(type(a))
        else:
            return False
    return (_DTYPES.get(tuple(key)) == (out.dtype,)
            and torch._debug_has_internal_overlap(out) != 1)


_DTYPES: dict = {}


def _signature(x, out: list) -> bool:
    """What decides a result dtype: tensors' dtypes and 0-dim-ness, numbers' types, the rest."""
    if isinstance(x, torch.Tensor):
        out.append(x.dtype)
        out.append(x.dim() == 0)
    elif type(x) in _NUMBER:
        out.append(type(x))
    elif isinstance(x, (list, tuple)):
        out.append(len(x))
        for e in x:
            if not _signature(e, out):
                return False
    else:
        try:
            hash(x)
        except TypeError:
            return False
        out.append(x)
    return True


def _result_dtypes(spec: OutOp, args, kwargs) -> Optional[tuple]:
    """The dtypes of the functional variant's results (None where its meta kernel cannot say)."""
    if spec.functional is None:
        return None
    parts = [spec.op]
    ok = _signature(args, parts)
    f_kwargs = kwargs
    if len(kwargs) > len(spec.outs):
        f_kwargs = {k: v for k, v in kwargs.items() if k not in spec.outs}
        ok = ok and _signature(tuple(sorted(f_kwargs.items())), parts)
    elif kwargs:
        f_kwargs = {}
    key = tuple(parts) if ok else None
    hit = _DTYPES.get(key, _DTYPES)
    if hit is not _DTYPES:
        return hit
    try:
        out = spec.functional(*_twins(args), **_twins(f_kwargs))
    except Exception:   # noqa: BLE001 - no meta kernel, or a shape error the op itself raises
        return None
    dtypes = tuple(t.dtype for t in _tensors(out, []))
    if key is not None:
        if len(_DTYPES) >= _CACHE_LIMIT:
            _DTYPES.clear()
        _DTYPES[key] = dtypes
    return dtypes


def _span(t: torch.Tensor) -> tuple:
    offset = t.storage_offset()
    return offset, storage_extent(tuple(t.shape), t.stride(), offset)


def _may_overlap(pointwise: bool, outs, inputs) -> bool:
    """Could eager find out overlapping itself or an input? (cheap; the dry run decides)"""
    for o in outs:
        if torch._debug_has_internal_overlap(o) == 1:
            return True
        storage = o.untyped_storage()._cdata
        for t in inputs:
            if (t is o and pointwise) or not _is_functional(t) or \
                    t.untyped_storage()._cdata != storage:
                continue              # (TensorIterator: the same tensor is a full overlap)
            lo, hi = _span(o)
            a, b = _span(t)
            if a < hi and lo < b:
                return True
    return False


_PASSED: dict = {}
_INTERNAL_OVERLAP = ("unsupported operation: more than one element of the written-to tensor "
                     "refers to a single memory location. Please clone() the tensor before "
                     "performing the operation.")


def _dry_run(spec: OutOp, args, kwargs, outs, inputs, results) -> None:
    """Run the op on CPU zeros laid out like the wrappers; raise eager's error about the write."""
    flat = _tensors((args, list(kwargs.values())), [])
    if not all(_is_functional(t) or t.device.type == "cpu" for t in flat):
        return       # another device's tensor: the op itself raises eager's device error
    storage_of: dict = {}        # storage id -> its index among this op's storages
    extent: dict = {}            # (storage index, dtype) -> elements a CPU buffer needs
    for t in flat:
        if _is_functional(t):
            k = (storage_of.setdefault(t.untyped_storage()._cdata, len(storage_of)), t.dtype)
            extent[k] = max(extent.get(k, 1), storage_extent(
                tuple(t.shape), t.stride(), t.storage_offset()))
    if sum(n * k[1].itemsize for k, n in extent.items()) > DRY_RUN_BYTES:
        return _without_dry_run(spec, outs, inputs, results)
    parts = [spec.op, tuple(extent.items()),
             tuple(storage_of[t.untyped_storage()._cdata] if _is_functional(t) else -1
                   for t in flat)]
    key = None
    if tracer._key_of(args, parts) and tracer._key_of(tuple(sorted(kwargs.items())), parts):
        key = tuple(parts)
        if key in _PASSED:
            return
    buffers = {k: torch.zeros(n, dtype=k[1]) for k, n in extent.items()}

    def cpu(x):
        if isinstance(x, torch.Tensor) and _is_functional(x):
            buffer = buffers[(storage_of[x.untyped_storage()._cdata], x.dtype)]
            return buffer.as_strided(tuple(x.shape), x.stride(), x.storage_offset())
        if isinstance(x, (list, tuple)):
            return type(x)(cpu(e) for e in x)
        return x
    try:
        # (a random op's dry run must not move the user's CPU generator)
        with warnings.catch_warnings(), torch.no_grad(), torch.random.fork_rng(devices=[]):
            warnings.simplefilter("ignore")
            spec.op(*cpu(args), **{k: cpu(v) for k, v in kwargs.items()})
    except (RuntimeError, TypeError, ValueError, IndexError) as e:
        message = str(e)
        if _EAGER_VERDICT.search(message.split("\n", 1)[0]):
            raise type(e)(f"{message}\n  (xla_compat: {spec.op} on the functional path checked "
                          f"its out= write as eager does; nothing was written)") from None
    if key is not None:
        if len(_PASSED) >= _CACHE_LIMIT:
            _PASSED.clear()
        _PASSED[key] = True


def _without_dry_run(spec: OutOp, outs, inputs, results) -> None:
    """Tensors too large to reproduce: TensorIterator's rules for pointwise ops, else nothing."""
    if not spec.pointwise:
        return
    for o in outs:
        if torch._debug_has_internal_overlap(o) == 1:
            raise RuntimeError(f"{_INTERNAL_OVERLAP}\n  (xla_compat: raised by {spec.op})")
        geometry = (tuple(o.shape), o.stride(), o.storage_offset())
        for t in inputs:
            if (t is not o and _is_functional(t) and t.element_size() == o.element_size()
                    and t.untyped_storage()._cdata == o.untyped_storage()._cdata
                    and tracer.partial_overlap(
                        geometry, (tuple(t.shape), t.stride(), t.storage_offset()))):
                raise RuntimeError(f"{tracer.PARTIAL_OVERLAP}\n  (xla_compat: raised by "
                                   f"{spec.op})")
    for r, o in zip(results or (), outs):
        if r != o.dtype and not torch.can_cast(r, o.dtype):
            raise RuntimeError(
                f"result type {tracer._type_name(r)} can't be cast to the desired output type "
                f"{tracer._type_name(o.dtype)}\n  (xla_compat: raised by {spec.op})")


# -- in-place ops: the meta reference ---------------------------------------------------------------

_CAST = re.compile(r"Attempting to cast from torch\.(\w+) to out tensor with dtype torch\.(\w+)")
_REFERENCES: dict = {}


def _cast_error(e: RuntimeError, op) -> RuntimeError:
    """The ref's "Attempting to cast ..." as eager's TensorIterator words it."""
    m = _CAST.search(str(e))
    if m is None:
        return e
    result, written = (tracer._type_name(getattr(torch, n)) for n in m.groups())
    return RuntimeError(f"result type {result} can't be cast to the desired output type "
                        f"{written}\n  (xla_compat: raised by {op} on the functional path)")


def _in_place_reference(op, original):
    """``original`` (``op``'s Python meta kernel) with writes_eager's meta-reference hook, eager's
    order of checks (an overlapping ``self`` before the dtype), eager's cast message, and a memo
    of the geometries and numbers that passed."""
    hooked = writes_eager._meta_hook(op, original)
    functional = tracer.mutation_info(op)[2]

    def meta_reference(*args, **kwargs):
        if not writes_eager._in_meta_reference():
            return original(*args, **kwargs)
        self = args[0]
        parts = [op]
        key = None
        if tracer._key_of(args, parts) and tracer._key_of(tuple(sorted(kwargs.items())), parts):
            key = tuple(parts)
            if key in _REFERENCES:
                if functional is not None:     # what the hook leaves for the functional op
                    _state.pending = (functional, tuple(self.shape), self.dtype,
                                      tuple(self.stride()))
                return self
        if torch._debug_has_internal_overlap(self) == 1:
            writes_eager._overlap_probe(op, args, kwargs)
        try:
            out = hooked(*args, **kwargs)
        except RuntimeError as e:
            error = _cast_error(e, op)
            if error is e:
                raise
            raise error from None
        if key is not None:
            if len(_REFERENCES) >= _CACHE_LIMIT:
                _REFERENCES.clear()
            _REFERENCES[key] = True
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
    eager's storage. (copy_'s ``src`` is always a tensor, so upstream's kernel is called boxed.)"""
    if (type(src) is torch.Tensor and src is not self and _is_functional(src)
            and _is_functional(self) and src.element_size() == self.element_size()
            and src.untyped_storage()._cdata == self.untyped_storage()._cdata
            and tracer.partial_overlap((tuple(self.shape), self.stride(), self.storage_offset()),
                                       (tuple(src.shape), src.stride(), src.storage_offset()))):
        raise RuntimeError(f"{tracer.PARTIAL_OVERLAP}\n  (xla_compat: raised by aten.copy_ on "
                           f"the functional path; nothing was written)")
    return _copy_upstream.call_boxed(keyset, self, src, non_blocking)


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
        for op, meta in in_place:
            _lib.impl(op, _in_place_reference(op, meta), "Meta")
            functional = tracer.mutation_info(op)[2]
            if functional is not None and functional not in layouts:
                layouts.add(functional)
                handles(functional)(writes_eager._keep_written_layout(_HANDLERS.get(functional)))
    forget_plans()
