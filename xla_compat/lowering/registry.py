"""The one registry from aten overloads to lowering rules (pure functions on jax arrays).

A rule takes the op's arguments in aten's order, with every tensor replaced by a jax array
(lists of tensors by lists of arrays) and returns an array or a tuple of arrays, one per op
output. Mutating ops are lowered through their functional variant; a rule registered on a
mutating overload returns the new value of each mutated argument (after any fresh outputs).
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Callable

import torch

aten = torch.ops.aten


@dataclass(frozen=True, eq=False)
class Rule:
    """A lowering rule and how the tracer must call it (compared and hashed by identity:
    graph keys hash it for every node)."""

    fn: Callable
    name: str
    meta: bool = False      # pass aval=ShapeDtypeStruct (or a tuple of them) of the outputs
    static: bool = False    # keep Scalar arguments as compile-time constants
    random: bool = False    # pass key=<jax PRNG key>; the node threads the device RNG state
    # for a float16/bfloat16 node, ``own_rounding(*args, **kwargs)`` (the original arrays) says
    # whether the rule spells out eager's roundings itself for these arguments: opmath then
    # calls it unchanged instead of widening it (see opmath.call)
    own_rounding: Callable | None = None
    # lift the op's ``float``-typed arguments too (not only ``Scalar`` ones) into run-time
    # parameters: a learning rate a scheduler changes every step never recompiles (optim.py)
    lift_floats: bool = False


_RULES: dict = {}


def lowering(*ops, meta: bool = False, static: bool = False, random: bool = False,
             own_rounding: Callable | None = None, lift_floats: bool = False):
    """Register ``fn`` as the lowering of every aten overload (or packet) in ``ops``."""

    def register(fn):
        for op in ops:
            if isinstance(op, torch._ops.OpOverloadPacket):
                # a whole packet: not its out= overloads (the rule takes no out= argument;
                # they trace through their functional variant), which must be named to register
                overloads = [getattr(op, n) for n in op.overloads()]
                overloads = [ov for ov in overloads if not _writes_out(ov)]
            else:
                overloads = [op]
            for ov in overloads:
                if ov in _RULES:
                    _forget_plans()
                _RULES[ov] = Rule(fn, f"{fn.__module__.rsplit('.', 1)[-1]}.{fn.__name__}",
                                  meta, static, random, own_rounding, lift_floats)
        return fn

    return register


def _writes_out(ov) -> bool:
    return any(a.kwarg_only and a.alias_info is not None and a.alias_info.is_write
               for a in ov._schema.arguments)


def _forget_plans() -> None:
    """A rule changed: the tracer's plans hold the rules they were made with."""
    tracer = sys.modules.get("xla_compat.lazy.tracer")
    if tracer is not None:
        tracer.forget_plans()


def lookup(op) -> Rule | None:
    return _RULES.get(op)


def registered() -> dict:
    return dict(_RULES)


def override(op, fn) -> Callable[[], None]:
    """Replace one op's rule (test hooks plant bugs this way); returns the undo function."""
    before = _RULES.get(op)
    _forget_plans()
    _RULES[op] = Rule(fn, f"override.{getattr(fn, '__name__', 'fn')}",
                      before.meta if before else False, before.static if before else False,
                      before.random if before else False,
                      lift_floats=before.lift_floats if before else False)

    def undo():
        _forget_plans()
        if before is None:
            _RULES.pop(op, None)
        else:
            _RULES[op] = before

    return undo
