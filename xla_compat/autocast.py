"""``torch.autocast("hlo")``: mixed precision on the device, with CUDA's casting policy.

torch ships autocast kernels for its own devices only; a PrivateUse1 backend registers its own
under ``AutocastPrivateUse1`` (without them every op inside ``torch.autocast("hlo")`` failed:
"Could not run 'aten::matmul' with arguments from the 'Autocasthlo' backend"). Here:

- every op falls through the key (runs unchanged), except
- the ops of torch's shared policy lists (``autocast_mode.h``, the lists CUDA, XLA-on-GPU and
  the other devices use), whose kernels cast the op's eligible tensors (floating hlo tensors
  other than float64) and run the op with autocast off for it:

  * ``LOWER``: to the autocast dtype (``torch.get_autocast_dtype("hlo")``; torch's default for
    a PrivateUse1 device is float16, ``torch.autocast("hlo", dtype=torch.bfloat16)`` picks
    bfloat16): matmuls, convolutions, ``linear``, attention, RNN cells;
  * ``FP32``: to float32: pointwise functions that lose range, norms, losses, interpolation;
  * ``FP32_OPT_DTYPE``: reductions and softmax get ``dtype=float32`` unless the call sets one
    (an ineligible first argument: the call as it is);
  * ``FP32_APPEND_DTYPE``: ``norm`` without a dtype becomes ``norm`` with one;
  * ``PROMOTE``: the widest floating type among the eligible tensors (float32 over the autocast
    dtype; float64 ignored);
  * ``binary_cross_entropy`` raises eager's error (unsafe to autocast; use the logits form).

Weights are cast once per region, as torch's ``cached_cast`` does: a float32 leaf that requires
grad and is not a view, cast to the autocast dtype while the cache is enabled
(``torch.autocast(..., cache_enabled=True)``, the default), is cast on first use and every later
use inside the region takes that cast (one convert and one autograd node however often an RNN
step or a tied weight uses it). torch clears its cache when the outermost region exits
(``torch.clear_autocast_cache``); this one is cleared with it.
"""
from __future__ import annotations

import threading
import weakref

import torch

aten = torch.ops.aten
_KEY = "AutocastPrivateUse1"
_EXCLUDE = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastPrivateUse1)

LOWER = (
    "_convolution.deprecated", "_convolution", "conv1d", "conv2d", "conv3d", "conv_tbc",
    "conv_transpose1d", "conv_transpose2d.input", "conv_transpose3d.input", "convolution",
    "prelu", "addmm", "addmv", "addr", "matmul", "einsum", "mm", "mv", "linalg_vecdot", "linear",
    "addbmm", "baddbmm", "bmm", "chain_matmul", "linalg_multi_dot", "_thnn_fused_lstm_cell",
    "_thnn_fused_gru_cell", "lstm_cell", "gru_cell", "rnn_tanh_cell", "rnn_relu_cell",
    "_scaled_dot_product_flash_attention", "scaled_dot_product_attention")
FP32 = (
    "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p",
    "reciprocal", "rsqrt", "sinh", "tan", "pow.Tensor_Scalar", "pow.Tensor_Tensor", "pow.Scalar",
    "softplus", "layer_norm", "native_layer_norm", "rms_norm", "group_norm", "frobenius_norm.dim",
    "nuclear_norm", "nuclear_norm.dim", "cosine_similarity", "poisson_nll_loss",
    "cosine_embedding_loss", "nll_loss", "nll_loss2d", "hinge_embedding_loss", "kl_div",
    "l1_loss", "smooth_l1_loss", "huber_loss", "mse_loss", "margin_ranking_loss",
    "multilabel_margin_loss", "soft_margin_loss", "triplet_margin_loss", "multi_margin_loss",
    "binary_cross_entropy_with_logits", "dist", "pdist", "cdist", "renorm", "logsumexp",
    "upsample_nearest1d", "_upsample_nearest_exact1d", "upsample_nearest2d",
    "_upsample_nearest_exact2d", "upsample_nearest3d", "_upsample_nearest_exact3d",
    "upsample_linear1d", "upsample_bilinear2d", "_upsample_bilinear2d_aa",
    "upsample_trilinear3d", "upsample_bicubic2d", "_upsample_bicubic2d_aa")
FP32_OPT_DTYPE = (
    "prod", "prod.dim_int", "softmax.int", "log_softmax.int", "cumprod", "cumsum",
    "linalg_vector_norm", "linalg_matrix_norm", "linalg_matrix_norm.str_ord", "sum",
    "sum.dim_IntList")
# op without a dtype -> the overload with one (the dtype appended last)
FP32_APPEND_DTYPE = {"norm.Scalar": aten.norm.ScalarOpt_dtype,
                     "norm.ScalarOpt_dim": aten.norm.ScalarOpt_dim_dtype}
PROMOTE = ("addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "vdot", "grid_sampler",
           "index_put", "tensordot", "scatter_add")

_BCE_BANNED = (
    "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to autocast.\n"
    "Many models use a sigmoid layer right before the binary cross entropy layer.\n"
    "In this case, combine the two layers using torch.nn.functional."
    "binary_cross_entropy_with_logits\nor torch.nn.BCEWithLogitsLoss.  "
    "binary_cross_entropy_with_logits and BCEWithLogits are\nsafe to autocast.")

_libs: list = []


def _eligible(x) -> bool:
    return (isinstance(x, torch.Tensor) and x.device.type == "hlo" and x.is_floating_point()
            and x.dtype != torch.float64)


# id(weight) -> (weak reference to it, its cast): torch's cached_cast, for hlo weights. The weak
# reference tells a live weight from a new tensor that took a dead one's id.
_cached: dict = {}
_cached_lock = threading.Lock()


def _cast(x, dtype):
    """Each eligible tensor in ``x`` (a value, list or tuple) as ``dtype``."""
    if isinstance(x, torch.Tensor):
        if not _eligible(x) or x.dtype == dtype:
            return x
        if (x.requires_grad and x.is_leaf and x.dtype == torch.float32 and not x._is_view()
                and dtype == torch.get_autocast_dtype("hlo") and torch.is_autocast_cache_enabled()):
            return _cached_cast(x, dtype)
        return x.to(dtype)
    if isinstance(x, (list, tuple)):
        return type(x)(_cast(e, dtype) for e in x)
    return x


def _cached_cast(x, dtype):
    with _cached_lock:
        hit = _cached.get(id(x))
        if hit is not None and hit[0]() is x:
            return hit[1]
        cast = x.to(dtype)
        _cached[id(x)] = (weakref.ref(x), cast)
        return cast


def clear_cache() -> None:
    """Forget every cached weight cast (torch calls this when the outermost region exits)."""
    with _cached_lock:
        _cached.clear()


def _tensors(args, kwargs):
    for x in (*args, *kwargs.values()):
        if isinstance(x, (list, tuple)):
            yield from (e for e in x if isinstance(e, torch.Tensor))
        elif isinstance(x, torch.Tensor):
            yield x


def _overload(name: str):
    base, _, overload = name.partition(".")
    packet = getattr(aten, base, None)
    if packet is None or (overload or "default") not in packet.overloads():
        return None
    return getattr(packet, overload or "default")


def _casting(op, to):
    """A kernel casting every eligible tensor to ``to(args, kwargs)`` before ``op``."""
    def kernel(*args, **kwargs):
        with torch._C._ExcludeDispatchKeyGuard(_EXCLUDE):
            dtype = to(args, kwargs)
            return op(*_cast(args, dtype), **{k: _cast(v, dtype) for k, v in kwargs.items()})
    return kernel


def _low(args, kwargs):
    return torch.get_autocast_dtype("hlo")


def _fp32(args, kwargs):
    return torch.float32


def _promote(args, kwargs):
    """Eager's ``promote_type``: float32 wins over the autocast dtype; float64 is ignored."""
    if any(_eligible(t) and t.dtype == torch.float32 for t in _tensors(args, kwargs)):
        return torch.float32
    return torch.get_autocast_dtype("hlo")


def _set_opt_dtype(op):
    position = next(i for i, a in enumerate(op._schema.arguments) if a.name == "dtype")

    def kernel(*args, **kwargs):
        with torch._C._ExcludeDispatchKeyGuard(_EXCLUDE):
            if args and _eligible(args[0]):
                if len(args) > position:
                    if args[position] is None:
                        args = (*args[:position], torch.float32, *args[position + 1:])
                elif kwargs.get("dtype") is None:
                    kwargs = dict(kwargs, dtype=torch.float32)
            return op(*args, **kwargs)
    return kernel


def _append_dtype(op, with_dtype):
    arguments = op._schema.arguments

    def kernel(*args, **kwargs):
        # every argument, defaults filled in (the dispatcher may leave them out)
        values = [args[i] if i < len(args) else kwargs.get(a.name, a.default_value)
                  for i, a in enumerate(arguments)]
        with torch._C._ExcludeDispatchKeyGuard(_EXCLUDE):
            dtype = torch.float32 if _eligible(values[0]) else values[0].dtype
            return with_dtype(*values, dtype=dtype)
    return kernel


def _banned(*args, **kwargs):
    raise RuntimeError(_BCE_BANNED)


def install() -> None:
    """Register the fallthrough and the policy kernels (once)."""
    if _libs:
        return
    every = torch.library.Library("_", "IMPL")
    every.fallback(torch.library.fallthrough_kernel, _KEY)
    lib = torch.library.Library("aten", "IMPL")
    _libs.extend((every, lib))
    kernels = {}
    for names, to in ((LOWER, _low), (FP32, _fp32), (PROMOTE, _promote)):
        for name in names:
            op = _overload(name)
            if op is not None:
                kernels[name] = _casting(op, to)
    for name in FP32_OPT_DTYPE:
        op = _overload(name)
        if op is not None:
            kernels[name] = _set_opt_dtype(op)
    for name, with_dtype in FP32_APPEND_DTYPE.items():
        kernels[name] = _append_dtype(_overload(name), with_dtype)
    kernels["binary_cross_entropy"] = _banned
    for name, kernel in kernels.items():
        lib.impl(name, kernel, _KEY)
    torch_clear = torch.clear_autocast_cache

    def clear_autocast_cache():
        torch_clear()
        clear_cache()
    torch.clear_autocast_cache = clear_autocast_cache
