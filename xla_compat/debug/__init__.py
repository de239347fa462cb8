"""torch_xla-shaped debugging API: ``import xla_compat.debug.metrics as met``."""
