"""Printing, pickling and deep-copying functional hlo tensors.

The wrapper's Python type is plain ``torch.Tensor`` and it reports a storage, so torch's own
``__repr__`` prints ``_to_functional_tensor(...)`` of a possibly stale inner tensor, and
``__deepcopy__`` / ``__reduce_ex__`` take the storage route and crash. torch special-cases the
``xla`` device in these three places; we hook the same three places for our wrappers only and
hand everything else to torch unchanged. A fourth hook tracks ``nn.Parameter(wrapper)``: the
parameter is a new wrapper object no factory saw, and a failed sync must roll it back.
"""
from __future__ import annotations

import warnings

import torch
import torch._tensor_str as _tensor_str

from xla_compat.lazy.tensor import device_deepcopy

from .wrap import owns, track

_installed = False


def _repr_of(t: torch.Tensor) -> str:
    with torch.no_grad():
        cpu = t.detach().cpu()
    text = repr(cpu)
    extra = f"device='{t.device}'"
    if t.grad_fn is not None:
        extra += f", grad_fn=<{type(t.grad_fn).__name__}>"
    elif t.requires_grad:
        extra += ", requires_grad=True"
    return text[:-1] + f", {extra})" if text.endswith(")") else text


def install() -> None:
    """Install the hooks once (idempotent)."""
    global _installed
    if _installed:
        return
    _installed = True
    torch_str = _tensor_str._str
    torch_deepcopy = torch.Tensor.__deepcopy__
    torch_reduce_ex = torch.Tensor.__reduce_ex__

    def _str(self, *, tensor_contents=None):
        if owns(self) and tensor_contents is None:
            return _repr_of(self)
        return torch_str(self, tensor_contents=tensor_contents)

    def __deepcopy__(self, memo):
        if not owns(self) or type(self) is not torch.Tensor:
            return torch_deepcopy(self, memo)
        return device_deepcopy(self, memo)

    def __reduce_ex__(self, proto):
        if owns(self) and type(self) is torch.Tensor:
            # torch.save of a device tensor stores CPU data (torch_xla's behaviour, and the core's).
            return self.detach().cpu().__reduce_ex__(proto)
        return torch_reduce_ex(self, proto)

    torch_parameter_new = torch.nn.Parameter.__new__

    def parameter_new(cls, data=None, requires_grad=True):
        p = torch_parameter_new(cls, data, requires_grad)
        return track(p) if owns(p) else p

    _tensor_str._str = _str
    torch.nn.Parameter.__new__ = staticmethod(parameter_new)
    torch.Tensor.__deepcopy__ = __deepcopy__
    torch.Tensor.__reduce_ex__ = __reduce_ex__
    global _lib
    _lib = torch.library.Library("aten", "IMPL")
    with warnings.catch_warnings():     # "overriding a previously registered kernel": meant
        warnings.simplefilter("ignore")
        _lib.impl("_to_copy", _to_copy_functionalize, "Functionalize")


_lib = None
_FUNCTIONALIZE = torch._C.DispatchKeySet(torch._C.DispatchKey.Functionalize)


def _to_copy_functionalize(self, *, dtype=None, layout=None, device=None, pin_memory=None,
                           non_blocking=False, memory_format=None):
    """``_to_copy`` of a functional tensor (``x.to(torch.float64)``, ``x.cpu()``).

    Upstream's kernel re-wraps the result only for devices "opted into functionalization" (XLA
    and Lazy), so on ``hlo`` ``x.to(dtype)`` handed the user the bare inner tensor, which no
    longer aliased anything and broke the next in-place op that met a wrapper. Here a result on
    ``hlo`` is wrapped; one on another device (``.cpu()``) is returned as is, as upstream does."""
    inner = self
    if torch._is_functional_tensor(self):
        torch._sync(self)
        inner = torch._from_functional_tensor(self)
    with torch._C._ExcludeDispatchKeyGuard(_FUNCTIONALIZE):
        out = torch.ops.aten._to_copy.default(
            inner, dtype=dtype, layout=layout, device=device, pin_memory=pin_memory,
            non_blocking=non_blocking, memory_format=memory_format)
    if out.device.type != "hlo" or torch._is_functional_tensor(out):
        return out
    from .wrap import wrap
    return wrap(out)
