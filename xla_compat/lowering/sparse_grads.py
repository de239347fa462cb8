"""``Embedding`` and ``EmbeddingBag`` with ``sparse=True``: a dense weight gradient on the device.

Eager gives these a sparse COO weight gradient. XLA arrays are dense, so on ``hlo`` the gradient
is the dense tensor with the same values (eager's ``grad.to_dense()``), as torch_xla does for
``EmbeddingBag``; a warning says so once per op. Optimizers that take sparse gradients (SGD,
Adagrad) update the same rows by the same amounts from it; ``SparseAdam`` refuses it (use
``Adam``). Before this, ``embedding``'s composite backward built the sparse tensor on the CPU
and the process aborted (legacy) or autograd raised a bare SystemError (functional).

Both backward ops get a kernel at AutogradPrivateUse1 that calls the dense backward op instead
(and the same as the tracer's handler, for inference mode, where the op reaches the tracer
whole): ``embedding_backward`` is a composite that autograd would decompose into the sparse
construction. The checks sit at the autograd key, not in the tracer, because an exception raised
while ``_embedding_bag_backward`` is in Python dispatch aborts the process ("terminate called
without an active exception"; measured on torch 2.13, both paths).
"""
from __future__ import annotations

import warnings

import torch

from .. import paths
from ..lazy import tracer
from .registry import aten

_warned: set = set()


def _dense_instead(op: str, grad, num_weights: int, scale_grad_by_freq: bool) -> None:
    """Eager's check of a sparse backward, then the warning (once per op)."""
    if scale_grad_by_freq:
        raise RuntimeError(
            "embedding_backward: scale_grad_by_freq not supported with sparse gradients")
    if op in _warned:
        return
    _warned.add(op)
    warnings.warn(
        f"xla_compat: {op}(sparse=True) on the {paths.of(grad) or 'core'} path: the weight "
        f"gradient ({str(grad.dtype).replace('torch.', '')}[{num_weights}, {grad.shape[-1]}]) "
        f"is a dense tensor on the hlo device (XLA arrays are dense), with the values of eager's "
        f"sparse gradient. SGD and Adagrad take it as they take a sparse one; SparseAdam needs "
        f"Adam instead. Pass sparse=False to silence this.", stacklevel=3)


def _embedding_backward_for_hlo(grad, indices, num_weights, padding_idx, scale_grad_by_freq,
                                sparse):
    if sparse:
        _dense_instead("embedding", grad, num_weights, scale_grad_by_freq)
    return aten.embedding_dense_backward(grad, indices, num_weights, padding_idx,
                                         scale_grad_by_freq)


_LIB = torch.library.Library("aten", "IMPL")
_LIB.impl("embedding_backward", _embedding_backward_for_hlo, "AutogradPrivateUse1")


@tracer.special(aten.embedding_backward.default)
def _embedding_backward_reaching_the_tracer(cls, func, args, kwargs):
    return _embedding_backward_for_hlo(*args, **kwargs)


def _embedding_bag_backward_for_hlo(grad, indices, offsets, offset2bag, bag_size,
                                    maximum_indices, num_weights, scale_grad_by_freq, mode, sparse,
                                    per_sample_weights, padding_idx=-1):
    if sparse:
        _dense_instead("embedding_bag", grad, num_weights, scale_grad_by_freq)
    return aten._embedding_bag_dense_backward(grad, indices, offset2bag, bag_size,
                                              maximum_indices, num_weights, scale_grad_by_freq,
                                              mode, per_sample_weights, padding_idx)


_LIB.impl("_embedding_bag_backward", _embedding_bag_backward_for_hlo, "AutogradPrivateUse1")


@tracer.special(aten._embedding_bag_backward.default)
def _embedding_bag_backward_reaching_the_tracer(cls, func, args, kwargs):
    return _embedding_bag_backward_for_hlo(*args, **kwargs)
