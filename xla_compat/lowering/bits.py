"""Bit-level and integer ops: bitwise logic and shifts, gcd/lcm, and the float bit ops frexp,
ldexp and nextafter. Shifts follow eager's kernels: out-of-range counts do not wrap."""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from ._helpers import cast, to
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


def _shift_operands(x, y, aval):
    x, y = to(aval.dtype, x, y)
    return jnp.broadcast_to(x, aval.shape), jnp.broadcast_to(y, aval.shape)


@lowering(aten.bitwise_left_shift.Tensor, aten.bitwise_left_shift.Tensor_Scalar,
          aten.bitwise_left_shift.Scalar_Tensor, aten.__lshift__.Tensor, aten.__lshift__.Scalar,
          meta=True)
def left_shift(x, y, *, aval):
    """Eager: a count < 0 or >= the bit width gives 0 (XLA's shift_left does the same)."""
    x, y = _shift_operands(x, y, aval)
    bits = np.dtype(aval.dtype).itemsize * 8
    out = lax.shift_left(x, y)
    return jnp.where((y < 0) | (y >= bits), jnp.zeros((), aval.dtype), out)


@lowering(aten.bitwise_right_shift.Tensor, aten.bitwise_right_shift.Tensor_Scalar,
          aten.bitwise_right_shift.Scalar_Tensor, aten.__rshift__.Tensor, aten.__rshift__.Scalar,
          meta=True)
def right_shift(x, y, *, aval):
    """Eager: a count < 0 or past the value bits shifts by the largest count (sign fill)."""
    x, y = _shift_operands(x, y, aval)
    signed = jnp.issubdtype(aval.dtype, jnp.signedinteger)
    max_shift = np.dtype(aval.dtype).itemsize * 8 - int(signed)
    y = jnp.where((y < 0) | (y >= max_shift), jnp.asarray(max_shift, aval.dtype), y)
    return lax.shift_right_arithmetic(x, y) if signed else lax.shift_right_logical(x, y)


def _gcd(a, b):
    a, b = jnp.abs(a), jnp.abs(b)

    def body(state):
        a, b = state
        nonzero = a != 0
        safe = jnp.where(nonzero, a, 1)
        return jnp.where(nonzero, b % safe, a), jnp.where(nonzero, a, b)

    _, b = lax.while_loop(lambda s: jnp.any(s[0] != 0), body, (a, b))
    return b


@lowering(aten.gcd.default, meta=True)
def gcd(x, y, *, aval):
    x, y = _shift_operands(x, y, aval)
    return _gcd(x, y)


@lowering(aten.lcm.default, meta=True)
def lcm(x, y, *, aval):
    """Eager: |a / gcd * b|, 0 when the gcd is 0."""
    x, y = _shift_operands(x, y, aval)
    g = _gcd(x, y)
    safe = jnp.where(g == 0, jnp.ones((), aval.dtype), g)
    return jnp.where(g == 0, jnp.zeros((), aval.dtype), jnp.abs(lax.div(x, safe) * y))


@lowering(aten.nextafter.default, meta=True)
def nextafter(x, y, *, aval):
    x, y = to(aval.dtype, x, y)
    return jnp.nextafter(x, y)


@lowering(aten.frexp.Tensor, meta=True)
def frexp(x, *, aval):
    """Mantissa in [0.5, 1) and exponent like C's frexp; inf and NaN keep the value, exponent 0."""
    m, e = jnp.frexp(x)
    finite = jnp.isfinite(x)
    return (jnp.where(finite, m, x).astype(aval[0].dtype),
            jnp.where(finite, e, 0).astype(aval[1].dtype))


@lowering(aten.ldexp.Tensor, meta=True)
def ldexp(x, other, *, aval):
    """Eager's composite: x * pow(2.0, other), the power in other's float type."""
    p_dtype = other.dtype if jnp.issubdtype(other.dtype, jnp.floating) else jnp.float32
    p = jnp.power(jnp.asarray(2.0, p_dtype), cast(other, p_dtype))
    return cast(x, aval.dtype) * cast(p, aval.dtype)
