"""Dual-run validation: prove the legacy and the functional path agree, and find where they do not.

``dual_run(step, *args)`` / ``@dual_run_step`` compare whole steps (``function.py``);
``lockstep()`` runs every op on both paths and names the first op that differs (``pairs.py``).
Comparators in ``compare.py``, the JSONL report in ``report.py``, modes and sampling in ``modes.py``.
"""
from .compare import IgnoreRules, Mismatch
from .function import DualRunResult, MismatchError, dual_run, dual_run_step, last_result
from .pairs import Lockstep, PairTensor, lockstep


def autostart() -> None:
    """XLA_DUAL_RUN=lockstep: turn lockstep on for the process at first device use."""
    from .. import settings
    from . import pairs as _lockstep
    if settings.get().dual_run == "lockstep" and _lockstep.active() is None:
        _lockstep.start(name="lockstep (XLA_DUAL_RUN)")


__all__ = ["DualRunResult", "IgnoreRules", "Lockstep", "Mismatch", "MismatchError", "PairTensor",
           "autostart", "dual_run", "dual_run_step", "last_result", "lockstep"]
