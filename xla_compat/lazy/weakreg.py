"""WeakRegistry: objects by key, held weakly, in insertion order; cheap to add to.

``weakref.WeakValueDictionary`` costs a few microseconds per insertion in Python code; the
tracer adds one entry per traced op, so its registries use this instead: a plain dict of
``weakref.ref`` whose callback (``dict.pop`` bound to the key, all C code) removes the entry
when the object dies. CPython runs that callback before the object's memory (and so its id)
can be reused, so an entry is never removed on behalf of a newer object.
"""
from __future__ import annotations

import functools
import weakref


class WeakRegistry:
    """``key -> object`` for live objects only, in the order they were added."""

    __slots__ = ("_refs",)

    def __init__(self):
        self._refs: dict = {}

    def add(self, key, obj) -> None:
        refs = self._refs
        refs[key] = weakref.ref(obj, functools.partial(refs.pop, key))

    def values(self) -> list:
        """The live objects (a list: callbacks may change the registry while it is walked)."""
        out = []
        for ref in list(self._refs.values()):
            obj = ref()
            if obj is not None:
                out.append(obj)
        return out

    def __len__(self) -> int:
        return len(self._refs)
