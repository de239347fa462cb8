"""Rollout controls: the rollout config (environment or a JSON/TOML file), sticky job buckets and
the rollout stage of the path decision (deny list > allow list > percentage).

A job's bucket is ``sha256(salt, job id) mod 10,000``: the same on every host, rank, restart and
Python process. A job takes the rollout path when ``bucket < percentage * 100``, so raising the
percentage only ever adds jobs. A malformed value never raises out of here: it becomes a message
naming the field, and the dispatch layer answers CONFIG_ERROR with the safe default.
"""
from __future__ import annotations

import enum
import fnmatch
import hashlib
import json
import math
import os
import tomllib
from dataclasses import dataclass
from typing import Any, Mapping, Optional

from packaging.version import InvalidVersion, Version

BUCKETS = 10_000
DEFAULT_SALT = "xla_compat/functionalization/v1"


class Reason(str, enum.Enum):
    """Why the process runs on its path (the decision's reason code)."""

    KILL_SWITCH = "KILL_SWITCH"        # the kill switch forces the safe default everywhere
    CONFIG_ERROR = "CONFIG_ERROR"      # a malformed setting; safe default, message names it
    EXPLICIT_FLAG = "EXPLICIT_FLAG"    # XLA_USE_FUNCTIONALIZATION=1|0
    VERSION_GATE = "VERSION_GATE"      # the requested path cannot run on this torch: fell back
    DENY_LIST = "DENY_LIST"            # job id matches a deny pattern
    ALLOW_LIST = "ALLOW_LIST"          # job id matches an allow pattern
    ROLLOUT_BUCKET = "ROLLOUT_BUCKET"  # the job's bucket against the percentage decided
    DEFAULT = "DEFAULT"                # nothing asked for anything

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class RolloutConfig:
    """The effective rollout settings after merging the file and the environment."""

    percentage: Optional[float] = None       # None: no percentage rollout configured
    salt: str = DEFAULT_SALT
    allow: tuple[str, ...] = ()              # fnmatch globs on the job id
    deny: tuple[str, ...] = ()
    min_torch_version: Optional[str] = None  # no rollout (VERSION_GATE) below this torch
    kill_switch: bool = False

    @property
    def active(self) -> bool:
        """Could the rollout send this process to the rollout path at all?"""
        return bool(self.allow) or bool(self.percentage)


@dataclass(frozen=True)
class Outcome:
    """What the rollout stage says for one job: ``to_target`` None means it has no opinion."""

    to_target: Optional[bool]
    reason: Reason
    bucket: Optional[int]
    detail: str


# -- buckets ------------------------------------------------------------------------------------

def bucket(job_id: str, salt: str = DEFAULT_SALT) -> int:
    """The job's sticky bucket in [0, BUCKETS): a salted SHA-256, never Python's ``hash``."""
    digest = hashlib.sha256(f"{salt}\x00{job_id}".encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % BUCKETS


def threshold(percentage: float) -> int:
    """Buckets below this number are in (0.01% resolution)."""
    return int(round(percentage * BUCKETS / 100))


def in_rollout(job_bucket: int, percentage: float) -> bool:
    return job_bucket < threshold(percentage)


def matching(job_id: Optional[str], patterns) -> Optional[str]:
    """The first glob in ``patterns`` that matches ``job_id`` (case-sensitive), or None."""
    if job_id is None:
        return None
    for p in patterns:
        if fnmatch.fnmatchcase(job_id, p):
            return p
    return None


def evaluate(config: RolloutConfig, job_id: Optional[str]) -> Outcome:
    """The rollout stage alone: deny list > allow list > sticky percentage > no opinion."""
    b = bucket(job_id, config.salt) if job_id is not None else None
    hit = matching(job_id, config.deny)
    if hit is not None:
        return Outcome(False, Reason.DENY_LIST, b, f"job id {job_id!r} matches deny pattern {hit!r}")
    hit = matching(job_id, config.allow)
    if hit is not None:
        return Outcome(True, Reason.ALLOW_LIST, b,
                       f"job id {job_id!r} matches allow pattern {hit!r}")
    if config.percentage is not None:
        if b is None:
            return Outcome(None, Reason.DEFAULT, None,
                           "a rollout percentage is set but there is no job id; set XLA_JOB_ID")
        inside = in_rollout(b, config.percentage)
        return Outcome(inside, Reason.ROLLOUT_BUCKET, b,
                       f"bucket {b} is {'under' if inside else 'not under'} "
                       f"{threshold(config.percentage)} ({config.percentage:g}% of {BUCKETS})")
    return Outcome(None, Reason.DEFAULT, b, "no rollout configured")


# -- the config: file + environment, validated field by field -----------------------------------

# Field -> (environment variable, Settings attribute).
FIELDS = {
    "percentage": ("XLA_ROLLOUT_PERCENTAGE", "rollout_percentage"),
    "salt": ("XLA_ROLLOUT_SALT", "rollout_salt"),
    "allow": ("XLA_ROLLOUT_ALLOW", "rollout_allow"),
    "deny": ("XLA_ROLLOUT_DENY", "rollout_deny"),
    "min_torch_version": ("XLA_ROLLOUT_MIN_TORCH", "min_torch_version"),
    "kill_switch": ("XLA_ROLLOUT_KILL_SWITCH", "kill_switch"),
}


class ConfigError(ValueError):
    """One malformed rollout value; the message names the field and what it accepts."""


def _percentage(v):
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ConfigError(f"expected a number from 0 to 100, got {type(v).__name__}")
    if not math.isfinite(v) or not 0 <= v <= 100:
        raise ConfigError("must be a number from 0 to 100")
    return float(v)


def _salt(v):
    if not isinstance(v, str) or not v:
        raise ConfigError(f"expected a non-empty string, got {type(v).__name__}")
    return v


def _globs(v):
    if isinstance(v, str) or not isinstance(v, (list, tuple)) \
            or not all(isinstance(p, str) for p in v):
        raise ConfigError("expected a list of job-id glob patterns (strings)")
    return tuple(v)


def _version(v):
    if not isinstance(v, str):
        raise ConfigError(f"expected a version string such as \"2.13\", got {type(v).__name__}")
    try:
        Version(v)
    except InvalidVersion:
        raise ConfigError("expected a version such as \"2.13\"") from None
    return v


def _bool(v):
    if not isinstance(v, bool):
        raise ConfigError(f"expected true or false, got {type(v).__name__}")
    return v


_CHECKS = {"percentage": _percentage, "salt": _salt, "allow": _globs, "deny": _globs,
           "min_torch_version": _version, "kill_switch": _bool}


def read_file(path: str) -> dict[str, Any]:
    """The rollout file's top-level table. JSON for ``.json``, TOML for ``.toml``/``.tml``."""
    where = f"XLA_ROLLOUT_CONFIG={path!r}"
    ext = os.path.splitext(path)[1].lower()
    if ext not in (".json", ".toml", ".tml"):
        raise ConfigError(f"{where}: expected a .json or .toml file")
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise ConfigError(f"{where}: cannot read it ({e.strerror or e})") from None
    try:
        table = json.loads(data) if ext == ".json" else tomllib.loads(data.decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as e:   # JSONDecodeError and TOMLDecodeError
        kind = "JSON" if ext == ".json" else "TOML"
        raise ConfigError(f"{where}: not valid {kind}: {e}") from None
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: expected an object/table of rollout fields at the top")
    return table


def from_settings(s) -> tuple[RolloutConfig, tuple[str, ...]]:
    """The effective rollout config and every error found. The file is read first; each
    environment variable that is set replaces the file's field (the kill switch is on if either
    says so). A field with an error keeps its default, and the error is returned."""
    errors: list[str] = []
    values: dict[str, Any] = {}
    if s.rollout_config:
        try:
            table = read_file(s.rollout_config)
        except ConfigError as e:
            errors.append(str(e))
            table = {}
        for key, raw in table.items():
            if key not in _CHECKS:
                errors.append(f"rollout file {s.rollout_config}: unknown field {key!r}; known "
                              f"fields: {', '.join(_CHECKS)}")
                continue
            try:
                values[key] = _CHECKS[key](raw)
            except ConfigError as e:
                errors.append(f"rollout file {s.rollout_config}: field {key!r} = {raw!r}: {e}")
    file_kill = values.get("kill_switch", False)
    for key, (env_name, attr) in FIELDS.items():
        raw = getattr(s, attr)
        if raw is None:
            continue
        try:
            values[key] = _CHECKS[key](list(raw) if key in ("allow", "deny") else raw)
        except ConfigError as e:
            errors.append(f"{env_name}={raw!r}: {e}")
    values["kill_switch"] = bool(values.get("kill_switch", False) or file_kill)
    return RolloutConfig(**values), tuple(errors)


def describe(config: RolloutConfig) -> Mapping[str, str]:
    """The config as strings, for the decision's record of every setting seen."""
    return {f"rollout.{k}": ("unset" if v is None else
                             ",".join(v) if isinstance(v, tuple) else str(v))
            for k, v in vars(config).items()}
