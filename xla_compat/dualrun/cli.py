"""``python -m xla_compat report FILE``: registers the dual-run report subcommand."""
from .report import register_cli

register_cli()
