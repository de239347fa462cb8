"""torch.compile's dynamo calls this library's code instead of tracing into it.

Dynamo symbolically runs the Python a compiled function calls, unless the file lies in one of
its skipped directories. A legacy-path tensor is a Python subclass dynamo cannot trace, so it
breaks the graph and runs the module as written; but before each break it had read into the
path's dispatch code, whose loops over the process's live tensors, plans and caches grow with
the job. A three-layer module took 6 s to compile in a fresh process and 207 s in a worker of
the test suite. With the library's directories skipped, dynamo calls into them as it calls into
C code: 0.3 s, the same values.

Importing ``torch._dynamo`` costs a second, so nothing here imports it: the directories are
handed to dynamo when it is imported (a one-shot import hook) or at once if it already is. The
core registers its own package; each path package registers its directory (``skip``).
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import logging
import sys
import threading

_RULES = "torch._dynamo.trace_rules"
_lock = threading.Lock()
_packages: list[str] = []        # import names whose directories dynamo skips
_watching = False
log = logging.getLogger(__name__)


def skip(package: str) -> None:
    """Have dynamo call into, never trace, the modules of ``package`` (an import name, e.g.
    ``"xla_compat.legacy"``): now if dynamo is loaded, else as soon as it is."""
    global _watching
    with _lock:
        if package in _packages:
            return
        _packages.append(package)
        rules = sys.modules.get(_RULES)
        if rules is None or not hasattr(rules, "add"):
            if not _watching:
                sys.meta_path.insert(0, _Watch())
                _watching = True
            return
    _hand_over(rules, [package])


def _hand_over(rules, packages) -> None:
    for name in packages:
        try:
            rules.add(name)
        except Exception as e:  # noqa: BLE001 - a changed dynamo API only costs compile time
            log.debug("xla_compat: dynamo did not take %s as a skipped package: %s", name, e)


class _Watch(importlib.abc.MetaPathFinder):
    """Finds nothing itself; when dynamo's trace rules are imported, it lets the rest of the
    import machinery find them and runs ``_hand_over`` right after the module has executed,
    then steps aside."""

    def find_spec(self, name, path, target=None):
        if name != _RULES:
            return None
        global _watching
        with _lock:
            if self in sys.meta_path:
                sys.meta_path.remove(self)
            _watching = False
        spec = importlib.machinery.PathFinder.find_spec(name, path, target)
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        run = loader.exec_module

        def exec_module(module):
            run(module)
            with _lock:
                packages = list(_packages)
            _hand_over(module, packages)

        loader.exec_module = exec_module
        return spec
