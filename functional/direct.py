"""Writes through views as ONE update of their root wrapper, without regenerating views (issue 8).

Upstream's Functionalize kernel for an in-place op on a view syncs the view (it replays each
pending update of the storage, one inner op per view step and its inverse, then regenerates the
view from the base, one inner op per step), runs the op, queues the new value with the view's
steps and syncs the view again; ``copy_`` does much the same. A fresh view is born out of date
(its generation is 0, its storage's is not), so each of those syncs dispatches inner ops although
the values are known. torch 2.13 gives Python no way to make a view up to date (a wrapper's
generation is set only by regenerating it), so these kernels do not sync views at all:

* a view of a *root* wrapper (no view steps, contiguous, offset 0, one storage: its ``_base``)
  is read from the root's value through the view's chain (``viewchain.read``: one node, or the
  source of the write that just wrote those elements);
* the op runs on that value (one inner dispatch; none for ``copy_``);
* the root takes its value with the result written through the chain (``viewchain.write``: one
  node) and commits it as an update WITHOUT view steps, which applying costs no inner op.

Every other wrapper of the storage, the written view included, is out of date after that commit,
as upstream leaves it, and regenerates from the root whenever upstream next reads it; nothing
else of the wrapper's bookkeeping changes. ``copy_`` between two views of one storage with the
same layout is no write at all (eager returns early there too).

Taken only for functional hlo wrappers outside inference mode, with no tensor requiring grad
while grad mode is on (an optimizer's no_grad updates are taken), where the view's steps are
select/slice/transpose/permute/t from a plain root (the chain, memoised by the root's and view's
layouts and the kinds of steps, is checked against the view's strides and offset) or the tensor
is a root itself; in-place ops: ``add_``/``sub_`` (alpha a number; 1 for the Scalar overloads),
``mul_``, ``div_`` (no rounding mode) of a non-bool, non-complex tensor by a number or a
functional hlo tensor of another storage, whose result (from the functional op on meta twins)
has the written tensor's shape and dtype, into a tensor without self-overlap. Everything else is upstream's kernel; so is every eager error. (A number reaches a
Python kernel unwrapped and upstream's boxed kernel takes none for a Tensor argument, so for a
number upstream's generated steps are taken here one by one: ``_with_number``.)

Cost (W4, 16 writes through a slice and 16 through a transposed view per step): 321 -> 97 inner
dispatches per step, traced ~4.2 -> ~2.05 ms (legacy ~1.5 ms).
"""
from __future__ import annotations

import warnings

import torch
from torch._C._functionalization import get_view_meta_sequence as _metas

from xla_compat import _jax
from xla_compat.lazy import tracer
from xla_compat.lazy.ir import Aval
from xla_compat.lazy.tensor import lock
from xla_compat.lowering.boxes import compose
from xla_compat.lowering.views import surely_distinct

from . import viewchain
from .inner import FunctionalInner
from .overrides import override
from .strides import meta_like, storage_id as _storage_id

aten = torch.ops.aten
# (torch._sync is a Python function around this one, for torch.compile's FunctionalTensor)
_sync, _from = torch._functionalize_sync, torch._from_functional_tensor
_replace, _commit = torch._functionalize_replace, torch._functionalize_commit_update
_is_functional = torch._is_functional_tensor
_inference, _grad = torch.is_inference_mode_enabled, torch.is_grad_enabled
_MEMO_LIMIT = 4096


# -- a view's chain from its root -------------------------------------------------------------------

# ViewMeta kind -> (the view copy whose step it takes, its argument names); args follow the
# three fields every ViewMeta tuple starts with (symbolic inputs, multi-output, inverse mode).
_STEPS = {
    "slice_Tensor_ViewMeta": (aten.slice_copy.Tensor, ("dim", "start", "end", "step")),
    "select_int_ViewMeta": (aten.select_copy.int, ("dim", "index")),
    "transpose_int_ViewMeta": (aten.transpose_copy.int, ("dim0", "dim1")),
    "permute_ViewMeta": (aten.permute_copy.default, ("dims",)),
    "t_ViewMeta": (aten.t_copy.default, ()),
}


# (root layout, view layout, kinds of its steps) -> the view's Chain from the root, or None (not
# taken). The steps' arguments are not in the key: from a contiguous root at offset 0 the view's
# strides and offset say which elements it holds, whatever steps put it there (the first chain
# found for a key is checked against them).
_CHAINS: dict = {}
tracer.plan_memos.append(_CHAINS)


def root(w):
    """(root wrapper, Chain from it to ``w``) for a view ``w`` of a plain root, else None."""
    base = w._base
    if base is None or not _is_functional(base):
        return None
    metas = _metas(w)
    if not metas or _metas(base) or _storage_id(base) != _storage_id(w):
        return None
    key = (base.shape, base.stride(), base.storage_offset(), base.dtype,
           w.shape, w.stride(), w.storage_offset(), w.dtype, tuple(map(type, metas)))
    c = _CHAINS.get(key, _CHAINS)
    if c is _CHAINS:
        c = tracer.keep(_CHAINS, key, _chain(base, w, metas), _MEMO_LIMIT)
    return None if c is None else (base, c)


def _chain(base, w, metas):
    """The chain of ``w``'s steps from ``base``, where each is one viewchain knows and they put
    ``w`` where its strides and offset say (in a contiguous root from offset 0); else None."""
    shape = tuple(base.shape)
    if (base.dtype != w.dtype or base.storage_offset() != 0 or not base.is_contiguous()
            or w.numel() == 0):
        return None
    steps = []
    for m in metas:
        kind = _STEPS.get(type(m).__name__)
        fields = m.as_tuple()
        if kind is None or len(fields) != 3 + len(kind[1]) or any(fields[:2]):
            return None
        func, names = kind
        step = viewchain._step(func, dict(zip(names, fields[3:])),
                               compose(shape, tuple(steps)).shape)
        if step is None:
            return None
        steps.append(step)
    c = viewchain.chain(Aval(shape, _jax.to_jax_dtype(base.dtype)), tuple(steps))
    box = c.box
    root_strides = [1] * len(shape)
    for d in range(len(shape) - 2, -1, -1):
        root_strides[d] = root_strides[d + 1] * shape[d + 1]
    offset = sum(d[0] * s for d, s in zip(box.dims, root_strides))
    strides = [box.dims[b][2] * root_strides[b] for b in box.order]
    if (box.shape != tuple(w.shape) or offset != w.storage_offset()
            or any(n > 1 and s != t for n, s, t in zip(w.shape, strides, w.stride()))):
        return None
    return c


# -- values -----------------------------------------------------------------------------------------

def value_of(w):
    """The current IR value of functional wrapper ``w``: through its root where it is a view of a
    plain root (no inner op), else as upstream syncs it."""
    r = root(w)
    if r is None:
        _sync(w)
        return _from(w)._value
    base, c = r
    _sync(base)
    with lock:
        return viewchain.read(_from(base)._value, c)


def _commit_root(base, value) -> None:
    """The root wrapper ``base`` holds ``value`` now: an update without view steps."""
    shape, stride, offset, dtype = tuple(base.shape), base.stride(), base.storage_offset(), \
        base.dtype
    t = FunctionalInner(value, shape, dtype, stride, offset)
    t._geo = (shape, stride, dtype, offset)        # (tracer.geometry: views are born from it)
    _replace(base, t)
    _commit(base)


# -- copy_ ------------------------------------------------------------------------------------------

def same_elements(a, b) -> bool:
    """Two wrappers of one storage: are they the same elements in the same order (eager's early
    exit from ``copy_``)?"""
    return (a.shape == b.shape and a.dtype == b.dtype and a.stride() == b.stride()
            and a.storage_offset() == b.storage_offset() and a.is_conj() == b.is_conj()
            and a.is_neg() == b.is_neg())


def copy(self, src):
    """``self.copy_(src)`` for functional wrappers of equal shape and dtype, ``self`` without
    self-overlap, not the same elements and no partial overlap between them (the caller
    checked): ``self``, or None where upstream's kernel must run."""
    if (((self.requires_grad or src.requires_grad) and _grad()) or _inference()
            or type(_from(self)) is not FunctionalInner):
        return None
    if not _metas(self):
        value = value_of(src)         # a whole root: its new value is the source's
        _commit_root(self, value)
        return self
    r = root(self)
    if r is None:
        return None
    base, c = r
    value = value_of(src)
    _sync(base)
    with lock:
        written = viewchain.write(_from(base)._value, value, c)
    _commit_root(base, written)
    return self


# (geometries, dtypes and kinds of view steps of both views and both roots) -> (the
# destination's chain, the source's chain), or None: the full path decides
_COPIES: dict = {}
tracer.plan_memos.append(_COPIES)


def planned_copy(self, src):
    """``self.copy_(src)`` for two views of plain roots of two different storages, where a memo
    keyed by everything the full path's checks read (both views' and roots' geometries, dtypes
    and kinds of steps) says that path takes ``copy`` through both roots: the same nodes, without
    the checks (their outcome is the memo's) or the chain discovery. None: the full path runs."""
    if type(src) is not torch.Tensor or _inference():
        return None
    if (self.requires_grad or src.requires_grad) and _grad():
        return None
    db, sb = self._base, src._base
    if db is None or sb is None or not (_is_functional(self) and _is_functional(src)):
        return None
    ds, ss = _storage_id(self), _storage_id(src)
    if (ds == ss or not (_is_functional(db) and _is_functional(sb))
            or _storage_id(db) != ds or _storage_id(sb) != ss):
        return None
    dm, sm = _metas(self), _metas(src)
    if not dm or not sm or _metas(db) or _metas(sb):
        return None
    if type(_from(self)) is not FunctionalInner or type(_from(src)) is not FunctionalInner:
        return None
    key = (self.shape, self.stride(), self.storage_offset(), self.dtype, tuple(map(type, dm)),
           src.shape, src.stride(), src.storage_offset(), src.dtype, tuple(map(type, sm)),
           db.shape, db.stride(), db.storage_offset(), db.dtype,
           sb.shape, sb.stride(), sb.storage_offset(), sb.dtype)
    plan = _COPIES.get(key, _COPIES)
    if plan is _COPIES:
        plan = tracer.keep(_COPIES, key, _copy_plan(self, src), _MEMO_LIMIT)
    if plan is None:
        return None
    cd, cs = plan
    _sync(sb)
    with lock:
        value = viewchain.read(_from(sb)._value, cs)
    _sync(db)
    with lock:
        written = viewchain.write(_from(db)._value, value, cd)
    _commit_root(db, written)
    return self


def _copy_plan(self, src):
    """The full path's verdict for this key: (destination chain, source chain) where it would
    write through both roots with no error, else None."""
    from xla_compat.lowering.views import expanded
    if (expanded(self.shape, self.stride()) or self.shape != src.shape
            or self.dtype != src.dtype or self.device != src.device
            or not surely_distinct(tuple(self.shape), self.stride())):
        return None
    rd, rs = root(self), root(src)
    if rd is None or rs is None:
        return None
    return rd[1], rs[1]


# -- pointwise in-place ops -------------------------------------------------------------------------

# in-place overload -> its functional op
_IN_PLACE = {
    aten.add_.Tensor: aten.add.Tensor, aten.add_.Scalar: aten.add.Scalar,
    aten.sub_.Tensor: aten.sub.Tensor, aten.sub_.Scalar: aten.sub.Scalar,
    aten.mul_.Tensor: aten.mul.Tensor, aten.mul_.Scalar: aten.mul.Scalar,
    aten.div_.Tensor: aten.div.Tensor, aten.div_.Scalar: aten.div.Scalar,
}
_NUMBERS = (int, float)
# (functional op, view layout, what other is) -> the layout its operand takes (None: not taken)
_TAKEN: dict = {}
tracer.plan_memos.append(_TAKEN)


def _other_kind(self, other):
    """What decides the checks about ``other``: its number type, or a functional hlo tensor's
    shape and dtype (None: not taken)."""
    if type(other) in _NUMBERS:
        return type(other)
    if (type(other) is torch.Tensor and _is_functional(other)
            and not (other.requires_grad and _grad()) and other.device.type == "hlo"
            and _storage_id(other) != _storage_id(self)):
        return (other.shape, other.dtype)
    return None


def _takes(functional, self, other, kwargs):
    """The geometry of a contiguous operand of the view's shape, where no eager check can fail:
    a real, non-bool view without self-overlap, and the functional op (on meta twins) gives the
    view's shape and dtype; else None."""
    if self.dtype is torch.bool or self.dtype.is_complex:
        return None
    if not surely_distinct(tuple(self.shape), self.stride()):
        return None
    twin = other if type(other) in _NUMBERS else meta_like(other)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = functional(meta_like(self), twin, **kwargs)
    except Exception:   # noqa: BLE001 - eager raises: upstream's kernel says how
        return None
    if out.dtype != self.dtype or out.shape != self.shape:
        return None
    shape = tuple(self.shape)
    stride = [1] * len(shape)
    for d in range(len(shape) - 2, -1, -1):
        stride[d] = stride[d + 1] * max(shape[d + 1], 1)
    return (shape, tuple(stride), self.dtype, 0)


def in_place(functional, self, other, kwargs=None):
    """``self.op_(other, **kwargs)`` through ``self``'s root (``functional``: the op's functional
    form; ``kwargs``: an ``alpha`` number or nothing), or None where upstream's kernel must run."""
    if (self.requires_grad and _grad()) or _inference() or type(_from(self)) is not FunctionalInner:
        return None
    kind = _other_kind(self, other)
    if kind is None:
        return None
    metas = _metas(self)
    if metas:
        base = self._base
        if (base is None or not _is_functional(base) or _metas(base)
                or _storage_id(base) != _storage_id(self)):
            return None
        # one memo for the op's checks and the view's chain: everything both read
        key = (functional, self.shape, self.stride(), self.storage_offset(), self.dtype, kind,
               type(kwargs["alpha"]) if kwargs else None, tuple(map(type, metas)),
               base.shape, base.stride(), base.storage_offset(), base.dtype)
    else:
        base = self                   # a root itself: upstream's steps without its syncs
        key = (functional, self.shape, self.stride(), self.dtype, kind,
               type(kwargs["alpha"]) if kwargs else None)   # (alpha's checks: its type decides)
    plan = _TAKEN.get(key, _TAKEN)
    if plan is _TAKEN:
        plan = tracer.keep(_TAKEN, key, _in_place_plan(functional, self, other, kwargs, metas),
                           _MEMO_LIMIT)
    if plan is None:
        return None
    geo, c = plan
    if type(other) is torch.Tensor:
        other = FunctionalInner(value_of(other), tuple(other.shape), other.dtype)
    _sync(base)
    with lock:
        value = _from(base)._value
        if c is not None:
            value = viewchain.read(value, c)
    x = FunctionalInner(value, geo[0], geo[2], geo[1], 0)
    x._geo = geo
    out = _run(functional, (x, other), kwargs)
    if c is None:
        _commit_root(base, out._value)
        return self
    with lock:
        written = viewchain.write(_from(base)._value, out._value, c)
    _commit_root(base, written)
    return self


def _in_place_plan(functional, self, other, kwargs, metas):
    """(the operand's geometry, the view's chain from its root or None for a root) where the
    route is taken for this key, else None."""
    geo = _takes(functional, self, other, kwargs or {})
    if geo is None:
        return None
    if not metas:
        return geo, None
    r = root(self)
    return None if r is None else (geo, r[1])


_modes = torch._C._len_torch_dispatch_stack
_INNER = (FunctionalInner,)


def _run(func, args, kwargs=None):
    """``func`` on inner tensors: straight into their dispatch (where the dispatcher would send
    it) unless a dispatch mode is active, which must see it."""
    if _modes():
        return func(*args, **(kwargs or {}))
    return FunctionalInner.__torch_dispatch__(func, _INNER, args, kwargs)


_SKIP_FUNCTIONALIZE = torch._C.DispatchKeySet(torch._C.DispatchKey.Functionalize)
# What upstream's kernels exclude around the meta reference (Functionalize too, skipped there).
_META_REFERENCE = _SKIP_FUNCTIONALIZE | torch._C.DispatchKeySet(torch._C.DispatchKey.Python)
_exclude = torch._C._ExcludeDispatchKeyGuard


def _with_number(op, functional, self, other, rest, kwargs):
    """Upstream's generated Functionalize kernel of ``op`` for a number ``other``, step by step.

    A number reaches a Python kernel unwrapped, and a boxed call of upstream's kernel takes no
    number for a Tensor argument; an op called from Python wraps it again, as the dispatcher
    does: the meta reference (eager's checks), the functional op on the synced inner tensor,
    then replace, commit and sync."""
    if not _is_functional(self):
        with _exclude(_SKIP_FUNCTIONALIZE):
            return op(self, other, *rest, **kwargs)
    _sync(self)
    with _exclude(_META_REFERENCE):
        op(torch.empty_strided(self.shape, self.stride(), dtype=self.dtype, device="meta"),
           other, *rest, **kwargs)
    x = _from(self)
    if type(x) is FunctionalInner:
        out = _run(functional, (x, other, *rest), kwargs or None)
    else:
        with _exclude(_SKIP_FUNCTIONALIZE):
            out = functional(x, other, *rest, **kwargs)
    _replace(self, out)
    _commit(self)
    _sync(self)
    return self


def shares_storage(a, b) -> bool:
    """``a`` and ``b`` are functional wrappers of one storage (``b`` may be anything)."""
    return (type(b) is torch.Tensor and _is_functional(b) and _is_functional(a)
            and _storage_id(b) == _storage_id(a))


def raise_on_partial_overlap(op, self, other) -> None:
    """Eager's error where ``other``, of ``self``'s storage, shares some, not all, of its memory.

    Upstream's kernels check on the inner tensors, which are separate values once a sync or a
    write has passed (``v = t.unsqueeze(-1); v.mul_(-1); sync; v.add_(t)``); the wrappers keep
    eager's storage and geometry."""
    if (other.element_size() == self.element_size()
            and tracer.partial_overlap((tuple(self.shape), self.stride(), self.storage_offset()),
                                       (tuple(other.shape), other.stride(),
                                        other.storage_offset()))):
        raise RuntimeError(f"{tracer.PARTIAL_OVERLAP}\n  (xla_compat: raised by {op} on the "
                           f"functional path, operand {tuple(other.shape)} sharing memory with "
                           f"the written {tuple(self.shape)}; nothing was written)")


def _kernel(op, functional):
    upstream = torch.library.get_kernel(op, "Functionalize")
    number_as_tensor = isinstance(op._schema.arguments[1].type, torch.TensorType)
    # alpha other than 1 is taken where the functional op takes it by keyword (add/sub.Tensor)
    alpha_kwarg = any(a.name == "alpha" and a.kwarg_only for a in functional._schema.arguments)

    def kernel(keyset, self, other, *rest, **kwargs):
        alpha = rest[0] if rest else kwargs.get("alpha", 1)
        if type(self) is torch.Tensor and _is_functional(self) and len(rest) + len(kwargs) <= 1:
            if type(alpha) is int and alpha == 1:
                done = in_place(functional, self, other)
            elif type(alpha) in _NUMBERS and alpha_kwarg:
                done = in_place(functional, self, other, {"alpha": alpha})
            else:
                done = None
            if done is not None:
                return done
        if number_as_tensor and not isinstance(other, torch.Tensor):
            return _with_number(op, functional, self, other, rest, kwargs)
        if shares_storage(self, other):
            raise_on_partial_overlap(op, self, other)
        return upstream.call_boxed(keyset, self, other, *rest, **kwargs)
    kernel.__name__ = f"direct_{op._schema.name.split('::')[1]}_{op._overloadname}"
    return kernel


_lib = None


def install() -> None:
    """Register the pointwise in-place kernels at the Functionalize key (once); ``copy_``'s is
    checks.py's, which calls ``copy``."""
    global _lib
    if _lib is not None:
        return
    _lib = torch.library.Library("aten", "IMPL")
    for op, functional in _IN_PLACE.items():
        override(_lib, op, _kernel(op, functional), "Functionalize", with_keyset=True)
