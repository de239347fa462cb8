"""Sharding specs: how a tensor is laid out over a device mesh, and how that reaches jax.jit.

A ``ShardingSpec`` (a ``Mesh`` and one entry per tensor dimension) is attached to a LazyTensor
as ``t._sharding``; the paths keep it on the tensor the user holds across in-place replacements
(legacy: on the alias base; functional: with the alias id, see ``carry``). A spec reaches the
graph in two ways: ``constrain`` places device data with ``jax.device_put`` (the buffer lives
sharded) and wraps a pending value in a ``sharding_constraint`` node, which the executor lowers
to ``jax.lax.with_sharding_constraint`` and, for a root, turns into the jit's ``out_shardings``.
XLA's SPMD partitioner does the rest (partitioning and collectives).
"""
from __future__ import annotations

import functools
import math
import weakref
from dataclasses import dataclass
from typing import Optional

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from .lazy import ir
from .lazy.ir import DeviceData, Node, Slot, Value

CONSTRAINT_OP = "sharding_constraint"


@dataclass(frozen=True)
class Mesh:
    """A logical grid of jax devices, as torch_xla's ``xs.Mesh(device_ids, mesh_shape, axis_names)``.

    ``Mesh((2, 4), ("data", "model"))`` is short for ``Mesh(range(8), (2, 4), ("data", "model"))``.
    Device ids index ``jax.devices()``, laid out row-major over ``mesh_shape``.
    """

    device_ids: tuple
    mesh_shape: tuple = None
    axis_names: tuple = None

    def __post_init__(self):
        ids, shape, names = self.device_ids, self.mesh_shape, self.axis_names
        if shape is not None and len(shape) and all(isinstance(n, str) for n in shape) \
                and names is None:            # Mesh(mesh_shape, axis_names)
            ids, shape, names = tuple(range(math.prod(ids))), tuple(ids), tuple(shape)
        ids = tuple(int(i) for i in np.asarray(ids).reshape(-1))
        shape = (len(ids),) if shape is None else tuple(int(n) for n in shape)
        names = tuple(f"dim{i}" for i in range(len(shape))) if names is None else tuple(names)
        object.__setattr__(self, "device_ids", ids)
        object.__setattr__(self, "mesh_shape", shape)
        object.__setattr__(self, "axis_names", names)
        n = len(jax.devices())
        if math.prod(shape) != len(ids):
            raise ValueError(f"xla_compat: a mesh of shape {shape} needs {math.prod(shape)} "
                             f"device ids, got {len(ids)}")
        if len(set(ids)) != len(ids) or any(not 0 <= i < n for i in ids):
            raise ValueError(
                f"xla_compat: mesh device ids {list(ids)} must be distinct ids in 0..{n - 1} "
                f"({n} jax devices here; simulate more on a CPU host with "
                f"xs.simulate_host_devices(N) before the first device is used, or start the "
                f"process with XLA_FLAGS=--xla_force_host_platform_device_count=N)")
        if len(names) != len(shape) or len(set(names)) != len(shape) or \
                not all(isinstance(a, str) for a in names):
            raise ValueError(f"xla_compat: mesh shape {shape} needs {len(shape)} distinct axis "
                             f"names (strings), got {names}")

    @property
    def size(self) -> int:
        return len(self.device_ids)

    def shape(self) -> dict:
        """{axis name: size} (torch_xla's ``Mesh.shape()``)."""
        return dict(zip(self.axis_names, self.mesh_shape))

    def axis_size(self, name: str) -> int:
        return self.mesh_shape[self.axis_names.index(name)]

    def jax_mesh(self) -> jax.sharding.Mesh:
        return _jax_mesh(self.device_ids, self.mesh_shape, self.axis_names)

    def get_logical_mesh(self) -> np.ndarray:
        """The device ids laid out in the mesh's shape (torch_xla's name)."""
        return np.array(self.device_ids).reshape(self.mesh_shape)


@functools.lru_cache(maxsize=None)
def _jax_mesh(device_ids, shape, axis_names) -> jax.sharding.Mesh:
    devices = jax.devices()
    grid = np.array([devices[i] for i in device_ids], dtype=object).reshape(shape)
    return jax.sharding.Mesh(grid, axis_names)


@dataclass(frozen=True)
class ShardingSpec:
    """Tensor dimension ``i`` is split over the mesh axes named in ``partition[i]`` (None: not split)."""

    mesh: Mesh
    partition: tuple      # per dimension: None, an axis name, or a tuple of axis names

    def named(self) -> NamedSharding:
        return _named(self)

    @property
    def replicated(self) -> bool:
        return all(p is None for p in self.partition)

    def shard_shape(self, shape) -> tuple:
        """The shape of the piece one device holds."""
        return tuple(s // self._ways(p) for s, p in zip(shape, self.partition))

    def _ways(self, p) -> int:
        if p is None:
            return 1
        names = p if isinstance(p, tuple) else (p,)
        return math.prod(self.mesh.axis_size(n) for n in names)

    def check(self, shape) -> None:
        """Raise a clear error if this spec cannot lay out a tensor of ``shape``."""
        if len(self.partition) != len(shape):
            raise ValueError(
                f"xla_compat: partition spec {self.partition} has {len(self.partition)} entries "
                f"but the tensor has {len(shape)} dimensions {list(shape)}; give one entry (a mesh "
                f"axis, or None for 'not split') per dimension")
        for d, (s, p) in enumerate(zip(shape, self.partition)):
            ways = self._ways(p)
            if s % ways:
                raise ValueError(
                    f"xla_compat: dimension {d} of size {s} cannot be split {ways} ways over mesh "
                    f"axis {p!r}; pick a size divisible by {ways} or another axis")

    def __str__(self):
        return f"{self.partition} over mesh {self.mesh.shape()}"


@functools.lru_cache(maxsize=None)
def _named(spec: ShardingSpec) -> NamedSharding:
    return NamedSharding(spec.mesh.jax_mesh(), PartitionSpec(*spec.partition))


def replicated(mesh: Mesh, ndim: int) -> ShardingSpec:
    return ShardingSpec(mesh, (None,) * ndim)


# ----------------------------------------------------------------------------------------------
# Specs in the graph.

class _Constraint:
    """The rule of a ``sharding_constraint`` node; equal specs give equal rules (stable keys)."""

    __slots__ = ("spec",)

    def __init__(self, spec: ShardingSpec):
        self.spec = spec

    def __call__(self, x):
        return jax.lax.with_sharding_constraint(x, self.spec.named())

    def __eq__(self, other):
        return type(other) is _Constraint and other.spec == self.spec

    def __hash__(self):
        return hash(("sharding_constraint", self.spec))

    def __repr__(self):
        return f"sharding_constraint[{self.spec}]"


def spec_of_value(v: Value) -> Optional[ShardingSpec]:
    """The spec a value was constrained to, if its node is a sharding constraint."""
    return v.node.rule.spec if v.node.op == CONSTRAINT_OP else None


def place(array, spec: ShardingSpec):
    """``array`` laid out as ``spec`` says (the same array if it already is)."""
    target = spec.named()
    if array.sharding == target:
        return array
    return jax.device_put(array, target)


def constrain(v: Value, spec: Optional[ShardingSpec]) -> Value:
    """``v`` laid out as ``spec``: device data is moved now, a pending value gets a constraint."""
    if spec is None:
        return v
    node = v.node
    if type(node) is DeviceData:
        if node.array.sharding == spec.named():
            return v
        return ir.leaf(place(node.array, spec))
    if node.is_leaf:                           # a Python scalar or a poisoned value
        return v
    if spec_of_value(v) == spec:
        return v
    return Value(Node(CONSTRAINT_OP, _Constraint(spec), (Slot(0),), (), (v,), (v.aval,),
                      node.source), 0)


# ----------------------------------------------------------------------------------------------
# Specs on tensors.

# LazyTensors carrying a spec; a sync re-applies it to their current value (see ``apply_all``).
_marked: "weakref.WeakValueDictionary[int, object]" = weakref.WeakValueDictionary()
# alias id -> spec (the functional path carries a spec across in-place replacements with it)
_by_alias: dict[int, ShardingSpec] = {}


def attach(t, spec: Optional[ShardingSpec]) -> None:
    """Give the LazyTensor ``t`` the spec ``spec`` and lay out its value. None clears the spec;
    the value is then replicated over the old spec's mesh (no device holds only a piece)."""
    if spec is not None:
        spec.check(tuple(t.shape))
    old = t._sharding
    t._sharding = spec
    aid = getattr(t, "_alias_id", None)
    if aid is not None:
        if spec is None:
            _by_alias.pop(aid, None)
        else:
            _by_alias[aid] = spec
    if spec is None:
        _marked.pop(id(t), None)
        if old is not None:
            _relayout(t, replicated(old.mesh, t.dim()))
        return
    _marked[id(t)] = t
    _relayout(t, spec)


def _relayout(t, spec) -> None:
    v = t._value
    new = constrain(v, spec)
    if new is not v:
        t._value = new
        if type(new.node) is DeviceData:
            t._last_data = new


def carry(t, aid: int) -> None:
    """A new inner tensor ``t`` took over alias id ``aid``: it inherits that lineage's spec."""
    spec = _by_alias.get(aid)
    if spec is not None and getattr(t, "_sharding", None) != spec:
        t._sharding = spec
        _marked[id(t)] = t
        _relayout(t, spec)


def apply_all() -> None:
    """Before a sync: every marked tensor's current value gets its layout (the executor calls)."""
    for t in list(_marked.values()):
        spec = t._sharding
        if spec is not None:
            _relayout(t, spec)


def any_marked() -> bool:
    """Has any tensor a layout over a mesh (so buffers may be shared between leaves)?"""
    return bool(_marked) or bool(_by_alias)


def spec_of(t) -> Optional[ShardingSpec]:
    return getattr(t, "_sharding", None)
