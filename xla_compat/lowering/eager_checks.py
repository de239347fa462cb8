"""Argument checks eager makes and PyTorch's meta kernels skip, raised with eager's type and words.

The tracer runs these beside an op's meta kernel (``tracer.eager_check``), so once per distinct
signature. Without them the device would compute where CPU raises: ``mm`` of float32 and float64
promotes on meta and on XLA, but is an error in eager.
"""
from __future__ import annotations

import functools
import math
import warnings

import torch

from .. import write_checks
from ..lazy import tracer

aten = torch.ops.aten

# c10's names for scalar types in "expected m1 and m2 to have the same dtype" (C++ type names).
_CPP_NAME = {torch.float32: "float", torch.float64: "double", torch.float16: "c10::Half",
             torch.bfloat16: "c10::BFloat16", torch.int64: "long int", torch.int32: "int",
             torch.int16: "short int", torch.int8: "signed char", torch.uint8: "unsigned char",
             torch.bool: "bool", torch.complex64: "c10::complex<float>",
             torch.complex128: "c10::complex<double>"}


def _overloads(*packets):
    return [getattr(p, name) for p in packets for name in p.overloads()]


def _raise(func, bound, message: str):
    raise RuntimeError(message + tracer.raised_by(func, list(bound.values())))


def _raise_eager_error(func, bound, call) -> None:
    """Eager's own error for these inputs: ``call`` runs ``func`` on CPU stand-ins (a tensor of
    the input's dtype, shape or both; never the device values, which would make them
    materialise), and what it raises is raised again, same type and words, naming the op and the
    device inputs (tracer's own re-raise). Nothing is raised when the stand-in call succeeds."""
    try:
        call()
    except (RuntimeError, IndexError, ValueError) as e:
        tracer._reraise(e, func, list(bound.values()))


def _dtype(t):
    return t.dtype if isinstance(t, torch.Tensor) else None


@tracer.eager_check(*_overloads(aten.mm))
def _mm(func, b):
    a, m = _dtype(b.get("self")), _dtype(b.get("mat2"))
    if a is not None and m is not None and a != m:
        _raise(func, b, f"expected m1 and m2 to have the same dtype, but got: "
                        f"{_CPP_NAME.get(a, a)} != {_CPP_NAME.get(m, m)}")


def _addmm_like(first: str, second: str):
    def check(func, b):
        s, m1, m2 = _dtype(b.get("self")), _dtype(b.get(first)), _dtype(b.get(second))
        name = tracer.type_name
        if s is not None and m2 is not None and s != m2:
            _raise(func, b, f"self and mat2 must have the same dtype, but got {name(s)} and "
                            f"{name(m2)}")
        if m1 is not None and m2 is not None and m1 != m2:
            _raise(func, b, f"mat1 and mat2 must have the same dtype, but got {name(m1)} and "
                            f"{name(m2)}")
    return check


tracer.eager_check(*_overloads(aten.addmm, aten.addmm_))(_addmm_like("mat1", "mat2"))
tracer.eager_check(*_overloads(aten.addbmm, aten.addbmm_))(_addmm_like("batch1", "batch2"))


@tracer.eager_check(*_overloads(aten.mv))
def _mv(func, b):
    m, v = _dtype(b.get("self")), _dtype(b.get("vec"))
    if m is not None and v is not None and m != v:
        name = tracer.type_name     # eager's mv is addmv into a result of vec's dtype
        _raise(func, b, f"addmv input tensors must have the same dtype, but got {name(v)}, "
                        f"{name(m)}, and {name(v)}")


# -- Python numbers converted to the computation's dtype ------------------------------------------
# Eager converts add/sub's alpha and clamp's bounds to the dtype it computes in, and raises where
# the value does not fit (a float beyond the dtype's largest finite value, an int outside its
# range, except that an unsigned dtype takes negatives down to minus its largest value; inf
# and nan convert). On XLA the number would silently become inf or wrap around.

_CONVERT_NAME = {torch.float16: "c10::Half", torch.bfloat16: "c10::BFloat16",
                 torch.float32: "float", torch.float64: "double", torch.int8: "int8_t",
                 torch.uint8: "uint8_t", torch.int16: "int16_t", torch.int32: "int",
                 torch.int64: "int64_t", torch.complex32: "c10::complex<c10::Half>",
                 torch.complex64: "c10::complex<float>",
                 torch.complex128: "c10::complex<double>"}


def _fits(value, dtype) -> bool:
    if type(value) is bool or dtype == torch.bool:
        return True
    if dtype.is_complex:
        z, largest = complex(value), torch.finfo(dtype.to_real()).max
        return all(not math.isfinite(p) or abs(p) <= largest for p in (z.real, z.imag))
    if dtype.is_floating_point:
        return type(value) is complex or not math.isfinite(value) or \
            abs(value) <= torch.finfo(dtype).max
    if type(value) is not int:
        return True               # a float or complex for an integer dtype: eager's other error
    info = torch.iinfo(dtype)
    if info.min == 0:             # unsigned: c10 lets a negative number wrap around, as in C
        return -info.max <= value <= info.max
    return info.min <= value <= info.max


def _check_fits(func, b, value, dtype) -> None:
    if type(value) in (int, float, complex, bool) and dtype is not None \
            and not _fits(value, dtype):
        _raise(func, b, f"value cannot be converted to type {_CONVERT_NAME.get(dtype, dtype)} "
                        f"without overflow")


def _computed_in(b, *others):
    dtype = None
    for other in others:
        if other is None:
            continue
        d = torch.result_type(b["self"], other)
        dtype = d if dtype is None else torch.promote_types(dtype, d)
    return dtype if dtype is not None else _dtype(b.get("self"))


@tracer.eager_check(*_overloads(aten.add, aten.add_))
def _alpha_fits(func, b):
    alpha = b.get("alpha")
    if alpha is not None and isinstance(b.get("self"), torch.Tensor):
        _check_fits(func, b, alpha, _computed_in(b, b.get("other")))


@tracer.eager_check(*_overloads(aten.sub, aten.sub_, aten.rsub))
def _subtraction(func, b):
    """sub_check: a bool operand (tensor or number) is refused (the meta kernels refuse only two
    bool tensors); then alpha must fit, as for add."""
    _no_bool_subtraction(func, b)
    _alpha_fits(func, b)


def _no_bool_subtraction(func, b):
    x, other = b.get("self"), b.get("other")
    if _is_bool(x) and _is_bool(other):
        _raise(func, b, "Subtraction, the `-` operator, with two bool tensors is not supported. "
                        "Use the `^` or `logical_xor()` operator instead.")
    if _is_bool(x) or _is_bool(other):
        _raise(func, b, "Subtraction, the `-` operator, with a bool tensor is not supported. If "
                        "you are trying to invert a mask, use the `~` or `logical_not()` "
                        "operator instead.")


def _is_bool(x) -> bool:
    return (isinstance(x, torch.Tensor) and x.dtype == torch.bool) or type(x) is bool


# -- integer division by a zero number ------------------------------------------------------------
# Eager's integer kernels raise "ZeroDivisionError" for a zero divisor; XLA gives -1 (quotients)
# or the dividend (remainders), as CUDA does. A Python-number divisor is known when the op is
# traced (the meta cache and the plans key numbers by value, so this runs for each distinct one);
# a tensor divisor's values are not (a sync per division), and are not checked.

# (Python dispatch hands a wrapped number to the Tensor overloads as a number, too; the out=
# overloads are left out: the check calls the op without an out tensor.)
_INTEGER_DIVISIONS = [op for op in _overloads(aten.floor_divide, aten.floor_divide_,
                                              aten.remainder, aten.remainder_, aten.fmod,
                                              aten.fmod_, aten.div, aten.div_)
                      if not any(a.is_out for a in op._schema.arguments)]


@tracer.eager_check(*_INTEGER_DIVISIONS)
def _integer_zero_divisor(func, b):
    x, other = b.get("self"), b.get("other")
    if not (isinstance(x, torch.Tensor) and type(other) in (int, bool) and other == 0
            and x.numel() > 0):
        return
    if func._schema.name in ("aten::div", "aten::div_") and b.get("rounding_mode") is None:
        return                    # true division: a float result, inf or nan
    dtype = _computed_in(b, other)
    if dtype.is_floating_point or dtype.is_complex:
        return
    rest = {k: v for k, v in b.items() if k not in ("self", "other")}
    _raise_eager_error(func, b, lambda: func(torch.ones(1, dtype=x.dtype), other, **rest))


@tracer.eager_check(aten.nanmedian.dim)
def _nanmedian_of_nothing(func, b):
    """Eager refuses to reduce an empty dim (median.dim's meta kernel says so; nanmedian.dim's
    does not, and the device returned zeros): eager's own IndexError, from an empty CPU tensor
    of the same shape."""
    x = b.get("self")
    if isinstance(x, torch.Tensor) and x.numel() == 0 and x.dim() > 0:
        stand_in = torch.empty(x.shape, dtype=x.dtype)
        _raise_eager_error(func, b, lambda: func(stand_in, b.get("dim", 0),
                                                 b.get("keepdim", False)))


@tracer.eager_check(aten.clamp.default, aten.clamp_.default)
def _bounds_fit(func, b):
    if isinstance(b.get("self"), torch.Tensor):
        dtype = _computed_in(b, b.get("min"), b.get("max"))
        for bound in (b.get("min"), b.get("max")):
            _check_fits(func, b, bound, dtype)


_POW_SCALAR = (aten.pow.Tensor_Scalar, aten.pow_.Scalar, aten.pow.Tensor_Scalar_out)


def _number_exponent(b):
    x, exponent = b.get("self"), b.get("exponent")
    if isinstance(x, torch.Tensor) and type(exponent) in (int, float, complex, bool):
        return x, exponent
    return None, None


@tracer.eager_check_first(*_POW_SCALAR)
def _integer_exponent(func, b):
    """Eager's pow meta function first refuses a negative integer power of an integer tensor."""
    x, exponent = _number_exponent(b)
    if x is not None and not (x.dtype.is_floating_point or x.dtype.is_complex) \
            and type(exponent) in (int, bool) and exponent < 0:
        _raise(func, b, "Integers to negative integer powers are not allowed.")


@tracer.eager_check(*_POW_SCALAR)
def _exponent_fits(func, b):
    """A half-precision or integer pow converts its exponent to its dtype (float32 and wider
    compute in double, so they take any exponent)."""
    x, exponent = _number_exponent(b)
    if x is None:
        return
    dtype = _computed_in(b, exponent)
    if dtype in (torch.float16, torch.bfloat16) or not (dtype.is_floating_point
                                                         or dtype.is_complex):
        _check_fits(func, b, exponent, dtype)




# -- eager's words where a meta kernel refuses a call with its own -------------------------------

_MASKED_FILLS = _overloads(aten.masked_fill, aten.masked_fill_)


@tracer.eager_check_first(*_MASKED_FILLS)
def _masked_fill_arguments(func, b):
    """A boolean mask, and a value the tensor's dtype can take (``_complex_fill_fits``)."""
    mask = b.get("mask")
    if isinstance(mask, torch.Tensor) and mask.dtype != torch.bool:
        _raise(func, b, f"masked_fill_ only supports boolean masks, but got mask with dtype "
                        f"{_CPP_NAME.get(mask.dtype, mask.dtype)}")
    _complex_fill_fits(func, b)


def complex_fill(b):
    """(self, value) where eager converts a complex fill value to a non-complex tensor's dtype
    (bool: nonzero; others: the real part, refused when there is an imaginary part), else None.
    The meta stand-in, the number check and host_values' 0-dim tensor check all ask this."""
    x, value = b.get("self"), b.get("value")
    if not isinstance(x, torch.Tensor) or x.dtype.is_complex:
        return None
    if type(value) is complex or (isinstance(value, torch.Tensor) and value.dtype.is_complex):
        return x, value
    return None


def _complex_fill_fits(func, b):
    """A complex number with an imaginary part cannot fill a real tensor (a complex tensor
    value's parts are checked on the host: host_values)."""
    found = complex_fill(b)
    if found is not None and type(found[1]) is complex:
        x, value = found
        if x.dtype != torch.bool and value.imag != 0:
            _raise(func, b, f"value cannot be converted to type "
                            f"{_CONVERT_NAME.get(x.dtype, x.dtype)} without overflow")


@tracer.meta_arguments(*_MASKED_FILLS)
def _complex_fill_stand_in(func, args, kwargs):
    """The meta kernels refuse every complex value for a real tensor, where eager converts it
    (``complex_fill``): they run on the converted value's stand-in."""
    found = complex_fill(tracer.bind(func, args, kwargs))
    if found is None:
        return args, kwargs
    x, value = found
    if type(value) is complex:
        stand_in = bool(value) if x.dtype == torch.bool else value.real
    else:
        stand_in = torch.empty_strided(value.shape, value.stride(), dtype=x.dtype, device="meta")
    names = [a.name for a in func._schema.arguments]
    i = names.index("value")
    if i < len(args):
        return (*args[:i], stand_in, *args[i + 1:]), kwargs
    return args, {**kwargs, "value": stand_in}


@tracer.eager_check_first(*_overloads(aten.lerp, aten.lerp_))
def _lerp_dtypes(func, b):
    x = b.get("self")
    if not isinstance(x, torch.Tensor):
        return
    for name in ("end", "weight"):
        t = b.get(name)
        if isinstance(t, torch.Tensor) and t.dtype != x.dtype:
            _raise(func, b, f"expected dtype {_CPP_NAME.get(x.dtype, x.dtype)} for `{name}` but "
                            f"got dtype {_CPP_NAME.get(t.dtype, t.dtype)}")


@tracer.eager_check_first(*_overloads(aten.convolution))
def _convolution(func, b):
    """Eager's checks of a convolution's operands: the input's channels against the weight and
    groups (a transposed convolution's too), the bias's size, the weight's rank, an input and a
    weight of two dtypes, bool operands. The meta kernel makes a few in other words ("Invalid
    channel dimensions", an IndexError for a weight of another rank) and skips the rest, which
    then failed while lowering. Asked of the CPU kernel, before the meta kernel, on zeros of the
    real shapes and strides (its messages quote the input's sizes, and which of its kernels
    checks the dtypes depends on the batch size): once per signature, a convolution of the
    zeros when the call is valid; not asked past _WHOLE_LIMIT elements of input or weight."""
    x, w, bias = b.get("input"), b.get("weight"), b.get("bias")
    if not (isinstance(x, torch.Tensor) and isinstance(w, torch.Tensor)):
        return
    if x.numel() > _WHOLE_LIMIT or w.numel() > _WHOLE_LIMIT:
        return
    cpu = dict(b, input=_zeros_like_layout(x), weight=_zeros_like_layout(w))
    if isinstance(bias, torch.Tensor):
        cpu["bias"] = _zeros_like_layout(bias)

    def call():
        with torch.no_grad():
            func(**cpu)
    _raise_eager_error(func, b, call)


# Factories reach the device through their out= forms (``torch.arange(..., device=)`` is an
# empty tensor and ``arange.start_out``): their CPU kernels refuse dtypes (``arange`` of bools
# or complex values, ``linspace``/``logspace`` of bools, ``randperm`` of bools) the device
# computed. Asked with the smallest call of the same dtype (the real sizes may be large; only
# a dtype refusal is taken from it).
_FACTORY_PROBES = {
    aten.arange: lambda out: torch.arange(0, 1, 1, out=out),
    aten.linspace: lambda out: torch.linspace(0, 1, 2, out=out),     # (one step: no kernel)
    aten.logspace: lambda out: torch.logspace(0, 1, 2, out=out),
    aten.randperm: lambda out: torch.randperm(1, out=out, generator=torch.Generator()),
}


@tracer.eager_check_first(*_overloads(*_FACTORY_PROBES))
def _factory_dtypes(func, b):
    out = b.get("out")
    if isinstance(out, torch.Tensor):
        probe = _FACTORY_PROBES[func.overloadpacket]
        factory_dtype_check(lambda: probe(torch.empty(0, dtype=out.dtype)), out.dtype, func)


def factory_dtype_check(probe, dtype, name) -> None:
    """``probe`` (a factory's smallest CPU call of ``dtype``) raising a dtype refusal raises
    it, naming ``name``: the out= factories above, and those the device implements as kernels
    (``tril_indices``, ``kaiser_window``)."""
    try:
        probe()
    except (NotImplementedError, RuntimeError) as e:
        if any(words in str(e) for words in _DTYPE_REFUSALS):
            message = str(e).splitlines()[0]
            raise type(e)(f"{message}\n  (xla_compat: raised by {name} of dtype {dtype}: CPU "
                          f"eager has no kernel for it, so the device refuses the call too)") \
                from None


@tracer.eager_check_first(*_overloads(aten.dot, aten.vdot))
def _dot_dtypes(func, b):
    x, y = b.get("self"), b.get("tensor", b.get("other"))    # (dot's second is "tensor")
    if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) and x.dtype != y.dtype:
        _raise(func, b, f"dot : expected both vectors to have "
                        f"same dtype, but found {tracer.type_name(x.dtype)} and "
                        f"{tracer.type_name(y.dtype)}")


# -- normalisation with parameters of another dtype ("mixed dtype (CPU)") -------------------------
# CPU eager's kernels read parameters (weight, bias, running stats) of the input's dtype, or
# float32 ones for a bfloat16/float16 input (a "mixed" call, decided by the first parameter
# given); the statistics they return are float32 in a mixed call and the input's dtype
# otherwise. The meta kernels check none of it and give float32 statistics for half inputs.

_REDUCED_FLOAT = (torch.bfloat16, torch.float16)


def mixed_statistics_dtype(func, b, parameters: tuple):
    """The dtype of the statistics the normalisation ``func`` returns on arguments ``b``, after
    eager's checks of its ``parameters``' dtypes (their names, in the order eager's
    is_mixed_type reads them), raised with eager's words. The op table is lowering/norms.py's."""
    x = b.get("input")
    dtypes = [p.dtype for p in map(b.get, parameters) if isinstance(p, torch.Tensor)]
    if not dtypes or dtypes[0] == x.dtype:
        for d in dtypes:
            if d != x.dtype:
                _raise(func, b, f"expected scalar type {tracer.type_name(x.dtype)} but found "
                                f"{tracer.type_name(d)}")
        return x.dtype
    if any(d != torch.float32 for d in dtypes):
        _raise(func, b, "mixed dtype (CPU): expect parameter to have scalar type of Float")
    if x.dtype not in _REDUCED_FLOAT:
        _raise(func, b, "mixed dtype (CPU): all inputs must share same datatype.")
    return torch.float32


# -- dtypes the CPU kernel has no implementation for -----------------------------------------------
# Meta kernels accept every dtype, XLA computes most: ``hypot`` of integers, ``mm`` of bools,
# ``&`` of floats would run on the device where CPU eager raises NotImplementedError
# ('"hypot_cpu" not implemented for 'Long''). Asking the CPU kernel is the one source that
# cannot drift from eager: on a meta-cache miss (once per signature) the op runs on CPU tensors
# of one element per dimension and the argument's dtype, and only that error is taken from it
# (any other error of such a call, a shape or value check, says nothing about the real call).
# Only ops for which such stand-ins are a valid call are asked: pointwise ops (no size or index
# arguments) and the matrix products. A kernel handed sizes or indices that do not fit its
# tensors may read out of bounds (ctc_loss_backward segfaulted on them), so no other op is.
# Ops that draw random numbers (the CPU generator is the user's) and calls with no tensor are
# not asked.

# What a kernel says when it has no implementation for a dtype: '"hypot_cpu" not implemented for
# 'Long'', and for complex operands "maximum not implemented for complex tensors." (a
# RuntimeError) and "clamp is not supported for complex types".
_DTYPE_REFUSALS = (" not implemented for '", " not implemented for complex tensors",
                   " is not supported for complex types", " is not supported for complex inputs",
                   " is not supported for complex tensors",
                   "Boolean inputs not supported for ",
                   "torch.sign is not intended to support complex numbers",
                   "does not support bool", "only support floating point and complex dtypes",
                   "does not support complex", " can't be cast to the desired output type ",
                   " only supports floating-point dtypes for ",
                   "handles only integral, floating-point and boolean",
                   "to - 1 is out of bounds for ", "from is out of bounds for ",
                   "Expected both inputs to be Half, Float or Double tensors",
                   "Unsupported input type encountered for ",
                   "is not yet implemented for complex tensors",
                   "Integer division with addcdiv is no longer supported",
                   "FFT doesn't support tensors of type", "Unknown Complex ScalarType for ",
                   "This function doesn't handle types other than float and double",
                   "The input tensor may not be a boolean tensor",
                   "Expected a floating point or complex tensor as input",
                   "value cannot be converted to type ",
                   "Converting complex Scalar to non-complex type is not supported",
                   " expected to have the same dtype, but got ",
                   " must have the same scalar type",
                   "is not yet implemented for tensors with different dtypes",
                   "expected scalar type ", "Expected object of scalar type ",
                   "Subtraction, the `-` operator, with a bool tensor is not supported")
_MATRIX_PRODUCTS = frozenset(p for p in (aten.mm, aten.bmm, aten.addmm, aten.addmm_, aten.mv,
                                         aten.addmv, aten.addmv_, aten.dot, aten.vdot,
                                         aten.addbmm, aten.addbmm_, aten.baddbmm,
                                         aten.baddbmm_, aten.addr, aten.addr_))


@tracer.register_every_op_check
def cpu_kernel_dtypes(func, args, kwargs) -> None:
    asked = _asked(func)
    if not asked:
        return
    found: list = []
    whole = func.overloadpacket in _WHOLE_STAND_INS
    pair = func.overloadpacket in _FILLS
    make = torch.ones if func.overloadpacket in _ONES_STAND_INS else torch.zeros

    def stand_in(x):
        # a CPU tensor of x's dtype, one element per dimension (none where x has none: the
        # call's output is never larger than the real one's)
        if isinstance(x, torch.Tensor):
            found.append(x)
            if pair and not found[1:]:
                return torch.empty(min(x.numel(), 2), dtype=x.dtype)
            if whole:
                if x.numel() > _WHOLE_LIMIT:
                    raise _Skip
                return _zeros_like_layout(x)
            return make([min(n, 1) for n in x.shape], dtype=x.dtype)
        if isinstance(x, torch.Generator):
            return torch.Generator()       # never the caller's: its state stays as it was
        return x
    try:
        cpu_args = tracer.map_nested(args, stand_in)
        cpu_kwargs = {k: tracer.map_nested(v, stand_in) for k, v in kwargs.items()}
    except _Skip:
        return
    if not found or any(t.layout != torch.strided for t in found):
        return
    if torch.Tag.nondeterministic_seeded in func.tags:
        own = _with_own_generator(func, cpu_args, cpu_kwargs)
        if own is None:
            return
        func, cpu_args, cpu_kwargs = own
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            func(*cpu_args, **cpu_kwargs)
    except (NotImplementedError, RuntimeError, ValueError) as e:
        if any(words in str(e) for words in _DTYPE_REFUSALS):
            _raise_not_implemented(func, args, kwargs, e)
    except Exception:      # noqa: BLE001 - a check of the stand-ins' shapes or values
        pass


class _Skip(Exception):
    pass


def _with_own_generator(func, args, kwargs):
    """(op, args, kwargs) of a random draw that takes a fresh generator instead of the default
    CPU one (whose state belongs to the caller, and to any thread drawing from it meanwhile):
    the ``*_like`` factories' overloads without a generator become their ``generator`` twins.
    None for a draw with neither (their out= forms): not asked."""
    func = _GENERATOR_TWINS.get(func, func)
    names = [a.name for a in func._schema.arguments]
    if "generator" not in names:
        return None
    i = names.index("generator")
    if i < len(args):
        return func, (*args[:i], torch.Generator(), *args[i + 1:]), kwargs
    return func, args, {**kwargs, "generator": torch.Generator()}


@functools.lru_cache(maxsize=None)
def _asked(func) -> bool:
    """Is the CPU kernel asked about ``func``'s dtypes? Pointwise ops, matrix products and the
    listed reductions, nn ops and random draws, except copies between dtypes and devices."""
    packet = func.overloadpacket
    if torch.Tag.nondeterministic_seeded in func.tags and packet not in _RANDOM:
        return False
    if (packet not in _MATRIX_PRODUCTS and packet not in _UNTAGGED and packet not in _REDUCTIONS
            and packet not in _NN and packet not in _RANDOM and packet not in _LINALG
            and not _pointwise(func)):
        return False
    if packet in _UNTAGGED:
        return True
    name = func._schema.name.split("::", 1)[1]
    return not (name in _COPIES or name.endswith("_copy") or "fill" in name)


# Copies between dtypes and devices (not ``copysign``, not ``nan_to_num``: their names only
# contain the words), and fills named ``*fill*`` that take every dtype; and ops without the
# pointwise tag whose CPU kernels refuse dtypes (``bool // bool``) or values of another dtype:
# a fill value the tensor's dtype cannot hold (``fill_(300)`` of uint8, ``fill_(1j)`` of an
# integer tensor), a source of another dtype (``index_copy``, ``index_add``, ``put_``).
_COPIES = frozenset({"copy", "copy_", "_to_copy", "_copy_from", "_copy_from_and_resize"})
# fill_ of one element takes its own path, which converts the value without a check for half
# floats (1e40 fills a one-element float16 tensor with inf, and is refused for two): the
# tensor's stand-in has as many elements as it, up to two.
_FILLS = frozenset({aten.fill, aten.fill_})
_UNTAGGED = frozenset({aten.fill, aten.fill_, aten.index_fill, aten.index_fill_, aten.scatter,
                       aten.masked_fill, aten.masked_fill_,
                       aten.scatter_, aten.put, aten.put_, aten.index_copy, aten.index_copy_,
                       aten.index_add, aten.index_add_,
                       aten.floor_divide, aten.floor_divide_, aten.polar, aten.complex,
                       aten.isin, aten.mvlgamma, aten.mvlgamma_, aten.histogram,
                       aten.histogramdd, aten._histogramdd_bin_edges,
                       aten._histogramdd_from_bin_cts, aten._histogramdd_from_bin_tensors})
# Reductions, scans and sorts whose CPU kernels refuse dtypes the device would compute
# (``argmax`` and ``topk`` of bools, ``var``/``std`` of integers, ``median`` and ``trace`` of
# bools, ``logcumsumexp`` of integers, ordering and ``nansum`` of complex values, a scatter's
# ``amax`` of complex values and ``mean`` of bools, ``searchsorted``, ``histc`` and ``bincount``
# of bools or integers); ``topk`` and
# ``kthvalue`` check k against the real size before the dtype, so they are asked with zeros of
# the real shape (up to _WHOLE_LIMIT elements).
_REDUCTIONS = frozenset({aten.argmax, aten.argmin, aten.var, aten.std, aten.var_mean,
                         aten.std_mean, aten.median, aten.nanmedian, aten.kthvalue, aten.topk,
                         aten.trace, aten.logcumsumexp, aten._logcumsumexp, aten.amax, aten.amin,
                         aten.max, aten.min, aten.aminmax, aten.mode, aten.sort, aten.argsort,
                         aten.cummax, aten.cummin, aten.nansum, aten.scatter_reduce,
                         aten.scatter_reduce_, aten.searchsorted, aten.bucketize, aten.histc,
                         aten.bincount, aten.dist})
# The nn ops whose CPU kernels refuse dtypes the device would compute or fail on in jax's
# words: softmax and the normalisations of integers, pooling of bools and complex values,
# losses of integers, upsampling and im2col of integers, pdist/cdist in half precision. Their
# CPU kernels check sizes (windows, normalised shapes, halves, scale factors) before dtypes, so
# they are asked with zeros of the real shape and strides (a kernel picks its memory-format
# path from them): sizes that fit the tensors, so nothing reads out of bounds.
_NN = frozenset({
    aten._softmax, aten._log_softmax, aten.native_layer_norm, aten.native_group_norm,
    aten.native_batch_norm, aten._native_batch_norm_legit,
    aten._native_batch_norm_legit_no_training, aten._native_batch_norm_legit_functional,
    aten.avg_pool2d, aten.avg_pool3d, aten.max_pool2d_with_indices,
    aten.max_pool3d_with_indices, aten.adaptive_max_pool2d, aten.adaptive_max_pool3d,
    aten._adaptive_avg_pool2d, aten._adaptive_avg_pool3d, aten.fractional_max_pool2d,
    aten.fractional_max_pool3d, aten.max_unpool2d, aten.max_unpool3d,
    aten.mse_loss, aten.smooth_l1_loss, aten.huber_loss, aten.binary_cross_entropy,
    aten.binary_cross_entropy_with_logits, aten.soft_margin_loss, aten.multi_margin_loss,
    aten.multilabel_margin_loss_forward, aten.nll_loss_forward, aten.nll_loss2d_forward,
    aten.log_sigmoid_forward, aten.glu, aten.hardswish, aten.hardswish_, aten._prelu_kernel,
    aten.upsample_nearest1d, aten.upsample_nearest2d, aten.upsample_nearest3d,
    aten._upsample_nearest_exact1d, aten._upsample_nearest_exact2d,
    aten._upsample_nearest_exact3d, aten.upsample_linear1d, aten.upsample_bilinear2d,
    aten._upsample_bilinear2d_aa, aten.upsample_bicubic2d, aten._upsample_bicubic2d_aa,
    aten.upsample_trilinear3d, aten.grid_sampler_2d, aten.grid_sampler_3d, aten._pdist_forward,
    aten._cdist_forward, aten.im2col, aten.col2im, aten.reflection_pad1d, aten.reflection_pad2d,
    aten.reflection_pad3d, aten.replication_pad1d, aten.replication_pad2d,
    aten.replication_pad3d})
# Random draws whose CPU kernels refuse dtypes (``poisson``, ``bernoulli`` and ``normal`` of
# integers, ``multinomial`` of integers, ``rand_like`` of integers, ``rrelu`` of integers),
# asked with a generator of their own (``_with_own_generator``): never the caller's, never the
# default CPU one.
_RANDOM = frozenset({
    aten.bernoulli, aten.bernoulli_, aten.normal, aten.normal_, aten.uniform_,
    aten.exponential_, aten.geometric_, aten.cauchy_, aten.log_normal_, aten.random_,
    # (the functional path's forms of the in-place fills)
    aten.normal_functional, aten.uniform, aten.exponential, aten.geometric, aten.cauchy,
    aten.log_normal, aten.random,
    aten.multinomial, aten.poisson, aten._standard_gamma, aten.binomial, aten.rand_like,
    aten.randn_like, aten.randint_like, aten.rrelu_with_noise, aten.rrelu_with_noise_,
    aten.rrelu_with_noise_functional})
_GENERATOR_TWINS = {
    aten.rand_like.default: aten.rand_like.generator,
    aten.randn_like.default: aten.randn_like.generator,
    aten.randint_like.default: aten.randint_like.generator,
    aten.randint_like.Tensor: aten.randint_like.Tensor_generator,
    aten.randint_like.low_dtype: aten.randint_like.low_generator_dtype}
# Linear algebra and FFTs, whose LAPACK and pocketfft/MKL kernels take float and complex dtypes
# only (half precision neither): the device failed in jax's words while lowering or compiling
# (``lu``, ``eigh``, ``svd`` of integers or float16), or computed (``solve_triangular`` in
# float16). Asked with zeros of the real shape: their size checks (square matrices, matching
# batch dims, an FFT's lengths) come first, and a LAPACK call on zeros only reports a singular
# matrix in its ``info``.
_LINALG = frozenset({
    aten.linalg_lu, aten.linalg_lu_factor_ex, aten.linalg_lu_solve, aten.lu_unpack,
    aten._linalg_det, aten._linalg_slogdet, aten.linalg_solve_triangular,
    aten.triangular_solve, aten._linalg_solve_ex, aten.linalg_cholesky_ex, aten.cholesky,
    aten.cholesky_solve, aten.cholesky_inverse, aten.linalg_qr, aten.geqrf, aten.ormqr,
    aten._linalg_svd, aten._linalg_eigh, aten.linalg_eig, aten._linalg_eigvals,
    aten.linalg_lstsq, aten.linalg_householder_product, aten.linalg_inv_ex, aten.linalg_cross,
    aten.linalg_ldl_factor_ex, aten.linalg_ldl_solve, aten._fft_r2c, aten._fft_c2c,
    aten._fft_c2r})
_WHOLE_STAND_INS = frozenset({aten.topk, aten.kthvalue}) | _NN | _LINALG
# Ops asked with stand-ins holding ones: histc of equal bounds widens them to the data's
# (min - 1, max + 1), which zeros of uint8 cannot hold (eager raises an overflow there before
# its dtype refusal).
_ONES_STAND_INS = frozenset({aten.histc})
# The most elements a stand-in of the real shape may have: the call runs once per signature
# (a meta-cache miss), a few milliseconds at this size; a larger call is not asked.
_WHOLE_LIMIT = 1 << 18


def _zeros_like_layout(x: torch.Tensor) -> torch.Tensor:
    """CPU zeros of ``x``'s dtype, shape and strides."""
    if x.is_contiguous():
        return torch.zeros(x.shape, dtype=x.dtype)
    extent = write_checks.extent(x) - x.storage_offset()
    return torch.zeros(extent, dtype=x.dtype).as_strided(x.shape, x.stride())


def _pointwise(func) -> bool:
    """Tagged pointwise, or the in-place form of an op that is (24 in-place overloads, abs_ and
    frac_ among them, lack the tag their functional forms carry)."""
    if torch.Tag.pointwise in func.tags:
        return True
    name = func._schema.name.split("::", 1)[1]
    if torch.Tag.inplace not in func.tags or not name.endswith("_"):
        return False
    functional = getattr(getattr(aten, name[:-1], None), func._overloadname, None)
    return functional is not None and torch.Tag.pointwise in functional.tags


def _raise_not_implemented(func, args, kwargs, e: Exception):
    message = str(e).splitlines()[0]
    raise type(e)(message + tracer.raised_by(
        func, [*args, *kwargs.values()], ": CPU eager has no kernel for these dtypes, so the "
        "device refuses the call too; convert the inputs to a dtype the op takes")) from None


def t_in_place_dims(t: torch.Tensor) -> None:
    """``t_``'s dimension check, in eager's words: the view ``t``'s meta kernel names ``t()``, and
    ``t_``'s meta kernel asserts (AssertionError). Both paths run it before restriding."""
    if t.dim() > 2:
        raise RuntimeError(f"t_() expects a tensor with <= 2 dimensions, but self is {t.dim()}D")
