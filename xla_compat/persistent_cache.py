"""Compiled graphs kept on disk, so a restarted job loads its executables instead of compiling
them again (torch_xla's ``XLA_PERSISTENT_CACHE_PATH`` and ``runtime.initialize_cache``).

This is JAX's persistent compilation cache: an entry is keyed by the graph's HLO, the compile
options and the jax/XLA versions, so a changed graph or an upgraded jaxlib misses instead of
loading a stale executable. Every compiled graph is stored, however fast it compiled. A
read-only cache loads entries and writes none (several workers sharing one directory that one
of them fills). Hits and misses count in the metrics (``PersistentCacheHit`` /
``PersistentCacheMiss``); the in-memory cache still answers first, so a graph seen earlier in the
process never reaches the disk.
"""
from __future__ import annotations

import os
import threading

import jax

from . import metrics, settings

_lock = threading.Lock()
_path: str | None = None            # the directory in use; JAX keeps the first one it opens
_counting = threading.local()       # set while this thread compiles one of our graphs
_REQUEST = "/jax/compilation_cache/compile_requests_use_cache"
_HIT = "/jax/compilation_cache/cache_hits"
_NEVER = 1e12                       # a minimum compile time no compile reaches: store nothing


def initialize(path: str, readonly: bool = False) -> None:
    """Keep compiled graphs in ``path`` (created if missing) and load them from there; with
    ``readonly`` only load. JAX opens one cache directory per process: a second call with
    another directory raises, the same directory again only changes ``readonly``."""
    global _path
    path = os.path.abspath(os.path.expanduser(str(path)))
    with _lock:
        if _path is not None:
            if _path != path:
                raise RuntimeError(
                    f"xla_compat: the persistent compile cache is already at {_path!r}; it "
                    f"cannot move to {path!r} in the same process (JAX keeps the first "
                    "directory it opens). Call initialize_cache (or set "
                    "XLA_PERSISTENT_CACHE_PATH) once, before the first sync.")
            _store(not readonly)
            return
        if not readonly:
            try:
                os.makedirs(path, exist_ok=True)
            except OSError as e:
                raise RuntimeError(
                    f"xla_compat: cannot create the persistent compile cache directory "
                    f"{path!r} ({e}). Point XLA_PERSISTENT_CACHE_PATH at a writable directory, "
                    "or open an existing one read-only (XLA_PERSISTENT_CACHE_READ_ONLY=1).") from e
        jax.monitoring.register_event_listener(_count)
        jax.config.update("jax_compilation_cache_dir", path)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
        _store(not readonly)
        _path = path


def _store(store: bool) -> None:
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0 if store else _NEVER)


def path() -> str | None:
    """The cache directory in use, or None."""
    return _path


def from_settings() -> None:
    """Open the directory ``XLA_PERSISTENT_CACHE_PATH`` names, once, before the first compile."""
    s = settings.get()
    if s.persistent_cache_path and _path is None:
        initialize(s.persistent_cache_path, readonly=s.persistent_cache_readonly)


class compiling:
    """Around the compile of one of our graphs: a cache request that JAX did not answer from
    disk counts as a miss (JAX itself reports a miss only when it stores the entry). Other jax
    compiles, such as a seed's, stay out of the metrics."""

    def __enter__(self):
        _counting.events = {}

    def __exit__(self, *exc):
        seen, _counting.events = _counting.events, None
        if seen.get(_REQUEST):
            hits = seen.get(_HIT, 0)
            if hits:
                metrics.inc("PersistentCacheHit", hits)
            if seen[_REQUEST] > hits:
                metrics.inc("PersistentCacheMiss", seen[_REQUEST] - hits)


def _count(event: str, **_) -> None:
    seen = getattr(_counting, "events", None)
    if seen is not None and event in (_REQUEST, _HIT):
        seen[event] = seen.get(event, 0) + 1
