"""Dual-run validation: prove the legacy and the functional path agree, and find where they do not.

``dual_run(step, *args)`` / ``@dual_run_step`` compare whole steps (``function.py``);
``lockstep()`` runs every op on both paths and names the first op that differs (``lockstep.py``).
Comparators in ``compare.py``, the JSONL report in ``report.py``, modes and sampling in ``modes.py``.
"""
from .compare import IgnoreRules, Mismatch
from .function import DualRunResult, MismatchError, dual_run, dual_run_step, last_result

__all__ = ["DualRunResult", "IgnoreRules", "Mismatch", "MismatchError", "dual_run",
           "dual_run_step", "last_result"]
