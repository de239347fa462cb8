"""How a rule is called for its node: the hook where reduced-precision floating types (float16,
bfloat16) may compute in float32 as eager's CPU kernels do (see ``call``)."""
from __future__ import annotations


def call(rule, node, args: list, kwargs: dict):
    """``rule.fn(*args, **kwargs)`` for ``node`` (a ``lazy.ir.Node``)."""
    return rule.fn(*args, **kwargs)
