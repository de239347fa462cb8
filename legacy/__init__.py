"""The legacy path: the in-house view/alias tracker (xla_compat.legacy)."""
