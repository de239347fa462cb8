"""Cross products of test parameters that ``make test`` samples and ``make test-slow`` runs whole.

A test over the product of several axes (views x ops x geometries) is written once over the whole
product. ``all_pairs`` marks every case outside an all-pairs subset ``slow``: every value of
each axis meets every value of every other axis in at least one case that ``make test`` runs,
which finds the bugs that depend on two of the parameters together at a third of the cost or
less. ``make test-slow`` (``-m slow``) runs the rest.
"""
from __future__ import annotations

import itertools

import pytest


def all_pairs(*axes, valid=lambda *case: True, id_of=str) -> list:
    """Each valid case of the product of ``axes`` as a ``pytest.param`` (its id: its values'
    ``id_of`` joined by ``-``); cases outside a greedy all-pairs cover are marked ``slow``."""
    cases = [c for c in itertools.product(*axes) if valid(*c)]
    keep = _cover(cases, len(axes))
    return [pytest.param(*c, id="-".join(id_of(v) for v in c),
                         marks=() if i in keep else pytest.mark.slow)
            for i, c in enumerate(cases)]


def _pairs(case) -> set:
    return {(i, a, j, b) for (i, a), (j, b) in itertools.combinations(
        [(i, _hashable(v)) for i, v in enumerate(case)], 2)}


def _hashable(v):
    return v if isinstance(v, (str, int, float, tuple)) else repr(v)


def _cover(cases: list, n_axes: int) -> set:
    """Indices of cases that together hold every pair the valid cases hold (greedy: the case
    with the most pairs not yet held first; ties to the earliest)."""
    pairs = [_pairs(c) for c in cases]
    wanted = set().union(*pairs) if pairs else set()
    keep: set = set()
    while wanted:
        best = max(range(len(cases)), key=lambda i: (len(pairs[i] & wanted), -i))
        keep.add(best)
        wanted -= pairs[best]
    return keep


def one_path_each(names, paths=("legacy", "functional")) -> list:
    """(path, name) params: each name on one path in ``make test`` (alternately), on the other in
    ``make test-slow``. For device tests whose lowerings are the paths' shared code: every name
    still runs on the device, and each path meets half of them."""
    out = []
    for i, name in enumerate(sorted(names)):
        for j, path in enumerate(paths):
            marks = () if (i + j) % 2 == 0 else pytest.mark.slow
            out.append(pytest.param(path, name, marks=marks, id=f"{path}-{name}"))
    return out


def alternate_paths(items, paths=("legacy", "functional")) -> int:
    """Mark ``slow`` half of the path cases of each test function parametrised beyond its path
    (on the ``path`` fixture or a ``path`` argument): its cases, sorted by the rest of their ids,
    run on ``paths`` in turn in ``make test``, the other path in ``make test-slow``. A function
    parametrised over the path alone keeps both, and one that samples itself (any case already
    marked ``slow``) is left as it is. Returns how many items were marked.

    For tests of code the paths share (``tests/lowering``: the op families' rules): each case
    still runs on the device in ``make test``, and each path meets half of them."""
    functions: dict = {}
    for item in items:
        spec = getattr(item, "callspec", None)
        if spec is None or spec.params.get("path") not in paths:
            continue
        path = spec.params["path"]
        rest = spec.id.split("-")
        rest.remove(path)
        functions.setdefault(item.function, []).append(("-".join(rest), path, item))
    marked = 0
    for cases in functions.values():
        if any(item.get_closest_marker("slow") for _, _, item in cases):
            continue
        keys = sorted({key for key, _, _ in cases})
        if len(keys) < 2:
            continue
        turn = {key: paths[i % len(paths)] for i, key in enumerate(keys)}
        for key, path, item in cases:
            if path != turn[key]:
                item.add_marker(pytest.mark.slow)
                marked += 1
    return marked
