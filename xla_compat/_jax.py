"""The one place that configures jax and converts between torch and jax dtypes and arrays."""
from __future__ import annotations

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from .errors import UnsupportedDtypeError  # noqa: E402

_TORCH_TO_JAX = {
    torch.float32: jnp.float32,
    torch.float64: jnp.float64,
    torch.float16: jnp.float16,
    torch.bfloat16: jnp.bfloat16,
    torch.int64: jnp.int64,
    torch.int32: jnp.int32,
    torch.int16: jnp.int16,
    torch.int8: jnp.int8,
    torch.uint8: jnp.uint8,
    torch.uint16: jnp.uint16,
    torch.uint32: jnp.uint32,
    torch.uint64: jnp.uint64,
    torch.bool: jnp.bool_,
    torch.complex64: jnp.complex64,
    torch.complex128: jnp.complex128,
}
# numpy dtype objects throughout, so avals hash alike whether they came from jax or torch.
_TORCH_TO_JAX = {k: np.dtype(v) for k, v in _TORCH_TO_JAX.items()}
_JAX_TO_TORCH = {v: k for k, v in _TORCH_TO_JAX.items()}

# torch's .numpy() cannot export bfloat16; it travels as int16 bits.
_BITCAST = {torch.bfloat16: (torch.int16, ml_dtypes.bfloat16)}


def platform() -> str:
    """The platform graphs compile for: jax's default backend ("cpu", "gpu", "tpu")."""
    global _PLATFORM
    if _PLATFORM is None:
        _PLATFORM = jax.default_backend()
    return _PLATFORM


_PLATFORM = None


def to_jax_dtype(dtype: torch.dtype):
    try:
        return _TORCH_TO_JAX[dtype]
    except KeyError:
        raise UnsupportedDtypeError(
            f"xla_compat: dtype {dtype} is not supported on the hlo device; convert to a "
            f"supported dtype first (complex32: complex64; the float8 types: float16 or "
            f"bfloat16)") from None


def to_torch_dtype(dtype) -> torch.dtype:
    return _JAX_TO_TORCH[np.dtype(dtype)]


def supported(dtype: torch.dtype) -> bool:
    return dtype in _TORCH_TO_JAX


def device():
    """The jax device that backs hlo:0."""
    return jax.devices()[0]


def from_torch(t: torch.Tensor) -> jax.Array:
    """Copy a CPU tensor into a jax array on the backing device (one host copy).

    The copy is ours alone: ``.numpy()`` on the caller's tensor would make torch mark its
    storage non-resizable (a later eager ``out=`` resize of it raises), and on a CPU backend
    ``device_put`` may keep pointing at the host buffer it is given, so handing it the caller's
    memory would let a later in-place write on the CPU tensor change the device value.
    ``copy_`` also lays the copy out contiguously and resolves conj/neg bits.
    """
    host = torch.empty(t.shape, dtype=t.dtype)
    host.copy_(t.detach())
    if t.dtype in _BITCAST:
        as_int, np_dtype = _BITCAST[t.dtype]
        array = host.view(as_int).numpy().view(np_dtype)
    else:
        array = host.numpy()
    return jax.device_put(array, device())


def to_torch(a: jax.Array) -> torch.Tensor:
    """Copy a jax array into a fresh, writable CPU tensor."""
    host = np.asarray(a)
    dtype = to_torch_dtype(host.dtype)
    if dtype in _BITCAST:
        as_int, _ = _BITCAST[dtype]
        return torch.from_numpy(host.view(np.int16).copy()).view(dtype)
    return torch.from_numpy(np.array(host, copy=True))
