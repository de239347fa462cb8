"""How aten calls on LegacyTensors are handled: views, in-place metadata ops, everything else.

A view op builds no IR: it returns a LegacyTensor on the same alias with one more step in its
chain (sizes, strides and storage offset come from running the op on a meta tensor laid out as
the input is in eager, so errors and metadata match eager). In-place metadata ops swap the
tensor's own chain. Every other op goes to the core tracer, which reads inputs through
``LegacyTensor._value`` (re-deriving stale views) and writes mutations back through it.
"""
from __future__ import annotations

import functools
import sys
from typing import NamedTuple

import numpy as np
import torch

from xla_compat import _jax, write_checks
from xla_compat.lazy import tensor as _core_tensor
from xla_compat.lazy import tracer
from xla_compat.lazy.ir import Aval
from xla_compat.lazy.tensor import lock
from xla_compat.lowering.eager_checks import t_in_place_dims

from . import overlap, views
from . import tensor as _tensor_module
from .tensor import _UNREAD, LegacyTensor
from .views import (AsStrided, Bitcast, Diagonal, Expand, Layout, Permute, Reshape, Select,
                    Slice, Unfold, ViewAsComplex, ViewAsReal)

aten = torch.ops.aten

VIEWS: dict = {}
RESTRIDES: dict = {}


# ``@view_op(ops)``: ``fn(x, meta_out, *args, **kwargs) -> chain (or list of chains)``.
view_op = tracer.op_table(VIEWS)


def dispatch(func, args, kwargs):
    with lock:
        handler = VIEWS.get(func)
        if handler is not None:
            return make_view(func, handler, args, kwargs)
        handler = RESTRIDES.get(func)
        if handler is not None:
            return handler(func, args, kwargs)
        if _composite_view(func):
            return func.decompose(*args, **kwargs)
        if func._schema.is_mutable:
            if (write_checks.foreach_write(func)
                    and write_checks.foreach_crosses(args, kwargs, STORAGES)):
                for a, k in write_checks.foreach_one_by_one(args, kwargs):
                    dispatch(func, a, k)
                return None
            check_overlapping_write(func, args, kwargs)
            if func is aten.index_put_.default and _accumulates_into_overlap(args, kwargs):
                return index_put_accumulate_overlapping(args, kwargs)
            out = overlap.in_place(func, args, kwargs)
            if out is not NotImplemented:
                return out
            plan = out_plan(func)
            if plan is not None and all(isinstance(t, LegacyTensor) for t in
                                        _written(tracer.bind(func, args, kwargs), plan.names)):
                return run_out_op(func, plan, args, kwargs)
            resize_outs(func, args, kwargs)
        return tracer.trace(LegacyTensor, func, args, kwargs)


@functools.lru_cache(maxsize=None)
def _composite_view(func) -> bool:
    """Does ``func`` return a view of an input through its CompositeImplicitAutograd kernel
    alone (``narrow``, ``flatten``, ``chunk``, ``reshape``...)? Such an op reaches the path only
    from inside another composite kernel below autograd (``bartlett_window`` narrows its result
    in C++ and writes through it); traced as an op of its own it became a new storage, and the
    writes through it never reached the base. Its composite kernel makes the view from ops the
    path knows (``slice``, ``view``...), as eager's does."""
    aliases = any(r.alias_info is not None and not r.alias_info.is_write
                  for r in func._schema.returns)
    return aliases and torch._C._dispatch_has_kernel_for_dispatch_key(
        func.name(), "CompositeImplicitAutograd")


# ----------------------------------------------------------------------------------------------
# Accumulating writes into a view whose elements overlap.

def _accumulates_into_overlap(args, kwargs) -> bool:
    x = args[0]
    accumulate = args[3] if len(args) > 3 else kwargs.get("accumulate", False)
    return (bool(accumulate) and isinstance(x, LegacyTensor) and not views.injective(x._chain)
            and all(step.keeps_elements for step in x._chain))


def index_put_accumulate_overlapping(args, kwargs):
    """``v.index_put_(indices, values, accumulate=True)`` on a view whose elements share
    storage (``x.expand(3, 1)``): eager adds every value into the memory its index reaches, so
    rows sharing an element all see the sum. The view's deltas are computed on zeros and added
    through the view's index map into the storage, as one whole-storage write."""
    x = args[0]
    indices = args[1] if len(args) > 1 else kwargs["indices"]
    values = args[2] if len(args) > 2 else kwargs["values"]
    zeros = torch.zeros(x.shape, dtype=x.dtype, device=x.device)
    delta = torch.ops.aten.index_put.default(zeros, indices, values, True)
    alias = x._alias
    root = alias.read((), alias.base.aval)
    from .alias import _node
    alias.record((), _node("legacy.add", views.AddChain(x._chain), (root, delta._value),
                           root.aval))
    return x


# ----------------------------------------------------------------------------------------------
# Views.

def _dim(d: int, ndim: int) -> int:
    return d % max(ndim, 1) if d < 0 else d


def storage_elements(t: LegacyTensor) -> int:
    """Size of ``t``'s storage counted in ``t``'s own elements (as eager allocated it)."""
    return -(-t._alias.nbytes // t.element_size())


def meta_of(t: LegacyTensor) -> torch.Tensor:
    """A meta tensor with ``t``'s sizes, strides and storage offset over a storage of its size."""
    storage = torch.empty(max(storage_elements(t), 0), dtype=t.dtype, device="meta")
    return storage.as_strided(t.shape, t.stride(), t.storage_offset())


class VMeta(NamedTuple):
    """Sizes, dtype, strides and storage offset of a view, as eager computes them."""

    shape: tuple
    dtype: torch.dtype
    stride: tuple
    offset: int


def _vmeta(m):
    if isinstance(m, torch.Tensor):
        return VMeta(tuple(m.shape), m.dtype, tuple(m.stride()), m.storage_offset())
    return type(m)(_vmeta(e) for e in m)


_META_CACHE: dict = {}


def _freeze(a):
    if isinstance(a, (list, tuple)):
        return (type(a) is list,) + tuple(_freeze(e) for e in a)
    if isinstance(a, torch.Tensor):
        raise TypeError("tensor arguments are not cached")
    return (type(a), a)


def view_meta(func, x, args, kwargs):
    """The view's metadata from the op's meta kernel on x's eager layout (cached per signature)."""
    try:
        key = (func, tuple(x.shape), tuple(x.stride()), x.storage_offset(), x.dtype,
               storage_elements(x), _freeze(args), _freeze(sorted(kwargs.items())))
        hit = _META_CACHE.get(key)
    except TypeError:   # an unhashable argument
        key = hit = None
    if hit is not None:
        return hit
    try:
        out = _vmeta(func(meta_of(x), *args, **kwargs))
    except NotImplementedError:
        raise
    except Exception as e:  # eager's error, naming the op
        tracer._reraise(e, func, (x, *args))
    if key is not None:
        if len(_META_CACHE) > 65536:
            _META_CACHE.clear()
        _META_CACHE[key] = out
    return out


def make_view(func, handler, args, kwargs, steps=None):
    """The view(s) ``func`` makes of ``args[0]``; ``steps``, if given, gets the chains the handler
    built (before ``views.fold``: what a view plan appends, ``fast.py``)."""
    x = args[0]
    out = view_meta(func, x, tuple(args[1:]), kwargs)
    chains = handler(x, out, *args[1:], **kwargs)
    if steps is not None:
        steps.append(chains)
    if isinstance(out, VMeta):
        return _member(x, out, chains)
    return type(out)(_member(x, m, c) for m, c in zip(out, chains))


def _member(x: LegacyTensor, meta: VMeta, chain: tuple) -> LegacyTensor:
    alias = x._alias
    return LegacyTensor(_UNREAD, meta.shape, meta.dtype, meta.stride, meta.offset,
                        alias=alias, chain=views.fold(chain, alias.root.shape))


@view_op(aten.alias.default, aten.detach.default, aten.lift_fresh.default)
def _same(x, out, *args, **kwargs):
    return x._chain


@view_op(aten.view.default, aten._reshape_alias.default, aten._unsafe_view.default,
         aten.squeeze.default, aten.squeeze.dim, aten.squeeze.dims, aten.unsqueeze.default)
def _reshape(x, out, *args, **kwargs):
    if tuple(out.shape) == tuple(x.shape):
        return x._chain
    return x._chain + (Reshape(tuple(out.shape)),)


@view_op(aten.view.dtype)
def _view_dtype(x, out, dtype):
    if out.dtype == x.dtype:
        return x._chain
    return x._chain + (Bitcast(_jax.to_jax_dtype(out.dtype), tuple(out.shape)),)


def _permute_chain(x, dims):
    dims = tuple(_dim(d, x.dim()) for d in dims)
    if dims == tuple(range(len(dims))):
        return x._chain
    return x._chain + (Permute(dims),)


@view_op(aten.permute.default)
def _permute(x, out, dims):
    return _permute_chain(x, dims)


@view_op(aten.transpose.int)
def _transpose(x, out, d0, d1):
    perm = list(range(x.dim()))
    if x.dim() >= 2:
        d0, d1 = _dim(d0, x.dim()), _dim(d1, x.dim())
        perm[d0], perm[d1] = perm[d1], perm[d0]
    return _permute_chain(x, perm)


@view_op(aten.t.default)
def _t(x, out):
    return _permute_chain(x, (1, 0)) if x.dim() == 2 else x._chain


@view_op(aten.expand.default)
def _expand(x, out, size, *, implicit=False):
    if tuple(out.shape) == tuple(x.shape):
        return x._chain
    return x._chain + (Expand(tuple(out.shape)),)


@view_op(aten.select.int)
def _select(x, out, d, index):
    d = _dim(d, x.dim())
    return x._chain + (Select(d, index + x.shape[d] if index < 0 else index),)


def slice_bounds(size: int, start, end):
    """Eager's normalisation of slice bounds."""
    start = 0 if start is None else start
    end = size if end is None else end
    if start < 0:
        start += size
    if end < 0:
        end += size
    start = min(max(start, 0), size)
    end = min(max(end, start), size)
    return start, end


@view_op(aten.slice.Tensor)
def _slice(x, out, d=0, start=None, end=None, step=1):
    d = _dim(d, x.dim())
    start, end = slice_bounds(x.shape[d], start, end)
    if (start, end, step) == (0, x.shape[d], 1):
        return x._chain
    return x._chain + (Slice(d, start, end, step),)


@view_op(aten.split.Tensor, aten.split_with_sizes.default)
def _split(x, outs, sizes, d=0):
    d = _dim(d, x.dim())
    chains, start = [], 0
    for m in outs:
        n = m.shape[d]
        chains.append(x._chain + (Slice(d, start, start + n, 1),))
        start += n
    return chains


@view_op(aten.unbind.int)
def _unbind(x, outs, d=0):
    d = _dim(d, x.dim())
    return [x._chain + (Select(d, i),) for i in range(len(outs))]


@view_op(aten.diagonal.default)
def _diagonal(x, out, offset=0, dim1=0, dim2=1):
    return x._chain + (Diagonal(offset, _dim(dim1, x.dim()), _dim(dim2, x.dim())),)


@view_op(aten.unfold.default)
def _unfold(x, out, d, size, step):
    if x.dim() == 0:
        return x._chain + (Reshape((1,)),)
    return x._chain + (Unfold(_dim(d, x.dim()), size, step),)


@view_op(aten.as_strided.default)
def _as_strided(x, out, size, stride, storage_offset=None):
    if not all(step.keeps_elements for step in x._chain):
        raise NotImplementedError(
            "xla_compat: as_strided of a view that reinterprets the dtype (view_as_real, "
            "view_as_complex, view(dtype)) is not supported on the legacy path; clone() first")
    offset = x.storage_offset() if storage_offset is None else storage_offset
    view = Layout(tuple(int(s) for s in size), tuple(int(s) for s in stride), int(offset))
    have = storage_elements(x)
    if view.storage_size > have:   # meta tensors skip eager's bounds check
        item = x.element_size()
        raise RuntimeError(
            f"setStorage: sizes {list(view.shape)}, strides {list(view.stride)}, storage offset "
            f"{view.offset}, and itemsize {item} requiring a storage size of "
            f"{view.storage_size * item} are out of bounds for storage of size {have * item}")
    root = x._alias.root                       # storage semantics: the chain so far is moot
    if len(root.shape) == 1 and root.is_plain:
        return views.in_flat(view, root)       # (a slice and a reshape where it can)
    return (AsStrided(view, root),)


@view_op(aten.view_as_real.default)
def _view_as_real(x, out):
    return x._chain + (ViewAsReal(),)


@view_op(aten.view_as_complex.default)
def _view_as_complex(x, out):
    return x._chain + (ViewAsComplex(),)


# ----------------------------------------------------------------------------------------------
# In-place metadata ops: the tensor itself becomes the view the out-of-place op would return.

def restride(x: LegacyTensor, new: LegacyTensor) -> LegacyTensor:
    """Give ``x`` the sizes, strides, offset and chain of ``new`` (a member of x's storage).

    The C++ ``.data`` setter copies sizes, strides and offset and keeps x's autograd metadata
    and version counter (the in-place op itself bumps the version, as in eager).
    """
    _core_tensor.take_geometry(x, new)
    x._join(new)
    return x


def _restride_as(view_func):
    def handler(func, args, kwargs):
        x = args[0]
        new = make_view(view_func, VIEWS[view_func], args, kwargs)
        return restride(x, new)
    return handler


for _inplace, _view in [(aten.transpose_.default, aten.transpose.int),
                        (aten.t_.default, aten.t.default),
                        (aten.squeeze_.default, aten.squeeze.default),
                        (aten.squeeze_.dim, aten.squeeze.dim),
                        (aten.squeeze_.dims, aten.squeeze.dims),
                        (aten.unsqueeze_.default, aten.unsqueeze.default),
                        (aten.as_strided_.default, aten.as_strided.default)]:
    RESTRIDES[_inplace] = _restride_as(_view)


def _t_in_place(func, args, kwargs, _restride_t=RESTRIDES[aten.t_.default]):
    t_in_place_dims(args[0])                 # eager's words (the view's meta kernel says t())
    return _restride_t(func, args, kwargs)


RESTRIDES[aten.t_.default] = _t_in_place


def _resize(func, args, kwargs):
    """Eager's ``resize_``: a new shape laid out afresh (contiguous, or ``memory_format``) from
    the same storage offset; past the end of the storage, the storage grows first. Eager's
    resize on a meta twin gives the layout and eager's errors."""
    x = args[0]
    if (len(args) < 3 and kwargs.get("memory_format") is None
            and tuple(int(s) for s in args[1]) == tuple(x.shape)):
        return x                            # eager's early return: nothing to check or change
    try:
        out = func(meta_of(x), *args[1:], **kwargs)
    except Exception as e:
        tracer._reraise(e, func, args)
    shape, stride = tuple(out.shape), tuple(out.stride())
    if shape == tuple(x.shape) and stride == tuple(x.stride()):
        return x
    end = out.storage_offset() + int(np.prod(shape, dtype=np.int64))
    if out.numel() and end > storage_elements(x):
        _grow(x, end)
    return restride(x, make_view(aten.as_strided.default, VIEWS[aten.as_strided.default],
                                 (x, shape, stride, out.storage_offset()), {}))


def _grow(x: LegacyTensor, elements: int) -> None:
    """Eager's ``resize_`` past the end of the storage grows the storage in place: every tensor
    on it keeps its sizes, strides and offset, over a larger storage. Here the alias becomes a
    flat storage of ``elements`` (the old one's elements first, zeros after: eager leaves them
    uninitialised), and each member reaches its place in it through the old root's."""
    old = x._alias
    if old.sharding is not None or not all(step.keeps_elements for step in x._chain):
        raise NotImplementedError(
            f"xla_compat: resize_ from {list(x.shape)} to {elements - x.storage_offset()} "
            f"elements grows the storage of a "
            f"{'sharded tensor' if old.sharding is not None else 'dtype-reinterpreting view'}, "
            f"which the legacy path cannot grow in place; use x = x.new_empty(...) (or "
            f"torch.cat) instead")
    from .alias import Alias, _node
    flat = Layout((elements,), (1,), 0)
    rule = views.GrowStorage(old.root, elements)
    new = Alias(_node("legacy.grow", rule, (old.flush(),), Aval((elements,), old._dtype)), flat)
    new.grown = (old, rule)
    prefix = views.in_flat(old.root, flat)
    for m in _tensor_module.legacy_tensors():
        if m._a is old:
            m._gen = new.gen if m._gen == old.gen else -1    # a current value stays current
            m._a = new
            m._chain = views.fold(views.rebase(m._chain, prefix, flat), flat.shape)


RESTRIDES[aten.resize_.default] = _resize


def _set(func, args, kwargs):
    dst, src = args
    if not isinstance(src, LegacyTensor):
        raise TypeError(f"xla_compat: set_ needs a legacy-path hlo tensor as source, got a "
                        f"{type(src).__name__} on {src.device}")
    return restride(dst, src)


RESTRIDES[aten.set_.source_Tensor] = _set


# ----------------------------------------------------------------------------------------------
# Writes into views whose elements overlap: error exactly where eager errors.

def _geometry(t: LegacyTensor):
    return tuple(t.shape), tuple(t.stride()), t.storage_offset()


def check_overlapping_write(func, args, kwargs) -> None:
    """Eager's overlap errors: a written tensor whose elements overlap (an expanded view), an
    input that partially overlaps the written tensor in their shared storage (``x.t().copy_(x)``)
    or, for an op outside TensorIterator (``index_copy_``, ``scatter_``, ...), that shares any
    element with it. A CPU probe over a shared zero storage decides whether this op checks
    (``fill_`` does not; write_checks.probe_in_place)."""
    names, _, _ = tracer.mutation_info(func)
    bound = tracer.bind(func, args, kwargs)
    written = []
    for n in names:
        vals = bound.get(n)
        written += [t for t in (vals if isinstance(vals, (list, tuple)) else [vals])
                    if isinstance(t, LegacyTensor)]
    for t in written:
        if (not views.injective(t._chain)
                and torch._debug_has_internal_overlap(meta_of(t)) == 1):
            write_checks.probe_in_place(func, args, kwargs, STORAGES)
            return
    if not written:
        return
    iterator = write_checks.iterator_op(func)
    operands = tracer._flat_tensors([v for n, v in bound.items() if n not in names])
    for x in operands:
        if not isinstance(x, LegacyTensor):
            continue
        for t in written:
            if x._alias is not t._alias or (iterator and x is t):
                continue
            if (tracer.partial_overlap(_geometry(t), _geometry(x))
                    and x.element_size() == t.element_size()
                    if iterator else write_checks.shares_elements(t, x)):
                write_checks.probe_in_place(func, args, kwargs, STORAGES)
                return


# ----------------------------------------------------------------------------------------------
# out= ops, run as functionalization runs them: eager's checks from the out= overload's meta
# kernel (where it has one), the functional op, then each result written into its out tensor
# (resized first where its shape differs, as eager resizes it). Tracing the out= overload itself
# would need its meta kernel (masked_select.out, nonzero.out, geqrf.a have none) and a rule
# that takes out= (a rule registered on a whole packet also lands on its .out overloads).

class OutPlan(NamedTuple):
    """How to run an out= op: its out= argument names, the other arguments it writes (running
    statistics of a batch norm), and its functional variant."""

    names: tuple
    others: tuple
    functional: object


@functools.lru_cache(maxsize=None)
def out_plan(func) -> OutPlan | None:
    """The plan of an op that writes keyword out= arguments and returns them; None for every
    other op (in-place ops, factories' out= overloads without a functional variant). Other
    written arguments are allowed where the functional variant is a ``*_functional`` op, which
    returns their new values after the op's own results."""
    names, fresh, functional = tracer.mutation_info(func)
    outs = tuple(a.name for a in func._schema.arguments
                 if a.kwarg_only and a.alias_info is not None and a.alias_info.is_write)
    if not outs or fresh or functional is None:
        return None
    others = tuple(n for n in names if n not in outs)
    if others and not functional._schema.name.endswith("_functional"):
        return None
    return OutPlan(outs, others, functional)


def _written(bound, names) -> list:
    out = []
    for n in names:
        v = bound.get(n)
        out += list(v) if isinstance(v, (list, tuple)) else [v]
    return out


# The legacy path's device tensors: LegacyTensors, sharing memory where they share an alias.
STORAGES = write_checks.Storages("legacy", lambda t: isinstance(t, LegacyTensor),
                                 lambda t: id(t._alias), storage_elements)


@functools.lru_cache(maxsize=None)
def _out_op(func) -> write_checks.OutOp:
    return write_checks.OutOp.of(func)


def run_out_op(func, plan: OutPlan, args, kwargs):
    spec = _out_op(func)
    in_place = write_checks.in_place_form(spec, args, kwargs, STORAGES)
    if in_place is not None:           # out= its own overlapping input: eager's in-place walk
        return in_place[0](*args, **in_place[1])
    if not plan.others:     # eager's dtype and overlap checks of the write (write_checks.py)
        write_checks.check_out(spec, args, kwargs, STORAGES)
    try:
        tracer.meta(func, args, kwargs)     # eager's errors (shapes, ...) for this out=
        checked = True
    except NotImplementedError:             # no meta kernel: the functional op checks inputs
        checked = False
    f_kwargs = {k: v for k, v in kwargs.items() if k not in plan.names}
    bound = tracer.bind(func, args, kwargs)
    outs = _written(bound, plan.names)
    targets = outs + _written(bound, plan.others)
    results = plan.functional(*args, **f_kwargs)
    flat = tracer._flat_tensors(results)
    if len(flat) != len(targets):
        raise NotImplementedError(
            f"xla_compat: {func} writes {len(targets)} tensors but its functional variant "
            f"{plan.functional} returned {len(flat)} results; the legacy path cannot pair them. "
            f"Call {plan.functional} without out= and copy_ the results instead")
    for t, r in zip(targets, flat):
        if t is None or r is None:
            continue
        if not checked and plan.others and not torch.can_cast(r.dtype, t.dtype):
            raise RuntimeError(
                f"result type {tracer.type_name(r.dtype)} can't be cast to the desired output "
                f"type {tracer.type_name(t.dtype)}"
                + tracer.raised_by(func, (args, list(kwargs.values()))))
        if tuple(t.shape) != tuple(r.shape):
            resize_out(t, r.shape)
        if not overlap.last_write(t, r, [t] + tracer._flat_tensors((args, list(f_kwargs.values())))):
            t.copy_(r)
    return _out_returns(func, args, kwargs)


def _out_returns(func, args, kwargs):
    """The out= op's returns: the out arguments they alias (schema alias sets)."""
    returns = func._schema.returns
    if not returns:
        return None
    bound = tracer.bind(func, args, kwargs)
    by_set = {s: bound[a.name] for a in func._schema.arguments
              if a.alias_info is not None and a.alias_info.is_write
              for s in a.alias_info.before_set}
    outs = tuple(by_set[next(iter(r.alias_info.before_set))] for r in returns)
    return outs[0] if len(outs) == 1 else outs


def resize_out(t: LegacyTensor, shape) -> None:
    """Eager's ``resize_`` of an out= tensor: contiguous strides from its offset, in its storage,
    which grows in place where it is too small (its other views stay on it)."""
    _resize(aten.resize_.default, (t, tuple(int(s) for s in shape)), {})


def resize_outs(func, args, kwargs) -> None:
    """out= tensors of another shape (ops traced through their out= overload): resized."""
    outs = [a.name for a in func._schema.arguments
            if a.kwarg_only and a.alias_info is not None and a.alias_info.is_write]
    if not any(isinstance(kwargs.get(n), LegacyTensor) for n in outs):
        return
    _, after = tracer.meta(func, args, kwargs)
    flat = tracer._flat_tensors((args, list(kwargs.values())))
    for i, t in enumerate(flat):
        if isinstance(t, LegacyTensor) and i in after and tuple(after[i].shape) != tuple(t.shape):
            resize_out(t, after[i].shape)


_tensor_module.bind_ops(sys.modules[__name__])
