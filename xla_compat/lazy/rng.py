"""Device RNG state: a threefry key that is an input and an output of every graph that draws.

Each random op takes the current state and yields a new one, so a cached graph never replays
the same numbers; ``manual_seed`` makes runs reproducible.
"""
from __future__ import annotations

import contextlib
import threading

import jax
import numpy as np

from .ir import Aval, Value, leaf

STATE_AVAL = Aval((2,), np.dtype("uint32"))
_DEFAULT_SEED = 101  # torch_xla's default

_state: Value | None = None
# The last materialised state the pending chain of draws started from: where a failed sync
# returns the state to (``restore``).
_base: Value | None = None
# Threads drawing from a stream of their own (a dual-run shadow, which may outlive its wait):
# thread id -> [state Value, its base]. Empty, and one check per draw, otherwise.
_streams: dict = {}


def _seed_value(seed: int) -> Value:
    seed = int(seed) & 0xFFFF_FFFF_FFFF_FFFF
    # threefry's key data for a 64-bit seed is its two 32-bit halves.
    words = np.array([seed >> 32, seed & 0xFFFF_FFFF], dtype=np.uint32)
    return leaf(jax.device_put(words))


def state() -> Value:
    global _state
    if _streams:
        own = _streams.get(threading.get_ident())
        if own is not None:
            return own[0]
    if _state is None:
        _state = _seed_value(_DEFAULT_SEED)
    return _state


def advance(new: Value) -> None:
    global _state, _base
    if _streams:
        own = _streams.get(threading.get_ident())
        if own is not None:
            if own[0].node.is_leaf:
                own[1] = own[0]
            own[0] = new
            return
    if _state is not None and _state.node.is_leaf:
        _base = _state
    _state = new


def manual_seed(seed: int) -> None:
    advance(_seed_value(seed))


@contextlib.contextmanager
def private(start: Value):
    """Inside the block this thread draws from a stream of its own starting at ``start`` (and
    seeds only that stream); the shared state and other threads' draws are untouched."""
    me = threading.get_ident()
    _streams[me] = [start, None]
    try:
        yield
    finally:
        _streams.pop(me, None)


def pending() -> Value | None:
    """This thread's state Value if a graph has advanced it since it was last materialised."""
    if _state is None and not _streams:
        return None
    current = state()
    return current if not current.node.is_leaf else None


def set_materialized(old: Value, value: Value) -> None:
    """A sync computed the pending state ``old``: every stream still at ``old`` takes ``value``.
    A stream another thread advanced meanwhile keeps its newer draws."""
    global _state
    for own in list(_streams.values()):
        if own[0] == old:
            own[0] = value
    if _state == old:
        _state = value


def restore(old: Value) -> None:
    """A sync that was to compute the pending state ``old`` failed: every stream still at
    ``old`` returns to the materialised state its chain of draws started from, as every tensor
    returns to its last value (the failed step's numbers are gone with its graph). Left at
    ``old``, every later draw would take the failed graph as its input and fail again."""
    global _state
    for own in list(_streams.values()):
        if own[0] == old and _alive(own[1]):
            own[0] = own[1]
    if _state == old and _alive(_base):
        _state = _base


def _alive(v: Value | None) -> bool:
    return v is not None and not v.node.array.is_deleted()


def get_state():
    """The state as a CPU uint8 tensor (torch's ``get_rng_state`` shape); syncs a pending state."""
    import torch
    if pending() is not None:
        from .. import executor
        executor.sync_tensors()
    words = np.asarray(state().node.array, dtype=np.uint32)
    return torch.from_numpy(words.view(np.uint8).copy())


def set_state(new_state) -> None:
    """Restore a state returned by ``get_state``."""
    words = np.asarray(new_state.detach().cpu().numpy(), dtype=np.uint8).view(np.uint32)
    advance(leaf(jax.device_put(words.reshape(STATE_AVAL.shape))))
