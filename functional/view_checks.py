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

``resize_`` (``eager_resize.py``), ``set_`` of a storage, and ``detach_`` (cannot fail) are not
covered here.
"""
from __future__ import annotations

import torch

from xla_compat.lowering.eager_checks import t_in_place_dims

from .overrides import installs_once, override

aten = torch.ops.aten
_is_functional = torch._is_functional_tensor

OPS = (aten.transpose_.default, aten.t_.default, aten.squeeze_.default, aten.squeeze_.dim,
       aten.squeeze_.dims, aten.unsqueeze_.default, aten.as_strided_.default,
       aten.swapdims_.default, aten.swapaxes_.default)


def meta_like(t: torch.Tensor) -> torch.Tensor:
    """A meta tensor of ``t``'s dtype, sizes, strides and storage offset over a meta storage of
    ``t``'s storage size."""
    storage = torch.UntypedStorage(t.untyped_storage().nbytes(), device="meta")
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


@installs_once
def install(lib) -> None:
    """Register the kernels (once) for every op of ``OPS`` that has a Functionalize kernel."""
    for op in OPS:
        if torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "Functionalize"):
            override(lib, op, _checked(op), "Functionalize", with_keyset=True)
    set_ = aten.set_.source_Tensor
    override(lib, set_, _set_to_tensor(torch.library.get_kernel(set_, "Functionalize")),
             "Functionalize", with_keyset=True)
