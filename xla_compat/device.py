"""The ``hlo`` device: PyTorch's PrivateUse1 backend registered from Python.

Factories reach the two kernels registered here (``empty.memory_format``, ``empty_strided``);
every other op on an ``hlo`` tensor reaches ``LazyTensor.__torch_dispatch__``. The path layer
installs a factory hook so new tensors come out as that path's tensors. ``torch.load`` with an
``hlo`` map_location is served here too (see ``_restore_storage``).
"""
from __future__ import annotations

import functools
import re

import torch
import torch.serialization

from . import _backend, _jax, autograd_thread
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


def new_empty(size, dtype, strides=None) -> torch.Tensor:
    """A fresh device tensor of ``size`` (zero-filled: uninitialised memory reads as zeros),
    laid out with ``strides`` (a dense layout, ``dense_strides``) or contiguously."""
    autograd_thread.claim()
    dtype = dtype or torch.get_default_dtype()
    size = tuple(int(s) for s in size)
    aval = Aval(size, _jax.to_jax_dtype(dtype))
    node = Node("empty", _EmptyRule(aval), (), (), (), (aval,))
    cls, wrap = _factory_provider()
    return wrap(cls(Value(node, 0), size, dtype, strides, 0))     # (no strides: no offset)


def dense_strides(size, stride):
    """``stride`` where it lays ``size`` out densely without overlap in another order than the
    contiguous one (``empty_strided`` of a permuted layout, ``channels_last``), which a device
    tensor keeps as eager does; None for the contiguous layout and for layouts with gaps or
    overlap, which device tensors do not hold (their storage is their elements: contiguous)."""
    size, stride = tuple(int(n) for n in size), tuple(int(s) for s in stride)
    if len(size) != len(stride) or any(n == 0 for n in size):
        return None
    expected, dims = 1, sorted((s, n) for n, s in zip(size, stride) if n != 1)
    for s, n in dims:
        if s != expected:
            return None
        expected *= n
    from .lowering.views import contiguous_strides
    return None if stride == contiguous_strides(size) else stride


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
    if memory_format in (torch.channels_last, torch.channels_last_3d):
        stride = torch.empty(size, memory_format=memory_format, device="meta").stride()
        return new_empty(size, dtype, dense_strides(size, stride))
    return new_empty(size, dtype)


def _empty_strided(size, stride, dtype=None, layout=None, device=None, pin_memory=None):
    _check_device(device)
    return new_empty(size, dtype, dense_strides(size, stride))


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
    _register_load()


def _copy_from(src, dst, non_blocking=False):
    from .lazy import tracer
    return tracer.copy_into(dst, src)


def device(index: int = 0) -> torch.device:
    register()
    if index != 0:
        raise RuntimeError(f"xla_compat: hlo has one device (hlo:0); got index {index}")
    return DEVICE


# -- torch.load(f, map_location=<hlo>) -------------------------------------------------------
# torch moves each loaded storage with ``storage.to(device)``, which an hlo tensor (a wrapper with
# no storage of its own) cannot serve. So a storage mapped to hlo stays on the CPU, marked with
# its target; the tensors torch then builds on it are moved to the device as they are built.
# Tensors that shared a storage in the file share one device base here (as_strided views of it),
# as they would on the CPU: tied weights stay tied.

_TARGET = "_xla_compat_target"        # on a CPU storage: the hlo device its tensors go to
_BASES = "_xla_compat_bases"          # on a CPU storage: dtype -> its device base tensor
_LOCATION = re.compile(rf"{NAME}(:\d+)?")


def _restore_storage(storage, location: str):
    """torch.serialization deserializer for hlo locations: mark the (CPU) storage."""
    if not isinstance(location, str) or not _LOCATION.fullmatch(location):
        return None
    if storage.device.type != "cpu":
        return None
    target = torch.device(location)
    _check_device(target)
    setattr(storage, _TARGET, torch.device(NAME, 0))
    return storage


def _no_tag(storage):
    return None          # device tensors pickle as CPU tensors: there are no hlo storages to tag


def _on_device(cpu: torch.Tensor, untyped, target) -> torch.Tensor:
    """The device tensor for ``cpu`` (built on ``untyped``), sharing a base with the tensors
    already built on the same storage."""
    bases = getattr(untyped, _BASES, None)
    if bases is None:
        bases = {}
        setattr(untyped, _BASES, bases)
    itemsize = cpu.element_size()
    nbytes = untyped.nbytes()
    base = bases.get(cpu.dtype)
    whole = (cpu.storage_offset() == 0 and cpu.is_contiguous()
             and cpu.numel() * itemsize == nbytes)
    if base is None and (whole or nbytes % itemsize):
        t = cpu.to(target)
        if not nbytes % itemsize:
            bases[cpu.dtype] = t       # the first tensor spanning the storage is the base
        return t
    if base is None:
        flat = torch.empty(0, dtype=cpu.dtype).set_(untyped, 0, (nbytes // itemsize,), (1,))
        base = bases[cpu.dtype] = flat.to(target)
    return base.as_strided(cpu.shape, cpu.stride(), cpu.storage_offset())


_torch_rebuild_tensor = torch._utils._rebuild_tensor
_torch_rebuild_tensor_v3 = torch._utils._rebuild_tensor_v3


@functools.wraps(_torch_rebuild_tensor)
def _rebuild_tensor(storage, storage_offset, size, stride):
    cpu = _torch_rebuild_tensor(storage, storage_offset, size, stride)
    target = getattr(storage._untyped_storage, _TARGET, None)
    return cpu if target is None else _on_device(cpu, storage._untyped_storage, target)


@functools.wraps(_torch_rebuild_tensor_v3)
def _rebuild_tensor_v3(storage, storage_offset, size, stride, requires_grad, backward_hooks,
                       dtype, metadata=None):
    target = getattr(storage._untyped_storage, _TARGET, None)
    if target is None:
        return _torch_rebuild_tensor_v3(storage, storage_offset, size, stride, requires_grad,
                                        backward_hooks, dtype, metadata)
    cpu = _torch_rebuild_tensor_v3(storage, storage_offset, size, stride, False, backward_hooks,
                                   dtype, metadata)
    t = _on_device(cpu, storage._untyped_storage, target)
    t.requires_grad = requires_grad
    return t


def _register_load() -> None:
    # Priority 19: before torch's own PrivateUse1 deserializer (23), which calls storage.to(hlo).
    torch.serialization.register_package(19, _no_tag, _restore_storage)
    # torch._utils looks both up by name when a tensor is rebuilt; they pass CPU storages through.
    torch._utils._rebuild_tensor = _rebuild_tensor
    torch._utils._rebuild_tensor_v3 = _rebuild_tensor_v3
