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
# Threads drawing from a stream of their own (a dual-run shadow, which may outlive its wait):
# thread id -> [state Value]. Empty, and one check per draw, otherwise.
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
    global _state
    if _streams:
        own = _streams.get(threading.get_ident())
        if own is not None:
            own[0] = new
            return
    _state = new


def manual_seed(seed: int) -> None:
    advance(_seed_value(seed))


@contextlib.contextmanager
def private(start: Value):
    """Inside the block this thread draws from a stream of its own starting at ``start`` (and
    seeds only that stream); the shared state and other threads' draws are untouched."""
    me = threading.get_ident()
    _streams[me] = [start]
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
