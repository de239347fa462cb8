"""Printing, pickling and deep-copying functional hlo tensors.

The wrapper's Python type is plain ``torch.Tensor`` and it reports a storage, so torch's own
``__repr__`` prints ``_to_functional_tensor(...)`` of a possibly stale inner tensor, and
``__deepcopy__`` / ``__reduce_ex__`` take the storage route and crash. torch special-cases the
``xla`` device in these three places; we hook the same three places for our wrappers only and
hand everything else to torch unchanged. A fourth hook tracks ``nn.Parameter(wrapper)``: the
parameter is a new wrapper object no factory saw, and a failed sync must roll it back.
"""
from __future__ import annotations

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
