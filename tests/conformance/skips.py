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
    # torch.cuda.jiterator: CUDA-only by construction; eager CPU raises for every sample.
    **{name: "torch.cuda.jiterator compiles CUDA kernels; eager CPU raises for every sample"
       for name in ("jiterator_unary", "jiterator_binary", "jiterator_4inputs_with_extra_args",
                    "jiterator_binary_return_by_ref", "jiterator_2inputs_2outputs")},
    # Impossible on XLA by nature: XLA arrays are dense, and XLA has no 32-bit complex type.
    "to_sparse": "produces a sparse COO layout; XLA arrays are dense (the hlo device registers "
                 "only the strided layout)",
    "sparse.sampled_addmm": "takes and returns sparse CSR tensors; XLA arrays are dense",
    "sparse.mm.reduce": "takes a sparse CSR operand; XLA arrays are dense",
    "chalf": "converts to complex32 (chalf), a dtype XLA does not have (the device raises an "
             "UnsupportedDtypeError naming it)",
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
# The pooling windows' offsets are drawn with torch.rand on the input's device; with the same
# `_random_samples` the device matches eager exactly (tests/lowering/test_nn_pooling.py).
RANDOM_OPS.update({name: "draws its random pooling windows; compared by shape, dtype, statistics"
                   for name in ("nn.functional.fractional_max_pool2d",
                                "nn.functional.fractional_max_pool3d")})

# -- uninitialised memory: compare shape and dtype only -------------------------------------------
METADATA_ONLY: dict[str, str] = {name: "output is uninitialised memory in eager; shape and dtype "
                                       "are compared, values are not"
                                 for name in ("empty", "empty_like", "empty_strided",
                                              "empty_permuted", "new_empty", "new_empty_strided")}

# -- factors unique only up to sign (phase): aligned to eager's before comparing ------------------
# Singular and eigenvectors are unique up to a sign (a unit phase if complex) per vector; XLA's
# routines need not pick LAPACK's. Each vector of the device result is multiplied by the phase
# that best aligns it with eager's, then everything is compared exactly as usual (values, shapes,
# the other outputs). Pairs stay paired: the vectors of later entries that have a partner in the
# first entry (U's columns <-> Vh's rows) take that partner's phase, so flipping only one of u_j,
# v_j still fails. Entries: (output index, "col" | "row"): where the vectors lie.
_SIGN_REASON = "singular/eigenvectors are unique only up to sign; aligned to eager's, then compared"
SIGN_ALIGNED: dict[str, tuple[str, tuple]] = {
    "linalg.svd": (_SIGN_REASON, ((0, "col"), (2, "row"))),
    "svd": (_SIGN_REASON, ((0, "col"), (2, "col"))),
    "linalg.eigh": (_SIGN_REASON, ((1, "col"),)),
    "linalg.eig": (_SIGN_REASON, ((1, "col"),)),
    # These draw a random projection (device RNG here, CPU RNG in eager), but their samples ask
    # for at least as many components as the rank, so the result is the exact SVD (up to sign).
    "svd_lowrank": (_SIGN_REASON + "; random projection, exact at these ranks", ((0, "col"), (2, "col"))),
    "pca_lowrank": (_SIGN_REASON + "; random projection, exact at these ranks", ((0, "col"), (2, "col"))),
}


def align_signs(name: str, actual, expected):
    """``actual`` with each vector of SIGN_ALIGNED[name]'s entries rotated onto eager's phase."""
    spec = SIGN_ALIGNED[name][1]
    if not isinstance(actual, (list, tuple)) or not isinstance(expected, (list, tuple)) \
            or len(actual) != len(expected):
        return actual
    out = list(actual)
    usable = [(i, kind) for i, kind in spec if isinstance(actual[i], torch.Tensor)
              and isinstance(expected[i], torch.Tensor) and actual[i].shape == expected[i].shape
              and actual[i].dim() >= 2 and actual[i].numel() > 0]
    as_cols = {i: (lambda x: x) if kind == "col" else (lambda x: x.mT.conj())
               for i, kind in usable}   # a row of Vh is a conjugated vector
    counts = [actual[i].shape[-1 if kind == "col" else -2] for i, kind in usable]
    paired = min(counts) if len(counts) > 1 else (counts[0] if counts else 0)
    primary = None
    for i, kind in usable:
        a, e = as_cols[i](actual[i]), as_cols[i](expected[i])
        dot = (e.conj() * a).sum(-2)             # <e_j, a_j>, per vector j
        mag = dot.abs()
        phase = torch.where(mag > 0, dot / torch.where(mag > 0, mag, 1), torch.ones_like(dot))
        phase = phase[..., :paired]
        if primary is None:
            primary = phase
        aligned = a[..., :paired] * primary.conj().unsqueeze(-2)
        rest = a[..., paired:]
        if rest.shape[-1]:  # vectors without a partner span a subspace: rotate within it
            rest = rest @ _procrustes(rest, e[..., paired:])
        out[i] = as_cols[i](torch.cat([aligned, rest], -1))
    return type(actual)(out)


def _procrustes(a, e):
    """The unitary R minimising |a R - e|: equal to e iff a spans the same subspace as e."""
    w, _, zh = torch.linalg.svd(a.mH.double() @ e.double())
    return (w @ zh).to(a.dtype)


# -- indices unique only up to ties: aligned to eager's before comparing --------------------------
# Where several elements are equal, which one an unstable sort, topk, kthvalue or mode names is
# unspecified (eager's CPU kernels pick by their partition algorithm; XLA's by its own). Each
# device index that names an element equal to the one eager's index names (NaN equal to NaN) is
# replaced by eager's; everything is then compared exactly as usual: values, and indices, which
# still fail where one names an element of another value. Sort and topk indices must also name
# distinct elements (checked before aligning: two positions naming one of two equal elements
# would otherwise pass). A stable sort (``stable=True``) is compared as it is.
# Entries: (reason, (position of ``dim`` among the args after the input, where the values are
# among the outputs or None (argsort: the output is the indices), distinct)).
_TIE_REASON = ("which of several equal elements an index names is unspecified; indices naming an "
               "element equal to eager's are aligned to eager's, then compared")
TIE_ALIGNED: dict[str, tuple[str, tuple]] = {
    "sort": (_TIE_REASON, (0, 0, True)),
    "argsort": (_TIE_REASON, (0, None, True)),
    "msort": (_TIE_REASON, (None, None, True)),
    "topk": (_TIE_REASON, (1, 0, True)),
    "kthvalue": (_TIE_REASON, (1, 0, False)),
    "mode": (_TIE_REASON, (0, 0, False)),
}


def align_ties(name: str, sample, actual, expected):
    """``actual`` with its indices aligned to eager's among equal elements (TIE_ALIGNED)."""
    dim_at, values_at, distinct = TIE_ALIGNED[name][1]
    x = sample.input
    if name == "msort" or not isinstance(x, torch.Tensor) or x.dim() == 0 \
            or sample.kwargs.get("stable") or (name in ("sort", "argsort")
                                              and len(sample.args) > 2 and sample.args[2]):
        return actual
    dim = sample.kwargs.get("dim", sample.args[dim_at] if len(sample.args) > dim_at else -1)
    dim %= x.dim()
    if values_at is None:
        got, want = actual, expected
    elif isinstance(actual, (list, tuple)) and isinstance(expected, (list, tuple)):
        got, want = actual[1], expected[1]
    else:
        return actual
    if not (isinstance(got, torch.Tensor) and isinstance(want, torch.Tensor)
            and got.shape == want.shape and got.dtype == want.dtype == torch.int64):
        return actual
    squeezed = got.dim() < x.dim()
    a, e = (got.unsqueeze(dim), want.unsqueeze(dim)) if squeezed else (got, want)
    if bool(((a < 0) | (a >= x.shape[dim])).any()):
        return actual                                  # out of range: compared (and failing) as is
    if distinct and a.shape[dim] > 1:
        ordered = a.sort(dim).values
        if bool((ordered.diff(dim=dim) == 0).any()):
            raise AssertionError(f"{name}: device indices name one element twice along dim {dim}")
    xa, xe = x.gather(dim, a), x.gather(dim, e)
    same = xa == xe
    if xa.is_floating_point() or xa.is_complex():
        same |= xa.isnan() & xe.isnan()
    aligned = torch.where(same, e, a)
    if squeezed:
        aligned = aligned.squeeze(dim)
    if values_at is None:
        return aligned
    out = list(actual)
    out[1] = aligned
    return type(actual)(out)


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
TOLERANCES: dict[str, tuple[dict[torch.dtype, tuple[float, float]], str]] = {
    "matrix_exp": ({torch.float32: (1e-5, 1e-3)},
                   "same algorithm as eager (Bader-Blanes-Casas Taylor, scaling and squaring); its "
                   "samples have 1-norms near 27 (4 squarings) and entries up to 1e5, where float32 "
                   "rounding of two BLAS libraries differs by up to 2e-4 absolute in small entries "
                   "(eager itself is 5e-3 away from the float64 result there)"),
    "nn.functional.conv_transpose3d": (
        {torch.complex64: (1.3e-5, 1.3e-4)},
        "eager runs a complex convolution as three float32 ones (Gauss's trick, above the "
        "backend: the device sees the same three) and takes the imaginary part as c - a - b, "
        "which cancels; float32 rounding that passes in each real convolution becomes up to "
        "2.4e-5 absolute in small entries. op_db allows the same (atol 1.3e-4) for complex64 "
        "between CUDA and the CPU"),
}

# Ops whose samples are ill-conditioned in a dtype: eager's own result is farther from the
# exact one than the dtype's tolerance, so two correct implementations differ by more than it
# too. For these, a device result that misses eager's by more than the tolerance still passes
# where it is no farther from the exact result (the sample run in float64/complex128 on the
# CPU) than twice eager's own error plus the tolerance (``harness.compare_accuracy``).
ACCURACY_JUDGED: dict[str, tuple[frozenset, str]] = {
    "matrix_exp": (
        frozenset({torch.complex64}),
        "samples with 1-norms near 40 (6 squarings) and entries up to 3e7; eager's complex64 "
        "result is 1.9 (absolute) from the complex128 one in small entries, ours 0.65 "
        "(normwise both ~1e-6)"),
    "nn.functional.conv_transpose3d": (
        frozenset({torch.float32}),
        "a transposed 3-d convolution sums 27 taps of 3 channels, in XLA's order against "
        "oneDNN's; on this repository's later host (AMD EPYC, session 33) outputs of ~300 land "
        "up to 3e-5 from eager's (1e-7 relative), past float32's default tolerance: the device "
        "is the closer to the float64 result there (1.4e-6 against eager's 3.2e-5)"),
    "linalg.cond": (
        frozenset({torch.complex64}),
        "a condition number is a ratio of singular values: float32 rounding in the small one is "
        "magnified by the ratio; on this repository's later host (session 33) a sample's ~61 "
        "lands 1.1e-4 from eager's, the device 8.5e-5 (1.4e-6 relative) and eager 3.0e-5 from "
        "the complex128 result"),
    "__rpow__": (
        frozenset({torch.complex64}),
        "a complex64 base to a power of modulus ~10: exp(y log x) magnifies float32 rounding "
        "of y log x ~20x; eager (glibc's cpowf) is up to 4.3e-6 relative from the complex128 "
        "result; the device computes complex64 powers in complex128 and rounds once (5.6e-8)"),
}


def accuracy_judged(full_name: str, dtype: torch.dtype) -> bool:
    entry = ACCURACY_JUDGED.get(full_name)
    return entry is not None and dtype in entry[0]


def skip_sample(full_name: str, variant: str, dtype: torch.dtype, sample) -> str | None:
    """The reason to skip one sample, or None to run it."""
    kwargs = sample.kwargs or {}
    if full_name == "matrix_exp" and dtype == torch.bfloat16:
        # mexp_impl<double> wraps its float64 coefficient tables with from_blob(..., bfloat16),
        # so eager reads them as garbage bfloat16 values and returns NaN for every matrix whose
        # 1-norm selects a degree >= 4 (all the samples)
        return "eager's bfloat16 matrix_exp returns NaN (coefficient tables read as bfloat16)"
    if full_name == "svd_lowrank" and isinstance(kwargs.get("M"), torch.Tensor):
        a = sample.input @ sample.args[0].mT - kwargs["M"]
        if int(torch.linalg.matrix_rank(a).max()) > kwargs.get("q", 6):
            # a rank-q approximation of a matrix of higher rank depends on the random
            # projection: device and CPU generators draw different numbers
            return "approximates a matrix of rank > q: the result depends on the random numbers"
    if full_name == "tensor_split" and sample.args and isinstance(sample.args[0], torch.Tensor):
        # eager requires the split points on the CPU for every device ("tensor_split expected
        # tensor_indices_or_sections to be on cpu"); the harness moves every tensor argument
        return "split points must stay on the CPU (eager rejects device ones on any device)"
    if full_name == "nn.functional.scaled_dot_product_attention" and kwargs.get("dropout_p"):
        # the dropout mask comes from the device RNG (eager's from the CPU generator), so the
        # values differ by design; dropout_p=0 samples are exact, and the dropout is checked by
        # statistics in tests/lowering/test_attention_dropout.py
        return "attention dropout draws from the device RNG (eager: the CPU generator)"
    gen = kwargs.get("generator")
    if isinstance(gen, torch.Generator):
        return "sample passes a CPU torch.Generator, which cannot drive device random ops"
    return None
