"""Lowering rules, one module per op family, all registered into ``registry``."""
from . import registry  # noqa: F401
from .registry import lookup, lowering  # noqa: F401


def load_all() -> None:
    """Import every family so its rules register (idempotent)."""
    import importlib
    import pkgutil

    for mod in pkgutil.iter_modules(__path__):
        if mod.name not in ("registry",) and not mod.name.startswith("_"):
            importlib.import_module(f"{__name__}.{mod.name}")
