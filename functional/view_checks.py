"""In-place view ops on the functional path: ``transpose_``, ``t_``, ``squeeze_``, ``unsqueeze_``,
``as_strided_`` fail like eager's and leave the tensor as it was; ``set_`` leaves the old storage
writable.

Upstream's Functionalize kernel for an in-place view op first appends the view to the wrapper's
view metas (``mutate_view_meta``) and only then runs the op on a meta copy, where a bad argument
raises: ``t.transpose_(0, 5)`` raised eager's IndexError, but the wrapper kept the half-made view,
and every later read of ``t`` or of a view made from it raised again (found by the fuzz, once its
programs restrided tensors in place). Eager raises before it changes anything.

So each such op gets a Functionalize kernel here that runs it first on a meta tensor laid out like
the wrapper over a meta storage of the wrapper's storage size (so ``as_strided_`` meets eager's
``setStorage`` bound check), raising eager's error before upstream's kernel runs; then upstream's
kernel. Cost: one meta op (~10 us) per in-place view op, which programs call rarely (``t()`` and
the other out-of-place views do not come here).

**``x.set_(y)``** (another functional tensor): upstream's kernel moves ``x`` onto ``y``'s storage
and *freezes* ``x``'s old storage, so any later write to a tensor still on it (the base ``x`` was
a view of, or another view of it) raised "cannot mutate tensors with frozen storage", where eager
writes them as usual. Here ``x`` takes ``y``'s value, view chain and storage as ``x.data = y``
does (``FunctionalTensorWrapper::shallow_copy_from``, what ``set__impl`` does less the freeze),
after eager's checks on meta tensors (``Could not set tensor of type ...``); the old storage and
its other tensors go on as before.

**``resize_``** gets eager's errors the same way (``resize_(-1)``, ``channels_last`` of a 2-d
shape). Within the storage it is an ``as_strided_`` with eager's strides (upstream's kernel lays
the tensor out contiguously whatever the memory format, and it takes the storage's size from a
count that an out= op's resize leaves stale: ``torch.arange(4.).view(2, 2).resize_(4)`` was
refused as growing a view). Growing the storage of a tensor that has views, or of a view, is
upstream's limit (``FunctionalTensorWrapper::maybe_replace_storage``, which raises before it
changes anything): it is raised as a ``FunctionalizationLimit`` that names the shapes and what
to do instead. (The legacy path grows such a storage as eager does.) ``set_`` of a storage and
``detach_`` (cannot fail) are not covered here; in-place ops that resize their ``self`` are in
``eager_resize.py``.
"""
from __future__ import annotations

import torch

from torch._C._functionalization import get_view_meta_sequence as _metas

from xla_compat.lowering.eager_checks import t_in_place_dims

from .overrides import installs_once, override

aten = torch.ops.aten
_is_functional = torch._is_functional_tensor

OPS = (aten.transpose_.default, aten.t_.default, aten.squeeze_.default, aten.squeeze_.dim,
       aten.squeeze_.dims, aten.unsqueeze_.default, aten.as_strided_.default,
       aten.swapdims_.default, aten.swapaxes_.default)


def _storage_bytes(t: torch.Tensor) -> int:
    """The size of a functional tensor's storage: upstream's count, or its inner tensor's (which
    has eager's geometry) where an out= op resized it (``torch.arange``) and upstream's count
    stayed at the old size. Never the wrapper's ``untyped_storage()``: upstream's ``resize_``
    counts that Python handle as one more view of the storage and refuses to grow it."""
    return max(torch._functionalize_get_storage_size(t, False),
               torch._from_functional_tensor(t).untyped_storage().nbytes())


def meta_like(t: torch.Tensor) -> torch.Tensor:
    """A meta tensor of ``t``'s dtype, sizes, strides and storage offset over a meta storage of
    ``t``'s storage size."""
    storage = torch.UntypedStorage(_storage_bytes(t), device="meta")
    out = torch.empty(0, dtype=t.dtype, device="meta")
    with torch.no_grad():
        out.set_(storage, t.storage_offset(), t.shape, t.stride())
    return out


def _on_meta(op, self, *args, **kwargs) -> None:
    """Eager's error for ``op(self, ...)``, raised by the op's meta kernel."""
    op(meta_like(self), *args, **kwargs)


def _t_dims(op, self, *args, **kwargs) -> None:
    t_in_place_dims(self)


_CHECKS = {aten.t_.default: _t_dims}      # op -> its check where the meta kernel's is not eager's


def _set_to_tensor(upstream):
    def kernel(keyset, self, source):
        if not (_is_functional(self) and isinstance(source, torch.Tensor)
                and _is_functional(source)):
            return upstream.call_boxed(keyset, self, source)
        aten.set_.source_Tensor(meta_like(self), meta_like(source))   # eager's checks
        self.data = source                # shares source's storage; the old one stays writable
        return self
    kernel.__name__ = "set_to_tensor_without_freezing"
    return kernel


def _checked(op):
    upstream = torch.library.get_kernel(op, "Functionalize")
    check = _CHECKS.get(op, _on_meta)

    def kernel(keyset, self, *args, **kwargs):
        if isinstance(self, torch.Tensor) and _is_functional(self):
            check(op, self, *args, **kwargs)          # eager's error, nothing changed yet
        return upstream.call_boxed(keyset, self, *args, **kwargs)
    kernel.__name__ = f"checked_{op._schema.name.split('::')[1]}_{op._overloadname}"
    return kernel


_UPSTREAM_GROW_LIMIT = "Attempted to resize a view tensor to a larger size"


def _resize(upstream):
    def kernel(keyset, self, size, *, memory_format=None):
        if not (isinstance(self, torch.Tensor) and _is_functional(self)):
            return upstream.call_boxed(keyset, self, size, memory_format=memory_format)
        # eager's errors (negative sizes, channels_last of another rank) and eager's layout
        twin = torch.empty_strided(self.shape, self.stride(), dtype=self.dtype, device="meta")
        twin.resize_(size, memory_format=memory_format)
        shape, stride, offset = tuple(twin.shape), twin.stride(), self.storage_offset()
        end = (offset + twin.numel()) * self.element_size() if twin.numel() else 0
        real = _storage_bytes(self)
        if (torch._functionalize_get_storage_size(self, False) < real and not _metas(self)
                and self.numel() * self.element_size() == real and self.is_contiguous()):
            # upstream's count is stale (an out= op resized this tensor, torch.arange): its
            # kernel "grows" the storage to the tensor's own size, which counts it right (where
            # the storage has no other views)
            try:
                upstream.call_boxed(keyset, self, tuple(self.shape))
            except RuntimeError as e:
                if _UPSTREAM_GROW_LIMIT not in str(e):
                    raise
        if end <= real:
            # No growth: a new layout over the same storage, as upstream's own kernel makes it
            # (but with the memory format's strides, where upstream's are contiguous)
            if shape != tuple(self.shape) or stride != self.stride():
                self.as_strided_(shape, stride, offset)
            return self
        if not self.is_contiguous():
            raise _limit(self, size, "is not contiguous (eager keeps its storage order, which the "
                                     "functional path does not see)")
        try:
            return upstream.call_boxed(keyset, self, size, memory_format=memory_format)
        except RuntimeError as e:
            if _UPSTREAM_GROW_LIMIT not in str(e):
                raise
            raise _limit(self, size, "is a view or has views (upstream functionalization keeps "
                                     "a storage's size)") from e
    kernel.__name__ = "checked_resize_"
    return kernel


def _limit(self, size, why: str):
    from .writes import FunctionalizationLimit
    need = (self.storage_offset() + int(torch.Size(size).numel())) * self.element_size()
    return FunctionalizationLimit(
        f"xla_compat: resize_ from {list(self.shape)} to {list(size)} needs a storage of {need} "
        f"bytes, which the functional path counts as growing the storage of a tensor that {why}; "
        f"it cannot grow it. Nothing was changed. Use x = x.new_empty({list(size)}) and copy "
        f"what you need (or torch.cat), or resize before making views; the legacy path grows "
        f"it as eager does.")


@installs_once
def install(lib) -> None:
    """Register the kernels (once) for every op of ``OPS`` that has a Functionalize kernel."""
    for op in OPS:
        if torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "Functionalize"):
            override(lib, op, _checked(op), "Functionalize", with_keyset=True)
    resize_ = aten.resize_.default
    override(lib, resize_, _resize(torch.library.get_kernel(resize_, "Functionalize")),
             "Functionalize", with_keyset=True)
    set_ = aten.set_.source_Tensor
    override(lib, set_, _set_to_tensor(torch.library.get_kernel(set_, "Functionalize")),
             "Functionalize", with_keyset=True)
