"""The ``hlo`` device: PyTorch's PrivateUse1 backend registered from Python.

Factories reach the two kernels registered here (``empty.memory_format``, ``empty_strided``);
every other op on an ``hlo`` tensor reaches ``LazyTensor.__torch_dispatch__``. The path layer
installs a factory hook so new tensors come out as that path's tensors.
"""
from __future__ import annotations

import torch

from . import _backend, _jax
from .lazy.ir import Aval, Node, Value
from .lazy.tensor import DEVICE, LazyTensor

NAME = _backend.NAME
_registered = False
_lib = None


def _core_factory():
    return LazyTensor, lambda t: t


_factory_provider = _core_factory


def set_factory_provider(fn) -> None:
    """``fn()`` returns (LazyTensor subclass, wrap hook) for new tensors; the path layer sets it."""
    global _factory_provider
    _factory_provider = fn


def new_empty(size, dtype) -> torch.Tensor:
    """A fresh device tensor of ``size`` (zero-filled: uninitialised memory reads as zeros)."""
    dtype = dtype or torch.get_default_dtype()
    size = tuple(int(s) for s in size)
    aval = Aval(size, _jax.to_jax_dtype(dtype))
    node = Node("empty", _EmptyRule(aval), (), (), (), (aval,))
    cls, wrap = _factory_provider()
    return wrap(cls(Value(node, 0), size, dtype))


class _EmptyRule:
    """Zeros of a fixed aval; equal rules for equal avals keep cache keys stable."""

    __slots__ = ("aval",)

    def __init__(self, aval):
        self.aval = aval

    def __call__(self):
        import jax.numpy as jnp
        return jnp.zeros(self.aval.shape, self.aval.dtype)

    def __eq__(self, other):
        return type(other) is _EmptyRule and other.aval == self.aval

    def __hash__(self):
        return hash(("empty", self.aval))


def _check_device(device):
    if device is not None and torch.device(device).index not in (None, 0):
        raise RuntimeError(f"xla_compat: device {device} does not exist; hlo has one device, "
                           f"hlo:0")


def _empty_memory_format(size, dtype=None, layout=None, device=None, pin_memory=None,
                         memory_format=None):
    _check_device(device)
    return new_empty(size, dtype)


def _empty_strided(size, stride, dtype=None, layout=None, device=None, pin_memory=None):
    _check_device(device)
    return new_empty(size, dtype)


def register() -> None:
    """Register ``hlo`` once per process (idempotent)."""
    global _registered, _lib
    if _registered:
        return
    _registered = True
    _lib = torch.library.Library("aten", "IMPL")
    _lib.impl("empty.memory_format", _empty_memory_format, "PrivateUse1")
    _lib.impl("empty_strided", _empty_strided, "PrivateUse1")
    # Reached below the Python key (torch.tensor(..., device="hlo") copies this way).
    _lib.impl("_copy_from", _copy_from, "PrivateUse1")
    _lib.impl("_copy_from_and_resize", _copy_from, "PrivateUse1")


def _copy_from(src, dst, non_blocking=False):
    from .lazy import tracer
    return tracer.copy_into(dst, src)


def device(index: int = 0) -> torch.device:
    register()
    if index != 0:
        raise RuntimeError(f"xla_compat: hlo has one device (hlo:0); got index {index}")
    return DEVICE
