"""Printing, pickling and deep-copying functional hlo tensors.

The wrapper's Python type is plain ``torch.Tensor`` and it reports a storage, so torch's own
``__repr__`` prints ``_to_functional_tensor(...)`` of a possibly stale inner tensor, and
``__deepcopy__`` / ``__reduce_ex__`` take the storage route and crash. torch special-cases the
``xla`` device in these three places; we hook the same three places for our wrappers only and
hand everything else to torch unchanged. A fourth hook tracks ``nn.Parameter(wrapper)``: the
parameter is a new wrapper object no factory saw, and a failed sync must roll it back.
"""
from __future__ import annotations

import warnings

import torch
import torch._tensor_str as _tensor_str

from xla_compat.lazy.tensor import device_deepcopy

from .strides import storage_id as _storage_id
from .wrap import owns, sync_wrapper, track, wrap

_installed = False


def _repr_of(t: torch.Tensor) -> str:
    with torch.no_grad():
        cpu = t.detach().cpu()
    text = repr(cpu)
    extra = f"device='{t.device}'"
    if t.grad_fn is not None:
        extra += f", grad_fn=<{type(t.grad_fn).__name__}>"
    elif t.requires_grad:
        extra += ", requires_grad=True"
    return text[:-1] + f", {extra})" if text.endswith(")") else text


def install() -> None:
    """Install the hooks once (idempotent)."""
    global _installed
    if _installed:
        return
    _installed = True
    torch_str = _tensor_str._str
    torch_deepcopy = torch.Tensor.__deepcopy__
    torch_reduce_ex = torch.Tensor.__reduce_ex__

    def _str(self, *, tensor_contents=None):
        if owns(self) and tensor_contents is None:
            return _repr_of(self)
        return torch_str(self, tensor_contents=tensor_contents)

    def __deepcopy__(self, memo):
        if not owns(self) or type(self) is not torch.Tensor:
            return torch_deepcopy(self, memo)
        return device_deepcopy(self, memo)

    def __reduce_ex__(self, proto):
        if owns(self) and type(self) is torch.Tensor:
            # torch.save of a device tensor stores CPU data (torch_xla's behaviour, and the core's).
            return self.detach().cpu().__reduce_ex__(proto)
        return torch_reduce_ex(self, proto)

    torch_parameter_new = torch.nn.Parameter.__new__

    def parameter_new(cls, data=None, requires_grad=True):
        p = torch_parameter_new(cls, data, requires_grad)
        return track(p) if owns(p) else p

    _tensor_str._str = _str
    torch.nn.Parameter.__new__ = staticmethod(parameter_new)
    torch.Tensor.__deepcopy__ = __deepcopy__
    torch.Tensor.__reduce_ex__ = __reduce_ex__
    global _lib
    _lib = torch.library.Library("aten", "IMPL")
    with warnings.catch_warnings():     # "overriding a previously registered kernel": meant
        warnings.simplefilter("ignore")
        _lib.impl("_to_copy", _to_copy_functionalize, "Functionalize")
        _install_pack_padded_sequence()
        _install_as_strided()
        _install_copy_ops()
        _install_unfold_backward()
        _lib.impl("_has_same_storage_numel", _same_storage_numel, "Functionalize")
    from . import list_writes
    list_writes.install(_lib)


def _same_storage_numel(a, b) -> bool:
    """Forward-mode AD's question (does a tangent's storage hold as many elements as its primal
    base's?) about the user's tensors, as eager answers it. Upstream's kernel asks the inner
    tensors, and a view's inner tensor is a storage of its own."""
    from .view_checks import _storage_bytes
    return (_storage_bytes(a) // a.element_size()) == (_storage_bytes(b) // b.element_size())


# -- unfold_backward as an op ----------------------------------------------------------------------

def _install_unfold_backward() -> None:
    """A program's own ``unfold_backward`` (istft's overlap-add, a composite's gradient) sums the
    windows. The inner tensor also gets it as functionalization's write-back of an unfold view,
    which must not sum where windows overlap (``writes.unfold_write_back``): calls that come
    through the Functionalize key, as a program's do, are marked as ops."""
    upstream = torch.library.get_kernel(torch.ops.aten.unfold_backward.default, "Functionalize")

    def unfold_backward_op(keyset, grad, input_sizes, dim, size, step):
        from .writes import as_op
        with as_op():
            return upstream.call_boxed(keyset, grad, input_sizes, dim, size, step)
    _lib.impl("unfold_backward", unfold_backward_op, "Functionalize", with_keyset=True)


_lib = None
_FUNCTIONALIZE = torch._C.DispatchKeySet(torch._C.DispatchKey.Functionalize)


def _to_copy_functionalize(self, *, dtype=None, layout=None, device=None, pin_memory=None,
                           non_blocking=False, memory_format=None):
    """``_to_copy`` of a functional tensor (``x.to(torch.float64)``, ``x.cpu()``).

    Upstream's kernel re-wraps the result only for devices "opted into functionalization" (XLA
    and Lazy), so on ``hlo`` ``x.to(dtype)`` handed the user the bare inner tensor, which no
    longer aliased anything and broke the next in-place op that met a wrapper. Here a result on
    ``hlo`` is wrapped; one on another device (``.cpu()``) is returned as is, as upstream does."""
    inner = self
    if torch._is_functional_tensor(self):
        inner = sync_wrapper(self)    # (its lineage's last value: a failed read rolls back)
    with torch._C._ExcludeDispatchKeyGuard(_FUNCTIONALIZE):
        out = _TO_COPY(inner, dtype=dtype, layout=layout, device=device, pin_memory=pin_memory,
                       non_blocking=non_blocking, memory_format=memory_format)
    if out.device.type != "hlo" or torch._is_functional_tensor(out):
        return out
    return wrap(out)


_TO_COPY = torch.ops.aten._to_copy.default


def _install_pack_padded_sequence() -> None:
    """``_pack_padded_sequence`` of an hlo wrapper: ``data`` on the device, wrapped;
    ``batch_sizes`` a plain CPU tensor, as eager returns it. Upstream's fallback wrapped both, and
    the LSTM kernel then read a CPU wrapper's data pointer ("its data is not allocated yet").
    Other functionalizations (``torch.func.functionalize``, compile) keep upstream's kernel."""
    op = torch.ops.aten._pack_padded_sequence.default
    upstream = torch.library.get_kernel(op, "Functionalize")

    def pack_padded_sequence(keyset, input, lengths, batch_first):
        if not owns(input):
            return upstream.call_boxed(keyset, input, lengths, batch_first)
        from .wrap import sync_wrapper, wrap
        with torch._C._ExcludeDispatchKeyGuard(_FUNCTIONALIZE):
            data, batch_sizes = op(sync_wrapper(input), lengths, batch_first)
        return wrap(data), batch_sizes
    _lib.impl("_pack_padded_sequence", pack_padded_sequence, "Functionalize", with_keyset=True)


# -- as_strided of a view ------------------------------------------------------------------------

_as_strided_upstream = None


def _view_base(t: torch.Tensor):
    """The functional hlo wrapper ``t`` is a view of, when ``as_strided`` may be taken on it:
    it has no view steps itself, shares ``t``'s storage and dtype. None otherwise."""
    from torch._C._functionalization import get_view_meta_sequence
    if not owns(t) or not get_view_meta_sequence(t):
        return None
    storage = _storage_id(t)

    def fits(base) -> bool:
        return (base is not None and owns(base) and base.dtype == t.dtype
                and not get_view_meta_sequence(base)
                and _storage_id(base) == storage)
    if fits(t._base):
        return t._base
    # Not an autograd view of it (``x.detach()``): a wrapper made at the boundary, if one fits.
    from .wrap import _wrappers
    return next((w for w in list(_wrappers.values()) if fits(w)), None)


def _as_strided_functionalize(keyset, self, size, stride, storage_offset=None):
    """``view.as_strided(...)`` of a functional hlo view is taken on the view's base.

    Eager's ``as_strided`` indexes the storage the view shares with its base, and its offset
    defaults to the view's own. Upstream functionalization instead chains it after the view's
    steps: reads can only see the view's own elements, and a write through it raises
    ("as_strided() is non-compositional"), except on XLA. The base, whose elements are the whole
    storage, gives eager's elements for both. Anything else is upstream's kernel."""
    base = _view_base(self)
    if base is None:
        return _as_strided_upstream.call_boxed(keyset, self, size, stride, storage_offset)
    offset = self.storage_offset() if storage_offset is None else storage_offset
    return torch.ops.aten.as_strided.default(base, size, stride, offset)


def _install_as_strided() -> None:
    global _as_strided_upstream
    _as_strided_upstream = torch.library.get_kernel(torch.ops.aten.as_strided.default,
                                                    "Functionalize")
    _lib.impl("as_strided", _as_strided_functionalize, "Functionalize", with_keyset=True)


# -- a user's own call of a *_copy op --------------------------------------------------------------

# The *_copy ops whose inner result takes its view's strides (strides.py); as_strided_copy too.
_COPY_OPS = ("alias_copy", "as_strided_copy", "detach_copy", "diagonal_copy", "expand_copy",
             "permute_copy", "select_copy", "slice_copy", "split_copy", "split_with_sizes_copy",
             "squeeze_copy", "t_copy", "transpose_copy", "unbind_copy", "unfold_copy",
             "unsqueeze_copy", "view_copy", "view_as_real_copy", "view_as_complex_copy",
             "_reshape_alias_copy")


def _map(f, x):
    if isinstance(x, (list, tuple)):
        return type(x)(_map(f, e) for e in x)
    return f(x)


def _unwrap(t):
    if isinstance(t, torch.Tensor) and torch._is_functional_tensor(t):
        torch._sync(t)
        return torch._from_functional_tensor(t)
    return t


def _copy_op_functionalize(op, upstream):
    """A direct call of ``op`` (a ``*_copy`` op) on functional hlo tensors.

    Functionalization's view kernels call ``*_copy`` ops below this key, so only a user's own
    call arrives here. Eager returns a fresh tensor laid out as the op's meta kernel says
    (contiguous); the inner tensor of a view copy carries the *view's* strides (strides.py), which
    a user's copy must not: ``expand_copy(z, ...)`` would report zero strides and refuse writes.
    Upstream's kernel for a functional op (sync, unwrap, run, wrap), with that layout."""
    from .inner import FunctionalInner
    from .strides import _to_meta
    from .wrap import wrap

    def kernel(keyset, *args, **kwargs):
        flat = [a for a in args if isinstance(a, torch.Tensor)]
        if not any(owns(a) for a in flat):
            return upstream.call_boxed(keyset, *args, **kwargs)
        layout = op(*_to_meta(args), **_to_meta(kwargs))
        with torch._C._ExcludeDispatchKeyGuard(_FUNCTIONALIZE):
            out = op(*_map(_unwrap, args), **_map(_unwrap, kwargs))

        def fresh(pair):
            o, m = pair
            return wrap(FunctionalInner(o._value, tuple(o.shape), o.dtype, tuple(m.stride()), 0))
        if isinstance(out, (list, tuple)):
            return type(out)(fresh(p) for p in zip(out, layout))
        return fresh((out, layout))
    return kernel


def _install_copy_ops() -> None:
    for name in _COPY_OPS:
        packet = getattr(torch.ops.aten, name)
        for overload in packet.overloads():
            op = getattr(packet, overload)
            if op._schema.is_mutable:             # the out= forms stay upstream's
                continue
            upstream = torch.library.get_kernel(op, "Functionalize")
            _lib.impl(op, _copy_op_functionalize(op, upstream), "Functionalize",
                      with_keyset=True)
