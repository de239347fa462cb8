"""Gradients of PyTorch's OpInfo samples on hlo against CPU eager, per path.

    python -m tests.conformance.grads --paths legacy,functional --out tests/conformance/GRADS.md
    python -m tests.conformance.grads --ops sin,cumsum --paths legacy

``make conformance`` compares forward results only; this run takes every OpInfo that supports
autograd, draws float32 samples with ``requires_grad=True``, and compares the gradients of
``sum(out * cotangent)`` (a fixed random cotangent per output) with respect to every input that
requires grad, computed by eager on the CPU and on the device, where autograd's backward formulas
run as traced device ops. Outputs whose sign is a free choice (eigenvectors, singular vectors:
``skips.SIGN_ALIGNED``) enter the loss as ``abs``, which makes it independent of that choice.

A gradient outside the tolerance is judged on accuracy before it counts as a failure: when the
device's gradient is nowhere farther from the float64 gradient than eager's float32 one is
somewhere (twice its largest error, plus the tolerance), the sample is ill-conditioned for
float32 (``logcumsumexp`` of a column holding 1e4: a one-ulp difference of the forward result
becomes 2e-3 in the backward's ``exp(x - result)``, eager's own error elsewhere), not wrong on the
device.
"""
from __future__ import annotations

import argparse
import datetime
import signal
import sys
import time
import warnings
import zlib

import torch
from torch.utils._pytree import tree_leaves

from . import harness, skips

# OpInfos left out, with the reason (the rest of the skips are skips.py's, as for make conformance)
GRAD_SKIPS = {
    "nn.functional.multi_head_attention_forward": "its samples train with dropout 0.5: random",
}
DTYPE = torch.float32
SAMPLE_TIMEOUT_S = 120


class _Timeout(Exception):
    pass


def _alarm(*_):
    raise _Timeout(f"sample ran past {SAMPLE_TIMEOUT_S} s")


def _tensors(x) -> list:
    """The tensors in ``x`` (nested lists, tuples, dicts and named tuples)."""
    return [t for t in tree_leaves(x) if isinstance(t, torch.Tensor)]


def _fresh(x, dev):
    """``x`` on ``dev`` with fresh leaves: each tensor that required grad requires it again."""
    if isinstance(x, torch.Tensor):
        y = harness.to_device(x.detach().clone(), dev)
        return y.requires_grad_(x.requires_grad)
    if isinstance(x, (list, tuple)) and not hasattr(x, "_fields"):
        return type(x)(_fresh(e, dev) for e in x)
    if isinstance(x, dict):
        return {k: _fresh(v, dev) for k, v in x.items()}
    return harness.to_device(x, dev)


def gradients(op, sample, dev, dtype=None, gauge_free: bool = False):
    """The gradients of ``sum(out * cot)`` with respect to the sample's inputs that require grad
    (None for an input the outputs do not depend on), on CPU tensors; None when the sample has
    no differentiable output. ``dtype`` recasts floating inputs (the float64 reference)."""
    def cast(x):
        if dtype is not None and isinstance(x, torch.Tensor) and x.is_floating_point():
            return x.detach().to(dtype).requires_grad_(x.requires_grad)
        if isinstance(x, (list, tuple)) and not hasattr(x, "_fields"):
            return type(x)(cast(e) for e in x)
        if isinstance(x, dict):
            return {k: cast(v) for k, v in x.items()}
        return x
    inp = _fresh(cast(sample.input), dev)
    args, kwargs = _fresh(cast(tuple(sample.args)), dev), _fresh(cast(dict(sample.kwargs)), dev)
    inputs = [t for t in _tensors([inp, args, kwargs]) if t.requires_grad]
    torch.manual_seed(0)
    out = op(inp, *args, **kwargs)
    outs = [o for o in _tensors(out) if o.requires_grad and o.is_floating_point()]
    if not outs or not inputs:
        return None
    g = torch.Generator().manual_seed(1)
    loss = 0
    for o in outs:
        cot = torch.randn(o.shape, generator=g, dtype=torch.float64).to(o.dtype).to(o.device)
        loss = loss + ((o.abs() if gauge_free else o) * cot).sum()
    grads = torch.autograd.grad(loss, inputs, allow_unused=True)
    return [None if x is None else x.detach().cpu() for x in grads]


def _differs(op, got, want, exact) -> str | None:
    """Why ``got`` (device) is not ``want`` (eager), judged on accuracy against ``exact``
    (float64) where it is outside the tolerance; None when it agrees."""
    if len(got) != len(want):
        return f"{len(got)} gradients against eager's {len(want)}"
    for i, (a, e) in enumerate(zip(got, want)):
        if (a is None) != (e is None):
            return f"gradient {i}: {'none' if a is None else 'one'} where eager has " \
                   f"{'one' if a is None else 'none'}"
        if a is None:
            continue
        if a.shape != e.shape or a.dtype != e.dtype:
            return f"gradient {i}: {a.dtype}{list(a.shape)} against eager's {e.dtype}{list(e.shape)}"
        rtol, atol = harness.tolerance(op, e.dtype, DTYPE)
        rtol, atol = max(rtol, 1e-4), max(atol, 1e-4)     # a backward sums many products
        if torch.allclose(a, e, rtol=rtol, atol=atol, equal_nan=True):
            continue
        x = exact[i] if exact is not None else None
        if x is not None and a.isnan().equal(e.isnan()):
            ours = float((a.double() - x).abs().nan_to_num(0).max())
            eagers = float((e.double() - x).abs().nan_to_num(0).max())
            if ours <= 2 * eagers + atol:       # as far from exact as eager's float32 is
                continue
        d = (a.double() - e.double()).abs()
        k = int(d.nan_to_num(float("inf")).argmax())
        return (f"gradient {i}: {int((d > atol + rtol * e.double().abs()).sum())}/{d.numel()} "
                f"elements differ, largest at flat index {k}: {a.flatten()[k].item():.6g} against "
                f"eager's {e.flatten()[k].item():.6g}")
    return None


def run_op(op, path: str, cap: int = 2) -> harness.Tally:
    """One OpInfo's float32 gradient samples on ``path``: a Tally (variant "grad")."""
    import xla_compat as xc
    from xla_compat import paths
    name = harness.full_name(op)
    tally = harness.Tally(name, "grad", harness.dtype_name(DTYPE), path)
    missing = harness.load_paths([path])[path]
    if missing:
        tally.failed, tally.first_error = 1, f"path {path} unavailable: {missing}"
        return tally
    reason = (GRAD_SKIPS.get(name) or skips.SKIP_OPS.get(name) or skips.RANDOM_OPS.get(name)
              or skips.METADATA_ONLY.get(name))
    if reason is None and not op.supports_autograd:
        reason = "no autograd support in op_db"
    if reason is None and not op.supports_dtype(DTYPE, "cpu"):
        reason = "no float32 on CPU"
    if reason is not None:
        tally.skipped, tally.skip_reason = 1, reason
        return tally
    try:
        torch.manual_seed(zlib.crc32(name.encode()))
        samples = harness.select(list(op.sample_inputs("cpu", DTYPE, requires_grad=True)), cap)
    except Exception as e:
        tally.failed, tally.first_error = 1, f"generating samples: {harness.first_line(e)}"
        return tally
    tally.samples_total = len(samples)
    gauge_free = name in skips.SIGN_ALIGNED
    start = time.perf_counter()
    for sample in samples:
        why = skips.skip_sample(name, "", DTYPE, sample)
        if why is not None:
            harness._count(tally, "skip", why, {})
            continue
        try:
            want = gradients(op, sample, "cpu", gauge_free=gauge_free)
        except Exception as e:
            harness._count(tally, "skip", f"eager raises: {harness.first_line(e, 120)}", {})
            continue
        if want is None:
            harness._count(tally, "skip", "no differentiable output", {})
            continue
        before = harness._fallbacks()
        error = None
        with paths.activated(path):
            old = signal.signal(signal.SIGALRM, _alarm)
            signal.alarm(SAMPLE_TIMEOUT_S)
            try:
                got = gradients(op, sample, xc.device(), gauge_free=gauge_free)
                exact = None
                if got is not None and any(
                        a is not None and e is not None and not torch.allclose(
                            a, e, rtol=1e-4, atol=1e-4, equal_nan=True)
                        for a, e in zip(got, want)):
                    exact = gradients(op, sample, "cpu", torch.float64, gauge_free)
                error = "no gradient on the device" if got is None else \
                    _differs(op, got, want, exact)
            except Exception as e:
                error = harness.first_line(e)
            finally:
                signal.alarm(0)
                signal.signal(signal.SIGALRM, old)
            late = harness.settle()
        used = {k: v - before.get(k, 0) for k, v in harness._fallbacks().items()
                if v > before.get(k, 0)}
        if error is None and late is not None:
            error = f"sync after the sample failed: {late}"
        if error is not None:
            harness._count(tally, "fail", f"{error} [{harness.describe(sample)}]", used)
        else:
            harness._count(tally, "fallback" if used else "pass", "", used)
    tally.seconds = round(time.perf_counter() - start, 3)
    return tally


def report(rows: list, paths_run: list, seconds: float, cap: int) -> str:
    import subprocess
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    lines = ["# OpInfo gradient conformance", "",
             "Gradients of `sum(out * cotangent)` for PyTorch's OpInfo samples (float32, "
             "`requires_grad=True`) on `hlo` against CPU eager, per path. Generated by `make "
             "conformance-grads` (`python -m tests.conformance.grads`); do not edit by hand. "
             "How it compares: the module docstring of `tests/conformance/grads.py`.", "",
             f"- date {datetime.datetime.now().isoformat(timespec='seconds')}, commit {commit}, "
             f"torch {torch.__version__}; samples per op capped at {cap}; wall time "
             f"{seconds / 60:.1f} min", ""]
    lines += ["| | " + " | ".join(paths_run) + " |", "|---|" + "---|" * len(paths_run)]
    by = {p: [r for r in rows if r.path == p] for p in paths_run}

    def cell(p, f):
        return str(sum(f(r) for r in by[p]))
    for label, f in [("OpInfos run", lambda r: int(not r.skip_reason or r.passed + r.failed > 0)),
                     ("OpInfos with every sample's gradients matching",
                      lambda r: int(r.passed > 0 and not r.failed and not r.fallback)),
                     ("samples passed", lambda r: r.passed),
                     ("samples failed", lambda r: r.failed),
                     ("samples matching only through CPU fallback", lambda r: r.fallback),
                     ("samples skipped", lambda r: r.skipped)]:
        lines.append(f"| {label} | " + " | ".join(cell(p, f) for p in paths_run) + " |")
    lines += ["", "## Failures and fallbacks", ""]
    bad = [r for r in rows if r.failed or r.fallback]
    if not bad:
        lines.append("None.")
    for r in bad:
        lines.append(f"- `{r.op}` ({r.path}): {r.failed} failed, {r.fallback} fallback: "
                     f"{r.first_error or r.fallback_ops}")
    skipped = sorted({(r.op, r.skip_reason) for r in rows if r.skip_reason and not r.passed
                      and not r.failed})
    lines += ["", f"## OpInfos not run ({len(skipped)})", "",
              "| OpInfo | reason |", "|---|---|"]
    lines += [f"| `{op}` | {reason} |" for op, reason in skipped]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--paths", default="legacy,functional")
    parser.add_argument("--ops", default="", help="comma-separated OpInfo full names")
    parser.add_argument("--cap", type=int, default=2, help="samples per OpInfo")
    parser.add_argument("--out", default="", help="write the report here")
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    from torch.testing._internal.common_methods_invocations import op_db
    wanted = set(filter(None, args.ops.split(",")))
    paths_run = args.paths.split(",")
    missing = harness.load_paths(paths_run)
    if any(missing.values()):
        print(f"paths not available: {missing}", file=sys.stderr)
        return 2
    start, rows = time.perf_counter(), []
    for path in paths_run:
        for op in op_db:
            if wanted and harness.full_name(op) not in wanted:
                continue
            row = run_op(op, path, args.cap)
            rows.append(row)
            if row.failed or row.fallback:
                print(f"{path} {row.op}: {row.first_error or row.fallback_ops}", flush=True)
    text = report(rows, paths_run, time.perf_counter() - start, args.cap)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    print(text.split("## Failures")[0])
    return 1 if any(r.failed or r.fallback for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
