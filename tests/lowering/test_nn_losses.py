"""Losses on hlo match CPU eager for every reduction, forward and gradient."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from xla_compat.lowering import registry
from xla_compat.lowering.registry import aten

from ._nn_check import check



@pytest.fixture(autouse=True)
def _seed_each_test():
    torch.manual_seed(0)     # inputs do not depend on which tests ran before
REDUCTIONS = ["none", "mean", "sum"]


def test_loss_ops_have_rules():
    for op in (aten.mse_loss.default, aten.mse_loss_backward.default,
               aten.binary_cross_entropy.default, aten.binary_cross_entropy_backward.default,
               aten.binary_cross_entropy_with_logits.default, aten.smooth_l1_loss.default,
               aten.smooth_l1_loss_backward.default, aten.huber_loss.default,
               aten.huber_loss_backward.default, aten.soft_margin_loss.default,
               aten.soft_margin_loss_backward.default, aten.multilabel_margin_loss_forward.default,
               aten.multilabel_margin_loss_backward.default, aten.multi_margin_loss.default,
               aten.multi_margin_loss_backward.default):
        assert registry.lookup(op) is not None, op


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_mse_loss(reduction):
    check(lambda x, t: F.mse_loss(x, t, reduction=reduction), torch.randn(4, 5), torch.randn(4, 5))


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_binary_cross_entropy(reduction):
    x = torch.rand(4, 5) * 0.98 + 0.01
    check(lambda x, t, w: F.binary_cross_entropy(x, t, w, reduction=reduction),
          x, torch.rand(4, 5), torch.rand(5), frozen=(1, 2))


def test_binary_cross_entropy_at_zero_and_one_clamps_like_eager():
    x = torch.tensor([0.0, 1.0, 0.5, 1e-30, 1 - 1e-7])
    check(lambda x, t: F.binary_cross_entropy(x, t, reduction="none"), x,
          torch.tensor([1.0, 0.0, 0.3, 1.0, 0.0]), frozen=(1,))


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_binary_cross_entropy_with_logits(reduction):
    x = torch.randn(4, 5) * 4
    t = torch.rand(4, 5)
    check(lambda x, t: F.binary_cross_entropy_with_logits(x, t, reduction=reduction), x, t)
    check(lambda x, t, w, pw: F.binary_cross_entropy_with_logits(
        x, t, w, reduction=reduction, pos_weight=pw), x, t, torch.rand(5), torch.rand(5) * 3,
        frozen=(2, 3))


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("beta", [1.0, 0.5])
def test_smooth_l1_and_huber(reduction, beta):
    x, t = torch.randn(6, 5) * 2, torch.randn(6, 5)
    check(lambda x, t: F.smooth_l1_loss(x, t, reduction=reduction, beta=beta), x, t)
    check(lambda x, t: F.huber_loss(x, t, reduction=reduction, delta=beta), x, t)


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_soft_margin_and_kl_div(reduction):
    x = torch.randn(4, 5)
    check(lambda x, t: F.soft_margin_loss(x, t, reduction=reduction), x,
          torch.randint(0, 2, (4, 5)).float() * 2 - 1, frozen=(1,))
    red = "batchmean" if reduction == "mean" else reduction
    check(lambda x, t: F.kl_div(x, t, reduction=red), F.log_softmax(x, 1), torch.rand(4, 5))
    check(lambda x, t: F.kl_div(x, t, reduction=red, log_target=True), F.log_softmax(x, 1),
          torch.randn(4, 5))


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_multilabel_margin_loss(reduction):
    x = torch.randn(3, 5)
    t = torch.tensor([[3, 0, -1, 1, 2], [1, 1, 4, 0, 2], [-1, 2, 3, 0, 0]])
    check(lambda x, t: F.multilabel_margin_loss(x, t, reduction=reduction), x, t)
    # One unbatched sample; flattened because torch 2.13's meta kernel gives reduction="none" a
    # shape of [1] where eager gives [] (the hlo tensor follows the meta kernel).
    check(lambda x, t: F.multilabel_margin_loss(x, t, reduction=reduction).reshape(-1), x[0], t[0])
    check(lambda x, t: F.multilabel_margin_loss(x, t, reduction=reduction).reshape(-1), x[0, 0],
          torch.tensor(0))


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("p", [1, 2])
def test_multi_margin_loss(reduction, p):
    x, t = torch.randn(4, 5), torch.tensor([0, 3, 4, 1])
    check(lambda x, t: F.multi_margin_loss(x, t, p=p, margin=0.7, reduction=reduction), x, t)
    check(lambda x, t, w: F.multi_margin_loss(x, t, p=p, weight=w, reduction=reduction), x, t,
          torch.rand(5), frozen=(2,))
    check(lambda x, t: F.multi_margin_loss(x, t, p=p, reduction=reduction), x[1], t[1:2])
    # A 0-d input: flattened, as torch 2.13's meta kernel gives reduction="none" the shape [1]
    # where eager gives [] (the hlo tensor follows the meta kernel).
    check(lambda x, t: F.multi_margin_loss(x, t, p=p, reduction=reduction).reshape(-1), x[1, 2],
          torch.tensor(0))


def test_cross_entropy_with_label_smoothing_and_probabilities():
    x = torch.randn(4, 5)
    check(lambda x, t: F.cross_entropy(x, t, label_smoothing=0.1), x, torch.tensor([0, 3, 4, 1]))
    check(lambda x, t: F.cross_entropy(x, t), x, torch.softmax(torch.randn(4, 5), 1), frozen=(1,))
