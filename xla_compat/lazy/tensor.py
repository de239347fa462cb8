"""LazyTensor: a torch.Tensor wrapper subclass on ``hlo:0`` that holds an IR value.

Invariants: ``_value`` is the tensor's current value (an output of an IR node; a ``DeviceData``
leaf once materialised). The core knows no aliasing: an in-place op rebinds ``_value`` of the
tensor it mutates and view ops produce fresh tensors (``*_copy`` semantics). The two paths add
aliasing on top: ``functional`` by wrapping, ``legacy`` by subclassing.
"""
from __future__ import annotations

import threading

import torch

from .. import _backend  # noqa: F401  (registers the hlo device)
from .ir import Value
from .weakreg import WeakRegistry

DEVICE = torch.device("hlo", 0)
_wrapper = torch.Tensor._make_wrapper_subclass
_STRIDED = torch.strided

# Every live LazyTensor by id; a sync looks here for tensors with pending IR.
_live = WeakRegistry()
# torch function -> does it write into an argument (checked for path mixing)?
_mutating: dict = {}
# One lock serialises tracing bookkeeping and syncs across threads.
lock = threading.RLock()

class LazyTensor(torch.Tensor):
    """A device tensor whose value is an IR ``Value``; nothing runs until a sync."""

    path_name = "core"
    _geo = None           # (shape, strides, dtype, offset), cached for trace-plan keys
    _sharding = None      # a sharding.ShardingSpec once xc.mark_sharding laid the tensor out
    _core_registry = True  # listed in live_tensors(); False for paths that keep their own list

    @staticmethod
    def __new__(cls, value: Value, shape, dtype, strides=None, storage_offset=None,
                requires_grad=False):
        if strides is None:
            storage_offset = None
        # Positional: the keyword form costs a fifth more, on every traced op's result.
        t = _wrapper(cls, shape, strides, storage_offset, None, dtype, _STRIDED, DEVICE, False,
                     requires_grad)
        t._value = value
        t._last_data = value if value.node.rule is None else None
        if cls._core_registry:
            _live.add(id(t), t)
        return t

    # torch's default for dispatch subclasses: no Python call per torch function (shape and
    # stride reads included). Paths that need a torch-function hook install their own.
    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        out = _tracer.replay(cls, func, args, False, kwargs)
        if out is not None:
            return out
        if len(types) > 1:
            _tracer.check_paths(types, func)
        return _tracer.trace(cls, func, args, kwargs or {})

    @classmethod
    def plans_ok(cls, func) -> bool:
        """May the tracer replay ``func`` from a plan for this class (``tracer.replay``)? A
        path whose dispatch adds work after the tracer for some ops says no for those."""
        return True

    # -- leaving the device ------------------------------------------------------------------
    def __repr__(self, *, tensor_contents=None):
        cpu = self.detach().cpu()
        text = repr(cpu)
        extra = f"device='{DEVICE}'"
        if self.requires_grad and self.grad_fn is None:
            extra += ", requires_grad=True"
        elif self.grad_fn is not None:
            extra += f", grad_fn=<{type(self.grad_fn).__name__}>"
        return text[:-1] + f", {extra})" if text.endswith(")") else text

    @property
    def data(self):
        return self.detach()

    @data.setter
    def data(self, new):
        # The C++ setter copies sizes and strides; the IR value lives on the Python object.
        take_geometry(self, new)
        self._value = new._value
        self._last_data = getattr(new, "_last_data", None)

    def tolist(self):
        return self.detach().cpu().tolist()

    def numpy(self, *, force=False):
        # As for any non-CPU tensor (and on the functional path, whose wrappers are plain
        # tensors): data leaves the device through .cpu(), or through numpy(force=True), which
        # copies. np.asarray(t) calls numpy() and raises too (torch.Tensor.__array__), as it
        # does for a CUDA or an XLA tensor and on the functional path.
        if force:
            return self.detach().cpu().numpy()
        raise TypeError(f"can't convert {DEVICE} device type tensor to numpy. Use Tensor.cpu() "
                        f"to copy the tensor to host memory first.")

    def __reduce_ex__(self, proto):
        # torch.save of a device tensor stores CPU data (torch_xla's behaviour).
        return self.detach().cpu().__reduce_ex__(proto)

    def __deepcopy__(self, memo):
        return device_deepcopy(self, memo)

def take_geometry(t: torch.Tensor, new: torch.Tensor) -> None:
    """``t`` takes ``new``'s sizes, strides, storage offset and dtype (the C++ ``.data`` setter).

    Every change of a device tensor's metadata goes through here: the tracer caches a tensor's
    geometry on it (``_geo``, the trace-plan key) and this forgets it."""
    torch._C.TensorBase.data.__set__(t, new)
    t._geo = None


def device_deepcopy(t: torch.Tensor, memo: dict) -> torch.Tensor:
    """``copy.deepcopy`` of a device tensor: a detached clone keeping ``requires_grad``."""
    if id(t) in memo:
        return memo[id(t)]
    with torch.no_grad():
        out = t.detach().clone()
    out.requires_grad_(t.requires_grad)
    memo[id(t)] = out
    return out

def path_checking_torch_function(cls, func, types, args=(), kwargs=None):
    """A ``__torch_function__`` that rejects a mutation whose arguments mix paths, and otherwise
    behaves like torch's default for dispatch subclasses (no result conversion).

    The legacy path has it (``guard_mixed_mutations``): a functional wrapper among a mutation's
    arguments would otherwise reach an internal assert in PyTorch's Functionalize kernel before
    any dispatch hook of ours runs."""
    mutating = _mutating.get(func)
    if mutating is None:
        from . import tracer
        mutating = _mutating[func] = tracer.is_mutating_function(func, None)
    if mutating or (kwargs and kwargs.get("out") is not None):
        from . import tracer
        tracer.check_mutation_paths(cls, func, args, kwargs)
    with torch._C.DisableTorchFunctionSubclass():
        return func(*args, **(kwargs or {}))

_tracer = None     # xla_compat.lazy.tracer, set when it is imported (it imports this module)

def bind_tracer(module) -> None:
    global _tracer
    _tracer = module

# Classes whose mutations must reject another path's tensors (``path_checking_torch_function``).
# The check costs a Python call on every torch function (shape and stride reads included), so
# it is installed only once tensors of two paths may meet: when a path that can mix says so.
_mix_guarded: list = []
_paths_may_mix = False

def guard_mixed_mutations(cls):
    """Class decorator: ``cls`` checks mutations for path mixing once ``paths_may_mix()``."""
    _mix_guarded.append(cls)
    if _paths_may_mix:
        _unguarded[cls] = cls.__dict__.get("__torch_function__")
        cls.__torch_function__ = classmethod(path_checking_torch_function)
    return cls

def paths_may_mix() -> None:
    """Tensors of two paths may now meet in one op (called when the functional path wraps its
    first tensor): guarded classes start checking their mutations."""
    global _paths_may_mix
    if _paths_may_mix:
        return
    _paths_may_mix = True
    for cls in _mix_guarded:
        _unguarded[cls] = cls.__dict__.get("__torch_function__")
        cls.__torch_function__ = classmethod(path_checking_torch_function)


_unguarded: dict = {}     # guarded class -> its own __torch_function__ before (None: inherited)


def settle_mix_guard(live: list) -> None:
    """After a full sync (``live``: every tensor of the live registry): when none of them is a
    path's tensor any more (the registry lists the core's and the functional path's inner
    tensors, and every functional wrapper keeps its inner tensor alive), no other path's tensor
    is left to meet a guarded one, and the guarded classes stop paying a Python call per torch
    function. The next wrapper a path makes turns the check back on (``paths_may_mix``)."""
    global _paths_may_mix
    if not _paths_may_mix:
        return
    for t in live:
        if type(t) is not LazyTensor:
            return
    _paths_may_mix = False
    for cls in _mix_guarded:
        own = _unguarded.pop(cls, None)
        if own is not None:
            cls.__torch_function__ = own
        elif "__torch_function__" in cls.__dict__:
            del cls.__torch_function__      # back to the inherited default

def live_tensors() -> list[LazyTensor]:
    return _live.values()
