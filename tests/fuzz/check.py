"""Run one program on CPU eager and on each device path; every tensor it names must agree."""
from __future__ import annotations

import re

import torch

import xla_compat as xc
from xla_compat import paths

from .programs import Program, results, run

PATHS = ("legacy", "functional")


class Disagreement(AssertionError):
    """A device path computed something CPU eager did not."""


class KnownIssue(Exception):
    """A disagreement matching an open, reported issue (``KNOWN``); counted, not failed."""


# (path, pattern in the disagreement, label): open issues reported to the lead, each with a
# regression test in tests/test_reliability_regressions.py. Fixed issues leave this list.
KNOWN = (
    *((p, re.compile(r"UnsupportedOpError: xla_compat: aten\.\w+\.\w+ with out= a view whose "
                     r"elements share memory"),
       f"{p}: a reduction's out= into a view of shared elements (expand, overlapping unfold): "
       f"eager's result is its kernel's loop order (documented limit, refused clearly)")
      for p in ("legacy", "functional")),
    ("functional", re.compile(r"as_strided\(\) is non-compositional"),
     "functional: write through as_strided of a view (upstream functionalization limit)"),
    ("functional", re.compile(r"FunctionalizationLimit: .*writes into a view whose elements "
                              r"overlap"),
     "functional: a write eager allows into a view of shared elements (expand) is refused where "
     "the storage is not plain (a permuted root) or an index_put_ writes several values "
     "(functional/shared_writes.py takes the rest)"),
    ("functional", re.compile(r"setStorage: .*out of bounds for the \d+ elements of the tensor "
                              r"as_strided was called on|as_strided reaches storage element \d+, "
                              r"which lies outside the tensor it was called on"),
     "functional: as_strided of a view reaching past the view's own elements (upstream limit: "
     "functionalize(remove='mutations_and_views') raises the same; documented in the guide)"),
    ("functional", re.compile(r"FunctionalizationLimit: .*a write through x\.unfold\(.*must (keep "
                              r"the elements between the windows|write each element the "
                              r"windows share)"),
     "functional: a write through unfold windows with gaps, or computed from overlapping "
     "windows, after the view was synced away from its base (clear FunctionalizationLimit; the "
     "values it needs are no longer in the graph)"),
    ("functional", re.compile(r"FunctionalizationLimit: .*counts as growing the storage of a "
                              r"tensor that (is a view or has views|is not contiguous)"),
     "functional: resize_ past the end of the storage of a view or of a tensor with views "
     "(upstream functionalization keeps a storage's size; documented in the guide)"),
    ("functional", re.compile(r"setStorage: .*nothing was raised"),
     "functional: as_strided beyond the storage is not rejected"),
    ("functional", re.compile(r": strides of size-1 dims only \("),
     "functional: a base regenerated through inverse views takes their strides where a size-1 "
     "dim leaves them free (no element moves; "
     "test_a_base_written_through_a_view_keeps_its_size_one_dims_strides)"),
)


def known(path: str, message: str):
    for p, pattern, label in KNOWN:
        if p == path and pattern.search(message):
            return label
    return None


def check(program: Program, on=PATHS) -> None:
    """Raise ``Disagreement`` naming the path and tensor where a device run differs from CPU."""
    for name in on:
        __import__(f"xla_compat.{name}")
    expected = results(run(program, "cpu"))
    for name in on:
        with paths.activated(name):
            try:
                got = results(run(program, "device"))
                xc.sync()
            except Exception as e:
                what = "" if isinstance(e, AssertionError) else f" raised {type(e).__name__}:"
                message = f"{name} path{what} {e}"
                label = known(name, message)
                if label:
                    raise KnownIssue(label) from e
                raise Disagreement(message) from e
            try:
                compare(got, expected, name)
            except Disagreement as e:
                label = known(name, str(e))
                if label:
                    raise KnownIssue(label) from e
                raise


def compare(got: dict, expected: dict, path: str) -> None:
    for key, want in expected.items():
        have = got.get(key)
        where = f"{path} path, {key}"
        if have is None:
            raise Disagreement(f"{where}: not defined on the device")
        if tuple(have.shape) != tuple(want.shape) or have.dtype != want.dtype:
            raise Disagreement(f"{where}: {have.dtype}{list(have.shape)} on the device, "
                               f"{want.dtype}{list(want.shape)} on the CPU")
        # Strides of a view are its layout over the shared storage (eager's, on both paths);
        # reads went through .cpu()/.clone() and may be laid out afresh.
        # A tensor without elements has no layout to agree on.
        if not key.startswith("reads") and want.numel() and have.stride() != want.stride():
            # (a size-1 dim's stride moves no element: told apart, as its own open issue)
            which = "strides of size-1 dims only" if all(
                a == b or n == 1 for a, b, n in zip(have.stride(), want.stride(), want.shape)
            ) else "strides"
            raise Disagreement(f"{where}: {which} {have.stride()} on the device, "
                               f"{want.stride()} on the CPU")
        host = have.detach().cpu()
        try:
            torch.testing.assert_close(host, want, rtol=1e-6, atol=1e-5, equal_nan=True)
        except AssertionError as e:
            raise Disagreement(f"{where}: values differ\n  device: {host.tolist()}\n"
                               f"  cpu:    {want.tolist()}\n{e}") from None
