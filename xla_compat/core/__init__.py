"""torch_xla-shaped API: ``import xla_compat.core.xla_model as xm`` in place of torch_xla's."""
