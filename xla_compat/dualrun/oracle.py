"""Naming the lowering behind a lockstep divergence: each IR node the divergent op created is
re-run by PyTorch on the CPU on the same input values; the first that disagrees is the culprit."""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from .. import _jax, executor
from ..lazy import ir, tracer
from ..lazy.ir import ScalarParam, Value
from ..lazy.tensor import DEVICE
from ..lazy.tracer import fill
from ..lowering.registry import Rule
from .compare import compare_arrays


def flat(x):
    """The leaves of nested lists, tuples and dicts."""
    if isinstance(x, (list, tuple)):
        for e in x:
            yield from flat(e)
    elif isinstance(x, dict):
        for e in x.values():
            yield from flat(e)
    else:
        yield x


def tree_map(x, fn):
    """``x`` with ``fn`` applied to each leaf of its nested lists, tuples and dicts."""
    if isinstance(x, tuple):
        return tuple(tree_map(e, fn) for e in x)
    if isinstance(x, list):
        return [tree_map(e, fn) for e in x]
    if isinstance(x, dict):
        return {k: tree_map(v, fn) for k, v in x.items()}
    return fn(x)


def where(source) -> Optional[str]:
    """``file:line`` of a recorded (file, line, function) source, or None."""
    return f"{source[0]}:{source[1]}" if source else None


def culprit(path: str, node, detail: str) -> dict:
    """The report entry naming ``node`` (on ``path``) as the lowering that went wrong."""
    return {"path": path, "op": node.op, "rule": getattr(node.rule, "name", None),
            "source": where(node.source), "function": node.source[2] if node.source else None,
            "inputs": [f"{v.aval.dtype}{list(v.aval.shape)}" for v in node.inputs
                       if type(v.node) is not ScalarParam],
            "detail": detail}


def window_nodes(values, first: int, last: int) -> list:
    """The non-leaf nodes under ``values`` created in (first, last), in creation order."""
    return sorted((n for n in ir.reaches(values) if first < n.id < last and not n.is_leaf),
                  key=lambda n: n.id)


def _cpu_arg(x):
    if isinstance(x, torch.device) and x.type == DEVICE.type:
        return torch.device("cpu")
    return x


def check(path: str, values, first: int, last: int) -> list[dict]:
    """Nodes created in (first, last) under ``values`` whose output differs from the aten op
    run by PyTorch on the CPU on the same input values, in creation order."""
    found = []
    for node in window_nodes(values, first, last):
        op = tracer.overload_named(node.op)
        rule = node.rule
        if op is None or not isinstance(rule, Rule) or rule.random or op._schema.is_mutable:
            continue
        outs = [Value(node, i) for i in range(len(node.avals))]
        graph = executor.collect(list(node.inputs) + outs)
        try:
            arrays = executor.build_function(graph)(*executor._params(graph))
        except Exception:  # cannot re-evaluate (a deleted buffer): no verdict on this node
            continue
        ins, got = arrays[:len(node.inputs)], arrays[len(node.inputs):]
        cpu_ins = [v.node.value if type(v.node) is ScalarParam else _jax.to_torch(a)
                   for v, a in zip(node.inputs, ins)]
        args = tree_map(fill(node.args, cpu_ins), _cpu_arg)
        kwargs = {k: tree_map(fill(v, cpu_ins), _cpu_arg) for k, v in node.kwargs}
        try:
            want = op(*args, **kwargs)
        except Exception:  # PyTorch cannot run it on the CPU: no verdict
            continue
        want = [w for w in flat(want) if isinstance(w, torch.Tensor)]
        for i, (g, w) in enumerate(zip(got, want)):
            w = w.detach()
            m = compare_arrays(f"{node.op} output {i}", np.asarray(w.float().numpy()
                                                                   if w.dtype == torch.bfloat16
                                                                   else w.numpy()),
                               np.asarray(g).astype(w.numpy().dtype if w.dtype != torch.bfloat16
                                                    else np.float32), w.dtype)
            if m is not None:
                found.append(culprit(path, node, m.detail))
                break
    return found
