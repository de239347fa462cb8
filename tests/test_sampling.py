"""tests/sampling.py: make test runs an all-pairs subset of a cross product, make test-slow the rest."""
from __future__ import annotations

import itertools

from tests.sampling import all_pairs


def _split(params):
    fast = [p.values for p in params if not p.marks]
    slow = [p.values for p in params if p.marks]
    assert all(m.name == "slow" for p in params for m in p.marks)
    return fast, slow


def test_every_pair_of_values_meets_in_a_case_make_test_runs():
    axes = (list("abcdefg"), [1, 2, 3, 4], [(6,), (2, 7)], ["x", "y"])
    params = all_pairs(*axes)
    fast, slow = _split(params)
    assert sorted(fast + slow) == sorted(itertools.product(*axes))      # every case, once
    for (i, a), (j, b) in itertools.combinations(list(enumerate(axes)), 2):
        for u, v in itertools.product(a, b):
            assert any(c[i] == u and c[j] == v for c in fast), (u, v)
    assert len(fast) <= 2 * 7 * 4 and len(slow) > len(fast)       # near the 7 x 4 minimum


def test_invalid_cases_are_left_out_and_their_pairs_not_asked_for():
    params = all_pairs(["p", "q"], ["lockstep", "function"], ["hang", "nan"],
                       valid=lambda path, mode, fault: fault != "hang" or mode == "lockstep")
    fast, slow = _split(params)
    assert ("p", "function", "hang") not in fast + slow and len(fast + slow) == 6
    assert {(c[1], c[2]) for c in fast} == {("lockstep", "hang"), ("lockstep", "nan"),
                                            ("function", "nan")}
    assert [p.id for p in params][0] == "p-lockstep-hang"


def test_a_product_of_two_axes_is_run_whole():
    fast, slow = _split(all_pairs([1, 2, 3], ["a", "b"]))
    assert len(fast) == 6 and not slow


class _Item:
    """What alternate_paths reads of a collected test item."""

    def __init__(self, function, path, rest, slow=False):
        class Spec:
            params = {"path": path}
            id = "-".join([path, *rest]) if rest else path
        self.callspec, self.function = Spec(), function
        self.marks = ["slow"] if slow else []

    def get_closest_marker(self, name):
        return name if name in self.marks else None

    def add_marker(self, mark):
        self.marks.append(mark.name)


def test_alternate_paths_runs_each_case_on_one_path_and_the_paths_take_turns():
    from tests.sampling import alternate_paths

    def f(): pass      # noqa: E704
    def g(): pass      # noqa: E704
    def h(): pass      # noqa: E704
    items = [_Item(f, p, [op, dt]) for op in ("abs", "sin", "tan") for dt in ("f32", "bf16")
             for p in ("legacy", "functional")]
    items += [_Item(g, p, []) for p in ("legacy", "functional")]           # over the path alone
    items += [_Item(h, "legacy", ["a"]), _Item(h, "functional", ["a"], slow=True),
              _Item(h, "legacy", ["b"], slow=True), _Item(h, "functional", ["b"])]
    assert alternate_paths(items) == 6
    fast = [(i.callspec.params["path"], i.callspec.id) for i in items[:12] if not i.marks]
    assert len(fast) == 6 and len({id_.split("-", 1)[1] for _, id_ in fast}) == 6
    assert sorted(p for p, _ in fast) == ["functional"] * 3 + ["legacy"] * 3
    assert not any(i.marks for i in items[12:14])                          # g: both paths
    assert [bool(i.marks) for i in items[14:]] == [False, True, True, False]   # h: its own
