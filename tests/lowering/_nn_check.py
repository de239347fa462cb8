"""Shared check for the nn lowering tests: forward and gradients on hlo vs CPU eager.

Runs on the core path with CPU fallback forbidden, so a pass means the op was lowered (by a rule
or one of PyTorch's decompositions into lowered ops), never computed on the CPU.
"""
from __future__ import annotations

import torch

import xla_compat as xc
from xla_compat import metrics, paths, settings

RTOL, ATOL = 1e-5, 1e-6


def _flat(out):
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (list, tuple)):
        return [t for o in out for t in _flat(o)]
    return []


def _compare(actual, expected, rtol, atol, what):
    assert len(actual) == len(expected), what
    for i, (a, e) in enumerate(zip(actual, expected)):
        a = a.detach().cpu()
        assert a.dtype == e.dtype, f"{what}[{i}]: dtype {a.dtype} != {e.dtype}"
        assert a.shape == e.shape, f"{what}[{i}]: shape {tuple(a.shape)} != {tuple(e.shape)}"
        torch.testing.assert_close(a, e.detach(), rtol=rtol, atol=atol, equal_nan=True,
                                   msg=lambda m: f"{what}[{i}]: {m}")


def check(fn, *inputs, grad=True, rtol=RTOL, atol=ATOL, grad_rtol=None, grad_atol=None, seed=0,
          frozen=()):
    """Assert ``fn(*inputs)`` and the gradients of its float outputs match CPU eager.

    ``inputs`` are CPU tensors (or other arguments passed through); floating-point tensors get
    ``requires_grad`` when ``grad``, except those at positions in ``frozen`` (buffers an op
    writes in place). Returns the CPU outputs for extra assertions.
    """
    def prepare(device):
        out = []
        for i, x in enumerate(inputs):
            if isinstance(x, torch.Tensor):
                x = x.detach().clone().to(device)
                if grad and x.is_floating_point() and i not in frozen:
                    x.requires_grad_()
            out.append(x)
        return out

    cpu_in = prepare("cpu")
    expected = _flat(fn(*cpu_in))
    gen = torch.Generator().manual_seed(seed)
    diff_out = [o for o in expected if o.requires_grad]
    diff_in = [x for x in cpu_in if isinstance(x, torch.Tensor) and x.requires_grad]
    cotangents = [torch.randn(o.shape, generator=gen, dtype=o.dtype) for o in diff_out]
    expected_grads = []
    if diff_out and diff_in:
        expected_grads = torch.autograd.grad(diff_out, diff_in, cotangents, allow_unused=True)

    metrics.reset()
    with paths.activated("core"), settings.override(cpu_fallback="error"):
        dev = xc.device()
        dev_in = prepare(dev)
        actual = _flat(fn(*dev_in))
        _compare(actual, expected, rtol, atol, "output")
        if expected_grads:
            d_out = [o for o in actual if o.requires_grad]
            d_in = [x for x in dev_in if isinstance(x, torch.Tensor) and x.requires_grad]
            grads = torch.autograd.grad(d_out, d_in, [c.to(dev) for c in cotangents],
                                        allow_unused=True)
            pairs = [(g, e) for g, e in zip(grads, expected_grads) if e is not None]
            assert all(g is not None for g, _ in pairs), "a gradient is missing on hlo"
            _compare([g for g, _ in pairs], [e for _, e in pairs],
                     grad_rtol or rtol, grad_atol or atol, "grad")
    assert metrics.fallback_ops() == [], f"CPU fallback: {metrics.fallback_ops()}"
    return expected
