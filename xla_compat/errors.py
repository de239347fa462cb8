"""The library's own exception types (imported by the modules that raise them, and by users through
``xla_compat``)."""
from __future__ import annotations


class UnsupportedOpError(NotImplementedError):
    """An op with no lowering while CPU fallback is disabled, or a tensor the device cannot hold
    (a sparse layout, a dtype XLA does not have)."""


class UnsupportedDtypeError(UnsupportedOpError):
    """A dtype the device does not hold (``complex32``, which XLA lacks; the float8 types): names
    the op and its inputs where an op asked for it. Not a ``TypeError``: torch's binary operators
    turn a ``TypeError`` into ``NotImplemented``, and Python then reports an unrelated
    "unsupported operand type(s)"."""
