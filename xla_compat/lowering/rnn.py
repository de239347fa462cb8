"""Fused LSTM and GRU cells: what ``nn.LSTM``, ``nn.GRU``, ``nn.LSTMCell`` and ``nn.GRUCell`` run
on any PrivateUse1 device.

ATen's RNN code takes the fused-cell route (``_thnn_fused_lstm_cell`` / ``_thnn_fused_gru_cell``)
on CUDA, XPU and PrivateUse1 devices: the gate projections are matmuls, the cell one kernel. Those
kernels exist for CUDA only, so every LSTM or GRU on the device failed ("Could not run
'aten::_thnn_fused_lstm_cell' with arguments from the 'CPU' backend"). Here they are, with the
CUDA kernels' workspace layouts, which their backward ops read:

- LSTM: gates = input_gates + hidden_gates (+ biases), chunks i, f, g, o;
  ``cy = f * cx + i * g``, ``hy = o * tanh(cy)``; workspace = [i, f, g, o] after activation.
- GRU: chunks r, z, n of each side; ``r = sigmoid(ir + hr)``, ``z = sigmoid(iz + hz)``,
  ``n = tanh(in + r * hn)``, ``hy = n + z * (hx - n)``; workspace = [r, z, n, hx, hn].

Gates are computed in the accumulation type (float32 for float16/bfloat16), as the CUDA kernels'
``accscalar_t``.
"""
from __future__ import annotations

import jax.numpy as jnp
import torch
from jax import nn as jnn

from ..lazy import tracer
from ._helpers import cast
from .elementwise import compute_dtype
from .registry import aten, lowering

_LIB = torch.library.Library("aten", "IMPL")


def _acc(*xs):
    dt = xs[0].dtype
    acc = compute_dtype(dt)
    return dt, [None if x is None else x.astype(acc) for x in xs]


@lowering(aten._thnn_fused_lstm_cell.default)
def fused_lstm_cell(input_gates, hidden_gates, cx, input_bias=None, hidden_bias=None):
    dt, (ig, hg, c, bi, bh) = _acc(input_gates, hidden_gates, cx, input_bias, hidden_bias)
    gates = ig + hg
    if bi is not None:
        gates = gates + bi
    if bh is not None:
        gates = gates + bh
    i, f, g, o = jnp.split(gates, 4, axis=-1)
    i, f, g, o = jnn.sigmoid(i), jnn.sigmoid(f), jnp.tanh(g), jnn.sigmoid(o)
    cy = f * c + i * g
    hy = o * jnp.tanh(cy)
    workspace = jnp.concatenate([i, f, g, o], axis=-1)
    return cast(hy, dt), cast(cy, dt), cast(workspace, dt)


@lowering(aten._thnn_fused_lstm_cell_backward_impl.default)
def fused_lstm_cell_backward(grad_hy, grad_cy, cx, cy, workspace, has_bias):
    dt, (c, cyv, ws) = _acc(cx, cy, workspace)
    i, f, g, o = jnp.split(ws, 4, axis=-1)
    go = jnp.zeros_like(c) if grad_hy is None else grad_hy.astype(c.dtype)
    gc_in = jnp.zeros_like(c) if grad_cy is None else grad_cy.astype(c.dtype)
    tanh_cy = jnp.tanh(cyv)
    g_o = go * tanh_cy
    g_c = go * o * (1 - tanh_cy * tanh_cy) + gc_in
    g_i, g_f, g_g = g_c * g, g_c * c, g_c * i
    grad_cx = g_c * f
    grad_gates = jnp.concatenate([g_i * (1 - i) * i, g_f * (1 - f) * f, g_g * (1 - g * g),
                                  g_o * (1 - o) * o], axis=-1)
    if not has_bias:              # (its grad_bias is None)
        return cast(grad_gates, dt), cast(grad_cx, dt)
    return cast(grad_gates, dt), cast(grad_cx, dt), cast(jnp.sum(grad_gates, axis=0), dt)


@lowering(aten._thnn_fused_gru_cell.default)
def fused_gru_cell(input_gates, hidden_gates, hx, input_bias=None, hidden_bias=None):
    dt, (ig, hg, h, bi, bh) = _acc(input_gates, hidden_gates, hx, input_bias, hidden_bias)
    if bi is not None:
        ig = ig + bi
    if bh is not None:
        hg = hg + bh
    ir, iz, in_ = jnp.split(ig, 3, axis=-1)
    hr, hz, hn = jnp.split(hg, 3, axis=-1)
    r = jnn.sigmoid(ir + hr)
    z = jnn.sigmoid(iz + hz)
    n = jnp.tanh(in_ + r * hn)
    hy = n + z * (h - n)
    workspace = jnp.concatenate([r, z, n, h, hn], axis=-1)
    return cast(hy, dt), cast(workspace, dt)


@lowering(aten._thnn_fused_gru_cell_backward.default)
def fused_gru_cell_backward(grad_hy, workspace, has_bias):
    dt, (go, ws) = _acc(grad_hy, workspace)
    r, z, n, h, hn = jnp.split(ws, 5, axis=-1)
    g_z = go * (h - n) * (1 - z) * z
    grad_hx = go * z
    g_n = go * (1 - z) * (1 - n * n)
    g_hn = g_n * r
    g_r = g_n * hn * (1 - r) * r
    grad_input_gates = jnp.concatenate([g_r, g_z, g_n], axis=-1)
    grad_hidden_gates = jnp.concatenate([g_r, g_z, g_hn], axis=-1)
    if has_bias:
        bi, bh = jnp.sum(grad_input_gates, axis=0), jnp.sum(grad_hidden_gates, axis=0)
    else:
        bi = bh = jnp.zeros((0,), grad_input_gates.dtype)
    return tuple(cast(t, dt) for t in (grad_input_gates, grad_hidden_gates, grad_hx, bi, bh))


# -- meta kernels: none upstream for the GRU cell; the LSTM cell's refuses bias=None ----------------

def _gru_cell_meta(input_gates, hidden_gates, hx, input_bias=None, hidden_bias=None):
    b, h = hx.shape
    return torch.empty_like(hx), hx.new_empty((b, 5 * h))


def _gru_cell_backward_meta(grad_hy, workspace, has_bias):
    b, h = grad_hy.shape
    bias = (3 * h,) if has_bias else (0,)
    return (grad_hy.new_empty((b, 3 * h)), grad_hy.new_empty((b, 3 * h)),
            torch.empty_like(grad_hy), grad_hy.new_empty(bias), grad_hy.new_empty(bias))


for _name, _kernel in (("_thnn_fused_gru_cell", _gru_cell_meta),
                       ("_thnn_fused_gru_cell_backward", _gru_cell_backward_meta)):
    if not torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{_name}", "Meta"):
        _LIB.impl(_name, _kernel, "Meta")


@tracer.meta_arguments(aten._thnn_fused_lstm_cell.default)
def _lstm_bias_for_meta(func, args, kwargs):
    """torch's meta kernel checks the biases' devices without allowing None (``bias=False``
    LSTMs): it runs on zero biases instead (the shapes it gives do not depend on them)."""
    bound = tracer.bind(func, args, kwargs)
    if bound.get("input_bias") is not None and bound.get("hidden_bias") is not None:
        return args, kwargs
    gates = bound["input_gates"]
    zero = torch.zeros(gates.shape[-1], dtype=gates.dtype, device="meta")
    return (bound["input_gates"], bound["hidden_gates"], bound["cx"],
            zero if bound.get("input_bias") is None else bound["input_bias"],
            zero if bound.get("hidden_bias") is None else bound["hidden_bias"]), {}


# -- packed sequences: eager keeps ``batch_sizes`` on the CPU whatever the data's device ----------

@tracer.special(aten._pack_padded_sequence.default)
def _pack_padded_sequence(cls, func, args, kwargs):
    """(data, batch_sizes): ``batch_sizes`` comes from eager's own op on a CPU stand-in of the
    input's (time, batch) layout with one feature (so eager's checks of ``lengths`` are made as
    eager makes them, at the cost of time x batch numbers), and stays on the CPU as eager's does (PackedSequence
    refuses any other); ``data`` gathers the device input's rows in that order."""
    from .host_values import _host_values, _meta, _node
    b = tracer.bind(func, args, kwargs)
    x, lengths, batch_first = b["input"], _host_values(b["lengths"]), bool(b["batch_first"])
    stand = torch.zeros(tuple(x.shape[:2]) + (min(x.numel(), 1),))   # (an empty x: eager's error)
    _, batch_sizes = torch.ops.aten._pack_padded_sequence(stand, lengths, batch_first)
    width = x.shape[0] if batch_first else x.shape[1]
    rows = tuple(t * width + i for t, n in enumerate(batch_sizes.tolist()) for i in range(n))
    data = _node(func, _pack_rows, (x, rows, batch_first),
                 [_meta((len(rows),) + tuple(x.shape[2:]), x.dtype)], cls)[0]
    return data, batch_sizes


def _pack_rows(x, rows, batch_first):
    xt = jnp.swapaxes(x, 0, 1) if batch_first else x
    flat = xt.reshape((xt.shape[0] * xt.shape[1],) + xt.shape[2:])
    return flat[jnp.asarray(rows, jnp.int64)]
