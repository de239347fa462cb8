"""``resize_`` on both paths, against CPU eager.

Eager's ``resize_`` lays the tensor out afresh from its storage offset (contiguous strides, or the
``memory_format``'s) and, where the new size reaches past the end of the storage, grows the
storage in place: every tensor on it keeps its sizes, strides and offset over the larger storage,
whose new elements are uninitialised (the programs below write them before they read them).
Legacy grows a storage as eager does; the functional path grows a tensor that is neither a view
nor has views, and refuses the rest (upstream functionalization keeps a storage's size) with a
``FunctionalizationLimit`` that changes nothing.
"""
from __future__ import annotations

import warnings

import pytest
import torch

import xla_compat as xc

from .test_reliability_failures import FAULTS

CL = torch.channels_last


def _assert_same(got: list, want: list) -> None:
    for g, w in zip(got, want, strict=True):
        assert (tuple(g.shape), g.stride(), g.storage_offset()) == (
            tuple(w.shape), w.stride(), w.storage_offset())
        torch.testing.assert_close(g.cpu(), w, rtol=0, atol=0)


def _run(prog) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")           # eager's warning on resizing a non-empty out=
        want = prog("cpu")
        got = prog(xc.device())
        _assert_same(got, want)
        xc.sync()
        _assert_same(got, want)


# -- both paths --------------------------------------------------------------------------------

def _empty_grows(d):
    x = torch.empty(0, device=d)
    x.resize_(2, 3)
    x.fill_(1.5)
    x[1] += 1
    return [x]


def _base_grows_twice(d):
    x = torch.arange(3.0, device=d)
    x.resize_(5)
    x[3:] = 7
    x.resize_(2, 4)
    x.view(-1)[5:] = -1
    return [x]


def _grown_base_keeps_its_values(d):
    x = torch.arange(6.0, device=d).view(2, 3).clone()
    x.resize_(3, 3)
    x[2] = 9
    return [x]


def _shrinks_and_grows_back_within(d):
    x = torch.arange(6.0, device=d)
    x.resize_(2, 2)
    x[1, 1] = -1
    x.resize_(6)                      # back within its storage: its elements are still there
    return [x]


def _out_of_an_arange_resized_within(d):
    x = torch.arange(8.0, device=d).view(2, 4)      # arange's out= resize made this storage
    x.resize_(8)
    x[5:] = 0
    return [x]


def _channels_last_over_the_same_storage(d):
    x = torch.arange(24.0, device=d).view(1, 2, 3, 4)
    x.resize_(1, 2, 3, 4, memory_format=CL)         # the same elements, read in CL order
    return [x]


def _channels_last_after_a_shrink(d):
    x = torch.arange(24.0, device=d)
    x.resize_(2)
    x.resize_(1, 2, 3, 4, memory_format=CL)         # within the storage: no growth
    return [x]


def _channels_last_grown_from_empty(d):
    x = torch.empty(0, device=d)
    x.resize_(2, 3, 2, 2, memory_format=CL)
    x.copy_(torch.arange(24.0, device=d).view(2, 3, 2, 2))
    return [x, x + 1]


def _out_of_another_shape_grows_with_its_view(d):
    x = torch.zeros(2, device=d)
    v = x[:1]
    torch.add(torch.ones(3, device=d), 1, out=x)
    return [x, v]


def _out_resized_then_laid_out_anew_with_a_view(d):
    o = torch.empty(0, device=d)
    torch.add(torch.arange(6.0, device=d), 1, out=o)    # o resized to 6 by the out= op
    v = o[:3]
    o.resize_(2, 3)                                     # within its storage, v still on it
    o[1] = 0
    v.mul_(2)
    return [o, v]


BOTH = [_out_resized_then_laid_out_anew_with_a_view, _empty_grows, _base_grows_twice,
        _grown_base_keeps_its_values, _out_of_an_arange_resized_within,
        _channels_last_over_the_same_storage, _channels_last_grown_from_empty,
        _out_of_another_shape_grows_with_its_view]


@pytest.mark.parametrize("prog", BOTH, ids=lambda p: p.__name__.strip("_"))
def test_resize_matches_eager(path, prog):
    _run(prog)


def test_the_storage_size_after_a_resize_reads_as_eagers(path):
    """``untyped_storage().nbytes()`` after an out= op resized its out tensor and after a
    ``resize_`` grew one (functional: upstream's count stayed at the old size after the out=
    op's resize; it is recounted)."""
    def sizes(d):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            o = torch.empty(0, device=d)
            torch.add(torch.arange(6.0, device=d), 1, out=o)
            x = torch.ones(2, device=d)
            x.resize_(5)
            return [o.untyped_storage().nbytes(), x.untyped_storage().nbytes(),
                    x[1:].untyped_storage().nbytes()]
    assert sizes(xc.device()) == sizes("cpu") == [24, 20, 20]


# -- legacy as eager; functional refuses (FunctionalizationLimit, nothing changed) -------------
# A storage with views grows on legacy; upstream functionalization keeps a storage's size. And a
# tensor resized smaller is a view to functionalization, which reads it past its own elements
# only through as_strided of its base (the documented as_strided limit).

def _base_with_a_view_grows(d):
    x = torch.arange(4.0, device=d)
    v = x[1:3]
    x.resize_(6)
    x[4:] = 7
    v.mul_(2)                          # v is still on x's (grown) storage
    return [x, v]


def _view_grows_past_the_storage(d):
    x = torch.arange(4.0, device=d)
    v = x[2:]
    v.resize_(5)                       # x's storage grows to 7 elements
    v.fill_(-1)
    return [v, x]


def _transposed_view_of_a_grown_base(d):
    b = torch.arange(6.0, device=d).view(2, 3)
    t = b.t()
    b.resize_(4, 3)
    b[2:] = 9
    t.add_(1)                          # t reads the first 6 elements, transposed
    return [b, t]


def _view_of_a_temporary_grows(d):
    x = torch.arange(6.0, device=d).view(2, 3)      # a view of arange's result
    x.resize_(3, 3)
    x[2] = 9
    return [x]


def _view_grows_twice(d):
    x = torch.arange(3.0, device=d)
    v = x[1:]
    v.resize_(4)                       # storage 3 -> 5
    v[2:] = 5
    w = v[1:]
    w.resize_(2, 3)                    # storage 5 -> 8
    w.view(-1)[3:] = -2
    return [x, v, w]


GROWS_WITH_VIEWS = [_base_with_a_view_grows, _view_grows_past_the_storage,
                    _transposed_view_of_a_grown_base, _view_of_a_temporary_grows,
                    _view_grows_twice]
BACK_WITHIN = [_shrinks_and_grows_back_within, _channels_last_after_a_shrink]


@pytest.mark.parametrize("prog", GROWS_WITH_VIEWS + BACK_WITHIN,
                         ids=lambda p: p.__name__.strip("_"))
def test_legacy_as_eager_functional_refuses(path, prog):
    if path == "legacy":
        _run(prog)
        return
    from xla_compat.functional import FunctionalizationLimit
    message = (r"growing the storage of a tensor that is a view or has views.*Nothing was "
               r"changed" if prog in GROWS_WITH_VIEWS else r"out of bounds for the \d+ elements "
               r"of the tensor as_strided was called on")
    with pytest.raises(FunctionalizationLimit, match=message):
        prog(xc.device())


def test_functional_refusal_to_grow_a_storage_with_views_changes_nothing():
    from xla_compat import paths
    from xla_compat.functional import FunctionalizationLimit
    with paths.activated("functional"):
        x = torch.arange(4.0, device=xc.device())
        v = x[1:3]
        with pytest.raises(FunctionalizationLimit, match=r"resize_ from \[4\] to \[6\] needs a "
                                                           r"storage of 24 bytes"):
            x.resize_(6)
        assert x.shape == (4,) and v.shape == (2,)
        x.add_(1)
        torch.testing.assert_close(x.cpu(), torch.arange(4.0) + 1)
        torch.testing.assert_close(v.cpu(), torch.tensor([2.0, 3.0]))
        del v
        x.resize_(6)                    # the view gone, the storage grows
        x[4:] = 0
        torch.testing.assert_close(x.cpu(), torch.tensor([1.0, 2.0, 3.0, 4.0, 0.0, 0.0]))


# -- eager's errors, and the tensor left as it was ---------------------------------------------

@pytest.mark.parametrize("args, kwargs", [
    ((-1, 3), {}),
    ((2, 3), {"memory_format": CL}),
    ((3, 2), {"memory_format": torch.preserve_format}),
], ids=["negative", "channels_last_of_2d", "preserve"])
def test_a_bad_resize_raises_eagers_error_and_changes_nothing(path, dev, args, kwargs):
    with pytest.raises(RuntimeError) as want:
        torch.arange(6.0).view(2, 3).resize_(*args, **kwargs)
    x = torch.arange(6.0, device=dev).view(2, 3)
    with pytest.raises(RuntimeError) as got:
        x.resize_(*args, **kwargs)
    assert str(want.value).splitlines()[0] in str(got.value)
    assert (tuple(x.shape), x.stride()) == ((2, 3), (3, 1))
    x.add_(1)
    torch.testing.assert_close(x.cpu(), torch.arange(6.0).view(2, 3) + 1)


# -- a failed sync after a growth -------------------------------------------------------------

@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_a_failed_sync_after_a_growth_keeps_the_storage_as_it_was_grown(path, dev, fault):
    """The sync that would have run the growth fails: the tensor keeps its new size, its old
    elements their last synced values, and writes since that sync are dropped (as for any
    failed sync); the next step grows and writes as eager."""
    plant, error = FAULTS[fault]
    x = torch.arange(4.0, device=dev)
    views = [x[1:3]] if path == "legacy" else []
    x.add_(0)
    xc.sync()
    undo = plant()
    try:
        x.resize_(6)
        x[4:] = 7
        x.add_(1)
        with pytest.raises(error):
            xc.sync()
    finally:
        undo()
    assert x.shape == (6,)
    torch.testing.assert_close(x[:4].cpu(), torch.arange(4.0))
    for v in views:
        torch.testing.assert_close(v.cpu(), torch.tensor([1.0, 2.0]))
    x[4:] = 5
    x.add_(1)
    xc.sync()
    torch.testing.assert_close(x.cpu(), torch.tensor([1.0, 2.0, 3.0, 4.0, 6.0, 6.0]))
    for v in views:
        torch.testing.assert_close(v.cpu(), torch.tensor([2.0, 3.0]))
