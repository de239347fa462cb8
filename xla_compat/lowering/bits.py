"""Bitwise logic: and, or, xor, not, in the promoted dtype (bool stays logical).

Shifts, gcd/lcm and the float bit ops live in ``math_misc.py``."""
from __future__ import annotations

import jax.numpy as jnp

from ._helpers import to
from .registry import aten, lowering


def _bitwise(ops, fn):
    @lowering(*ops, meta=True)
    def rule(x, y, *, aval):
        return fn(*to(aval.dtype, x, y))
    rule.__name__ = fn.__name__
    return rule


_bitwise((aten.bitwise_and.Tensor, aten.bitwise_and.Scalar, aten.bitwise_and.Scalar_Tensor,
          aten.__and__.Tensor, aten.__and__.Scalar), jnp.bitwise_and)
_bitwise((aten.bitwise_or.Tensor, aten.bitwise_or.Scalar, aten.bitwise_or.Scalar_Tensor,
          aten.__or__.Tensor, aten.__or__.Scalar), jnp.bitwise_or)
_bitwise((aten.bitwise_xor.Tensor, aten.bitwise_xor.Scalar, aten.bitwise_xor.Scalar_Tensor,
          aten.__xor__.Tensor, aten.__xor__.Scalar), jnp.bitwise_xor)


@lowering(aten.bitwise_not.default)
def bitwise_not(x):
    return ~x
