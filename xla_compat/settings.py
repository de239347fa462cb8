"""Settings: every environment variable xla_compat reads, parsed once into one frozen object.

Nothing else in the library reads ``os.environ``. Tests build ``Settings`` directly and install
it with ``settings.override(...)``.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
from dataclasses import dataclass, field
from typing import Mapping


class SettingError(ValueError):
    """A malformed environment value; names the variable and what it accepts."""


def _flag(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    low = raw.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise SettingError(f"{name}={raw!r}: expected 1/0, true/false, yes/no or on/off")


def _int(env: Mapping[str, str], name: str, default: int, lo: int = 0) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise SettingError(f"{name}={raw!r}: expected an integer") from None
    if value < lo:
        raise SettingError(f"{name}={raw!r}: must be at least {lo}")
    return value


def _choice(env: Mapping[str, str], name: str, default: str, choices: tuple[str, ...]) -> str:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    low = raw.strip().lower()
    if low not in choices:
        raise SettingError(f"{name}={raw!r}: expected one of {', '.join(choices)}")
    return low


@dataclass(frozen=True)
class Settings:
    """Everything configurable, as read from the environment at first use."""

    cpu_fallback: str = "warn"          # XLA_CPU_FALLBACK: warn | silent | error
    ir_debug: bool = True               # XLA_IR_DEBUG: record the Python line that created each op
    dump_path: str | None = None        # XLA_HLO_DUMP: append every compiled graph's IR and HLO here
    metrics_file: str | None = None     # XLA_METRICS_FILE: write the metrics report here at exit
    compile_cache_size: int = 1024      # XLA_COMPILE_CACHE_SIZE: LRU bound on compiled graphs
    donate: bool = True                 # XLA_DONATE_BUFFERS: donate overwritten inputs
    raw: Mapping[str, str] = field(default_factory=dict)  # every XLA_* variable seen

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "Settings":
        env = os.environ if env is None else env
        return cls(
            cpu_fallback=_choice(env, "XLA_CPU_FALLBACK", "warn", ("warn", "silent", "error")),
            ir_debug=_flag(env, "XLA_IR_DEBUG", True),
            dump_path=env.get("XLA_HLO_DUMP") or None,
            metrics_file=env.get("XLA_METRICS_FILE") or None,
            compile_cache_size=_int(env, "XLA_COMPILE_CACHE_SIZE", 1024, lo=1),
            donate=_flag(env, "XLA_DONATE_BUFFERS", True),
            raw={k: v for k, v in env.items() if k.startswith("XLA_")},
        )

    def replace(self, **changes) -> "Settings":
        return dataclasses.replace(self, **changes)


_lock = threading.Lock()
_current: Settings | None = None


def get() -> Settings:
    global _current
    if _current is None:
        with _lock:
            if _current is None:
                _current = Settings.from_env()
    return _current


@contextlib.contextmanager
def override(**changes):
    """Temporarily replace fields of the active settings (tests and scoped tools)."""
    global _current
    before = get()
    _current = before.replace(**changes)
    try:
        yield _current
    finally:
        _current = before
