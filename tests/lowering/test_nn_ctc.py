"""CTC loss matches CPU eager on both paths, with no CPU fallback: padded and concatenated
targets, empty targets, repeated labels, inputs too short for their target (infinite loss,
zero_infinity), every reduction, length lists or length tensors, and ATen's gradient formula.

Backward runs on the calling thread: a path activated with ``paths.activated`` is per thread,
and the autograd engine's device thread would create its own tensors on the default path.
"""
from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F

from tests.conftest import assert_same
from tests.lowering._core import core_no_fallback, dev  # noqa: F401 (autouse fixture)

T, N, C, S = 12, 4, 6, 5
INPUT_LENGTHS = [12, 10, 3, 7]
TARGET_LENGTHS = [5, 0, 3, 4]


def _targets(concatenated):
    torch.manual_seed(3)
    tg = torch.randint(1, C, (N, S))
    tg[3, 1] = tg[3, 2]                     # a repeated label needs a blank between them
    tg[2, :3] = torch.tensor([1, 1, 1])     # 3 frames cannot hold 1,_,1,_,1: infinite loss
    if concatenated:
        return torch.cat([tg[i, :TARGET_LENGTHS[i]] for i in range(N)])
    return tg


def _run(log_probs, targets, lengths_as_tensors, **kw):
    il, tl = INPUT_LENGTHS, TARGET_LENGTHS
    if lengths_as_tensors:
        il, tl = torch.tensor(il), torch.tensor(tl)
    expected_in = log_probs.clone().requires_grad_()
    expected = F.ctc_loss(expected_in, targets, il, tl, **kw)
    actual_in = dev(log_probs).requires_grad_()
    if lengths_as_tensors:
        il, tl = dev(il), dev(tl)
    actual = F.ctc_loss(actual_in, dev(targets), il, tl, **kw)
    assert_same(actual, expected.detach(), 1e-5, 1e-5)
    if torch.isfinite(expected).all():
        g = torch.rand_like(expected)
        (expected * g).sum().backward()
        with torch.autograd.set_multithreading_enabled(False):
            (actual * dev(g)).sum().backward()
        assert_same(actual_in.grad, expected_in.grad, 1e-4, 1e-5)


@pytest.mark.parametrize("concatenated,zero_infinity,reduction", list(itertools.product(
    [False, True], [False, True], ["none", "mean", "sum"])))
def test_ctc_loss_and_gradient_match_eager(path, concatenated, zero_infinity, reduction):
    torch.manual_seed(0)
    log_probs = torch.randn(T, N, C).log_softmax(-1)
    _run(log_probs, _targets(concatenated), False, reduction=reduction,
         zero_infinity=zero_infinity)


def test_ctc_gradient_of_unnormalised_log_probs_is_atens_formula(path):
    # ATen's gradient is exp(lp) - exp(lcab + nll - lp), right only through a log_softmax:
    # eager's value, not the true derivative, is what must come out
    torch.manual_seed(1)
    _run(torch.randn(T, N, C), _targets(False), False, reduction="sum", zero_infinity=True)


@pytest.mark.parametrize("concatenated", [False, True])
def test_ctc_with_length_tensors_on_the_device(path, concatenated):
    torch.manual_seed(2)
    _run(torch.randn(T, N, C).log_softmax(-1), _targets(concatenated), True,
         reduction="mean", zero_infinity=True)
