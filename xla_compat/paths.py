"""The contract between the core and the paths: what a path provides, and which path is active.

Each path package (``xla_compat.legacy``, ``xla_compat.functional``) registers one ``PathImpl``
at import. The core calls only through this module, so it never imports a path; the dispatch
layer (``xla_compat.dispatch``) decides which path is active and is the only code that knows
both exist. ``core`` is registered here: bare LazyTensors, views as copies (no aliasing).
"""
from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass, field
from typing import Callable, Iterable, Optional

import torch

from . import device as _device
from .lazy.tensor import LazyTensor, lock as _device_lock


def _identity(t):
    return t


def _nothing(tensors) -> None:
    return None


def _always() -> Optional[str]:
    return None


def _assign_value(t, value) -> None:
    """``t`` (a user-visible tensor) now holds ``value`` (same shape and dtype), as an in-place
    write of the whole tensor would leave it: paths whose tensors hold their value directly."""
    inner_tensor(t)._value = value


@dataclass(frozen=True)
class PathImpl:
    """What a path provides to the core and the dispatch layer."""

    name: str
    version: str
    torch_versions: str                      # a packaging specifier set, e.g. ">=2.13"
    tensor_cls: type                         # LazyTensor subclass factories create
    wrap: Callable = _identity               # LazyTensor -> user-visible tensor
    inner: Callable = _identity              # user-visible tensor -> its LazyTensor (synced)
    owns: Callable = lambda t: False         # is this user-visible tensor one of ours?
    before_sync: Callable = _nothing         # apply pending alias updates (tensors or None=all)
    probe: Callable = _always                # None if this torch can run the path, else why not
    to_path: Callable = None                 # copy a tensor of another path onto this one
    assign: Callable = _assign_value         # t now holds a Value (a whole-tensor write)
    storage_id: Callable = id                # an int its tensors share exactly when they share
                                             # storage (core: every tensor its own)
    extras: dict = field(default_factory=dict)


_registry: dict[str, PathImpl] = {}
_local = threading.local()
_default = "core"
_resolver: Optional[Callable[[], object]] = None


def register(impl: PathImpl) -> None:
    _registry[impl.name] = impl


def unregister(name: str) -> None:
    """Remove a path (tests that register fake paths clean up with this)."""
    _registry.pop(name, None)


def set_default_resolver(fn: Optional[Callable[[], object]]) -> None:
    """``fn()`` is called whenever the active path is asked for until it clears itself with
    ``set_default_resolver(None)``: the dispatch layer decides at first device use this way."""
    global _resolver
    _resolver = fn


def get(name: str) -> PathImpl:
    try:
        return _registry[name]
    except KeyError:
        raise ValueError(f"xla_compat: unknown path {name!r}; known paths: "
                         f"{', '.join(sorted(_registry))}") from None


def names() -> list[str]:
    return sorted(_registry)


def active() -> PathImpl:
    """The path new tensors get in this thread (a scoped override, else the process default)."""
    if _resolver is not None:
        _resolver()
    stack = getattr(_local, "stack", None)
    if stack:
        return get(stack[-1])
    if _scoped and torch._C._current_graph_task_id() != -1:
        return get(_backward_path())
    return get(_default)


# Scopes open in any thread: {thread ident: its stack}. Autograd runs a device's backward on its
# own worker thread, which has no scope of its own; tensors it creates (zeros for an unused
# gradient) take the path of the scope that ran ``backward()`` so they meet their graph's tensors.
_scoped: dict = {}
_scoped_lock = threading.Lock()


def _backward_path() -> str:
    """The path for a tensor created on an autograd worker thread: the innermost scope open in
    the threads that have one, when they all name the same path; else the process default."""
    with _scoped_lock:
        names = {stack[-1] for stack in _scoped.values() if stack}
    return names.pop() if len(names) == 1 else _default


def set_default(name: str) -> None:
    """The process-wide path (the dispatch layer's decision)."""
    global _default
    get(name)
    _default = name


def _factory():
    impl = active()
    return impl.tensor_cls, impl.wrap


@contextlib.contextmanager
def activated(name: str):
    """Create tensors on path ``name`` inside the block (this thread only)."""
    get(name)
    stack = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    stack.append(name)
    with _scoped_lock:
        _scoped[threading.get_ident()] = stack
    try:
        yield get(name)
    finally:
        stack.pop()
        if not stack:
            with _scoped_lock:
                _scoped.pop(threading.get_ident(), None)


def of(t: torch.Tensor) -> Optional[str]:
    """The name of the path a device tensor belongs to, or None for non-hlo tensors."""
    for impl in _registry.values():
        if impl.owns(t):
            return impl.name
    if type(t) is LazyTensor:
        return "core"
    return None


def before_sync(tensors=None) -> None:
    """Every path settles ``tensors`` (all of its tensors when None) for a sync, holding the
    device lock: a path's pre-sync work (legacy folds pending writes into each storage) must
    not interleave with another thread recording a write."""
    with _device_lock:
        for impl in list(_registry.values()):
            impl.before_sync(tensors)


def inner_tensor(t) -> LazyTensor:
    name = of(t)
    if name is None:
        raise TypeError(f"xla_compat: a {type(t).__name__} on {getattr(t, 'device', '?')} is "
                        f"not an hlo tensor")
    return get(name).inner(t)


def storage_id(t: torch.Tensor) -> tuple:
    """Which storage ``t`` is on: equal for two tensors exactly when they share memory, as eager
    tensors on one storage do (a view and its base, two views of a tensor, ``x.data = y``).

    What eager code reads from ``t.untyped_storage().data_ptr()``: an hlo tensor has no host
    memory, so its storage has no address and its ``data_ptr()`` is only its storage offset in
    bytes, equal for any two tensors at offset 0. (The storage of a tensor that ``resize_`` grew
    is a new one, as eager's ``data_ptr()`` moves when it reallocates.)"""
    name = of(t)
    if name is None:
        return (t.device.type, torch._C._storage_id(t))
    return (name, get(name).storage_id(t))


def shares_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Do ``a`` and ``b`` share memory? (``storage_id``; on every path and on the CPU.)"""
    return a.device == b.device and storage_id(a) == storage_id(b)


def inner_tensors(tensors: Iterable) -> list:
    return [inner_tensor(t) for t in tensors]


_device.set_factory_provider(_factory)
register(PathImpl(name="core", version="0", torch_versions=">=2.13", tensor_cls=LazyTensor,
                  owns=lambda t: type(t) is LazyTensor))
