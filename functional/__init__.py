"""The functional path: PyTorch functionalization over the hlo device (xla_compat.functional)."""
