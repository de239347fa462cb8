"""The versioned dispatch layer: which path this process runs on, and why. The only code that
knows both paths exist.

The decision is made once per process, at first device use (``xc.device()``, or the first
factory call on ``hlo``), then frozen. Order, first match wins:

    kill switch > config error > explicit XLA_USE_FUNCTIONALIZATION=1|0 > version/capability gate
    > rollout (deny list > allow list > sticky percentage) > default

A malformed setting might hide a kill switch, so CONFIG_ERROR sits right under it and takes the
safe default. The gate applies to whatever asked for a path that this torch cannot run (the
explicit flag, or an active rollout): it falls back to the safe default with a warning.
"""
from __future__ import annotations

import contextlib
import importlib
import logging
import sys
import threading
import warnings
from dataclasses import dataclass
from typing import Mapping, Optional

import torch
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from . import metrics, paths, rollout, settings
from .lazy.tensor import DEVICE
from .rollout import Reason

log = logging.getLogger("xla_compat.dispatch")

SAFE_DEFAULT = "legacy"        # where the kill switch, config errors, gates and the default go
ROLLOUT_TARGET = "functional"  # where the rollout and XLA_USE_FUNCTIONALIZATION=1 send jobs
FLAG_PATHS = {True: "functional", False: "legacy"}   # XLA_USE_FUNCTIONALIZATION=1 / =0
PATH_PACKAGES = ("xla_compat.legacy", "xla_compat.functional")

__all__ = ["Decision", "Reason", "decide", "ensure_decided", "explain", "path", "use_path",
           "to_path", "supported", "PathUnavailableError"]


class PathUnavailableError(RuntimeError):
    """A path was asked for by name that this process cannot run."""


@dataclass(frozen=True)
class Decision:
    """The path this process runs on, why, and everything that was looked at to decide."""

    path: str
    path_version: str
    reason: Reason
    message: str
    bucket: Optional[int]
    percentage: Optional[float]
    job_id: Optional[str]
    job_id_source: str
    torch_version: str
    library_version: str
    seen: tuple[tuple[str, str], ...]        # every setting looked at, as (name, value)
    supported: tuple[tuple[str, Optional[str]], ...]  # (path, None or why this torch can't)
    warnings: tuple[str, ...] = ()

    def as_dict(self) -> dict:
        """JSON-ready (dual-run and metrics reports embed this)."""
        return {"path": self.path, "path_version": self.path_version,
                "reason": self.reason.value, "message": self.message, "bucket": self.bucket,
                "percentage": self.percentage, "job_id": self.job_id,
                "job_id_source": self.job_id_source, "torch_version": self.torch_version,
                "library_version": self.library_version, "settings": dict(self.seen),
                "supported": dict(self.supported), "warnings": list(self.warnings)}

    def __str__(self) -> str:
        lines = [f"path: {self.path} (version {self.path_version})",
                 f"reason: {self.reason.value}: {self.message}",
                 f"job id: {self.job_id} (from {self.job_id_source}), bucket "
                 f"{self.bucket if self.bucket is not None else '-'} of {rollout.BUCKETS}, "
                 f"percentage {'unset' if self.percentage is None else f'{self.percentage:g}'}",
                 f"torch {self.torch_version}, xla_compat {self.library_version}"]
        lines += [f"supported: {name}: {'yes' if why is None else 'no, ' + why}"
                  for name, why in self.supported]
        lines += [f"warning: {w}" for w in self.warnings]
        lines += [f"setting: {k}={v}" for k, v in self.seen]
        return "\n".join(lines)


# -- what a torch can run -----------------------------------------------------------------------

def _torch_version(s) -> str:
    return s.torch_version or torch.__version__


def unsupported_reason(impl: paths.PathImpl, torch_version: str) -> Optional[str]:
    """None if ``impl`` can run on ``torch_version`` (its specifier and its probe), else why."""
    try:
        spec = SpecifierSet(impl.torch_versions)
    except InvalidSpecifier:
        return f"its torch_versions {impl.torch_versions!r} is not a version specifier"
    try:
        version = Version(torch_version)
    except InvalidVersion:   # decide() reports it as CONFIG_ERROR; only the probe can tell here
        version = None
    if version is not None and not spec.contains(version, prereleases=True):
        return f"it supports torch{impl.torch_versions}, this is torch {torch_version}"
    try:
        why = impl.probe()
    except Exception as e:  # a probe that breaks means the path is not usable here
        why = f"its capability probe raised {type(e).__name__}: {e}"
    return why


def supported(s=None, impls: Mapping[str, paths.PathImpl] | None = None) -> dict:
    """Path name -> None (this torch can run it) or the reason it cannot."""
    s = s or settings.get()
    impls = _registered() if impls is None else impls
    version = _torch_version(s)
    return {name: unsupported_reason(impl, version) for name, impl in sorted(impls.items())}


# -- the decision (pure: settings + path registry in, Decision out) ------------------------------

def decide(s, impls: Mapping[str, paths.PathImpl] | None = None,
           library_version: str = "") -> Decision:
    """The decision for settings ``s`` over the paths ``impls`` (default: those registered)."""
    impls = _registered() if impls is None else dict(impls)
    config, errors = rollout.from_settings(s)
    errors = list(s.dispatch_errors) + list(errors)
    version = _torch_version(s)
    try:
        Version(version)
    except InvalidVersion:
        errors.append(f"torch_version={version!r}: not a version such as 2.13.0")
    support = supported(s, impls)
    outcome = rollout.evaluate(config, s.job_id)
    notes: list[str] = []
    safe = _safe_default(impls, support, notes)

    def result(name, reason, message):
        impl = impls.get(name)
        seen = {k: str(v) for k, v in sorted(s.raw.items())}
        seen.update(rollout.describe(config))
        seen.update({"torch_version": version, "job_id_source": s.job_id_source})
        return Decision(
            path=name, path_version=impl.version if impl else "?", reason=reason,
            message=message, bucket=outcome.bucket, percentage=config.percentage,
            job_id=s.job_id, job_id_source=s.job_id_source, torch_version=version,
            library_version=library_version, seen=tuple(seen.items()),
            supported=tuple(support.items()), warnings=tuple(notes))

    def gated(name, asked_by):
        """The fallback Decision if ``name`` cannot run here, else None."""
        why = support.get(name, f"the {name} path is not registered (its package did not import)")
        if why is None and name == ROLLOUT_TARGET and asked_by == "the rollout" \
                and config.min_torch_version and Version(version) < Version(config.min_torch_version):
            why = f"the rollout needs torch>={config.min_torch_version}, this is torch {version}"
        if why is None:
            return None
        msg = f"{asked_by} asked for the {name} path, but {why}; running on {safe} instead"
        notes.append(msg)
        return result(safe, Reason.VERSION_GATE, msg)

    if config.kill_switch:
        return result(safe, Reason.KILL_SWITCH, "the kill switch is on: every job runs on "
                      f"{safe} (unset XLA_ROLLOUT_KILL_SWITCH / kill_switch to turn it off)")
    if errors:
        return result(safe, Reason.CONFIG_ERROR,
                      "; ".join(errors) + f". Running on {safe}; fix the setting(s) named.")
    if s.use_functionalization is not None:
        name = FLAG_PATHS[bool(s.use_functionalization)]
        flag = f"XLA_USE_FUNCTIONALIZATION={int(bool(s.use_functionalization))}"
        return gated(name, flag) or result(name, Reason.EXPLICIT_FLAG, f"{flag} asked for {name}")
    if config.active:
        fallback = gated(ROLLOUT_TARGET, "the rollout")
        if fallback is not None:
            return fallback
    if outcome.to_target is not None:
        return result(ROLLOUT_TARGET if outcome.to_target else safe, outcome.reason,
                      outcome.detail)
    return result(safe, Reason.DEFAULT, outcome.detail + f"; {safe} is the default")


def _safe_default(impls, support, notes) -> str:
    if SAFE_DEFAULT in impls and support.get(SAFE_DEFAULT) is None:
        return SAFE_DEFAULT
    why = support.get(SAFE_DEFAULT) or "it is not registered (its package did not import)"
    notes.append(f"the safe default {SAFE_DEFAULT!r} cannot run ({why}); using the core "
                 f"path (no view aliasing)")
    return "core"


# -- the process decision: made once, at first device use ---------------------------------------

_lock = threading.RLock()
_decision: Optional[Decision] = None
_deciding = False
import_errors: dict[str, str] = {}   # path package -> why it did not import (doctor shows this)


def load_paths() -> None:
    """Import the path packages so they register; a package under construction is skipped."""
    for module in PATH_PACKAGES:
        if module in sys.modules or module in import_errors:
            continue
        try:
            importlib.import_module(module)
        except Exception as e:  # ImportError, or a half-written package
            import_errors[module] = f"{type(e).__name__}: {e}"
            log.debug("xla_compat: %s did not import: %s", module, e)


def _registered() -> dict:
    load_paths()
    return {name: paths.get(name) for name in paths.names()}


def ensure_decided() -> Optional[Decision]:
    """Make the process decision if it is not made yet; return it (None while it is being made)."""
    global _decision, _deciding
    if _decision is not None:
        return _decision
    with _lock:
        if _decision is not None or _deciding:
            return _decision
        _deciding = True
        try:
            from . import __version__
            d = decide(settings.get(), library_version=__version__)
            paths.set_default(d.path)
            _decision = d
            paths.set_default_resolver(None)
        finally:
            _deciding = False
    log.info("xla_compat: running on the %s path (%s: %s)", d.path, d.reason.value, d.message)
    for w in d.warnings:
        warnings.warn(f"xla_compat: {w}", RuntimeWarning, stacklevel=3)
    return d


def _report_section() -> str:
    if _decision is None:
        return ""
    return "Dispatch:\n" + "\n".join("  " + line for line in str(_decision).splitlines())


paths.set_default_resolver(ensure_decided)
metrics.add_report_section(_report_section)


# -- the public API -----------------------------------------------------------------------------

def explain() -> Decision:
    """The process decision (made now if no device was used yet)."""
    return ensure_decided()


def path() -> str:
    """The path new device tensors get here: a ``use_path`` block's, else the decision's."""
    ensure_decided()
    return paths.active().name


def _check_available(name: str) -> None:
    impls = _registered()
    if name not in impls:
        why = next((e for m, e in import_errors.items() if m.endswith("." + name)), None)
        raise PathUnavailableError(
            f"xla_compat: no path named {name!r}; registered paths: {', '.join(sorted(impls))}"
            + (f" (xla_compat.{name} did not import: {why})" if why else ""))
    d = ensure_decided()
    if d is not None and d.reason is Reason.KILL_SWITCH and name not in (d.path, "core"):
        raise PathUnavailableError(
            f"xla_compat: the kill switch is on, so the {name} path is off everywhere; unset "
            f"XLA_ROLLOUT_KILL_SWITCH (or kill_switch in the rollout file) to use it")
    why = unsupported_reason(impls[name], _torch_version(settings.get()))
    if why is not None:
        raise PathUnavailableError(f"xla_compat: the {name} path cannot run here: {why}")


@contextlib.contextmanager
def use_path(name: str):
    """Create device tensors on path ``name`` inside the block (this thread). Tensors keep their
    path afterwards; combine tensors of two paths only after ``to_path``."""
    _check_available(name)
    with paths.activated(name) as impl:
        yield impl


def to_path(t: torch.Tensor, name: str) -> torch.Tensor:
    """A copy of ``t`` on path ``name`` (``t`` itself if it is already there); a CPU tensor is
    moved to the device on that path.

    Like ``t.detach()``: the copy is a new autograd leaf (``requires_grad`` is kept)."""
    if paths.of(t) == name:
        return t
    _check_available(name)
    impl = paths.get(name)
    if impl.to_path is not None:
        return impl.to_path(t)
    host = t.detach().cpu()
    with paths.activated(name):
        return host.to(DEVICE).requires_grad_(t.requires_grad)


def forget_decision() -> None:
    """Forget the process decision: the next device use decides again (tests, and the CLI
    before it forces a path)."""
    global _decision
    with _lock:
        _decision = None
        paths.set_default("core")
        paths.set_default_resolver(ensure_decided)
