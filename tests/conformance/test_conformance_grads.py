"""A CI-sized slice of the gradient conformance run (``make conformance-grads``): one sample of
one op per family, each path, gradients equal to CPU eager's with no CPU fallback; and the run
catches a backward that is wrong on the device."""
from __future__ import annotations

import functools

import pytest
import torch

from tests.conftest import PATHS
from xla_compat.lowering import registry

from . import grads, harness

aten = torch.ops.aten
# The backward formulas run as device ops through the lowering rules both paths share: make test
# runs each op's case on one path (alternating), make test-slow the other (tests/sampling.py).
ALTERNATE_PATHS = True
# Each op's backward runs other aten ops: pooling's window scatter, conv's transposed conv,
# norms' reductions, indexing's scatter-add, cumulative ops' flips, eigh's gauge-free loss.
SLICE = ("sin", "nn.functional.softplus", "nn.functional.conv2d", "nn.functional.max_pool2d",
         "nn.functional.layer_norm", "nn.functional.cross_entropy", "index_select", "gather",
         "cumsum", "logcumsumexp", "linalg.eigh", "matmul", "nn.functional.interpolate.bilinear",
         "amax", "where")


@functools.lru_cache(maxsize=1)
def _op_db() -> dict:
    from torch.testing._internal.common_methods_invocations import op_db
    return {harness.full_name(op): op for op in op_db}


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("name", SLICE)
def test_gradients_match_cpu_eager(path, name):
    tally = grads.run_op(_op_db()[name], path, cap=1)
    assert tally.failed == 0 and tally.fallback == 0, tally.first_error or tally.fallback_ops
    assert tally.passed >= 1, tally.skip_reason


def test_a_wrong_backward_on_the_device_is_a_failure():
    """sin's backward multiplies by cos: a cos that is off on the device must fail the sample."""
    import jax.numpy as jnp

    def cos_off(x, **_):
        return jnp.cos(x) + 0.5
    undo = registry.override(aten.cos.default, cos_off)
    try:
        tally = grads.run_op(_op_db()["sin"], PATHS[0], cap=1)
    finally:
        undo()
    assert tally.failed == 1 and "gradient 0" in tally.first_error, tally


def test_skipped_ops_say_why():
    tally = grads.run_op(_op_db()["nn.functional.multi_head_attention_forward"], PATHS[0])
    assert tally.skipped == 1 and "dropout" in tally.skip_reason
