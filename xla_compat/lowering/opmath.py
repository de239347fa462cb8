"""How a rule is called for its node: float16/bfloat16 nodes compute in float32 ("opmath") and
round each result once, as eager's CPU kernels do.

Eager's CPU kernels load reduced-precision floats into float32, compute, and store the result
in the tensor's dtype: every op rounds once, whatever runs after it. A rule written for the
tensor's dtype would instead compute in float16/bfloat16, and XLA's CPU backend then widens each
operation to float32 itself and may drop the roundings between fused operations
(``xla_allow_excess_precision``). Here the rule of such a node sees float32 operands and a
float32 ``aval``; its results are converted to the node's dtype with explicit converts, which
XLA keeps: a chain of ops rounds between ops as eager does.

Which ops (``policy``):
- pointwise ops (``torch.Tag.pointwise`` and the activation backwards eager also computes per
  element): operands in Tensor slots that are not float16/bfloat16 (wrapped Python numbers,
  0-dim tensors) are first cast to the result dtype, as TensorIterator does, except where the
  kernel reads the original scalar in float32 (``_ORIGINAL_SCALAR``: ``x * 0.1``, ``x / 0.1``);
- reductions, matmuls, convolutions, normalisations, softmax, pooling, interpolation and
  losses: float16/bfloat16 operands are widened, nothing else changes (eager accumulates in
  float32 and rounds each output once);
- everything else (views, data movement, conversions, random ops, and rules that spell out
  eager's own intermediate roundings or depend on the dtype's range) calls the rule unchanged;
  so does a rule whose ``own_rounding`` predicate accepts the node's arguments (a kernel eager
  picks for some arguments only: transposed convolutions, conv.py).
The float32/float64 path costs one look at the output dtypes.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

LOW = frozenset({np.dtype(jnp.bfloat16), np.dtype(jnp.float16)})
F32 = np.dtype(np.float32)

POINTWISE, WIDEN = "pointwise", "widen"
# mantissa bits and smallest normal exponent of each reduced format
_FORMAT = {np.dtype(jnp.bfloat16): (7, -126), np.dtype(jnp.float16): (10, -14)}

# Pointwise by eager's kernels though not tagged so in torch 2.13.
POINTWISE_NAMES = frozenset({
    "elu_backward", "hardshrink_backward", "hardsigmoid_backward", "hardswish",
    "hardswish_backward", "hardtanh_backward", "leaky_relu_backward", "log_sigmoid_backward",
    "log_sigmoid_forward", "softplus_backward", "softshrink_backward", "glu", "glu_backward",
    "rsub", "arctan2", "floor_divide", "_prelu_kernel", "_prelu_kernel_backward",
    "special_digamma", "special_psi", "special_ndtr", "special_polygamma", "special_gammainc",
    "special_gammaincc",
})

# Kernels that accumulate in float32 and store each output once.
_WIDEN_NAMES = frozenset({
    # reductions, scans
    "sum", "mean", "prod", "var", "std", "var_mean", "std_mean", "logsumexp",
    "linalg_vector_norm", "cumsum", "cumprod", "logcumsumexp", "trace", "dist", "renorm",
    "_foreach_norm", "_foreach_powsum",
    # softmax and normalisation
    "_softmax", "softmax", "_softmax_backward_data",
    "_log_softmax_backward_data", "native_layer_norm", "native_layer_norm_backward",
    "native_group_norm", "native_group_norm_backward", "native_batch_norm_backward",
    "batch_norm_backward",
    # matmul and convolution
    "mm", "bmm", "addmm", "addmv", "addbmm", "baddbmm", "dot", "vdot", "mv", "matmul",
    "outer", "ger", "convolution", "_convolution", "convolution_backward",
    "_cdist_forward", "_cdist_backward", "_pdist_forward", "_pdist_backward", "_euclidean_dist",
    # pooling and interpolation
    "avg_pool2d", "avg_pool3d", "avg_pool2d_backward", "avg_pool3d_backward",
    "_adaptive_avg_pool2d", "_adaptive_avg_pool2d_backward",
    "_adaptive_avg_pool3d_backward", "upsample_bilinear2d", "_upsample_bilinear2d_aa",
    "_upsample_bicubic2d_aa", "upsample_linear1d_backward", "upsample_bilinear2d_backward",
    "upsample_trilinear3d_backward", "upsample_bicubic2d_backward",
    "_upsample_bilinear2d_aa_backward", "_upsample_bicubic2d_aa_backward",
    "grid_sampler_2d_backward", "grid_sampler_3d_backward",
    # losses
    "mse_loss", "mse_loss_backward", "smooth_l1_loss", "smooth_l1_loss_backward", "huber_loss",
    "huber_loss_backward", "soft_margin_loss", "soft_margin_loss_backward",
    "binary_cross_entropy", "binary_cross_entropy_backward", "binary_cross_entropy_with_logits",
    "multi_margin_loss", "multilabel_margin_loss_forward",
})

# Rules that spell out eager's own roundings for float16/bfloat16 (they look at aval.dtype), or
# whose result depends on the dtype's range or spacing.
_OWN_ROUNDING = frozenset({
    "addr", "linalg_cross", "nan_to_num", "nextafter", "frexp", "ldexp", "xlogy",
    # mvlgamma's composite: each of its steps stored in the half dtype (special.mvlgamma)
    "mvlgamma", "special_multigammaln",
    "_adaptive_avg_pool3d", "_trilinear",
    # log_softmax over the last dim: the row's sum and its log stored in the half dtype
    "_log_softmax", "log_softmax",
    # batch norm forward: eager's statistics rounded where it stores them (norms._HalfStats)
    "native_batch_norm", "_native_batch_norm_legit", "_native_batch_norm_legit_functional",
    "_native_batch_norm_legit_no_training", "_batch_norm_with_update_functional",
    "_batch_norm_no_update",
    # upsampling: weights stored in the half dtype (resample._interpolate; bilinear 2-d
    # takes another kernel, whose float32 weights WIDEN gives)
    "upsample_linear1d", "upsample_trilinear3d", "upsample_bicubic2d",
    # grid sampling: eager computes each step in the half dtype (resample._half_grid_sample)
    "grid_sampler_2d", "grid_sampler_3d",
})
# Overloads whose rule spells out eager's roundings (pow by a number: x*x*x rounds twice).
_OWN_ROUNDING_OPS = frozenset({"aten.pow.Tensor_Scalar"})

# Kernels that read a scalar operand in float32 without rounding it to the tensor's dtype first
# (BinaryOpsKernel.cpp: mul and true division by a CPU scalar; addcmul/addcdiv's value).
_ORIGINAL_SCALAR = frozenset({"mul", "div", "multiply", "divide", "true_divide"})

# Scalar-typed arguments eager converts to the tensor's dtype before computing (``alpha`` of
# add/sub is ``alpha_scalar.to<scalar_t>()``, pow's exponent likewise); other Scalars (clamp's
# bounds, addcmul's value, lerp's weight, activation parameters) are read in float32.
_ROUNDED_SCALARS = {"add": {"alpha"}, "sub": {"alpha"}, "subtract": {"alpha"}, "rsub": {"alpha"},
                    "pow": {"exponent"}}


def low_dtype(avals):
    """The float16/bfloat16 dtype among a node's outputs, or None."""
    for a in avals:
        if a.dtype in LOW:
            return a.dtype
    return None


@functools.lru_cache(maxsize=None)
def policy(op_name: str, random: bool):
    """POINTWISE, WIDEN or None for an IR op name ("aten.mul.Tensor") and its rule's kind."""
    parts = op_name.split(".")
    if random or len(parts) != 3:
        return None
    name = parts[1]
    if name in _OWN_ROUNDING or op_name in _OWN_ROUNDING_OPS:
        return None
    if name in _WIDEN_NAMES:
        return WIDEN
    if name in POINTWISE_NAMES:
        return POINTWISE
    from ..lazy.tracer import overload_named
    ov = overload_named(op_name)
    if ov is None:
        return None
    tags = set(ov.tags)
    if torch.Tag.nondeterministic_seeded in tags:
        return None
    if torch.Tag.pointwise in tags:
        return POINTWISE
    if torch.Tag.reduction in tags:
        return WIDEN
    return None


@functools.lru_cache(maxsize=None)
def _tensor_slots(op_name: str) -> tuple[frozenset, frozenset]:
    """Positions and keyword names of an op's Tensor-typed arguments."""
    from ..lazy.tracer import overload_named
    ov = overload_named(op_name)
    pos, kw = set(), set()
    for i, a in enumerate(ov._schema.arguments):
        t = a.type
        if isinstance(t, torch.OptionalType):
            t = t.getElementType()
        if isinstance(t, torch.ListType):
            t = t.getElementType()
        if isinstance(t, torch.TensorType):
            (kw if a.kwarg_only else pos).add(i)
            kw.add(a.name)
    return frozenset(pos), frozenset(kw)


@functools.lru_cache(maxsize=None)
def _rounded_slots(op_name: str) -> tuple[frozenset, frozenset]:
    """Positions and keyword names of the Scalar arguments eager rounds (``_ROUNDED_SCALARS``)."""
    from ..lazy.tracer import overload_named
    names = _ROUNDED_SCALARS.get(op_name.split(".")[1], ())
    ov = overload_named(op_name)
    pos = {i for i, a in enumerate(ov._schema.arguments) if a.name in names and not a.kwarg_only}
    return frozenset(pos), frozenset(names)


def _widen(x, low, foreign: bool):
    """``x`` for a float32 computation: float16/bfloat16 arrays widened; with ``foreign``, other
    real floating values (wrapped numbers, 0-dim tensors, rounded Scalars) first rounded to
    ``low``."""
    if isinstance(x, (list, tuple)):
        return type(x)(_widen(e, low, foreign) for e in x)
    if type(x) is float:
        return float(np.asarray(x, np.float32).astype(low)) if foreign else x
    dt = getattr(x, "dtype", None)
    if dt is None or not hasattr(x, "shape"):
        return x
    if dt in LOW and not (foreign and dt != low):
        return lax.convert_element_type(x, F32)
    if foreign and jnp.issubdtype(dt, jnp.floating):     # (a 0-dim float16 into bfloat16 too)
        return lax.convert_element_type(lax.convert_element_type(x, low), F32)
    return x


def _wide_aval(aval, wide=F32):
    if isinstance(aval, tuple):
        return tuple(_wide_aval(a, wide) for a in aval)
    return jax.ShapeDtypeStruct(aval.shape, wide) if aval.dtype in LOW else aval


def _common_wider(args, kwargs, pos, kw, low):
    """The float dtype a pointwise op's operands take it to past ``low`` (its result's), or
    None: a Tensor operand with dimensions of float32/float64 (or the other half format) takes
    part in TensorIterator's common dtype, as 0-dim tensors and wrapped numbers do not. Only an
    in-place or out= op meets this: a functional one's result is that common dtype."""
    wide = None
    operands = [a for i, a in enumerate(args) if i in pos]
    operands += [v for k, v in kwargs.items() if k in kw]
    for x in operands:
        for t in (x if isinstance(x, (list, tuple)) else (x,)):
            dt = getattr(t, "dtype", None)
            if (dt is None or not getattr(t, "shape", ()) or dt == low
                    or not jnp.issubdtype(dt, jnp.floating)):
                continue
            wide = jnp.promote_types(wide or F32, F32 if dt in LOW else dt)
    return wide


def round_to(x, dtype):
    """``x`` (float32/float64) rounded to float16/bfloat16 ``dtype`` as a C++ float-to-half store
    does (to nearest even, subnormals kept), in a way XLA cannot fold away.

    A bare convert pair (f32 -> f16 -> f32) between fused ops is dropped by XLA's CPU backend,
    and ``reduce_precision`` to float16's own format flushes its subnormals: so the mantissa is
    rounded with float32's exponent range and float16's subnormal range is rounded to multiples
    of 2**-24 on the side; the final convert is then exact (or overflows to inf, as it should)."""
    dt = np.dtype(dtype)
    if not jnp.issubdtype(x.dtype, jnp.floating) or x.dtype in LOW:
        return lax.convert_element_type(x, dt)
    if x.dtype != F32:
        x = lax.convert_element_type(x, F32)    # c10::Half/BFloat16 are built from a float too
    mant, emin = _FORMAT[dt]
    normal = lax.reduce_precision(x, 8, mant)
    if emin == -126:
        return lax.convert_element_type(normal, dt)      # bfloat16 has float32's subnormals
    q = float(2 ** (mant - emin))
    tiny = lax.round(x * q, lax.RoundingMethod.TO_NEAREST_EVEN) / q
    return lax.convert_element_type(jnp.where(jnp.abs(x) < 2.0 ** emin, tiny, normal), dt)


def work(dtype):
    """The dtype eager's kernels compute ``dtype`` tensors in (their opmath type)."""
    return F32 if dtype in LOW else dtype


def store(x, dtype):
    """A computed value stored into a tensor of ``dtype`` (rounded once)."""
    return round_to(x, dtype) if dtype in LOW else x.astype(dtype)


def fma(a, b, c):
    """``a * b + c`` of float32 values rounded once, as the fused multiply-add eager's compiled
    kernels use (a product of two float32 is exact in float64; the sum is rounded to float32
    from there). XLA may or may not contract a multiply and an add itself."""
    f64 = jnp.float64
    return (a.astype(f64) * b.astype(f64) + c.astype(f64)).astype(F32)


def _narrow(out, avals):
    """Round each output whose node dtype is float16/bfloat16 to it (Nones stand for undefined
    outputs and take no aval, as the executor counts them)."""
    single = not isinstance(out, (list, tuple))
    outs = [out] if single else list(out)
    k = 0
    for i, o in enumerate(outs):
        if o is None:
            continue
        if k < len(avals):
            dt = avals[k].dtype
            if dt in LOW and o.dtype != dt:
                outs[i] = round_to(o, dt)
        k += 1
    return outs[0] if single else type(out)(outs)


def call(rule, node, args: list, kwargs: dict):
    """``rule.fn(*args, **kwargs)`` for ``node`` (a ``lazy.ir.Node``), in float32 when the node's
    result is float16/bfloat16 and eager computes it in float32 (see the module docstring)."""
    low = low_dtype(node.avals)
    if low is None:
        return rule.fn(*args, **kwargs)
    if rule.own_rounding is not None and rule.own_rounding(*args, **kwargs):
        return rule.fn(*args, **kwargs)
    how = policy(node.op, rule.random)
    if how is None:
        return rule.fn(*args, **kwargs)
    if how == POINTWISE:
        pos, kw = _tensor_slots(node.op)
        wide = _common_wider(args, kwargs, pos, kw, low)
        if wide is not None:
            # an in-place or out= op into a half tensor whose operands hold another float
            # dtype: TensorIterator computes in their common dtype and rounds once, on storing
            args = [_widen(a, low, False) for a in args]
            kwargs = {k: (_wide_aval(v, wide) if k == "aval" else _widen(v, low, False))
                      for k, v in kwargs.items()}
            return _narrow(rule.fn(*args, **kwargs), node.avals)
        if node.op.split(".")[1] in _ORIGINAL_SCALAR:
            pos, kw = frozenset(), frozenset()
        rpos, rkw = _rounded_slots(node.op)
        args = [_widen(a, low, i in pos or i in rpos) for i, a in enumerate(args)]
        kwargs = {k: v if k == "aval" else _widen(v, low, k in kw or k in rkw)
                  for k, v in kwargs.items()}
    else:
        args = [_widen(a, low, False) for a in args]
        kwargs = {k: v if k == "aval" else _widen(v, low, False) for k, v in kwargs.items()}
    if "aval" in kwargs:
        kwargs["aval"] = _wide_aval(kwargs["aval"])
    return _narrow(rule.fn(*args, **kwargs), node.avals)
