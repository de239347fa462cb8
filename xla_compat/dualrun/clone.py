"""Cloning a step's arguments onto the shadow path, and naming the state a step can mutate.

Device tensors, modules (parameters, buffers, gradients, tensor attributes) and optimizers
(param groups and state) are copied onto the shadow path with identical values; containers are
rebuilt around the copies; anything else is shared between the two runs. A copy shares the
authoritative tensor's IR value, so cloning adds no computation and no transfer.
"""
from __future__ import annotations

import copy
from typing import Any, Iterator

import torch

from .. import dispatch, paths


def _is_container(x) -> bool:
    return isinstance(x, (list, tuple, dict))


def _tensor_to(t: torch.Tensor, shadow: str) -> torch.Tensor:
    """A detached copy of ``t`` on ``shadow`` (a CPU tensor stays a CPU copy)."""
    if paths.of(t) is None:
        out = t.detach().clone()
    else:
        out = dispatch.to_path(t.detach(), shadow)
        if out is t:
            out = t.detach().clone()
    if t.requires_grad and (out.is_floating_point() or out.is_complex()):
        out.requires_grad_(True)
    return out


class Cloner:
    """Copies objects onto ``shadow``; one memo, so shared tensors stay shared in the copy."""

    def __init__(self, shadow: str):
        self.shadow = shadow
        self.memo: dict[int, Any] = {}

    def tensor(self, t: torch.Tensor) -> torch.Tensor:
        hit = self.memo.get(id(t))
        if hit is not None:
            return hit
        if isinstance(t, torch.nn.Parameter):
            out = torch.nn.Parameter(_tensor_to(t, self.shadow), requires_grad=t.requires_grad)
        else:
            out = _tensor_to(t, self.shadow)
        if t.grad is not None:
            out.grad = _tensor_to(t.grad, self.shadow)
        self.memo[id(t)] = out
        return out

    def _seed_module(self, m: torch.nn.Module) -> None:
        for sub in m.modules():
            for p in sub._parameters.values():
                if p is not None:
                    self.tensor(p)
            for b in sub._buffers.values():
                if b is not None:
                    self.tensor(b)

    def _seed_optimizer(self, opt: torch.optim.Optimizer) -> None:
        for group in opt.param_groups:
            for p in group["params"]:
                self.tensor(p)
        for state in opt.state.values():
            for v in state.values():
                if isinstance(v, torch.Tensor):
                    self.tensor(v)

    def _seed(self, x) -> None:
        if isinstance(x, torch.nn.Module):
            self._seed_module(x)
        elif isinstance(x, torch.Tensor):
            self.tensor(x)
        elif isinstance(x, dict):
            for v in x.values():
                self._seed(v)
        elif _is_container(x):
            for v in x:
                self._seed(v)

    def _seed_optimizers(self, x) -> None:
        if isinstance(x, torch.optim.Optimizer):
            self._seed_optimizer(x)
        elif isinstance(x, dict):
            for v in x.values():
                self._seed_optimizers(v)
        elif _is_container(x):
            for v in x:
                self._seed_optimizers(v)

    def clone(self, x):
        """``x`` rebuilt on the shadow path (call ``clone_all`` for several related objects)."""
        if id(x) in self.memo:
            return self.memo[id(x)]
        if isinstance(x, torch.Tensor):
            return self.tensor(x)
        if isinstance(x, torch.nn.Module):
            out = copy.deepcopy(x, self.memo)
            self._fix_attributes(out)
            return out
        if isinstance(x, torch.optim.Optimizer):
            return copy.deepcopy(x, self.memo)
        if isinstance(x, dict):
            return type(x)((k, self.clone(v)) for k, v in x.items())
        if isinstance(x, tuple) and hasattr(x, "_fields"):     # namedtuple
            return type(x)(*(self.clone(v) for v in x))
        if isinstance(x, (list, tuple)):
            return type(x)(self.clone(v) for v in x)
        return x

    def clone_all(self, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        # Parameters first, so optimizers (which hold them) and modules map to the same copies.
        self._seed((args, kwargs))
        self._seed_optimizers((args, kwargs))
        return self.clone(args), self.clone(kwargs)

    def _fix_attributes(self, module: torch.nn.Module) -> None:
        """Plain tensor attributes (not parameters or buffers) deep-copied on the old path."""
        for sub in module.modules():
            for k, v in list(vars(sub).items()):
                if isinstance(v, torch.Tensor) and paths.of(v) not in (None, self.shadow):
                    setattr(sub, k, _tensor_to(v, self.shadow))


# -- the state a step can change, by name ------------------------------------------------------

def _param_names(x, prefix: str, out: dict) -> None:
    if isinstance(x, torch.nn.Module):
        for n, p in x.named_parameters(remove_duplicate=False):
            out.setdefault(id(p), f"{prefix}.{n}")
    elif isinstance(x, dict):
        for k, v in x.items():
            _param_names(v, f"{prefix}[{k!r}]", out)
    elif _is_container(x):
        for i, v in enumerate(x):
            _param_names(v, f"{prefix}[{i}]", out)


def named_state(args: tuple, kwargs: dict) -> dict[str, torch.Tensor | None]:
    """Every tensor the arguments hold, by a name that is the same for both paths' copies."""
    names: dict[int, str] = {}
    _param_names(args, "args", names)
    _param_names(kwargs, "kwargs", names)
    out: dict = {}
    for name, t in _walk(args, "args", names):
        out.setdefault(name, t)
    for name, t in _walk(kwargs, "kwargs", names):
        out.setdefault(name, t)
    return out


def _walk(x, prefix: str, names: dict) -> Iterator[tuple[str, Any]]:
    if isinstance(x, torch.Tensor):
        yield prefix, x
        if x.is_leaf and x.requires_grad:
            yield prefix + ".grad", x.grad
    elif isinstance(x, torch.nn.Module):
        for n, p in x.named_parameters(remove_duplicate=False):
            yield f"{prefix}.{n}", p
            yield f"{prefix}.{n}.grad", p.grad
        for n, b in x.named_buffers(remove_duplicate=False):
            yield f"{prefix}.{n}", b
    elif isinstance(x, torch.optim.Optimizer):
        for gi, group in enumerate(x.param_groups):
            for pi, p in enumerate(group["params"]):
                pname = names.get(id(p), f"{prefix}.param_groups[{gi}][{pi}]")
                for k, v in x.state.get(p, {}).items():
                    if isinstance(v, torch.Tensor):
                        yield f"{prefix}.state[{pname}].{k}", v
    elif isinstance(x, dict):
        for k, v in x.items():
            yield from _walk(v, f"{prefix}[{k!r}]", names)
    elif _is_container(x):
        for i, v in enumerate(x):
            yield from _walk(v, f"{prefix}[{i}]", names)


def versions(state: dict) -> dict[str, tuple]:
    """(identity, version counter) of each named tensor: a change means the step mutated it."""
    return {n: (None if t is None else (id(t), t._version)) for n, t in state.items()}


def alias_key(t: torch.Tensor):
    """Tensors with equal keys share storage (legacy: one Alias; functional/CPU: one storage)."""
    a = getattr(t, "_alias", None)
    if a is not None:
        return ("alias", id(a))
    try:    # (not t.untyped_storage(): on a functional wrapper that handle outlives the call,
            # and upstream's resize_ then refuses to grow the storage)
        return ("storage", torch._C._storage_id(t))
    except Exception:  # a tensor without storage: only identity counts
        return ("tensor", id(t))
