"""Dual-run modes (off | sample | strict | lockstep) and the deterministic step sampler.

A step is sampled when a hash of (step name, step number) falls under the rate, so a rerun of
the same job checks the same steps, and different step functions are sampled independently.
"""
from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass

from .. import settings

MODES = ("off", "sample", "strict", "lockstep")


@dataclass(frozen=True)
class Mode:
    """What a decorated step does: run once, dual-run some or all calls, raise, or lockstep."""

    name: str
    rate: float

    def __post_init__(self):
        if self.name not in MODES:
            raise ValueError(f"xla_compat: dual-run mode {self.name!r}: expected one of "
                             f"{', '.join(MODES)} (XLA_DUAL_RUN)")
        if not 0.0 <= self.rate <= 1.0:
            raise ValueError(f"xla_compat: dual-run rate {self.rate!r}: expected a fraction "
                             f"from 0 to 1 (XLA_DUAL_RUN_RATE)")

    @property
    def strict(self) -> bool:
        return self.name == "strict"

    def runs_both(self, name: str, step: int) -> bool:
        """Does call number ``step`` of step function ``name`` dual-run in this mode?"""
        if self.name == "strict":
            return True
        if self.name == "sample":
            return sampled(name, step, self.rate)
        return False


def current(name: str | None = None, rate: float | None = None) -> Mode:
    """The mode from settings (XLA_DUAL_RUN / XLA_DUAL_RUN_RATE), with explicit overrides."""
    s = settings.get()
    return Mode(name or s.dual_run, s.dual_run_rate if rate is None else rate)


def sampled(name: str, step: int, rate: float) -> bool:
    """Deterministic: the same (name, step, rate) gives the same answer in every process."""
    if rate >= 1.0:
        return True
    if rate <= 0.0:
        return False
    digest = hashlib.blake2b(f"{name}\0{step}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2 ** 64 < rate


class StepCounter:
    """Call numbers per step name (thread-safe); ``reset`` starts every count at 0 again."""

    def __init__(self):
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}

    def next(self, name: str) -> int:
        with self._lock:
            n = self._counts.get(name, 0)
            self._counts[name] = n + 1
            return n

    def reset(self) -> None:
        with self._lock:
            self._counts.clear()


steps = StepCounter()
