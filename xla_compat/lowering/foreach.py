"""``_foreach_*`` ops (what torch.optim's multi-tensor paths call): one per-tensor rule per list.

Each foreach op applies the matching single-tensor rule from the registry to every element, so a
foreach op computes exactly what the loop of single ops computes. The in-place overloads reach
here through their functional variants (``_foreach_add_.List`` -> ``_foreach_add.List``); Python
scalars (step sizes, bias corrections) arrive as traced jax scalars and never force a recompile.
"""
from __future__ import annotations

import jax.numpy as jnp

from . import registry
from ._helpers import cast
from .registry import aten, lowering


def _apply(base, *args, aval, **kwargs):
    """Call the registered rule of the single-tensor op ``base`` on one element."""
    rule = registry.lookup(base)
    if rule.meta:
        kwargs["aval"] = aval
    return rule.fn(*args, **kwargs)


def _avals(aval) -> tuple:
    return aval if isinstance(aval, tuple) else (aval,)


def _each(v, n: int) -> list:
    """A per-element argument: a list stays as is, a scalar or single tensor is repeated."""
    return list(v) if isinstance(v, (list, tuple)) else [v] * n


def _foreach_binary(name: str, base, *, alpha: bool = False):
    packet = getattr(aten, f"_foreach_{name}")
    ops = [getattr(packet, o) for o in ("List", "Scalar", "ScalarList", "Tensor")
           if o in packet.overloads()]

    @lowering(*ops, meta=True)
    def rule(xs, other, *, alpha=None, aval):
        avals = _avals(aval)
        kw = {} if alpha is None else {"alpha": alpha}
        return [_apply(base, x, y, aval=a, **kw)
                for x, y, a in zip(xs, _each(other, len(xs)), avals)]

    rule.__name__ = f"foreach_{name}"
    return rule


_foreach_binary("add", aten.add.Tensor, alpha=True)
_foreach_binary("sub", aten.sub.Tensor, alpha=True)
_foreach_binary("mul", aten.mul.Tensor)
_foreach_binary("div", aten.div.Tensor)
_foreach_binary("clamp_min", aten.clamp_min.Tensor)
_foreach_binary("clamp_max", aten.clamp_max.Tensor)
_foreach_binary("maximum", aten.maximum.default)
_foreach_binary("minimum", aten.minimum.default)
_foreach_binary("pow", aten.pow.Tensor_Tensor)


@lowering(aten._foreach_pow.ScalarAndTensor, meta=True)
def foreach_scalar_pow(base, exponents, *, aval):
    return [_apply(aten.pow.Scalar, base, e, aval=a) for e, a in zip(exponents, _avals(aval))]


def _pointwise(name: str, base):
    packet = getattr(aten, f"_foreach_{name}")

    @lowering(packet.Scalar, packet.ScalarList, meta=True)
    def rule(xs, t1s, t2s, value=1, *, aval):
        return [_apply(base, x, a1, a2, value=v, aval=a)
                for x, a1, a2, v, a in zip(xs, t1s, t2s, _each(value, len(xs)), _avals(aval))]

    rule.__name__ = f"foreach_{name}"
    # The .Tensor overloads (a CPU tensor of per-element scalars) become .ScalarList in host_values.


_pointwise("addcmul", aten.addcmul.default)
_pointwise("addcdiv", aten.addcdiv.default)


@lowering(aten._foreach_lerp.List, aten._foreach_lerp.Scalar, aten._foreach_lerp.ScalarList,
          meta=True)
def foreach_lerp(xs, ends, weight, *, aval):
    return [_apply(aten.lerp.Tensor, x, e, w, aval=a)
            for x, e, w, a in zip(xs, ends, _each(weight, len(xs)), _avals(aval))]


_UNARY = ("abs", "acos", "asin", "atan", "ceil", "cos", "cosh", "erf", "erfc", "exp", "expm1",
          "floor", "frac", "lgamma", "log", "log10", "log1p", "log2", "neg", "reciprocal",
          "round", "rsqrt", "sigmoid", "sign", "sin", "sinh", "sqrt", "tan", "tanh", "trunc")


def _foreach_unary(name: str):
    base = getattr(aten, name).default

    @lowering(getattr(aten, f"_foreach_{name}").default, meta=True)
    def rule(xs, *, aval):
        return [_apply(base, x, aval=a) for x, a in zip(xs, _avals(aval))]

    rule.__name__ = f"foreach_{name}"


for _name in _UNARY:
    _foreach_unary(_name)


@lowering(aten._foreach_norm.Scalar, static=True, meta=True)
def foreach_norm(xs, ord=2, dtype=None, *, aval):
    return [_apply(aten.linalg_vector_norm.default, x, ord, None, False, dtype=dtype, aval=a)
            for x, a in zip(xs, _avals(aval))]


@lowering(aten._foreach_powsum.Scalar, static=True, meta=True)
def foreach_powsum(xs, ord=2, dtype=None, *, aval):
    out = []
    for x, a in zip(xs, _avals(aval)):
        x = jnp.abs(cast(x, a.dtype))
        out.append(jnp.sum((x != 0).astype(a.dtype)) if ord == 0 else jnp.sum(x ** ord))
    return out


@lowering(aten._foreach_max.default)
def foreach_max(xs):
    return [jnp.max(x) for x in xs]


@lowering(aten._foreach_zero.default, meta=True)
def foreach_zero(xs, *, aval):
    return [jnp.zeros(a.shape, a.dtype) for a in _avals(aval)]


@lowering(aten._foreach_copy.default, meta=True)
def foreach_copy(xs, srcs, non_blocking=False, *, aval):
    return [jnp.broadcast_to(cast(s, a.dtype), a.shape) for s, a in zip(srcs, _avals(aval))]


@lowering(aten._foreach_clone.default)
def foreach_clone(xs, *, memory_format=None):
    return list(xs)


@lowering(aten._foreach_mm.default, meta=True)
def foreach_mm(xs, ys, *, aval):
    return [_apply(aten.mm.default, x, y, aval=a) for x, y, a in zip(xs, ys, _avals(aval))]
