"""Normalisation on hlo matches CPU eager: outputs, gradients and running-statistics updates."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from xla_compat.lowering import registry
from xla_compat.lowering.registry import aten

from ._nn_check import check



@pytest.fixture(autouse=True)
def _seed_each_test():
    torch.manual_seed(0)     # inputs do not depend on which tests ran before


def test_norm_ops_have_rules():
    for op in (aten._native_batch_norm_legit_functional.default,
               aten._native_batch_norm_legit.no_stats,
               aten._native_batch_norm_legit_no_training.default,
               aten.native_batch_norm_backward.default,
               aten.native_group_norm.default, aten.native_group_norm_backward.default,
               aten.native_layer_norm.default, aten.native_layer_norm_backward.default):
        assert registry.lookup(op) is not None, op


def _bn_train(x, w, b, rm, rv):
    out = F.batch_norm(x, rm, rv, w, b, training=True, momentum=0.3, eps=1e-3)
    return out, rm, rv     # the running stats were updated in place


@pytest.mark.parametrize("shape", [(4, 3), (4, 3, 5), (2, 3, 4, 5), (2, 3, 2, 3, 4)])
def test_batch_norm_training_updates_running_stats_with_unbiased_var(shape):
    c = shape[1]
    check(_bn_train, torch.randn(shape) * 3 + 1, torch.randn(c), torch.randn(c),
          torch.randn(c), torch.rand(c) + 0.5, frozen=(3, 4))


def test_batch_norm_training_without_affine():
    check(lambda x, rm, rv: _bn_train(x, None, None, rm, rv), torch.randn(5, 2, 3),
          torch.zeros(2), torch.ones(2), frozen=(1, 2))


def test_batch_norm_without_running_stats_uses_batch_statistics():
    # dx = (dy - mean(dy) - proj) * invstd * w cancels to ~0 in places; such elements keep the
    # rounding of the O(1) terms (a few 1e-7 each), so absolute 5e-6 on the input gradient.
    check(lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True),
          torch.randn(3, 4, 5, 2), torch.randn(4), torch.randn(4), grad_atol=5e-6)


@pytest.mark.parametrize("shape", [(4, 3), (2, 3, 4, 5)])
def test_batch_norm_eval_uses_running_stats(shape):
    c = shape[1]
    check(lambda x, w, b, rm, rv: (F.batch_norm(x, rm, rv, w, b, training=False, eps=1e-4), rm, rv),
          torch.randn(shape), torch.randn(c), torch.randn(c), torch.randn(c),
          torch.rand(c) + 0.5, frozen=(3, 4))


def test_batch_norm_module_train_then_eval():
    bn = torch.nn.BatchNorm2d(3, momentum=None)    # cumulative average: momentum from a counter

    def run(x):
        m = copy.deepcopy(bn).to(x.device)
        m.train()
        y1 = m(x)
        y2 = m(x * 2 + 1)
        m.eval()
        return y1, y2, m(x), m.running_mean, m.running_var, m.num_batches_tracked

    check(run, torch.randn(2, 3, 4, 4))


def test_instance_norm():
    # (Its running stats are written through at::alias(running_mean).copy_: aliasing, which is
    # the paths' job, not the core's; the lowering only sees batch_norm on a reshaped input.)
    check(lambda x, w, b: F.instance_norm(x, weight=w, bias=b), torch.randn(2, 3, 4, 5),
          torch.randn(3), torch.randn(3))


@pytest.mark.parametrize("shape,groups", [((2, 6, 4, 5), 3), ((3, 4), 2), ((2, 4, 7), 4),
                                          ((2, 6, 2, 3, 2), 1)])
def test_group_norm(shape, groups):
    c = shape[1]
    check(lambda x, w, b: F.group_norm(x, groups, w, b, eps=1e-3),
          torch.randn(shape) * 2 + 1, torch.randn(c), torch.randn(c))


def test_group_norm_of_an_empty_batch():
    check(lambda x, w, b: F.group_norm(x, 1, w, b), torch.randn(0, 2), torch.randn(2),
          torch.randn(2))


def test_group_norm_without_affine():
    check(lambda x: F.group_norm(x, 2), torch.randn(2, 4, 3, 3))


@pytest.mark.parametrize("norm_shape", [(5,), (4, 5)])
def test_layer_norm(norm_shape):
    x = torch.randn(3, 4, 5) * 2 + 1
    check(lambda x, w, b: F.layer_norm(x, norm_shape, w, b), x, torch.randn(norm_shape),
          torch.randn(norm_shape))
    check(lambda x: F.layer_norm(x, norm_shape), x)
