"""Settings: every environment variable xla_compat reads, parsed once into one frozen object.

Nothing else in the library reads ``os.environ``. Tests build ``Settings`` directly and install
it with ``settings.override(...)``.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import socket
import sys
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


def _lenient(errors: list, parse, *args):
    """``parse(*args)``, or None with the error recorded: dispatch settings never crash a job."""
    try:
        return parse(*args)
    except SettingError as e:
        errors.append(str(e))
        return None


def _opt_flag(env: Mapping[str, str], name: str) -> bool | None:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return None
    return _flag(env, name, False)


def _number(env: Mapping[str, str], name: str) -> float | None:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return None
    try:
        return float(raw)
    except ValueError:
        raise SettingError(f"{name}={raw!r}: expected a number from 0 to 100") from None


def _patterns(env: Mapping[str, str], name: str) -> tuple[str, ...] | None:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return None
    return tuple(p.strip() for p in raw.split(",") if p.strip())


def _fraction(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise SettingError(f"{name}={raw!r}: expected a fraction from 0 to 1, e.g. 0.01") from None
    if not 0.0 <= value <= 1.0:
        raise SettingError(f"{name}={raw!r}: expected a fraction from 0 to 1, e.g. 0.01")
    return value


def _seconds(env: Mapping[str, str], name: str) -> float | None:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return None
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise SettingError(f"{name}={raw!r}: expected a positive number of seconds, e.g. 30")
    return value


def _tolerances(env: Mapping[str, str], name: str) -> tuple:
    """``float32=1e-5:1e-6,bfloat16=0.016:1e-5`` -> ((dtype, rtol, atol), ...)."""
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return ()
    out = []
    for item in raw.split(","):
        if not item.strip():
            continue
        try:
            dtype, tols = item.split("=")
            rtol, atol = (float(v) for v in tols.split(":"))
        except ValueError:
            raise SettingError(f"{name}={raw!r}: expected dtype=rtol:atol items separated by "
                               f"commas, e.g. float32=1e-5:1e-6,bfloat16=0.016:1e-5") from None
        out.append((dtype.strip().replace("torch.", ""), rtol, atol))
    return tuple(out)


# Where the rollout's stickiness key comes from, in order. The first three are the same on every
# host, rank and restart of one job; the last is sticky only across restarts on one host (set
# XLA_JOB_ID for multi-host jobs).
JOB_ID_SOURCES = ("XLA_JOB_ID", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID")


def _job_id(env: Mapping[str, str]) -> tuple[str | None, str]:
    for name in JOB_ID_SOURCES:
        value = (env.get(name) or "").strip()
        if value:
            return value, name
    script = os.path.abspath(sys.argv[0]) if sys.argv and sys.argv[0] else "<interactive>"
    return f"{socket.gethostname()}:{script}", "hostname+script"


@dataclass(frozen=True)
class Settings:
    """Everything configurable, as read from the environment at first use."""

    cpu_fallback: str = "warn"          # XLA_CPU_FALLBACK: warn | silent | error
    ir_debug: bool = True               # XLA_IR_DEBUG: record the Python line that created each op
    dump_path: str | None = None        # XLA_HLO_DUMP: append every compiled graph's IR and HLO here
    metrics_file: str | None = None     # XLA_METRICS_FILE: write the metrics report here at exit
    compile_cache_size: int = 1024      # XLA_COMPILE_CACHE_SIZE: LRU bound on compiled graphs
    # XLA_COMPILE_CACHE_MAPS: LRU bound on the memory mappings the cached executables hold (each
    # maps its JIT code; past the kernel's vm.max_map_count LLVM fails and the process dies);
    # 0: half of vm.max_map_count
    compile_cache_maps: int = 0
    donate: bool = True                 # XLA_DONATE_BUFFERS: donate overwritten inputs
    persistent_cache_path: str | None = None  # XLA_PERSISTENT_CACHE_PATH: compiled graphs on disk
    persistent_cache_readonly: bool = False   # XLA_PERSISTENT_CACHE_READ_ONLY: load, never store
    autograd_caller_thread: bool = True  # XLA_AUTOGRAD_CALLER_THREAD: backward on the calling thread
    raw: Mapping[str, str] = field(default_factory=dict)  # every XLA_* variable seen

    # -- path dispatch and rollout (xla_compat.dispatch, xla_compat.rollout) --------------------
    # None means "not set here"; the rollout file (rollout_config) fills what the environment
    # leaves unset. Malformed values are recorded in dispatch_errors instead of raising: the
    # decision then takes the safe default with reason CONFIG_ERROR.
    use_functionalization: bool | None = None   # XLA_USE_FUNCTIONALIZATION=1|0: explicit path
    kill_switch: bool | None = None             # XLA_ROLLOUT_KILL_SWITCH=1: legacy everywhere
    rollout_percentage: float | None = None     # XLA_ROLLOUT_PERCENTAGE: 0-100 (0.01 steps)
    rollout_salt: str | None = None             # XLA_ROLLOUT_SALT: reshuffles the buckets
    rollout_allow: tuple[str, ...] | None = None  # XLA_ROLLOUT_ALLOW: job-id globs, comma-separated
    rollout_deny: tuple[str, ...] | None = None   # XLA_ROLLOUT_DENY: job-id globs, comma-separated
    min_torch_version: str | None = None        # XLA_ROLLOUT_MIN_TORCH: no rollout below this
    rollout_config: str | None = None           # XLA_ROLLOUT_CONFIG: a .json or .toml file
    job_id: str | None = None                   # XLA_JOB_ID, else one of JOB_ID_SOURCES
    job_id_source: str = "unset"                # which variable gave job_id
    torch_version: str | None = None            # None: the running torch (tests inject others)
    dispatch_errors: tuple[str, ...] = ()       # malformed dispatch values, one message each

    # -- dual-run validation (xla_compat.dualrun) ------------------------------------------------
    dual_run: str = "off"                # XLA_DUAL_RUN: off | sample | strict | lockstep
    dual_run_rate: float = 0.01          # XLA_DUAL_RUN_RATE: fraction of steps sample mode checks
    dual_run_report: str | None = None   # XLA_DUAL_RUN_REPORT: JSONL file, one line per dual run
    dual_run_tolerances: tuple = ()      # XLA_DUAL_RUN_TOLERANCES: float32=1e-5:1e-6,... overrides
    dual_run_ignore: tuple[str, ...] = ()  # XLA_DUAL_RUN_IGNORE: op:<glob> / name:<glob> rules
    dual_run_timeout: float | None = None  # XLA_DUAL_RUN_TIMEOUT: seconds before a shadow is abandoned

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "Settings":
        env = os.environ if env is None else env
        errors: list[str] = []
        job_id, job_id_source = _job_id(env)
        return cls(
            use_functionalization=_lenient(errors, _opt_flag, env, "XLA_USE_FUNCTIONALIZATION"),
            kill_switch=_lenient(errors, _opt_flag, env, "XLA_ROLLOUT_KILL_SWITCH"),
            rollout_percentage=_lenient(errors, _number, env, "XLA_ROLLOUT_PERCENTAGE"),
            rollout_salt=env.get("XLA_ROLLOUT_SALT") or None,
            rollout_allow=_patterns(env, "XLA_ROLLOUT_ALLOW"),
            rollout_deny=_patterns(env, "XLA_ROLLOUT_DENY"),
            min_torch_version=(env.get("XLA_ROLLOUT_MIN_TORCH") or "").strip() or None,
            rollout_config=env.get("XLA_ROLLOUT_CONFIG") or None,
            job_id=job_id,
            job_id_source=job_id_source,
            dispatch_errors=tuple(errors),
            cpu_fallback=_choice(env, "XLA_CPU_FALLBACK", "warn", ("warn", "silent", "error")),
            ir_debug=_flag(env, "XLA_IR_DEBUG", True),
            dump_path=env.get("XLA_HLO_DUMP") or None,
            metrics_file=env.get("XLA_METRICS_FILE") or None,
            compile_cache_size=_int(env, "XLA_COMPILE_CACHE_SIZE", 1024, lo=1),
            compile_cache_maps=_int(env, "XLA_COMPILE_CACHE_MAPS", 0),
            donate=_flag(env, "XLA_DONATE_BUFFERS", True),
            persistent_cache_path=env.get("XLA_PERSISTENT_CACHE_PATH") or None,
            persistent_cache_readonly=_flag(env, "XLA_PERSISTENT_CACHE_READ_ONLY", False),
            autograd_caller_thread=_flag(env, "XLA_AUTOGRAD_CALLER_THREAD", True),
            dual_run=_choice(env, "XLA_DUAL_RUN", "off", ("off", "sample", "strict", "lockstep")),
            dual_run_rate=_fraction(env, "XLA_DUAL_RUN_RATE", 0.01),
            dual_run_report=env.get("XLA_DUAL_RUN_REPORT") or None,
            dual_run_tolerances=_tolerances(env, "XLA_DUAL_RUN_TOLERANCES"),
            dual_run_ignore=_patterns(env, "XLA_DUAL_RUN_IGNORE") or (),
            dual_run_timeout=_seconds(env, "XLA_DUAL_RUN_TIMEOUT"),
            raw={k: v for k, v in env.items()
                 if k.startswith("XLA_") or k in JOB_ID_SOURCES},
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


def reload(env: Mapping[str, str] | None = None) -> Settings:
    """Rebuild the settings from ``env`` (default: the environment); the CLI uses this after it
    sets the variables a subcommand forces. Returns the new settings."""
    global _current
    with _lock:
        _current = Settings.from_env(env)
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
