"""The legacy path: the in-house view/alias tracker (xla_compat.legacy).

Users hold ``LegacyTensor``s directly. Views share an ``Alias`` (one storage) through chains of
``ViewStep``s; in-place ops record writes on the alias; stale members re-derive when read. At a
sync the alias bases (and the values of loose tensors, op results no view or write has touched,
which get an Alias only when first needed) are the graph's roots; afterwards every member
re-derives from device data.
"""
from __future__ import annotations

if __name__ != "xla_compat.legacy":
    # The repository root on sys.path makes ``legacy`` importable by its folder name: that is a
    # second copy of the path, whose kernels and registries would replace the real ones.
    raise ImportError(f"import xla_compat.legacy, not {__name__} (the same code under a second "
                      f"name would register the path twice)")

import torch

from xla_compat import dynamo, executor, paths
from xla_compat.lazy.ir import reaches, skip_frames_in

from . import alias as _alias
from . import fast as _fast  # noqa: F401  (the path's trace plans; imports ops)
from .alias import Alias
from .tensor import LegacyTensor, legacy_tensors
from .views import ViewStep

VERSION = "1.0"

skip_frames_in(__path__[0])


def _list_for_foreach_kernels() -> None:
    """torch's optimizers and ``clip_grad_norm_`` pick their multi-tensor (``_foreach_*``) kernels
    only for parameters whose exact type is listed (``type(p) in _foreach_supported_types``), as
    ``torch.distributed.tensor`` lists DTensor. Unlisted, a legacy model's SGD step was a loop of
    3 ops per parameter while the same model on the functional path (plain ``Parameter``s) took
    the foreach kernels: slower to trace, and the two paths ran different optimizer code."""
    from torch.optim import optimizer
    from torch.utils import _foreach_utils
    for types in (optimizer._foreach_supported_types, _foreach_utils._foreach_supported_types):
        if LegacyTensor not in types:
            types.append(LegacyTensor)


_list_for_foreach_kernels()


def _owns(t) -> bool:
    return isinstance(t, LegacyTensor)


def _inner(t: LegacyTensor) -> LegacyTensor:
    t._value  # re-derive a stale member so the core sees its current value
    return t


def _before_sync(tensors) -> None:
    if tensors is None:
        _alias.flush_all()
        return
    for t in tensors:
        if isinstance(t, LegacyTensor):
            _inner(t)


def _extra_roots():
    """A full sync materialises every storage (alias base, or a loose tensor's own value), not
    the views of it."""
    return [a.flush() for a in _alias.live_aliases()] + [
        t._v for t in _alias.loose_tensors() if not t._v.node.is_leaf]


def _predecessors():
    """Each storage's pending base and the materialised base it replaces (for donation)."""
    for a in _alias.live_aliases():
        if a.last is not None and not a.base.node.is_leaf:
            yield a.base, a.last


def _held_values():
    """Values still needed after a sync: never donate their buffers."""
    for a in _alias.live_aliases():
        yield from a.values()
    for t in legacy_tensors():
        a = t._a
        if a is None or t._gen == a.gen:
            yield t._v


def _rebind(mapping) -> None:
    """After a sync: bases become device data; members holding a materialised value take it,
    other members re-derive from the new base when next read (their old graph is dropped)."""
    was = {}
    for a in _alias.live_aliases():
        new = mapping.get(a.base)
        if new is not None:
            a.base = a.last = new
            a.grown = None
            was[id(a)] = a.gen
            a.gen += 1
    for t in legacy_tensors():
        a = t._a
        if a is not None and t._gen != was.get(id(a), a.gen):
            continue
        new = mapping.get(t._v)
        if new is not None:
            t._v = new
            t._last_data = new
            if a is not None:
                t._gen = a.gen


def _roll_back(error, roots=None) -> None:
    """A failed sync: every storage it computed returns to its last materialised value (see
    Alias); after a failed partial sync (one tensor's read) the others keep their pending
    writes."""
    nodes = None if roots is None else reaches(roots)
    for a in _alias.live_aliases():
        # (a storage the failed graph only read, as a materialised leaf, keeps its writes)
        if nodes is None or any(v.node in nodes and not v.node.is_leaf for v in a.values()):
            a.roll_back(error)
    for t in _alias.loose_tensors():      # as the core rolls back its tensors
        v = t._v
        if not v.node.is_leaf and (nodes is None or v.node in nodes):
            t._v = executor.restored(v, t._last_data, error)


def _probe():
    if not hasattr(torch._C.TensorBase, "data") or not hasattr(torch.Tensor,
                                                                "_make_wrapper_subclass"):
        return "this torch has no C++ .data setter / wrapper subclasses the tracker relies on"
    return None


def _to_path(t) -> LegacyTensor:
    inner = paths.inner_tensor(t)
    out = LegacyTensor(inner._value, inner.shape, inner.dtype)
    if t.requires_grad and (t.is_floating_point() or t.is_complex()):
        out.requires_grad_(True)
    return out


executor.register_extra_roots(_extra_roots)
executor.register_predecessors(_predecessors)
executor.register_value_holder(_held_values)
executor.register_rebinder(_rebind)
executor.register_failure_hook(_roll_back)
dynamo.skip(__name__)        # torch.compile calls the path's code, never traces it
paths.register(paths.PathImpl(
    name="legacy", version=VERSION, torch_versions=">=2.13", tensor_cls=LegacyTensor,
    inner=_inner, owns=_owns, before_sync=_before_sync, probe=_probe, to_path=_to_path,
    storage_id=lambda t: id(t._alias)))       # (the Alias is made on first need: a loose result)

__all__ = ["LegacyTensor", "Alias", "ViewStep", "VERSION"]
