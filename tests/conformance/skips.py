"""Every exception the conformance harness makes, each with its reason: THE one place to look.

Four kinds: ops not run at all (``SKIP_OPS``), ops compared by statistics because they draw random
numbers (``RANDOM_OPS``), ops whose output is uninitialised memory (``METADATA_ONLY``), and
tolerances looser than the dtype default (``TOLERANCES``), each justified. Sample-level skips are
decided by ``skip_sample``. Keys are OpInfo full names: ``name`` or ``name.variant_test_name``.
"""
from __future__ import annotations

import torch

# -- ops not run ---------------------------------------------------------------------------------
SKIP_OPS: dict[str, str] = {
    # The flash/efficient attention kernels exist only for CUDA; their CPU samples are empty.
    "torch.ops.aten._flash_attention_forward": "CUDA-only kernel; eager CPU has no implementation",
    "torch.ops.aten._efficient_attention_forward": "CUDA-only kernel; eager CPU has no implementation",
}

# -- random ops: compared by shape, dtype and statistics -------------------------------------------
# Different generators (threefry on the device, mt19937 on the CPU) cannot give equal numbers.
RANDOM_OPS: dict[str, str] = {name: "draws random numbers; compared by shape, dtype, statistics"
                              for name in (
    "bernoulli", "cauchy", "exponential", "geometric", "log_normal", "multinomial",
    "normal", "normal.in_place", "normal.number_mean", "uniform",
    "rand_like", "randn", "randn_like", "randint", "randint_like",
    "nn.functional.dropout", "nn.functional.dropout2d", "nn.functional.dropout3d",
    "nn.functional.alpha_dropout", "nn.functional.feature_alpha_dropout.with_train",
    "nn.functional.rrelu",
)}

# -- uninitialised memory: compare shape and dtype only -------------------------------------------
METADATA_ONLY: dict[str, str] = {name: "output is uninitialised memory in eager; shape and dtype "
                                       "are compared, values are not"
                                 for name in ("empty", "empty_like", "empty_strided",
                                              "empty_permuted", "new_empty", "new_empty_strided")}

# -- tolerances ------------------------------------------------------------------------------------
# Defaults are torch.testing.assert_close's per dtype: the bar PyTorch sets itself between devices.
DEFAULT_TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float32: (1.3e-6, 1e-5),
    torch.float64: (1e-7, 1e-7),
    torch.bfloat16: (1.6e-2, 1e-5),
    torch.float16: (1e-3, 1e-5),
}
# Also used: the op's own ``toleranceOverride`` decorators from op_db (PyTorch's statement of how
# far two correct implementations of that op may differ for that dtype); see harness.tolerance.
# Extra per-op overrides: (rtol, atol) by dtype, with the reason.
TOLERANCES: dict[str, tuple[dict[torch.dtype, tuple[float, float]], str]] = {}


def skip_sample(full_name: str, variant: str, dtype: torch.dtype, sample) -> str | None:
    """The reason to skip one sample, or None to run it."""
    kwargs = sample.kwargs or {}
    gen = kwargs.get("generator")
    if isinstance(gen, torch.Generator):
        return "sample passes a CPU torch.Generator, which cannot drive device random ops"
    return None
