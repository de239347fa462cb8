"""Ops that need values on the host: index bounds, boolean masks, data-dependent output shapes.

These are tracer special handlers, not lowering rules, because they look at index *values*:

- Bounds: an index whose values are already known on the host (a CPU tensor, or device data
  that is already materialised) is checked like CPU eager checks it (the indexing, gather,
  scatter, index_*, take/put and embedding ops, nll_loss targets, whose ignore_index is
  allowed, and a masked_scatter mask against its source's size); an out-of-range index
  re-runs the op on the CPU so the error is eager's own (type and message). An index that is
  still pending IR cannot be checked without running its graph; it is not checked (gathers then
  clamp and scatters drop the write), as on torch_xla.
- Boolean masks in ``x[mask]``, ``nonzero``, ``masked_select``, ``unique``: the output shape
  depends on the data. The input is materialised (a host round trip, counted as
  ``HostRoundTrip``), the size is counted on the host, and the result is built on the device by a
  node with that size fixed.
- CPU integer index tensors (``x[cpu_idx]``, allowed by eager for every device) move to the
  device; ``_foreach_addcdiv(..., cpu_scalars)`` reads its per-tensor values as Python scalars.
"""
from __future__ import annotations

import weakref

import jax.numpy as jnp
import numpy as np
import torch

from .. import _jax, metrics
from ..lazy import ir, tracer
from ..lazy.ir import DeviceData
from ..lazy.tensor import LazyTensor
from .eager_checks import complex_fill
from .registry import Rule, aten, lookup

# ----------------------------------------------------------------------------------------------
# Shared pieces.


def trace_rule(cls, func, args, kwargs):
    """What the tracer does for an op with a lowering rule (special handlers bypass it): its plan,
    else the cached meta kernel with eager's checks (``tracer.trace_rule``). The handler's own
    look at the values runs before, on every call."""
    if func._schema.is_mutable:
        return tracer.trace_mutation(cls, func, args, kwargs)
    rule = lookup(func)
    if rule is None:
        return tracer.decompose_or_fallback(cls, func, args, kwargs)
    return tracer.trace_rule(cls, func, rule, args, kwargs)


def to_device(cls, t: torch.Tensor) -> LazyTensor:
    metrics.inc("TransferToDevice")
    return cls(ir.leaf(_jax.from_torch(t)), t.shape, t.dtype)


def _host_values(t: torch.Tensor) -> torch.Tensor:
    """Materialise ``t`` for a data-dependent shape (runs its pending graph)."""
    if isinstance(t, LazyTensor):
        metrics.inc("HostRoundTrip")
        return tracer.materialize_cpu(t)
    return t


def _node(func, fn, args, out_metas, cls):
    """A node running ``fn`` (static arguments in ``args``) whose outputs are ``out_metas``."""
    node = tracer.make_node(func, _RULES.setdefault(fn, Rule(fn, f"host_values.{fn.__name__}",
                                                               static=True)),
                            args, {}, out_metas)
    return tracer.wrap_outputs(cls, list(out_metas), node)


_RULES: dict = {}


def _meta(shape, dtype=torch.int64):
    return torch.empty(tuple(shape), dtype=dtype, device="meta")


# ----------------------------------------------------------------------------------------------
# Index bounds.

_ranges: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _known_values(t) -> np.ndarray | None:
    """``t``'s values where they are on the host without running anything (a CPU tensor, or
    materialised device data), else None."""
    if not isinstance(t, LazyTensor):
        return t.numpy()
    node = t._value.node
    return np.asarray(node.array) if type(node) is DeviceData else None


def _known_range(t) -> tuple[int, int] | None:
    """(min, max) of an index whose values are on the host without running anything, else None."""
    if t is None or t.numel() == 0 or t.dtype == torch.bool:
        return None
    if not isinstance(t, LazyTensor):
        return int(t.min()), int(t.max())
    node = t._value.node
    if type(node) is not DeviceData:
        return None
    hit = _ranges.get(node)
    if hit is None:
        metrics.inc("IndexBoundsCheck")
        a = _known_values(t)
        hit = _ranges[node] = (int(a.min()), int(a.max()))
    return hit


def _in_range(t, size: int, negative_ok: bool, ignore=None) -> bool:
    """Are ``t``'s known values valid indices into ``size`` elements (values equal to
    ``ignore``, a loss's ignore_index, left out)? True where they are not known."""
    r = _known_range(t)
    if r is None:
        return True
    lo, hi = r
    if hi < size and lo >= (-size if negative_ok else 0):
        return True
    if ignore is None or not lo <= ignore <= hi:
        return False
    a = _known_values(t)          # (known: _known_range found its range)
    rest = a[a != ignore]
    return rest.size == 0 or (int(rest.max()) < size and int(rest.min()) >= 0)


def _cpu_copy(x):
    if isinstance(x, LazyTensor):
        return tracer.materialize_cpu(x).clone()
    if isinstance(x, torch.Tensor):
        return x.clone()
    if isinstance(x, torch.device):
        return torch.device("cpu")
    return x


def raise_like_cpu(func, args, kwargs):
    """Run ``func`` on CPU copies of its inputs; eager's error (if any) propagates, its first line
    eager's own words and a second naming the op (eager's own message does not, e.g.
    index_select's "INDICES element is out of DATA bounds")."""
    cargs = tracer.map_nested(args, _cpu_copy)
    ckwargs = {k: tracer.map_nested(v, _cpu_copy) for k, v in kwargs.items()}
    try:
        func(*cargs, **ckwargs)
    except (RuntimeError, IndexError, ValueError, TypeError) as e:
        tracer._reraise(e, func, (args, list(kwargs.values())))


def _size(x, d) -> int:
    return x.shape[d % x.dim()] if x.dim() else 1


def _dim_spec(negative_ok):
    def spec(b):
        return [(b["index"], _size(b["self"], b["dim"]), negative_ok)]
    return spec


def _flat_spec(b):
    return [(b["index"], b["self"].numel(), True)]


def _embedding_spec(b):
    return [(b["indices"], _size(b["weight"], 0), False)]


def _target_spec(b):
    """nll_loss(2d): a target names a class of ``self``'s dim 1 (dim 0 when it is 1-d), or is
    ignore_index."""
    x = b["self"]
    return [(b["target"], _size(x, 1 if x.dim() > 1 else 0), False, b.get("ignore_index", -100))]


_CHECKS = {}
for _ops, _spec in [
    ((aten.gather.default, aten.scatter.src, aten.scatter.value, aten.scatter.reduce,
      aten.scatter.value_reduce, aten.scatter_.src, aten.scatter_.value, aten.scatter_.reduce,
      aten.scatter_.value_reduce, aten.scatter_add.default, aten.scatter_add_.default,
      aten.scatter_reduce.two, aten.scatter_reduce_.two, aten.index_select.default,
      aten.index_add.default, aten.index_add_.default, aten.index_copy.default,
      aten.index_copy_.default, aten.index_reduce.default, aten.index_reduce_.default),
     _dim_spec(False)),
    ((aten.index_fill.int_Scalar, aten.index_fill.int_Tensor, aten.index_fill_.int_Scalar,
      aten.index_fill_.int_Tensor), _dim_spec(True)),
    ((aten.take.default, aten.put.default, aten.put_.default), _flat_spec),
    ((aten.embedding.default,), _embedding_spec),
    ((aten.nll_loss_forward.default, aten.nll_loss2d_forward.default), _target_spec),
]:
    for _op in _ops:
        _CHECKS[_op] = _spec


# Ops whose eager kernel takes only int64 indices (the rest also take int32). Their meta kernels
# mostly skip the index dtype check; a wrong dtype re-runs on the CPU for eager's own error.
_LONG_ONLY = frozenset(op for op in _CHECKS if op._schema.name in (
    "aten::index_copy", "aten::index_copy_", "aten::index_fill", "aten::index_fill_",
    "aten::put", "aten::put_"))


def _checked(cls, func, args, kwargs):
    bound = tracer.bind(func, args, kwargs)
    index = bound.get("index")
    if isinstance(index, torch.Tensor) and index.dtype is not torch.int64 and (
            index.dtype is not torch.int32 or func in _LONG_ONLY):
        raise_like_cpu(func, args, kwargs)
    for index, size, negative_ok, *ignore in _CHECKS[func](bound):
        if isinstance(index, torch.Tensor) and not _in_range(index, size, negative_ok, *ignore):
            raise_like_cpu(func, args, kwargs)
    _check_fill_value(func, args, kwargs, bound)           # index_fill of a tensor value
    return trace_rule(cls, func, args, kwargs)


tracer.special(*_CHECKS)(_checked)


def _known_count(mask, shape) -> int | None:
    """How many elements of ``shape`` a boolean ``mask`` (broadcast to it) selects, where its
    values are on the host without running anything; else None."""
    a = _known_values(mask)
    return None if a is None else int(np.broadcast_to(a, tuple(shape)).sum())


@tracer.special(aten.masked_fill.Tensor, aten.masked_fill_.Tensor, aten.masked_fill.Tensor_out)
def _fill_with_a_tensor_value(cls, func, args, kwargs):
    """A 0-dim tensor as the fill value: eager reads it (``item()``) and converts it to the
    filled tensor's dtype with a range check. A CPU value is checked here at every call, as
    eager checks it (300 into uint8 raises); a device value is not read for it (a sync per
    fill), except a complex one filling a real, non-bool tensor, which eager refuses with an
    imaginary part: that one is read, pending or not (running its graph, as eager's read does)."""
    b = tracer.bind(func, args, kwargs)
    _check_fill_value(func, args, kwargs, b)
    x, value = complex_fill(b) or (None, None)
    if isinstance(value, torch.Tensor) and value.dim() == 0 and x.dtype != torch.bool:
        v = _known_values(value)
        if v is None:
            v = _host_values(value).numpy()
        if complex(v).imag != 0:
            raise_like_cpu(func, args, kwargs)
    return trace_rule(cls, func, args, kwargs)


def _check_fill_value(func, args, kwargs, bound) -> None:
    """Eager's conversion of a CPU 0-dim fill value (``bound["value"]``) to the filled tensor's
    dtype, tried on a one-element tensor (index_fill and masked_fill of a tensor value; the
    value of a device tensor is not read)."""
    value = bound.get("value")
    if not isinstance(value, torch.Tensor) or value.dim() != 0 or isinstance(value, LazyTensor):
        return
    try:
        torch.zeros(1, dtype=bound["self"].dtype).masked_fill_(torch.zeros(1, dtype=torch.bool),
                                                              value)
    except RuntimeError as e:
        if "cannot be converted to type" in str(e):
            raise_like_cpu(func, args, kwargs)


@tracer.special(aten.masked_scatter.default, aten.masked_scatter_.default)
def _masked_scatter(cls, func, args, kwargs):
    """Eager refuses a source with fewer elements than the mask selects; a mask known on the
    host is checked here (a pending one is not: the device then repeats the last element)."""
    b = tracer.bind(func, args, kwargs)
    x, mask, source = b["self"], b["mask"], b["source"]
    if isinstance(mask, torch.Tensor) and mask.dtype == torch.bool:
        shape = torch.broadcast_shapes(x.shape, mask.shape)
        n = _known_count(mask, shape)
        if n is not None and n > source.numel():
            raise_like_cpu(func, args, kwargs)
    return trace_rule(cls, func, args, kwargs)


# ----------------------------------------------------------------------------------------------
# index / index_put: boolean masks become integer indices, CPU indices move to the device.

def _nonzero_columns(mask, n):
    return jnp.nonzero(mask, size=n)


def _mask_to_indices(cls, mask) -> list:
    """One integer index tensor per dim of ``mask`` selecting its True elements (host count)."""
    n = int(torch.count_nonzero(_host_values(mask)))
    if not isinstance(mask, LazyTensor):
        return [to_device(cls, c) for c in torch.nonzero(mask.bool(), as_tuple=True)]
    if mask.dim() == 0:
        raise NotImplementedError("xla_compat: a 0-d boolean index is not supported on hlo")
    out = _node(aten.nonzero.default, _nonzero_columns, (mask, n),
                [_meta((n,))] * mask.dim(), cls)
    return list(out)


def _integer_indices(cls, x, indices) -> list:
    out = []
    for i in indices:
        if i is not None and i.dtype in (torch.bool, torch.uint8):
            if i.dim() == 0:  # x[True] adds a dim; left to eager's decomposition below
                return None
            out += _mask_to_indices(cls, i)
        elif i is not None and not isinstance(i, LazyTensor):
            out.append(to_device(cls, i))
        else:
            out.append(i)
    return out


def _check_indices(func, args, kwargs, x, indices):
    for d, i in enumerate(indices):
        if isinstance(i, torch.Tensor) and d < x.dim() and not _in_range(i, x.shape[d], True):
            raise_like_cpu(func, args, kwargs)


def _check_index_types(func, x, indices, args) -> None:
    """Eager's IndexErrors for index tensors (the meta kernel raises RuntimeError, or nothing)."""
    def fail(message):
        raise IndexError(message + tracer.raised_by(func, args))
    dim = 0
    for i in indices:
        if i is None:
            dim += 1
            continue
        if i.dtype not in (torch.int64, torch.int32, torch.int8, torch.uint8, torch.bool):
            fail("tensors used as indices must be long, int, byte or bool tensors")
        if i.dtype in (torch.bool, torch.uint8):
            for k in range(i.dim()):
                if dim + k < x.dim() and i.shape[k] != x.shape[dim + k]:
                    fail(f"The shape of the mask {list(i.shape)} at index {k} does not match the "
                         f"shape of the indexed tensor {list(x.shape)} at index {dim + k}")
            dim += i.dim()
        else:
            dim += 1
    if dim > x.dim():
        fail(f"too many indices for tensor of dimension {x.dim()} (got {dim})")


@tracer.special(aten.index.Tensor, aten.index_put.default, aten.index_put_.default,
                aten._index_put_impl_.default, aten._index_put_impl.default)
def _index(cls, func, args, kwargs):
    x, indices, *rest = args
    _check_index_types(func, x, indices, args)
    new = _integer_indices(cls, x, indices)
    if new is None:
        return tracer.decompose_or_fallback(cls, func, args, kwargs)
    _check_indices(func, args, kwargs, x, new)
    return trace_rule(cls, func, (x, new, *rest), kwargs)


# ----------------------------------------------------------------------------------------------
# Data-dependent output shapes.

def _nonzero(x, n):
    if x.ndim == 0:
        return jnp.zeros((n, 0), jnp.int64)
    return jnp.stack(jnp.nonzero(x, size=n), axis=-1)


@tracer.special(aten.nonzero.default)
def _nonzero_special(cls, func, args, kwargs):
    (x,) = args
    n = int(torch.count_nonzero(_host_values(x)))
    return _node(func, _nonzero, (x, n), [_meta((n, x.dim()))], cls)[0]


def _masked_select(x, mask, n):
    shape = jnp.broadcast_shapes(x.shape, mask.shape)
    xb, mb = jnp.broadcast_to(x, shape), jnp.broadcast_to(mask, shape)
    return xb[jnp.nonzero(mb, size=n)] if shape else jnp.where(mb, xb, xb)[None][:n]


@tracer.special(aten.masked_select.default)
def _masked_select_special(cls, func, args, kwargs):
    x, mask = args
    tracer.run_meta(aten.mul.Tensor, (x, mask), {})  # eager's broadcasting error, if any
    shape = torch.broadcast_shapes(x.shape, mask.shape)
    n = int(torch.count_nonzero(_host_values(mask).expand(shape)))
    return _node(func, _masked_select, (x, mask, n), [_meta((n,), x.dtype)], cls)[0]


def _unique_sorted(x, n, return_inverse, return_counts):
    out, inv, counts = jnp.unique(jnp.reshape(x, (-1,)), size=n, return_inverse=True,
                                  return_counts=True)
    inv = jnp.reshape(inv, x.shape) if return_inverse else jnp.zeros((0,), jnp.int64)
    return out, inv, counts if return_counts else jnp.zeros((0,), jnp.int64)


@tracer.special(aten._unique2.default, aten._unique.default)
def _unique_special(cls, func, args, kwargs):
    b = tracer.bind(func, args, kwargs)
    x = b["self"]
    inverse = b.get("return_inverse", False)
    counts = b.get("return_counts", False) if func is aten._unique2.default else False
    n = int(torch.unique(_host_values(x)).numel())
    metas = [_meta((n,), x.dtype), _meta(x.shape if inverse else (0,)), _meta((n if counts else 0,))]
    outs = _node(func, _unique_sorted, (x, n, inverse, counts), metas, cls)
    return tuple(outs) if func is aten._unique2.default else (outs[0], outs[1])


def _unique_consecutive(x, n, return_inverse, return_counts):
    flat = jnp.reshape(x, (-1,))
    start = jnp.concatenate([jnp.ones((min(flat.shape[0], 1),), bool), flat[1:] != flat[:-1]])
    run = jnp.cumsum(start.astype(jnp.int64)) - 1
    out = jnp.zeros((n,), x.dtype).at[run].set(flat)
    inv = jnp.reshape(run, x.shape) if return_inverse else jnp.zeros((0,), jnp.int64)
    counts = jnp.zeros((n,), jnp.int64).at[run].add(1) if return_counts else jnp.zeros((0,), jnp.int64)
    return out, inv, counts


def unique_consecutive_flat(cls, func, args, kwargs):
    """``unique_consecutive`` without a dim (host_shapes' special handler takes both forms)."""
    b = tracer.bind(func, args, kwargs)
    x = b["self"]
    if b.get("dim") is not None:
        return tracer.cpu_fallback(cls, func, args, kwargs)
    inverse, counts = b.get("return_inverse", False), b.get("return_counts", False)
    n = int(torch.unique_consecutive(_host_values(x)).numel())
    metas = [_meta((n,), x.dtype), _meta(x.shape if inverse else (0,)), _meta((n if counts else 0,))]
    return tuple(_node(func, _unique_consecutive, (x, n, inverse, counts), metas, cls))


# ----------------------------------------------------------------------------------------------
# _foreach_addcmul/addcdiv with a CPU tensor of per-element scalars (what eager requires).

_SCALAR_LIST = {
    aten._foreach_addcmul.Tensor: aten._foreach_addcmul.ScalarList,
    aten._foreach_addcdiv.Tensor: aten._foreach_addcdiv.ScalarList,
    aten._foreach_addcmul_.Tensor: aten._foreach_addcmul_.ScalarList,
    aten._foreach_addcdiv_.Tensor: aten._foreach_addcdiv_.ScalarList,
}


@tracer.special(*_SCALAR_LIST)
def _foreach_tensor_scalars(cls, func, args, kwargs):
    b = tracer.bind(func, args, kwargs)
    scalars = b["scalars"]
    if isinstance(scalars, LazyTensor):  # eager wants them on the CPU; its meta kernel says so
        return trace_rule(cls, func, args, kwargs)
    values = [float(v) if scalars.dtype.is_floating_point else int(v) for v in scalars.tolist()]
    return trace_rule(cls, _SCALAR_LIST[func], (b["self"], b["tensor1"], b["tensor2"], values), {})
