"""Factories reached with a device tensor or an out= tensor: arange, range, linspace, full, eye,
*_like."""
from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from ..lazy import tracer
from ._helpers import cast, is_float
from .registry import aten, lowering


@lowering(aten.arange.start_step, aten.arange.start, aten.arange.default, aten.arange.start_out,
          aten.arange.out, meta=True)
def arange(start, end=None, step=1, *, aval, **_):
    if end is None:
        start, end = 0, start
    n = aval.shape[0]
    # torch computes start + i * step in double for floating results, then rounds once.
    acc = jnp.float64 if is_float(aval.dtype) else jnp.int64
    i = lax.iota(acc, n)
    return cast(cast(start, acc) + i * cast(step, acc), aval.dtype)


@tracer.meta_arguments(aten.arange.start_out, aten.arange.out)
def _arange_meta_arguments(func, args, kwargs):
    """An integer result other than int64 of fractional bounds or step (``arange(0, 1, 0.3,
    dtype=int8)``): eager counts ``ceil((end - start) / step)`` elements in double (and steps
    by the step converted to int64, which the rule does); torch's meta kernel converts the step
    first and refused a step of 0. (For int64 eager converts all three first, as the meta
    kernel does.) The meta kernel runs on ``arange(0, n, 1)`` of the same out."""
    b = tracer.bind(func, args, kwargs)
    out = b.get("out")
    start, end, step = b.get("start", 0), b.get("end"), b.get("step", 1)
    numbers = (start, end, step)
    if (not isinstance(out, torch.Tensor) or out.dtype.is_floating_point or out.dtype.is_complex
            or out.dtype in (torch.int64, torch.bool)
            or not all(type(v) in (int, float, bool) for v in numbers)
            or all(float(v).is_integer() for v in numbers) or float(step) == 0):
        return args, kwargs
    n = math.ceil((float(end) - float(start)) / float(step))
    if n < 0:
        return args, kwargs           # (eager's bound-sign check, the meta kernel's words)
    return ((n,) if func is aten.arange.out else (0, n, 1)), {"out": out}


@lowering(aten.range.default, aten.range.step, aten.range.out, aten.range.out_, meta=True)
def range_(start, end, step=1, *, aval, **_):
    """``torch.range`` (deprecated; its end included): ``start + i * step`` as arange computes
    it."""
    return arange(start, end, step, aval=aval)


_RANGE = ("default", "out", "Tensor_Tensor", "Tensor_Scalar", "Scalar_Tensor", "Tensor_Tensor_out",
          "Tensor_Scalar_out", "Scalar_Tensor_out")


@lowering(*[getattr(aten.linspace, o) for o in _RANGE], static=True, meta=True)
def linspace(start, end, steps, *, aval, **_):
    if steps == 1:
        return jnp.full((1,), cast(start, aval.dtype), aval.dtype).reshape(1)
    # Eager's kernel converts the ends to the output type first (4.3 -> 4 for int64), then steps
    # in the output type (double for integer outputs), from both ends.
    acc = aval.dtype if is_float(aval.dtype) else jnp.float64
    s, e = cast(cast(start, aval.dtype), acc), cast(cast(end, aval.dtype), acc)
    step = (e - s) / cast(steps - 1, acc)
    i = lax.iota(acc, steps)
    out = jnp.where(i < steps // 2, s + step * i, e - step * (cast(steps - 1, acc) - i))
    return cast(out, aval.dtype)


@lowering(*[getattr(aten.logspace, o) for o in _RANGE], static=True, meta=True)
def logspace(start, end, steps, base=10.0, *, aval, **_):
    """Eager's kernel: ends converted to the output type, then base ** (start + step * i) in
    double (float for integer outputs), from both ends."""
    if steps <= 1:  # eager fills with base ** start, start as given (not converted)
        return jnp.full((steps,), jnp.power(cast(base, jnp.float64), cast(start, jnp.float64)),
                        jnp.float64).astype(aval.dtype) if steps else jnp.zeros((0,), aval.dtype)
    acc = jnp.float64 if is_float(aval.dtype) else jnp.float32
    s, e = cast(start, aval.dtype), cast(end, aval.dtype)
    step = cast(e - s, acc) / (steps - 1)
    i = lax.iota(acc, steps)
    s, e = cast(s, acc), cast(e, acc)
    exponent = jnp.where(i < steps // 2, s + step * i, e - step * (steps - 1 - i))
    return cast(jnp.power(cast(base, acc), exponent), aval.dtype)


@lowering(aten.full.default, aten.full_like.default, aten.full.out, meta=True)
def full(*args, aval, **_):
    return jnp.full(aval.shape, cast(args[1], aval.dtype), aval.dtype)


@lowering(aten.new_full.default, meta=True)
def new_full(x, size, value, *, aval, **_):
    return jnp.full(aval.shape, cast(value, aval.dtype), aval.dtype)


@lowering(aten.zeros_like.default, aten.empty_like.default, aten.new_zeros.default,
          aten.new_empty.default, aten.new_empty_strided.default, aten.zeros.default,
          aten.empty.memory_format, aten.empty_strided.default, aten.empty_permuted.default,
          aten.zeros.out, meta=True)
def zeros(*args, aval, **_):
    return jnp.zeros(aval.shape, aval.dtype)


@lowering(aten.ones_like.default, aten.new_ones.default, aten.ones.default, aten.ones.out,
          meta=True)
def ones(*args, aval, **_):
    return jnp.ones(aval.shape, aval.dtype)


@lowering(aten.eye.default, aten.eye.m, aten.eye.out, aten.eye.m_out, meta=True)
def eye(*args, aval, **_):
    n, m = aval.shape
    return jnp.eye(n, m, dtype=aval.dtype)


@lowering(aten.kaiser_window.default, aten.kaiser_window.periodic, aten.kaiser_window.beta,
          aten.kaiser_window.out, aten.kaiser_window.periodic_out, aten.kaiser_window.beta_out,
          static=True, meta=True)
def kaiser_window(length, periodic=True, beta=12.0, *, aval, **_):
    """Eager's kernel: I0(beta * sqrt(|1 - ((i - a) / a)^2|)) / I0(beta), a = (n - 1) / 2, with
    n one longer and the last point dropped when ``periodic``; computed in the dtype's
    accumulation type (float32 for float16/bfloat16), its I0 eager's Chebyshev series."""
    from .elementwise import compute_dtype
    from .special import _i0
    if length == 0:
        return jnp.zeros((0,), aval.dtype)
    if length == 1:
        return jnp.ones((1,), aval.dtype)
    n = length + 1 if periodic else length
    acc = compute_dtype(aval.dtype) if is_float(aval.dtype) else jnp.float32
    alpha = jnp.asarray((n - 1) / 2.0, acc)
    i = lax.iota(acc, n)
    ratio = (i - alpha) / alpha
    w = _i0(jnp.asarray(beta, acc) * jnp.sqrt(jnp.abs(1 - ratio * ratio))) / _i0(
        jnp.asarray(beta, acc))
    return cast(w[:length], aval.dtype)


@lowering(aten.scalar_tensor.default, meta=True)
def scalar_tensor(s, *, aval, **_):
    return cast(s, aval.dtype)


# -- triu_indices / tril_indices: no tensor argument reaches the Python key, so they are kernels --
# for the device key. The indices depend only on static sizes: a constant built on the host
# (row-major, as eager orders them) and transferred, never a CPU fallback of the op.

def _indices(which):
    def kernel(row, col, offset=0, *, dtype=torch.int64, layout=None, device=None,
               pin_memory=None):
        from ..device import _check_device
        from .eager_checks import factory_dtype_check
        _check_device(device)
        factory_dtype_check(lambda: getattr(torch, f"{which}_indices")(1, 1, dtype=dtype),
                            dtype, f"{which}_indices")
        if row == 0 or col == 0:
            idx = np.zeros((2, 0), np.int64)
        else:
            idx = np.stack(getattr(np, f"{which}_indices")(row, offset, col)).astype(np.int64)
        return torch.from_numpy(idx).to(dtype or torch.int64).to(device or "hlo")
    kernel.__name__ = f"{which}_indices"
    return kernel


def _kaiser_window(window_length, periodic=True, beta=12.0, *, dtype=None, layout=None,
                   device=None, pin_memory=None):
    """``torch.kaiser_window`` on the device: eager's composite fills its result through a
    CPU-only kernel stub (an internal assert on any other device); its out= form, on a device
    tensor, reaches the lowering above."""
    from ..device import _check_device
    from .eager_checks import factory_dtype_check
    _check_device(device)
    dtype = dtype or torch.get_default_dtype()
    probe = window_length if window_length < 2 else 2       # (0 and 1 return early in eager)
    factory_dtype_check(lambda: torch.kaiser_window(probe, periodic, beta, dtype=dtype), dtype,
                        "kaiser_window")
    out = torch.empty(0, dtype=dtype, device=device or "hlo")
    return torch.ops.aten.kaiser_window.beta_out(window_length, periodic, beta, out=out)


def _efficientzerotensor(size, *, dtype=None, layout=None, device=None, pin_memory=None):
    """Autograd's zero tensors (forward-mode AD, ``torch.func.hessian``): plain zeros on the
    device (eager's are storage-free ZeroTensors; the values are the same)."""
    from ..device import _check_device
    _check_device(device)
    return torch.zeros(size, dtype=dtype or torch.get_default_dtype(), device=device or "hlo")


_lib = torch.library.Library("aten", "IMPL")
_lib.impl("_efficientzerotensor", _efficientzerotensor, "PrivateUse1")
_lib.impl("triu_indices", _indices("triu"), "PrivateUse1")
_lib.impl("tril_indices", _indices("tril"), "PrivateUse1")
for _overload in ("kaiser_window", "kaiser_window.periodic", "kaiser_window.beta"):
    _lib.impl(_overload, _kaiser_window, "PrivateUse1")
