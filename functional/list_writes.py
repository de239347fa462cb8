"""Functionalize kernels for the fused optimizer steps, which write several tensor lists.

Upstream's generated kernel for ``_fused_adam_`` (and AdamW, SGD, Adagrad) asks whether each
written list holds functional tensors; an empty list (``max_exp_avg_sqs`` without amsgrad, the
momentum buffers of momentum-free SGD) answers no, and the kernel then stops on an internal
assert ("mutating a non-functional tensor with a functional tensor"). Here a call on hlo
wrappers runs the functional variant on their inner tensors and gives each written wrapper its
new value, as upstream does for a list that is not empty; other calls keep upstream's kernel.
"""
from __future__ import annotations

import warnings

import torch

from xla_compat.lazy.tracer import bind, mutation_info

from .wrap import owns, sync_wrapper

aten = torch.ops.aten
_FUNCTIONALIZE = torch._C.DispatchKeySet(torch._C.DispatchKey.Functionalize)
_replace, _commit = torch._functionalize_replace, torch._functionalize_commit_update
_sync = torch._functionalize_sync

OPS = tuple(getattr(getattr(aten, name), overload)
            for name in ("_fused_adam_", "_fused_adamw_", "_fused_sgd_", "_fused_adagrad_")
            for overload in ("default", "tensor_lr"))


def _tensors(x):
    if isinstance(x, torch.Tensor):
        yield x
    elif isinstance(x, (list, tuple)):
        for e in x:
            yield from _tensors(e)


def _unwrap(x):
    if isinstance(x, (list, tuple)):
        return [_unwrap(e) for e in x]
    return sync_wrapper(x) if owns(x) else x


def _kernel(op):
    upstream = torch.library.get_kernel(op, "Functionalize")
    names, _, functional = mutation_info(op)

    def kernel(keyset, *args, **kwargs):
        if not any(owns(t) for t in _tensors((args, list(kwargs.values())))):
            return upstream.call_boxed(keyset, *args, **kwargs)
        bound = bind(op, args, kwargs)              # (the written lists have no defaults)
        written = [list(bound[n]) for n in names]
        for w in (w for ws in written for w in ws):
            if not owns(w):
                raise RuntimeError(
                    f"xla_compat: {op} writes a {w.device} tensor while others are on the hlo "
                    f"device (functional path); move every optimizer tensor with .to('hlo')")
        with torch._C._ExcludeDispatchKeyGuard(_FUNCTIONALIZE):
            out = functional(*_unwrap(list(args)), **{k: _unwrap(v) for k, v in kwargs.items()})
        for ws, values in zip(written, out):
            for w, value in zip(ws, values):
                _replace(w, value)
                _commit(w)
                _sync(w)
        return None
    return kernel


def install(lib) -> None:
    with warnings.catch_warnings():     # "overriding a previously registered kernel": meant
        warnings.simplefilter("ignore")
        for op in OPS:
            lib.impl(op.name().split("::")[1], _kernel(op), "Functionalize", with_keyset=True)
