"""Discrete Fourier transforms: aten's three FFT primitives (every torch.fft function, stft and
istft decompose to them) lowered to XLA's FFT through jnp.fft.

ATen's ``normalization`` is an ``fft_norm_mode``: 0 none, 1 by 1/sqrt(n), 2 by 1/n, where n is
the product of the signal sizes over ``dim`` (the output's for c2r). The scale applies in the
direction the op runs, whatever that direction is.
"""
from __future__ import annotations

import jax.numpy as jnp

from ._helpers import cast
from .registry import aten, lowering

# jnp.fft's `norm` puts 1/n on one direction: "backward" (the default) on the inverse,
# "forward" on the forward transform, "ortho" 1/sqrt(n) on both.
_FORWARD_NORM = {0: "backward", 1: "ortho", 2: "forward"}
_INVERSE_NORM = {0: "forward", 1: "ortho", 2: "backward"}


def _axes(dim, ndim):
    return tuple(d % ndim for d in dim)


@lowering(aten._fft_r2c.default, meta=True, static=True)
def fft_r2c(x, dim, normalization, onesided, *, aval):
    """Forward real-to-complex over ``dim``; ``onesided`` keeps n//2+1 entries of the LAST dim
    listed (its Hermitian half), as ``rfftn`` does with ``axes[-1]``."""
    axes = _axes(dim, x.ndim)
    norm = _FORWARD_NORM[normalization]
    if onesided:
        out = jnp.fft.rfftn(x, axes=axes, norm=norm)
    else:
        out = jnp.fft.fftn(cast(x, aval.dtype), axes=axes, norm=norm)
    return cast(out, aval.dtype)


@lowering(aten._fft_c2c.default, meta=True, static=True)
def fft_c2c(x, dim, normalization, forward, *, aval):
    """Complex-to-complex over ``dim``, forward (e^-i) or backward (e^+i); an empty ``dim`` copies."""
    if not dim:
        return x
    axes = _axes(dim, x.ndim)
    if forward:
        out = jnp.fft.fftn(x, axes=axes, norm=_FORWARD_NORM[normalization])
    else:
        out = jnp.fft.ifftn(x, axes=axes, norm=_INVERSE_NORM[normalization])
    return cast(out, aval.dtype)


@lowering(aten._fft_c2r.default, meta=True, static=True)
def fft_c2r(x, dim, normalization, last_dim_size, *, aval):
    """Backward complex-to-real over ``dim``: the input holds the Hermitian half of the LAST dim
    listed, the output has ``last_dim_size`` entries there (other dims keep their sizes). As in
    pocketfft/MKL, the imaginary parts a real signal cannot have (DC, Nyquist) are ignored."""
    axes = _axes(dim, x.ndim)
    sizes = tuple(x.shape[a] for a in axes[:-1]) + (last_dim_size,)
    out = jnp.fft.irfftn(x, s=sizes, axes=axes, norm=_INVERSE_NORM[normalization])
    return cast(out, aval.dtype)
