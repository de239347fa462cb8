"""Wrapping and unwrapping at the device boundary, syncing wrappers, and alias ids.

Invariants: a user-visible ``hlo`` tensor on this path is a FunctionalTensorWrapper (its Python
type is plain ``torch.Tensor``) around a ``FunctionalInner``. Autograd sees only the wrapper.
The wrapper's inner tensor can be stale while a write through one of its aliases is pending;
``torch._sync`` applies it. So anything that reads the inner tensor (a graph cut, a transfer)
syncs the wrapper first. Alias ids: when an in-place op replaces a wrapper's inner tensor, the
new inner tensor inherits the old one's id (what ``_propagate_xla_data`` does for torch_xla).
"""
from __future__ import annotations

import itertools
import threading
import weakref
from typing import Optional

import torch

from xla_compat import sharding
from xla_compat.lazy import tensor as _core_tensor
from xla_compat.lazy.tensor import DEVICE, LazyTensor

from .inner import FunctionalInner, tracing

# Wrappers made at the boundary (factories, transfers, parameters, buffers): a full sync syncs
# them so no pending alias update crosses a graph cut. Keyed by id; values are weak.
_wrappers: "weakref.WeakValueDictionary[int, torch.Tensor]" = weakref.WeakValueDictionary()
# id(wrapper) -> alias id of its buffer lineage.
_alias_of_wrapper: dict[int, int] = {}
# id(wrapper) -> the thread that made it. A wrapper's state (its inner tensor, its storage's
# pending updates) lives in torch's C++ functionalization, which runs an op without the GIL or
# the device lock: another thread touching it meanwhile races with the op (a write through a
# view was lost). So a full sync settles only the wrappers its own thread made, and those of
# threads that have ended (``settled_by_this_thread``); every thread's inner tensors still
# materialise, under the device lock, and a wrapper's pending update is applied when its own
# thread next reads or syncs it.
_maker: dict[int, int] = {}
# alias id -> the device value the lineage had after the last successful sync. An in-place op
# replaces the wrapper's inner tensor by a new, pending one; if the next sync fails, the new inner
# tensor returns to this value (the executor's rollback reads ``_last_data``).
_last_by_alias: dict[int, object] = {}
_alias_ids = itertools.count(1)
# (weakref to wrapper, inner tensor with pending IR) for the wrappers the current sync computes:
# if it fails, those wrappers' views must regenerate from the rolled-back values.
_in_flight: list = []
_FUNCTIONALIZE = torch._C.DispatchKey.Functionalize


def owns(t) -> bool:
    """Is ``t`` a functional wrapper on the hlo device?"""
    return (isinstance(t, torch.Tensor) and t.device.type == DEVICE.type
            and torch._is_functional_tensor(t))


def _forget(key: int):
    def drop(_ref=None):
        _maker.pop(key, None)
        aid = _alias_of_wrapper.pop(key, None)
        if aid is not None and aid not in _alias_of_wrapper.values():
            _last_by_alias.pop(aid, None)
    return drop


def track(w: torch.Tensor) -> torch.Tensor:
    """Remember a wrapper so full syncs apply its pending alias updates."""
    key = id(w)
    if key not in _wrappers:
        _wrappers[key] = w
        _maker[key] = threading.get_ident()
        weakref.finalize(w, _forget(key))
        inner_t = torch._from_functional_tensor(w)
        aid = _alias_of_wrapper[key] = alias_id(inner_t)
        last = getattr(inner_t, "_last_data", None)
        if last is not None:
            # the value it holds now (a transfer's, a parameter's): what an in-place op that
            # replaces its inner tensor before any sync returns to on failure, and the buffer
            # that op's result is donated (``executor._predecessors``)
            remember(aid, last)
    return w


def remember(aid: int, value) -> None:
    """``value`` (device data) is lineage ``aid``'s value before any sync: its rollback target."""
    _last_by_alias.setdefault(aid, value)


def wrap(t: LazyTensor, lifting: bool = False) -> torch.Tensor:
    """A new user-visible tensor around ``t`` (bare ``t`` while an inner op is being traced).

    ``lifting``: ``t`` is ``lift_fresh``'s argument (``torch.tensor(data, device=hlo)``), which
    torch makes with the Functionalize key excluded; it is a user tensor all the same."""
    # Inside a Functionalize kernel (it excludes its own key while it redispatches, e.g. for
    # ``arange(out=wrapper)``) the new tensor is that kernel's inner value: it wraps it itself.
    if tracing() or owns(t) or (not lifting and
                                torch._C._dispatch_tls_is_dispatch_key_excluded(_FUNCTIONALIZE)):
        return t
    if not _core_tensor._paths_may_mix:
        _core_tensor.paths_may_mix()      # legacy tensors may meet wrappers from now on
    w = torch._to_functional_tensor(t)
    if t.requires_grad:
        w.requires_grad_(True)
    return track(w)


def alias_id(inner_t: LazyTensor) -> int:
    """The alias id of an inner tensor, assigning a fresh one on first use."""
    aid = getattr(inner_t, "_alias_id", None)
    if aid is None:
        aid = inner_t._alias_id = next(_alias_ids)
    return aid


def propagate_alias_id(w: torch.Tensor, inner_t: LazyTensor) -> int:
    """Carry ``w``'s alias id to its current inner tensor (it may have replaced an older one)."""
    key = id(w)
    aid = _alias_of_wrapper.get(key)
    if aid is None:
        aid = alias_id(inner_t)
        if key in _wrappers:
            _alias_of_wrapper[key] = aid
    elif getattr(inner_t, "_alias_id", None) != aid:
        inner_t._alias_id = aid
    if getattr(inner_t, "_last_data", None) is None and aid in _last_by_alias:
        inner_t._last_data = _last_by_alias[aid]
    # SPMD: the lineage's sharding spec follows the alias id (as torch_xla's
    # _propagate_xla_data carries it), so in-place ops and optimizer steps keep the layout.
    sharding.carry(inner_t, aid)
    return aid


# (``torch._sync`` is a Python function around the first, for torch.compile's FunctionalTensor,
# which a wrapper of ours never is: a frame and an import fewer per wrapper and sync)
_sync, _from = torch._functionalize_sync, torch._from_functional_tensor


def sync_wrapper(w: torch.Tensor) -> LazyTensor:
    """Apply pending alias updates to ``w`` and return its (current) inner tensor.

    A wrapper seen here is tracked from now on (parameters made by ``nn.Parameter(wrapper)`` are
    new wrapper objects the factories never saw)."""
    _sync(w)
    inner_t = _from(w)
    if id(w) not in _wrappers:
        track(w)
    propagate_alias_id(w, inner_t)
    return inner_t


def inner(t) -> LazyTensor:
    if not owns(t):
        raise TypeError(f"xla_compat: expected a functional hlo tensor, got a "
                        f"{type(t).__name__} on {getattr(t, 'device', '?')}")
    return sync_wrapper(t)


def settled_by_this_thread() -> list:
    """The tracked wrappers a full sync in this thread may touch: those this thread made, and
    those of threads that have ended (see ``_maker``). In a one-thread program, all of them."""
    me = threading.get_ident()
    alive = None
    out = []
    for key, w in list(_wrappers.items()):
        maker = _maker.get(key, me)
        if maker != me:
            if alive is None:
                alive = {t.ident for t in threading.enumerate()}
            if maker in alive:
                continue
        out.append((key, w))
    return out


def after_sync(mapping) -> None:
    """Executor rebinder: remember each lineage's freshly materialised value (for rollback)."""
    _in_flight.clear()
    for key, w in settled_by_this_thread():
        aid = _alias_of_wrapper.get(key)
        if aid is None:
            continue
        last = getattr(torch._from_functional_tensor(w), "_last_data", None)
        if last is not None:
            _last_by_alias[aid] = last


def before_sync(tensors=None) -> None:
    """Apply pending alias updates of ``tensors`` (every tracked wrapper when None)."""
    targets = ([w for _, w in settled_by_this_thread()] if tensors is None
               else [t for t in tensors if owns(t)])
    _in_flight.clear()
    for w in targets:
        inner_t = sync_wrapper(w)
        if not inner_t._value.node.is_leaf:
            _in_flight.append((weakref.ref(w), inner_t))


def roll_back(error, roots=None) -> None:
    """Executor failure hook: the core returned each in-flight inner tensor to its last value (or
    poisoned it); committing that value as the wrapper's update makes its views regenerate from
    it instead of keeping their own poisoned inner tensors."""
    flights, _in_flight[:] = list(_in_flight), []
    for ref, inner_t in flights:
        w = ref()
        if (w is not None and torch._from_functional_tensor(w) is inner_t
                and inner_t._value is getattr(inner_t, "_last_data", None)):
            torch._functionalize_commit_update(w)


def probe() -> Optional[str]:
    """None when this torch can run the functional path, else the reason it cannot."""
    if not hasattr(torch, "_to_functional_tensor") or not hasattr(torch, "_sync"):
        return f"torch {torch.__version__} has no torch._to_functional_tensor/torch._sync"
    try:
        from torch.utils.backend_registration import \
            _setup_privateuseone_for_python_backend  # noqa: F401
    except ImportError:
        return (f"torch {torch.__version__} cannot register a Python PrivateUse1 backend "
                f"(torch.utils.backend_registration._setup_privateuseone_for_python_backend)")
    return None


def to_path(t: torch.Tensor) -> torch.Tensor:
    """A functional-path tensor with ``t``'s values (``t`` lives on another path or the CPU)."""
    if owns(t):
        return t
    if t.device.type != DEVICE.type:
        from xla_compat import paths
        with paths.activated("functional"):
            return t.detach().to(DEVICE).requires_grad_(t.requires_grad)
    from xla_compat import paths
    src = paths.inner_tensor(t)
    fresh = FunctionalInner(src._value, tuple(src.shape), src.dtype)
    out = wrap(fresh)
    if t.requires_grad:
        out.requires_grad_(True)
    return out
