"""Comparators: exact for integers and bools, a tolerance per floating dtype, NaN positions, ignores.

Default tolerances (``|a - b| <= atol + rtol * |b|``, as ``torch.allclose``), where ``b`` is the
authoritative value. They are a few ulps of each dtype: the two paths lower the same aten ops, so
they differ only where XLA fuses or reorders differently. Override per dtype with
``XLA_DUAL_RUN_TOLERANCES=float32=1e-4:1e-5,bfloat16=0.05:1e-3``.
"""
from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from .. import settings

DEFAULT_TOLERANCES: dict[str, tuple[float, float]] = {   # dtype -> (rtol, atol)
    "float64": (1e-12, 1e-14),
    "float32": (1e-5, 1e-6),
    "float16": (1e-3, 1e-5),
    "bfloat16": (1.6e-2, 1e-5),
    "complex128": (1e-12, 1e-14),
    "complex64": (1e-5, 1e-6),
}


def _dtype_name(dtype) -> str:
    return str(dtype).replace("torch.", "")


def tolerance(dtype, overrides: tuple = ()) -> tuple[float, float]:
    """(rtol, atol) for ``dtype``: 0, 0 for exact types; settings override the defaults."""
    name = _dtype_name(dtype)
    for d, rtol, atol in overrides or settings.get().dual_run_tolerances:
        if d == name:
            return rtol, atol
    return DEFAULT_TOLERANCES.get(name, (0.0, 0.0))


@dataclass(frozen=True)
class Mismatch:
    """One compared value whose two paths disagree (or could not be compared)."""

    name: str                  # "output[0]", "input model.fc.weight", "exception", ...
    kind: str                  # values | nan | shape | dtype | type | alias | exception | missing | timeout
    detail: str
    max_abs_err: Optional[float] = None
    max_rel_err: Optional[float] = None
    worst_index: Optional[tuple] = None
    authoritative: Optional[str] = None   # what the authoritative path had, in words
    shadow: Optional[str] = None

    def as_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if v is not None}

    def __str__(self) -> str:
        return f"{self.name}: {self.kind}: {self.detail}"


@dataclass(frozen=True)
class IgnoreRules:
    """Known differences: ``op:<glob>`` matches an op name, ``name:<glob>`` a compared value."""

    ops: tuple[str, ...] = ()
    names: tuple[str, ...] = ()

    @classmethod
    def parse(cls, rules) -> "IgnoreRules":
        ops, names = [], []
        for rule in rules:
            kind, _, pattern = rule.partition(":")
            if kind == "op" and pattern:
                ops.append(pattern)
            elif kind == "name" and pattern:
                names.append(pattern)
            else:
                raise ValueError(f"xla_compat: dual-run ignore rule {rule!r}: expected "
                                 f"'op:<glob>' or 'name:<glob>', e.g. name:*.running_var")
        return cls(tuple(ops), tuple(names))

    @classmethod
    def from_settings(cls) -> "IgnoreRules":
        return cls.parse(settings.get().dual_run_ignore)

    def __add__(self, other: "IgnoreRules") -> "IgnoreRules":
        return IgnoreRules(self.ops + other.ops, self.names + other.names)

    def ignores_op(self, op: str) -> bool:
        return any(fnmatch.fnmatchcase(op, p) for p in self.ops)

    def ignores_name(self, name: str) -> bool:
        return any(fnmatch.fnmatchcase(name, p) for p in self.names)


def _describe(x) -> str:
    if isinstance(x, torch.Tensor):
        return f"{_dtype_name(x.dtype)}{list(x.shape)}"
    if isinstance(x, np.ndarray):
        return f"{x.dtype}{list(x.shape)}"
    text = repr(x)
    return text if len(text) <= 80 else text[:77] + "..."


def _to_numpy(t: torch.Tensor) -> np.ndarray:
    t = t.detach()
    if t.dtype == torch.bfloat16:
        t = t.float()
    return t.cpu().resolve_conj().resolve_neg().numpy()


def compare_tensors(name: str, auth: torch.Tensor, shadow: torch.Tensor,
                    overrides: tuple = ()) -> Optional[Mismatch]:
    """None when ``shadow`` agrees with ``auth`` (CPU or device tensors), else the Mismatch."""
    if auth.dtype != shadow.dtype:
        return Mismatch(name, "dtype", f"{_dtype_name(auth.dtype)} vs {_dtype_name(shadow.dtype)}",
                        authoritative=_describe(auth), shadow=_describe(shadow))
    if tuple(auth.shape) != tuple(shadow.shape):
        return Mismatch(name, "shape", f"{list(auth.shape)} vs {list(shadow.shape)}",
                        authoritative=_describe(auth), shadow=_describe(shadow))
    return compare_arrays(name, _to_numpy(auth), _to_numpy(shadow), auth.dtype, overrides)


def compare_arrays(name: str, a: np.ndarray, b: np.ndarray, dtype, overrides: tuple = ()
                   ) -> Optional[Mismatch]:
    """Compare ``b`` (shadow) with ``a`` (authoritative) under ``dtype``'s tolerance."""
    if a.shape != b.shape:
        return Mismatch(name, "shape", f"{list(a.shape)} vs {list(b.shape)}")
    if a.size == 0:
        return None
    floating = np.issubdtype(a.dtype, np.inexact)
    if not floating:
        diff = a != b
        if not diff.any():
            return None
        idx = tuple(int(i) for i in np.unravel_index(int(np.argmax(diff)), a.shape))
        err = float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64))))
        return Mismatch(name, "values", f"{int(diff.sum())} of {a.size} elements differ "
                        f"(exact comparison for {_dtype_name(dtype)}); first at {list(idx)}: "
                        f"{a[idx]!r} vs {b[idx]!r}", max_abs_err=err, worst_index=idx)
    nan_a, nan_b = np.isnan(a), np.isnan(b)
    if (nan_a != nan_b).any():
        idx = tuple(int(i) for i in np.unravel_index(int(np.argmax(nan_a != nan_b)), a.shape))
        return Mismatch(name, "nan", f"NaN positions differ ({int((nan_a != nan_b).sum())} of "
                        f"{a.size}); first at {list(idx)}: {a[idx]!r} vs {b[idx]!r}",
                        worst_index=idx)
    rtol, atol = tolerance(dtype, overrides)
    a64 = a.astype(np.complex128 if np.iscomplexobj(a) else np.float64)
    b64 = b.astype(a64.dtype)
    both = nan_a | (a64 == b64)                 # equal (also equal infinities) or NaN in both
    with np.errstate(invalid="ignore", over="ignore"):
        abs_err = np.where(both, 0.0, np.abs(a64 - b64))
        abs_err = np.where(np.isnan(abs_err), np.inf, abs_err)  # inf vs -inf, inf vs finite
        rel_err = np.where(both, 0.0, abs_err / np.maximum(np.abs(a64), np.finfo(np.float64).tiny))
        over = abs_err - (atol + rtol * np.abs(np.where(both, 0.0, a64)))
    worst = int(np.argmax(over))
    idx = tuple(int(i) for i in np.unravel_index(worst, a.shape))
    max_abs, max_rel = float(abs_err.max()), float(rel_err.max())
    if over.flat[worst] <= 0:
        return None
    bad = int((over > 0).sum())
    return Mismatch(name, "values", f"{bad} of {a.size} elements beyond rtol={rtol:g} "
                    f"atol={atol:g}; worst at {list(idx)}: {a[idx]!r} vs {b[idx]!r} "
                    f"(max abs err {max_abs:.3g}, max rel err {max_rel:.3g})",
                    max_abs_err=max_abs, max_rel_err=max_rel, worst_index=idx)


def compare_values(name: str, auth, shadow, overrides: tuple = ()) -> list[Mismatch]:
    """Compare two (nested) results: tensors by value, containers element-wise, others by ==."""
    if isinstance(auth, torch.Tensor) or isinstance(shadow, torch.Tensor):
        if not (isinstance(auth, torch.Tensor) and isinstance(shadow, torch.Tensor)):
            return [Mismatch(name, "type", f"{type(auth).__name__} vs {type(shadow).__name__}",
                             authoritative=_describe(auth), shadow=_describe(shadow))]
        m = compare_tensors(name, auth, shadow, overrides)
        return [m] if m else []
    if isinstance(auth, (list, tuple)) and isinstance(shadow, (list, tuple)):
        if type(auth) is not type(shadow) or len(auth) != len(shadow):
            return [Mismatch(name, "type", f"{type(auth).__name__} of {len(auth)} vs "
                             f"{type(shadow).__name__} of {len(shadow)}")]
        out = []
        for i, (a, b) in enumerate(zip(auth, shadow)):
            out += compare_values(f"{name}[{i}]", a, b, overrides)
        return out
    if isinstance(auth, dict) and isinstance(shadow, dict):
        if list(auth) != list(shadow):
            return [Mismatch(name, "type", f"keys {list(auth)} vs {list(shadow)}")]
        out = []
        for k in auth:
            out += compare_values(f"{name}[{k!r}]", auth[k], shadow[k], overrides)
        return out
    if isinstance(auth, float) and isinstance(shadow, float):
        m = compare_arrays(name, np.array(auth), np.array(shadow), torch.float64, overrides)
        return [m] if m else []
    try:
        same = bool(auth == shadow) and type(auth) is type(shadow)
    except Exception:  # objects without a usable ==
        same = auth is shadow
    if same:
        return []
    return [Mismatch(name, "values", f"{_describe(auth)} vs {_describe(shadow)}",
                     authoritative=_describe(auth), shadow=_describe(shadow))]


def compare_exceptions(auth: Optional[BaseException], shadow: Optional[BaseException],
                       paths: tuple[str, str]) -> Optional[Mismatch]:
    """Same class and message (path names normalised) on both paths is a match."""
    if auth is None and shadow is None:
        return None

    def words(e):
        if e is None:
            return "returned normally"
        msg = str(e)
        for p in paths:
            msg = msg.replace(p, "<path>")
        return f"{type(e).__name__}: {msg}"

    a, b = words(auth), words(shadow)
    if a == b:
        return None
    head = lambda s: s.splitlines()[0][:300] if s else s  # noqa: E731
    return Mismatch("exception", "exception", f"authoritative {head(a)}; shadow {head(b)}",
                    authoritative=head(a), shadow=head(b))
