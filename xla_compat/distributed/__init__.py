"""Running past one device: SPMD sharding over a jax device mesh (``spmd``, torch_xla's ``xs``)."""
from __future__ import annotations

from . import spmd

__all__ = ["spmd"]
