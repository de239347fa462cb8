"""Writes into views whose elements share memory (``x.expand(3, 4).fill_(1)``), as eager leaves them.

Eager allows a few writes into such a view (``fill_``, ``zero_``, ``masked_fill_``,
``index_fill_``, ``index_put_``): each writes the elements it chooses, one value for all of them,
so a memory element that several view elements share holds that value if the op chose any of them
and keeps its own otherwise. Upstream's write-back of an expanded view adds every element's
change to the base (expand's inverse is ``sum_to_size``): ``x.expand(3).fill_(2)`` would leave
``x`` at ``x + 3 * (2 - x)``, so the meta reference refuses such writes (``FunctionalizationLimit``,
``writes_eager``).

Here, for a view of a plain root (contiguous from offset 0, one storage: its ``_base``), the write
is made on the root instead (or on a tensor whose own view steps change nothing, as a
``Parameter``'s ``detach``): the view's value is read from the root at the view's storage
positions (one gather), the op's functional form runs on it (one inner op), and the root takes
the elements the op changed, compared bit for bit, at their storage positions (one write,
committed without view steps, as ``direct.py`` commits). Eager's checks run first: the op's meta
reference on meta twins, without the refusal. Every other case keeps upstream's kernel and its
clear error: a view of a storage that is not plain, a tensor requiring grad with grad mode on,
inference mode, and an ``index_put_`` of several values (which of two values written to one
memory element survives is eager's iteration order) or with ``accumulate`` (upstream's sum is
right there).
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import torch

from xla_compat import write_checks
from xla_compat.lazy import tracer
from xla_compat.lazy.ir import Aval
from xla_compat.lazy.tensor import lock
from xla_compat.lowering.views import strided_index, write_positions

from . import direct, viewchain, writes_eager
from .boundary import _view_base
from .inner import FunctionalInner
from .checks import _requires_grad
from .overrides import override
from .strides import _to_meta, meta_like, storage_id as _storage_id
from .writes import Gather

aten = torch.ops.aten
_metas, _from, _sync = direct._metas, direct._from, direct._sync
_is_functional = torch._is_functional_tensor
_overlaps = write_checks.internal_overlap

# The in-place ops eager lets write into a view whose elements share memory, one value each.
OPS = (aten.fill_.Scalar, aten.fill_.Tensor, aten.zero_.default, aten.masked_fill_.Scalar,
       aten.masked_fill_.Tensor, aten.index_fill_.int_Scalar, aten.index_fill_.int_Tensor,
       aten.index_put_.default)


@dataclass(frozen=True, eq=False)
class ScatterChanged:
    """IR rule ``(root, new)``: ``root`` with each element of ``new`` that differs bit for bit
    from what the root holds at its storage position (the view's ``index``) written there, the
    last in the view's element order winning; a position no changed element reaches keeps its
    value (``lowering.views.write_positions``, as legacy's write-back through such a view)."""

    index: bytes
    shape: tuple

    def __call__(self, root, new):
        pos = np.frombuffer(self.index, dtype=np.int64)
        flat = write_positions(root.reshape(-1), pos, new.reshape(-1).astype(root.dtype),
                               overlapping=True)
        return flat.reshape(root.shape)

    def __eq__(self, other):
        return (type(other) is ScatterChanged and other.shape == self.shape
                and other.index == self.index)

    def __hash__(self):
        return hash(("scatter_changed", self.shape, self.index))


def _plain_root(self):
    """``self``'s root wrapper where this route takes the write, else None."""
    if (type(self) is not torch.Tensor or not _is_functional(self)
            or torch.is_inference_mode_enabled() or self.numel() == 0 or _overlaps(self) != 1):
        return None
    base = _view_base(self)
    if base is None:
        base = _identity_base(self)
    if (base is None or base.storage_offset() != 0 or not base.is_contiguous()
            or type(_from(base)) is not FunctionalInner):
        return None
    return base


_IDENTITY = frozenset({"detach_ViewMeta", "alias_ViewMeta"})


def _identity_base(self):
    """``self._base`` where its own view steps change nothing (a ``Parameter`` is a detached
    view of the tensor it was made from, which may be gone), else None."""
    base = self._base
    if (base is None or not _is_functional(base) or base.dtype != self.dtype
            or _storage_id(base) != _storage_id(self)
            or not all(type(m).__name__ in _IDENTITY for m in _metas(base))):
        return None
    return base


def _inner(x):
    """The inner tensor an operand of the functional op takes: a functional hlo wrapper's current
    value (through its root where it is a view), anything else as it is."""
    if type(x) is torch.Tensor and _is_functional(x):
        return FunctionalInner(direct.value_of(x), tuple(x.shape), x.dtype)
    return x


_META_REFERENCE = direct._META_REFERENCE


def _kernel(op, functional, upstream):
    def kernel(keyset, self, *args, **kwargs):
        base = _plain_root(self)
        if (base is None or (op is aten.index_put_.default and not _one_value(args, kwargs))
                or (torch.is_grad_enabled()
                    and _requires_grad((self, *args, *kwargs.values())))):
            return upstream.call_boxed(keyset, self, *args, **kwargs)
        # eager's checks (dtypes, shapes, index kinds), without the functional path's refusal
        writes_eager.allow_shared_writes(True)
        try:
            with direct._exclude(_META_REFERENCE), warnings.catch_warnings():
                warnings.simplefilter("ignore")       # (index_put_ on an expanded tensor)
                op(meta_like(self), *_to_meta(args),
                   **{k: _to_meta(v) for k, v in kwargs.items()})
        finally:
            writes_eager.allow_shared_writes(False)
        shape, stride, offset = tuple(self.shape), self.stride(), self.storage_offset()
        index = np.ascontiguousarray(strided_index(shape, stride, offset), dtype=np.int64)
        _sync(base)
        with lock:
            root = _from(base)._value
            old = viewchain._node("functional.shared_gather", Gather(index.tobytes(), shape),
                                  (root,), Aval(shape, root.aval.dtype))
        x = FunctionalInner(old, shape, self.dtype)
        rest = tracer.map_nested(args, _inner)
        out = direct._run(functional, (x, *rest),
                          {k: tracer.map_nested(v, _inner) for k, v in kwargs.items()} or None)
        with lock:
            written = viewchain._node(
                "functional.shared_write", ScatterChanged(index.reshape(-1).tobytes(), shape),
                (root, out._value), root.aval)
        direct._commit_root(base, written)
        return self
    kernel.__name__ = f"shared_{op._schema.name.split('::')[1]}_{op._overloadname}"
    return kernel


def _one_value(args, kwargs) -> bool:
    """``index_put_(indices, values, accumulate)``: one value, written (not accumulated)?"""
    values = args[1] if len(args) > 1 else kwargs.get("values")
    accumulate = args[2] if len(args) > 2 else kwargs.get("accumulate", False)
    return not accumulate and isinstance(values, torch.Tensor) and values.numel() == 1


_lib = None


def install() -> None:
    """Register the kernels at the Functionalize key (once), in front of whatever kernel is
    there (upstream's, or the path's overlap checks, which a call not taken here still runs)."""
    global _lib
    if _lib is not None:
        return
    _lib = torch.library.Library("aten", "IMPL")
    for op in OPS:
        upstream = torch.library.get_kernel(op, "Functionalize")
        override(_lib, op, _kernel(op, tracer.mutation_info(op)[2], upstream), "Functionalize",
                 with_keyset=True)
