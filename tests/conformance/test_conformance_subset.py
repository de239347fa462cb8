"""A CI-sized slice of the OpInfo conformance run: every op family, float32/int64/bool, every path.

The full gauge is ``make conformance`` (tests/conformance/run.py); this slice runs a few samples
of each op below (and its in-place variant) on each path and requires all of them to match CPU
eager on the device itself, with no CPU fallback. The last tests pin the harness's own behaviour.
"""
from __future__ import annotations

import functools

import pytest
import torch

import xla_compat as xc
from tests.conftest import PATHS

from . import harness

# One line per family; names are OpInfo full names (name or name.variant_test_name).
SUBSET = {
    "elementwise": ("add", "sub", "mul", "div.no_rounding_mode", "neg", "abs", "exp", "log",
                    "sigmoid", "tanh", "pow", "clamp", "where", "eq", "lt", "maximum",
                    "logical_and", "bitwise_and", "masked_fill"),
    "reductions": ("sum", "mean", "amax", "argmax", "prod", "cumsum", "all", "any", "var"),
    "sorting": ("sort", "argsort", "topk", "kthvalue", "mode"),
    "views": ("transpose", "permute", "view", "reshape", "expand", "narrow", "select",
              "squeeze", "unsqueeze", "t", "as_strided"),
    "indexing": ("index_select", "gather", "scatter", "index_put", "take_along_dim"),
    "linalg": ("matmul", "mm", "bmm", "addmm", "linalg.solve", "linalg.cholesky", "linalg.qr",
               "linalg.svd", "linalg.eigh", "linalg.lstsq"),
    "nn": ("nn.functional.relu", "softmax", "log_softmax", "nn.functional.layer_norm",
           "nn.functional.embedding", "nn.functional.linear", "nn.functional.gelu",
           "nn.functional.cross_entropy", "nn.functional.dropout"),
    "shape": ("cat", "stack", "split", "flip", "roll", "tril", "triu", "repeat"),
}
DTYPES = (torch.float32, torch.int64, torch.bool)
CAP = 1  # samples per op, dtype and variant (the first kind; make conformance runs 8)
ALL_PATHS = ("core",) + tuple(PATHS)
CASES = [(family, name) for family, names in SUBSET.items() for name in names]


@functools.lru_cache(maxsize=None)
def _op_db() -> dict:
    from torch.testing._internal.common_methods_invocations import op_db
    return {harness.full_name(op): op for op in op_db}


def _require(path: str) -> None:
    why = harness.load_paths([path])[path]
    if why:
        pytest.fail(f"path {path!r} cannot run its conformance subset: {why}")


@pytest.mark.parametrize("path", ALL_PATHS)
@pytest.mark.parametrize("family,name", CASES, ids=[f"{f}-{n}" for f, n in CASES])
def test_opinfo_samples_match_cpu_eager_on_the_device(path, family, name):
    _require(path)
    tallies = harness.run_op(_op_db()[name], path, cap=CAP, dtypes=DTYPES)
    ran = sum(t.passed + t.failed + t.fallback for t in tallies)
    assert ran > 0, f"{name}: no sample ran ({[t.skip_reason for t in tallies]})"
    bad = [f"{t.variant or 'op'} {t.dtype}: {t.failed} failed, {t.fallback} only via CPU fallback "
           f"{t.fallback_ops or ''} {t.first_error}" for t in tallies if t.failed or t.fallback]
    assert not bad, f"{name} on {path}:\n" + "\n".join(bad)


# -- the harness itself ----------------------------------------------------------------------------
def _add_sample():
    """A plain 2-d sample of ``add``."""
    return next(s for s in _op_db()["add"].sample_inputs("cpu", torch.float32)
                if s.input.dim() == 2)


@pytest.fixture
def core():
    with xc.paths.activated("core"):
        yield


def test_a_device_result_that_differs_from_eager_is_a_failure_with_its_first_line(core):
    op = _op_db()["add"]

    def off_by_one_on_device(x, *args, **kwargs):
        out = torch.add(x, *args, **kwargs)
        return out + 1 if out.device.type == "hlo" else out

    status, msg, _ = harness.run_sample(op, off_by_one_on_device, _add_sample(), torch.float32,
                                        "exact", inplace=False)
    assert status == "fail"
    assert msg.startswith("AssertionError: Tensor-likes are not close!")


def test_a_sample_that_only_matches_through_cpu_fallback_is_not_a_pass(core):
    op = _op_db()["add"]

    def through_cpu(x, *args, **kwargs):
        if x.device.type == "hlo":   # an op with no lowering rule and no decomposition
            return torch.ops.conformance_probe.double_it(torch.add(x, *args, **kwargs)) / 2
        return torch.add(x, *args, **kwargs)

    _register_probe()
    status, _, used = harness.run_sample(op, through_cpu, _add_sample(), torch.float32, "exact",
                                         inplace=False)
    assert status == "fallback"
    assert used == {"conformance_probe::double_it": 1}


def test_a_failing_graph_left_pending_does_not_poison_the_next_sample(core):
    op = _op_db()["add"]
    kept = []

    def leaves_a_broken_graph(x, *args, **kwargs):
        out = torch.add(x, *args, **kwargs)
        if out.device.type == "hlo":
            kept.append(_broken_tensor(out.shape))
        return out

    first = harness.run_sample(op, leaves_a_broken_graph, _add_sample(), torch.float32, "exact",
                               inplace=False)
    assert first[0] == "fail" and "sync after the sample failed" in first[1]
    second = harness.run_sample(op, op, _add_sample(), torch.float32, "exact", inplace=False)
    assert second[0] == "pass", second
    xc.sync()


def test_sign_aligned_factors_fail_when_only_one_vector_of_a_pair_flips():
    """linalg.svd is compared after aligning signs, but u_j and v_j must flip together."""
    torch.manual_seed(0)
    a = torch.randn(4, 3)
    u, s, vh = torch.linalg.svd(a, full_matrices=False)
    flip = torch.tensor([1.0, -1.0, 1.0])
    both = harness.skips.align_signs("linalg.svd", [u * flip, s, vh * flip[:, None]], [u, s, vh])
    harness.compare(both, [u, s, vh], lambda dt: (1e-6, 1e-6))
    only_u = harness.skips.align_signs("linalg.svd", [u * flip, s, vh], [u, s, vh])
    with pytest.raises(AssertionError):
        harness.compare(only_u, [u, s, vh], lambda dt: (1e-6, 1e-6))


def _tie_sample(x, *args, **kwargs):
    from torch.testing._internal.opinfo.core import SampleInput
    return SampleInput(x, args=args, kwargs=kwargs)


def test_tie_aligned_indices_pass_for_equal_elements_and_fail_otherwise():
    """Indices naming another of several equal elements are eager's after alignment; an index
    naming an element of another value, or one element twice, still fails."""
    x = torch.tensor([[3, 1, 3, 2, 1], [0, 0, 5, 0, 5]])
    want = torch.topk(x, 2)
    tol = lambda dt: (0, 0)          # noqa: E731 - exact, as for every int output
    other_tie = (want.values, torch.tensor([[2, 0], [4, 2]]))    # the other 3 and the other 5
    sample = _tie_sample(x, 2)
    harness.compare(harness.skips.align_ties("topk", sample, other_tie, tuple(want)),
                    tuple(want), tol)
    wrong = (want.values, torch.tensor([[0, 3], [2, 4]]))           # x[0, 3] is 2, not 3
    with pytest.raises(AssertionError):
        harness.compare(harness.skips.align_ties("topk", sample, wrong, tuple(want)),
                        tuple(want), tol)
    twice = (want.values, torch.tensor([[0, 0], [2, 2]]))
    with pytest.raises(AssertionError, match="twice"):
        harness.skips.align_ties("topk", sample, twice, tuple(want))
    # mode without keepdim (indices lose the dim), and a stable sort compared as it is.
    m = torch.mode(x, 1)
    other = (m.values, torch.tensor([4, 3]))                         # another 1, another 0
    harness.compare(harness.skips.align_ties("mode", _tie_sample(x, 1), other, tuple(m)),
                    tuple(m), tol)
    stable = torch.sort(x, stable=True)
    swapped = (stable.values, stable.indices.flip(1).flip(1).clone())
    swapped[1][0, :2] = swapped[1][0, :2].flip(0)                    # the two 1s swapped
    kept = harness.skips.align_ties("sort", _tie_sample(x, stable=True), swapped, tuple(stable))
    with pytest.raises(AssertionError):
        harness.compare(kept, tuple(stable), tol)


def test_sample_selection_keeps_every_kind_before_repeating_one():
    op = _op_db()["sum"]
    samples = list(op.sample_inputs("cpu", torch.float32))
    kinds = {harness.sample_kind(s) for s in samples}
    chosen = harness.select(samples, len(kinds))
    assert {harness.sample_kind(s) for s in chosen} == kinds
    assert len(harness.select(samples, len(kinds) + 1)) == len(kinds) + 1


_probe_lib = None


def _register_probe() -> None:
    """A custom op with only a CPU kernel: no lowering, no decomposition, so it falls back."""
    global _probe_lib
    if _probe_lib is not None:
        return
    _probe_lib = torch.library.Library("conformance_probe", "DEF")
    _probe_lib.define("double_it(Tensor x) -> Tensor")
    _probe_lib.impl("double_it", lambda x: x * 2, "CPU")
    _probe_lib.impl("double_it", lambda x: torch.empty_like(x), "Meta")


def _broken_tensor(shape):
    """A device tensor whose pending graph fails to lower."""
    from xla_compat.lazy.ir import Aval, Node, Value
    from xla_compat.lazy.tensor import LazyTensor
    import numpy as np

    def boom():
        raise RuntimeError("this graph is broken on purpose")

    aval = Aval(tuple(shape), np.dtype("float32"))
    return LazyTensor(Value(Node("broken", boom, (), (), (), (aval,)), 0), tuple(shape),
                      torch.float32)
