"""Small helpers shared by lowering families (dtype casts, dims, torch-style promotion)."""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from .. import _jax


def cast(x, dtype):
    """Convert like torch's ``.to(dtype)``: bool means nonzero (a complex value: either part),
    complex to any other real dtype keeps the real part."""
    dtype = np.dtype(dtype)
    if getattr(x, "dtype", None) == dtype:
        return x
    x = jnp.asarray(x)
    if dtype == np.bool_:
        return x != 0
    complex_in = jnp.issubdtype(x.dtype, jnp.complexfloating)
    if complex_in and not jnp.issubdtype(dtype, jnp.complexfloating):
        x = jnp.real(x)
    elif dtype == np.complex128 or (complex_in and x.dtype == np.complex128):
        if _jax.platform() == "tpu":
            return _complex_by_parts(x, dtype, complex_in)
    if x.dtype == np.bool_ and (jnp.issubdtype(dtype, jnp.inexact)):
        # XLA's simplifier rewrites convert(pred) * y as select(pred, y, 0) (and / y as
        # select(pred, 1 / y, 0)): 0 where eager's 0 * inf and 0 / 0 are NaN. The barrier keeps
        # the conversion a conversion.
        return lax.optimization_barrier(lax.convert_element_type(x, dtype))
    if (jnp.issubdtype(dtype, jnp.signedinteger) and jnp.issubdtype(x.dtype, jnp.signedinteger)
            and x.dtype.itemsize > dtype.itemsize):
        # XLA:CPU (jaxlib 0.10) crashes the process (SIGSEGV) compiling a fused and/or of a
        # signed integer with a conversion to its dtype from a wider signed integer
        # (``int32_tensor & int64_tensor.to(torch.int32)``); through the unsigned dtype of the
        # target's width the conversion truncates alike (two's complement) and compiles.
        x = lax.convert_element_type(x, np.dtype(f"uint{dtype.itemsize * 8}"))
    return lax.convert_element_type(x, dtype)


def _complex_by_parts(x, dtype, complex_in: bool):
    """A conversion to or from complex128, part by part: XLA:TPU aborts the process on a direct
    one ("Unsupported CVT X{64|128} expansion from c64 to c128"), while it converts float32 to
    float64 and builds complex128 from two float64s."""
    part = np.float64 if dtype == np.complex128 else np.float32
    re = lax.convert_element_type(jnp.real(x) if complex_in else x, part)
    im = lax.convert_element_type(jnp.imag(x), part) if complex_in else jnp.zeros_like(re)
    return lax.complex(re, im)


def to(dtype, *xs):
    """Cast every array argument to ``dtype`` (scalars too)."""
    return tuple(cast(x, dtype) for x in xs)


def dim(d: int, ndim: int) -> int:
    """Wrap a possibly negative dim (torch treats 0-d tensors as having one dim here)."""
    n = max(ndim, 1)
    return d % n if d < 0 else d


def dims(ds, ndim: int) -> tuple:
    if ds is None:
        return tuple(range(ndim))
    if isinstance(ds, int):
        ds = (ds,)
    return tuple(sorted(dim(d, ndim) for d in ds)) if ndim else ()


def is_float(dtype) -> bool:
    return jnp.issubdtype(dtype, jnp.floating) or jnp.issubdtype(dtype, jnp.complexfloating)


def is_int(dtype) -> bool:
    return jnp.issubdtype(dtype, jnp.integer)


def acc_dtype(dtype):
    """The accumulation dtype torch uses on CPU for reductions of ``dtype``."""
    if dtype in (jnp.float16, jnp.bfloat16):
        return jnp.float32
    return dtype
