"""Eager's checks of an out= write, made before anything is written, for both paths.

A path says which device tensors share memory (``Storages``); ``check_out`` then compares the
result dtypes (the functional variant on meta twins, cached) with the outs' and each out's
storage with the inputs' and its own. Where they differ, where an out overlaps itself (an
expanded view) or shares memory with an input, or where no meta kernel gives the result dtype,
the op runs on CPU zeros laid out like the device tensors, one buffer per storage: eager's own
error about dtypes or memory overlap is raised (first line unchanged). A dry run that passed is
remembered per geometry, so a loop pays it once. Eager's rules differ by op (``sum`` casts into
an int64 out, ``index_select`` refuses even a castable one), which is why eager itself decides.

Also here: eager's dtype check of ``index_put`` that its meta kernel skips.
"""
from __future__ import annotations

import functools
import re
import warnings
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np
import torch

from .lazy import tracer

aten = torch.ops.aten
_NUMBER = (int, float, bool, complex)
CACHE_LIMIT = 65536
# A dry run allocates the storages it reproduces; past this many bytes it is skipped.
DRY_RUN_BYTES = 1 << 28
# The errors of a dry run that are eager's verdict on the write itself, not on the zeros in it.
_EAGER_VERDICT = re.compile(r"type|cast|unsupported operation", re.IGNORECASE)
_INTERNAL_OVERLAP = ("unsupported operation: more than one element of the written-to tensor "
                     "refers to a single memory location. Please clone() the tensor before "
                     "performing the operation.")


@dataclass(frozen=True)
class Storages:
    """How a path tells its device tensors' memory: ``owns(t)``: a device tensor of this path;
    ``key(t)``: its storage's identity; ``extent(t)``: elements of ``t``'s dtype a buffer needs
    to hold every element ``t`` reaches."""

    path: str
    owns: Callable[[torch.Tensor], bool]
    key: Callable[[torch.Tensor], object]
    extent: Callable[[torch.Tensor], int]


@dataclass(frozen=True)
class OutOp:
    """One out= overload: its out arguments (keyword-only) and functional variant."""

    op: torch._ops.OpOverload
    outs: tuple
    functional: Optional[torch._ops.OpOverload]
    pointwise: bool
    reduction: bool = False

    @staticmethod
    def of(op) -> "OutOp":
        outs = tuple(a.name for a in op._schema.arguments if a.is_out)
        return OutOp(op, outs, tracer.mutation_info(op)[2], torch.Tag.pointwise in op.tags,
                     torch.Tag.reduction in op.tags)


def tensors(x, into: list) -> list:
    """The tensors in ``x`` (a tensor, or a list/tuple of arguments), appended to ``into``."""
    if isinstance(x, torch.Tensor):
        into.append(x)
    elif isinstance(x, (list, tuple)):
        for e in x:
            tensors(e, into)
    return into


def meta_twins(x, grad: bool = False):
    """Meta tensors laid out as the tensors in ``x`` (requiring grad where they do, if asked)."""
    if isinstance(x, torch.Tensor):
        twin = torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="meta")
        return twin.requires_grad_() if grad and x.requires_grad else twin
    if isinstance(x, (list, tuple)):
        return type(x)(meta_twins(e, grad) for e in x)
    return x


def extent(t: torch.Tensor) -> int:
    """Elements of storage ``t``'s own geometry reaches (its offset when it has none)."""
    offset = t.storage_offset()
    if any(n == 0 for n in t.shape):
        return offset
    return offset + 1 + sum((n - 1) * abs(s) for n, s in zip(t.shape, t.stride()))


# -- the check --------------------------------------------------------------------------------------

def check_out(spec: OutOp, args, kwargs, storages: Storages) -> None:
    """Raise eager's error for writing ``spec.op``'s result into its outs; write nothing."""
    if not (len(kwargs) == 1 and plainly_fine(spec, args, kwargs[spec.outs[0]], storages)):
        outs = tensors([kwargs.get(n) for n in spec.outs], [])
        inputs = tensors(args, [])
        if len(kwargs) > len(spec.outs):
            tensors([v for k, v in kwargs.items() if k not in spec.outs], inputs)
        results = result_dtypes(spec, args, kwargs)
        if (results is None or len(results) != len(outs)
                or any(r != o.dtype for r, o in zip(results, outs))
                or _may_overlap(spec.pointwise, outs, inputs, storages)):
            _dry_run(spec, args, kwargs, outs, inputs, results, storages)
    if spec.reduction:
        refuse_shared_reduction_out(spec, kwargs, storages)


def refuse_shared_reduction_out(spec: OutOp, kwargs, storages: Storages) -> None:
    """A reduction's out whose elements share memory (``t.expand(2)``, overlapping ``unfold``
    windows): eager accepts it, and what it leaves there is its reduction kernel's loop order
    (``sum`` into overlapping windows adds the windows' sums into the shared elements; into an
    expanded view it keeps the last), no rule either path could follow. Refused, clearly."""
    for o in tensors([kwargs.get(n) for n in spec.outs], []):
        if storages.owns(o) and _shares_memory(o):
            raise tracer.UnsupportedOpError(
                f"xla_compat: {spec.op} with out= a view whose elements share memory (shape "
                f"{list(o.shape)}, strides {list(o.stride())}, on the {storages.path} path): "
                f"eager writes a reduction there in its kernel's loop order (adding or "
                f"overwriting the shared elements), which no device path reproduces. Reduce "
                f"into a fresh tensor and write the elements you mean into the base. Nothing "
                f"was written.")


def in_place_form(spec: OutOp, args, kwargs, storages: Storages):
    """``(in-place overload, kwargs without the out)`` for a pointwise op whose one out is its
    own first input and has elements that share memory (``torch.mul(v, 2, out=v)``, ``v``
    overlapping ``unfold`` windows): eager's walk over such an out reads what it has just
    written, exactly as the in-place op's does (``v.mul_(2)`` compounds), so the path runs that.
    None otherwise (every ordinary out=, in one identity test)."""
    if not spec.pointwise or len(spec.outs) != 1 or not args:
        return None
    out = kwargs.get(spec.outs[0])
    if out is None or args[0] is not out or not storages.owns(out) or not _shares_memory(out):
        return None
    functional = spec.functional
    if functional is None:
        return None
    packet = getattr(torch.ops.aten, functional._schema.name.split("::")[1] + "_", None)
    inplace = getattr(packet, functional._overloadname, None) if packet is not None else None
    if inplace is None:
        return None
    return inplace, {k: v for k, v in kwargs.items() if k not in spec.outs}


_SHARES: dict = {}       # (size, stride) -> do two elements share a storage position?


def shares_memory(size: tuple, stride: tuple) -> bool:
    """Do two elements of a layout of ``size`` and ``stride`` share a storage position (an
    expanded dim counts)? Decided once per layout: geometry first, positions where it cannot."""
    key = (tuple(size), tuple(stride))
    shares = _SHARES.get(key)
    if shares is None:
        from .lowering import views as lv
        if lv.surely_distinct(*key):
            shares = False
        else:
            pos = lv.strided_index(key[0], key[1], 0)
            shares = bool(np.unique(pos).size < pos.size)
        shares = tracer.keep(_SHARES, key, shares, CACHE_LIMIT)
    return shares


def internal_overlap(t: torch.Tensor) -> int:
    """``at::has_internal_overlap`` (1: yes, 0: no, 2: too hard to tell) from the tensor's sizes
    and strides. ``torch._debug_has_internal_overlap`` reads a cached "non-overlapping and
    dense" flag, which a functional wrapper keeps from before an in-place view op: after
    ``t.as_strided_((2, 2), (0, 2))`` it said no, and an out= into ``t`` went unrefused."""
    shape, stride = t.shape, t.stride()
    if 0 in shape:
        return 0                  # (eager: a tensor of no elements is contiguous)
    for n, s in zip(shape, stride):
        if s == 0 and n > 1:
            return 1
    return 0 if tracer._non_overlapping_and_dense(shape, stride) else 2


def _shares_memory(t: torch.Tensor) -> bool:
    overlap = internal_overlap(t)
    if overlap != 2:
        return overlap == 1
    return shares_memory(tuple(t.shape), t.stride())


def plainly_fine(spec: OutOp, args, out, storages: Storages) -> bool:
    """The common case in one pass: one out tensor of the remembered result dtype, sharing no
    storage with the inputs (other than being one of them, for a pointwise op), not expanded.
    Builds ``result_dtypes``' key for positional tensors and numbers; False: look closer."""
    owns = storages.owns
    if not isinstance(out, torch.Tensor) or not owns(out):
        return False
    storage = storages.key(out)
    key = [spec.op, len(args)]
    for a in args:
        if isinstance(a, torch.Tensor):
            key.append(a.dtype)
            key.append(a.dim() == 0)
            if a is out:
                if not spec.pointwise:
                    return False
            elif owns(a) and storages.key(a) == storage:
                return False
        elif type(a) in _NUMBER:
            key.append(type(a))
        else:
            return False
    return (_DTYPES.get(tuple(key)) == (out.dtype,)
            and internal_overlap(out) != 1)


_DTYPES: dict = {}


def _dtype_of(t) -> tuple:
    return (t.dtype, t.dim() == 0)


def _signature(x, out: list) -> bool:
    """What decides a result dtype: tensors' dtypes and 0-dim-ness, numbers' types, the rest."""
    return tracer.key_parts(x, out, _dtype_of, type)


def result_dtypes(spec: OutOp, args, kwargs) -> Optional[tuple]:
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
        out = spec.functional(*meta_twins(args), **meta_twins(f_kwargs))
    except Exception:   # noqa: BLE001 - no meta kernel, or a shape error the op itself raises
        return None
    dtypes = tuple(t.dtype for t in tensors(out, []))
    if key is not None:
        tracer.keep(_DTYPES, key, dtypes, CACHE_LIMIT)
    return dtypes


def _span(t: torch.Tensor) -> tuple:
    return t.storage_offset(), extent(t)


def _may_overlap(pointwise: bool, outs, inputs, storages: Storages) -> bool:
    """Could eager find an out overlapping itself or an input? (cheap; the dry run decides)"""
    for o in outs:
        if internal_overlap(o) == 1:
            return True
        if not storages.owns(o):
            continue
        storage = storages.key(o)
        for t in inputs:
            if (t is o and pointwise) or not storages.owns(t) or storages.key(t) != storage:
                continue              # (TensorIterator: the same tensor is a full overlap)
            lo, hi = _span(o)
            a, b = _span(t)
            if a < hi and lo < b:
                return True
    return False


_PASSED: dict = {}


def _dry_run(spec: OutOp, args, kwargs, outs, inputs, results, storages: Storages) -> None:
    """Run the op on CPU zeros laid out like the device tensors; raise eager's error about the
    write."""
    layout = _zeros_layout(spec.op, args, kwargs, storages)
    if layout is None:
        return
    storage_of, sizes, nbytes, key = layout
    if nbytes > DRY_RUN_BYTES:
        return _without_dry_run(spec, outs, inputs, results, storages)
    if key is not None and key in _PASSED:
        return
    try:
        _call_on_zeros(spec.op, args, kwargs, storages, storage_of, sizes)
    except (RuntimeError, TypeError, ValueError, IndexError) as e:
        message = str(e)
        if _EAGER_VERDICT.search(message.split("\n", 1)[0]):
            raise type(e)(f"{message}\n  (xla_compat: {spec.op} on the {storages.path} path "
                          f"checked its out= write as eager does; nothing was written)") from None
    if key is not None:
        tracer.keep(_PASSED, key, True, CACHE_LIMIT)


def _zeros_layout(func, args, kwargs, storages: Storages):
    """How a call of ``func`` lies over CPU zeros standing for the device tensors' storages:
    (storage_of, sizes as ``storage_layout`` gives them, bytes the buffers take, a memo key for
    its verdict or None); None where a tensor of another device is among the arguments (the op
    itself raises eager's device error)."""
    flat = tensors((args, list(kwargs.values())), [])
    owns = storages.owns
    if not all(owns(t) or t.device.type == "cpu" for t in flat):
        return None
    storage_of, sizes = storage_layout(flat, storages)
    nbytes = sum(n * k[1].itemsize for k, n in sizes.items())
    parts = [func, tuple(sizes.items()),
             tuple(storage_of[storages.key(t)] if owns(t) else -1 for t in flat)]
    return storage_of, sizes, nbytes, tracer.call_key(parts, args, kwargs)


def _call_on_zeros(func, args, kwargs, storages: Storages, storage_of, sizes) -> None:
    """``func`` on CPU zeros laid out like the device tensors, one buffer per storage; its error,
    if any, propagates."""
    cpu = cpu_twins(storages, storage_of, sizes)
    # (a random op's dry run must not move the user's CPU generator)
    with warnings.catch_warnings(), torch.no_grad(), torch.random.fork_rng(devices=[]):
        warnings.simplefilter("ignore")
        func(*cpu(args), **{k: cpu(v) for k, v in kwargs.items()})


def storage_layout(flat, storages: Storages) -> tuple:
    """({storage key: its index among these tensors' storages}, {(storage index, dtype):
    elements a CPU buffer standing for it needs}) of the device tensors in ``flat``."""
    storage_of: dict = {}
    sizes: dict = {}
    for t in flat:
        if storages.owns(t):
            k = (storage_of.setdefault(storages.key(t), len(storage_of)), t.dtype)
            sizes[k] = max(sizes.get(k, 1), storages.extent(t))
    return storage_of, sizes


def cpu_twins(storages: Storages, storage_of: dict, sizes: dict):
    """A function giving each device tensor (in nested arguments) a CPU view of zeros laid out as
    it is, tensors of one storage sharing one buffer: eager's checks see the real aliasing."""
    buffers = {k: torch.zeros(n, dtype=k[1]) for k, n in sizes.items()}

    def twin(x):
        if isinstance(x, torch.Tensor) and storages.owns(x):
            buffer = buffers[(storage_of[storages.key(x)], x.dtype)]
            return buffer.as_strided(tuple(x.shape), x.stride(), x.storage_offset())
        if isinstance(x, torch.device):
            return torch.device("cpu")
        return x
    return functools.partial(tracer.map_nested, fn=twin)


def _without_dry_run(spec: OutOp, outs, inputs, results, storages: Storages) -> None:
    """Tensors too large to reproduce: TensorIterator's rules for pointwise ops, else nothing."""
    if not spec.pointwise:
        return
    for o in outs:
        if internal_overlap(o) == 1:
            raise RuntimeError(f"{_INTERNAL_OVERLAP}\n  (xla_compat: raised by {spec.op})")
        geometry = (tuple(o.shape), o.stride(), o.storage_offset())
        for t in inputs:
            if (t is not o and storages.owns(t) and storages.owns(o)
                    and t.element_size() == o.element_size()
                    and storages.key(t) == storages.key(o)
                    and tracer.partial_overlap(
                        geometry, (tuple(t.shape), t.stride(), t.storage_offset()))):
                raise RuntimeError(f"{tracer.PARTIAL_OVERLAP}\n  (xla_compat: raised by "
                                   f"{spec.op})")
    for r, o in zip(results or (), outs):
        if r != o.dtype and not torch.can_cast(r, o.dtype):
            raise RuntimeError(
                f"result type {tracer.type_name(r)} can't be cast to the desired output type "
                f"{tracer.type_name(o.dtype)}\n  (xla_compat: raised by {spec.op})")


# -- in-place ops ------------------------------------------------------------------------------------
# TensorIterator refuses an operand that partially overlaps the written tensor (``x.mul_(x)`` is
# fine); the other in-place ops (``index_copy_``, ``scatter_``, ``put_``, ``index_put_``, ...)
# assert no overlap of some operands at all. Each path finds the operands that share memory
# with the written tensor; where one does, eager itself decides on CPU zeros laid out alike.

# TensorIterator's in-place ops without the pointwise tag.
_ITERATOR_UNTAGGED = frozenset(("eq_", "ne_", "lt_", "le_", "gt_", "ge_", "copysign_",
                                "floor_divide_", "gcd_", "lcm_", "heaviside_", "clamp_"))


def iterator_op(func) -> bool:
    """Does eager run in-place ``func`` through TensorIterator (partial overlap is its error)?"""
    return (torch.Tag.pointwise in func.tags
            or func._schema.name.split("::")[-1] in _ITERATOR_UNTAGGED)


def shares_elements(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Do the element ranges of two tensors of one storage intersect?"""
    if a.numel() == 0 or b.numel() == 0:
        return False
    lo, hi = a.storage_offset() * a.element_size(), extent(a) * a.element_size()
    lo2, hi2 = b.storage_offset() * b.element_size(), extent(b) * b.element_size()
    return lo < hi2 and lo2 < hi


_PROBED: dict = {}


def probe_in_place(func, args, kwargs, storages: Storages) -> None:
    """Eager's memory-overlap error for in-place ``func``, whose written tensor shares memory
    with an operand: the op on CPU zeros laid out like the device tensors (one buffer per
    storage), before anything is written. A verdict that passed is remembered per geometry."""
    layout = _zeros_layout(func, args, kwargs, storages)
    if layout is None:
        return
    storage_of, sizes, nbytes, key = layout
    if nbytes > DRY_RUN_BYTES or (key is not None and key in _PROBED):
        return
    try:
        _call_on_zeros(func, args, kwargs, storages, storage_of, sizes)
    except RuntimeError as e:
        message = str(e)
        if message.startswith("unsupported operation"):
            raise RuntimeError(f"{message}\n  (xla_compat: raised by {func} on the "
                               f"{storages.path} path with inputs "
                               f"{tracer.describe((args, list(kwargs.values())))}; "
                               f"nothing was written)") from None
    except Exception:  # noqa: BLE001 - not the write's verdict: the op itself raises its error
        return
    if key is not None:
        tracer.keep(_PROBED, key, True, CACHE_LIMIT)


# -- eager checks meta kernels skip -----------------------------------------------------------------

@tracer.eager_check(aten.index_put_.default, aten.index_put.default,
                    aten._index_put_impl_.default, aten._index_put_impl.default)
def _index_put_dtypes(func, bound):
    self, values = bound.get("self"), bound.get("values")
    if (isinstance(self, torch.Tensor) and isinstance(values, torch.Tensor)
            and self.dtype != values.dtype):
        name = tracer.type_name
        raise RuntimeError(
            f"Index put requires the source and destination dtypes match, got "
            f"{name(self.dtype)} for the destination and {name(values.dtype)} for the source."
            + tracer.raised_by(func, list(bound.values())))


# -- in-place foreach ops: eager writes tensor by tensor ----------------------------------------------
# On CPU every ``_foreach_*_`` op runs its single-tensor op for each list position in turn, so
# where a written tensor shares memory with a tensor at another position (``[a, a]``,
# ``[b, b[:3]]``, a lone Tensor operand of one written storage) later positions see earlier
# writes. A path traces such a call position by position (``foreach_one_by_one``); any other call
# stays one op (position-wise it cannot tell the difference).

_FOREACH_WRITES: dict = {}


def foreach_write(func) -> bool:
    """Is ``func`` an in-place foreach op (writes its ``self`` list, returns nothing)? Cached."""
    hit = _FOREACH_WRITES.get(func)
    if hit is None:
        schema = func._schema
        first = schema.arguments[0] if schema.arguments else None
        hit = _FOREACH_WRITES[func] = bool(
            schema.name.startswith("aten::_foreach_") and not schema.returns
            and first is not None and first.name == "self" and first.alias_info is not None
            and first.alias_info.is_write)
    return hit


def foreach_sharing(args, kwargs, storages: Storages) -> tuple[bool, list]:
    """(does a written tensor of an in-place foreach call share its storage with a tensor at
    another list position, or with a lone Tensor operand when the list has several; the
    (written, operand) pairs of one position that share a storage, the operand not being the
    written tensor itself). One storage lookup per tensor."""
    written = args[0] if args else None
    if type(written) not in (list, tuple) or not written:
        return False, []
    owns, key = storages.owns, storages.key
    n = len(written)
    at: dict = {}
    crosses = False
    for i, t in enumerate(written):
        if owns(t) and at.setdefault(key(t), i) != i:
            crosses = True
    pairs = []
    for x in (*args[1:], *kwargs.values()):
        if isinstance(x, torch.Tensor):
            if n > 1 and owns(x) and key(x) in at:
                crosses = True
        elif type(x) in (list, tuple):
            for j, t in enumerate(x):
                if isinstance(t, torch.Tensor) and owns(t):
                    i = at.get(key(t))
                    if i is None:
                        continue
                    if i != j:
                        crosses = True
                    elif t is not written[j]:
                        pairs.append((written[j], t))
    return crosses, pairs


def foreach_crosses(args, kwargs, storages: Storages) -> bool:
    """``foreach_sharing``'s first answer."""
    written = args[0] if args else None
    if type(written) not in (list, tuple) or len(written) < 2:
        return False
    return foreach_sharing(args, kwargs, storages)[0]


def foreach_one_by_one(args, kwargs):
    """(args, kwargs) of the call at each list position in turn: every list of the call's
    length cut to its one element there, everything else as it is."""
    n = len(args[0])

    def pick(x, i):
        return [x[i]] if type(x) in (list, tuple) and len(x) == n else x
    for i in range(n):
        yield [pick(x, i) for x in args], {k: pick(v, i) for k, v in kwargs.items()}
