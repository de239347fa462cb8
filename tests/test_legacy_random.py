"""Legacy path, property test: random chains of views and writes (and syncs) agree with CPU eager."""
from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

import xla_compat as xc
from xla_compat import paths
from tests.conftest import RANDOM_DRAWS, assert_same


@pytest.fixture(autouse=True)
def legacy():
    import xla_compat.legacy  # noqa: F401  (registers the path)
    with paths.activated("legacy"):
        yield


def draw_view(data, t):
    """A view function valid for tensors shaped like ``t`` (drawn from ``data``)."""
    ints = lambda lo, hi: data.draw(st.integers(lo, hi))   # noqa: E731
    kinds = ["unsqueeze", "flatten", "alias"]
    if t.dim() >= 1:
        kinds += ["slice", "split", "unfold", "expand_piece", "as_strided"]
        if t.shape[0] > 0:
            kinds += ["select", "unbind"]
    if t.dim() >= 2:
        kinds += ["transpose", "diagonal", "permute", "reshape"]
    kind = data.draw(st.sampled_from(kinds))
    n = t.dim()
    if kind == "unsqueeze":
        d = ints(-n - 1, n)
        return kind, lambda x: x.unsqueeze(d)
    if kind == "flatten":
        return kind, lambda x: x.flatten() if x.is_contiguous() else x.unsqueeze(0)
    if kind == "alias":
        return kind, lambda x: x.detach()
    if kind == "slice":
        d = ints(0, n - 1)
        size = t.shape[d]
        start, stop, step = ints(-size - 1, size), ints(-size - 1, size + 1), ints(1, 3)
        return kind, lambda x: x.narrow(d, 0, x.shape[d]).__getitem__(
            (slice(None),) * d + (slice(start, stop, step),))
    if kind == "split":
        d, size = ints(0, n - 1), ints(1, 3)
        k = ints(0, 10)
        return kind, lambda x: x.split(size, d)[k % len(x.split(size, d))]
    if kind == "unfold":
        d = ints(0, n - 1)
        size = ints(1, max(t.shape[d], 1))
        step = ints(1, 3)
        if t.shape[d] == 0:
            return kind, lambda x: x.unsqueeze(0)
        return kind, lambda x: x.unfold(d, size, step)
    if kind == "expand_piece":
        k = ints(1, 3)
        return kind, lambda x: x.unsqueeze(0).expand(k, *x.shape)[k - 1]
    if kind == "as_strided":
        return kind, lambda x: x.as_strided(x.shape, x.stride(), x.storage_offset())
    if kind == "select":
        d, i = 0, ints(-t.shape[0], t.shape[0] - 1)
        return kind, lambda x: x.select(d, i)
    if kind == "unbind":
        i = ints(0, t.shape[0] - 1)
        return kind, lambda x: x.unbind(0)[i]
    if kind == "transpose":
        a, b = ints(0, n - 1), ints(0, n - 1)
        return kind, lambda x: x.transpose(a, b)
    if kind == "diagonal":
        off = ints(-2, 2)
        return kind, lambda x: x.diagonal(off)
    if kind == "permute":
        perm = data.draw(st.permutations(range(n)))
        return kind, lambda x: x.permute(*perm)
    # reshape: a view where the layout allows one; otherwise a transposing view (t() takes at
    # most 2 dims: a non-contiguous 3-d tensor, e.g. an unfold's, swaps its first and last)
    return kind, lambda x: (x.reshape(-1) if x.is_contiguous()
                            else x.t() if x.dim() <= 2 else x.transpose(0, -1))


WRITES = {
    "mul_add": lambda v: v.mul_(2).add_(1),
    "fill": lambda v: v.fill_(-3),
    "zero": lambda v: v.zero_(),
    "copy": lambda v: v.copy_(torch.arange(v.numel(), dtype=v.dtype).reshape(v.shape).to(v.device)),
    "setitem": lambda v: v.__setitem__((Ellipsis,), 5) if v.dim() else v.fill_(5),
}


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck),
          derandomize=not RANDOM_DRAWS, database=None)
@given(data=st.data())
def test_random_views_and_writes_match_eager(data):
    shape = tuple(data.draw(st.lists(st.integers(0, 4), min_size=1, max_size=3)))
    base_cpu = torch.arange(float(torch.tensor(shape).prod().item())).reshape(shape)
    base_dev = base_cpu.to(xc.device())
    live = [(base_cpu, base_dev)]
    for _ in range(data.draw(st.integers(1, 6))):
        action = data.draw(st.sampled_from(["view", "view", "write", "write", "sync"]))
        src_cpu, src_dev = live[data.draw(st.integers(0, len(live) - 1))]
        if action == "view":
            _, fn = draw_view(data, src_cpu)
            live.append((fn(src_cpu), fn(src_dev)))
        elif action == "write":
            w = WRITES[data.draw(st.sampled_from(sorted(WRITES)))]
            if torch._debug_has_internal_overlap(src_cpu) == 0:
                w(src_cpu)
                w(src_dev)
        else:
            xc.sync()
    for c, d in live:
        assert d.shape == c.shape and d.stride() == c.stride()
        assert_same(d, c)
