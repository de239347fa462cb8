"""Hand-written JAX twins of the workloads: the bar xla_compat is measured against.

Each twin is one ``jax.jit``-compiled step that donates the state it overwrites (parameters,
optimizer state, the KV cache), starting from the workload's own ``initial()`` numbers.
``twin(workload)`` returns a program with ``step()``, ``block()``, ``result()`` and
``hlo_text()`` (the StableHLO of the step).
"""
from __future__ import annotations

import math
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import torch

from benchmarks import workloads as W

_TWINS: dict[type, type] = {}


def twin_of(workload_cls):
    """Register the decorated class as the JAX twin of ``workload_cls``."""
    def register(cls):
        _TWINS[workload_cls] = cls
        return cls
    return register


def twin(workload):
    try:
        return _TWINS[type(workload)](workload)
    except KeyError:
        raise LookupError(f"no JAX twin for {type(workload).__name__}; add one to "
                          f"benchmarks/jax_twins.py with @twin_of") from None


def _jnp(t: torch.Tensor):
    return jnp.asarray(t.detach().numpy())


def _torch(a) -> torch.Tensor:
    return torch.from_numpy(np.array(a))


class _Twin:
    """The common loop: ``self.fn`` is the jitted step, ``self.args`` its next arguments."""

    fn = None
    args: tuple = ()

    def block(self) -> None:
        jax.block_until_ready(self.out)

    def hlo_text(self) -> str:
        return self.fn.lower(*self.args).as_text()


# ----------------------------------------------------------------------------------------------

@twin_of(W.ElementwiseChain)
class ChainTwin(_Twin):
    def __init__(self, w: W.ElementwiseChain):
        init = w.initial()
        self.args = (_jnp(init["x"]), _jnp(init["y"]))
        self.fn = jax.jit(partial(W.chain, n_ops=w.ops, ns=jnp))
        self.out = None

    def step(self) -> None:
        self.out = self.fn(*self.args)

    def result(self):
        return {"out": _torch(self.out)}


# ----------------------------------------------------------------------------------------------

def _linear(x, params, name, bias=True):
    # As 2-D matmuls (as torch does): XLA:CPU lowers the weight gradient of a 3-D x @ w.T,
    # a contraction over two dimensions, ~10x slower than the same product on flattened rows.
    w = params[f"{name}.weight"]
    y = (x.reshape(-1, x.shape[-1]) @ w.T).reshape(*x.shape[:-1], w.shape[0])
    return y + params[f"{name}.bias"] if bias else y


def _cross_entropy(logits, targets):
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, targets[:, None], axis=-1))


class _TrainingTwin(_Twin):
    """Parameters keyed like the torch ``state_dict``, so results compare name by name."""

    def __init__(self, model: torch.nn.Module, batch):
        self.params = {k: _jnp(v) for k, v in model.state_dict().items()}
        self.batch = tuple(_jnp(t) for t in batch)
        self.loss = None

    def result(self):
        out = {"loss": _torch(self.loss)}
        out.update((k, _torch(v)) for k, v in self.params.items())
        return out

    def block(self) -> None:
        jax.block_until_ready((self.params, self.loss))


@twin_of(W.MLPTraining)
class MLPTwin(_TrainingTwin):
    def __init__(self, w: W.MLPTraining):
        model, batch = w.initial()
        super().__init__(model, batch)
        n = len(w.dims) - 1

        def loss_fn(params, x, y):
            for i in range(n):
                x = _linear(x, params, f"layers.{i}")
                if i < n - 1:
                    x = jax.nn.relu(x)
            return _cross_entropy(x, y)

        @partial(jax.jit, donate_argnums=(0, 1))
        def step(params, bufs, x, y):
            loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
            # torch's SGD: buf = momentum * buf + grad (buf = grad at step 1), p -= lr * buf
            bufs = jax.tree.map(lambda b, g: w.momentum * b + g, bufs, grads)
            params = jax.tree.map(lambda p, b: p - w.lr * b, params, bufs)
            return params, bufs, loss

        self.fn = step
        self.bufs = jax.tree.map(jnp.zeros_like, self.params)

    @property
    def args(self):
        return (self.params, self.bufs, *self.batch)

    def step(self) -> None:
        self.params, self.bufs, self.loss = self.fn(*self.args)


def _layer_norm(x, params, name, eps=1e-5):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / jnp.sqrt(var + eps) * params[f"{name}.weight"] + params[f"{name}.bias"]


def _gpt_loss(params, idx, targets, *, w: W.GPTTraining):
    b, t = idx.shape
    d, h = w.d, w.heads
    x = params["tok.weight"][idx] + params["pos.weight"][jnp.arange(t)]
    mask = jnp.triu(jnp.ones((t, t), dtype=bool), k=1)
    for i in range(w.layers):
        p = f"blocks.{i}"
        q, k, v = jnp.split(_linear(_layer_norm(x, params, f"{p}.ln1"), params, f"{p}.qkv",
                                    bias=False), 3, axis=2)
        q, k, v = (z.reshape(b, t, h, d // h).transpose(0, 2, 1, 3) for z in (q, k, v))
        att = (q @ k.transpose(0, 1, 3, 2)) / math.sqrt(d // h)
        att = jax.nn.softmax(jnp.where(mask, -jnp.inf, att), axis=-1)
        y = (att @ v).transpose(0, 2, 1, 3).reshape(b, t, d)
        x = x + _linear(y, params, f"{p}.proj")
        f = jax.nn.gelu(_linear(_layer_norm(x, params, f"{p}.ln2"), params, f"{p}.ff.0"),
                        approximate=False)
        x = x + _linear(f, params, f"{p}.ff.2")
    logits = _linear(_layer_norm(x, params, "ln"), params, "head", bias=False)
    return _cross_entropy(logits.reshape(-1, w.vocab), targets.reshape(-1))


@twin_of(W.GPTTraining)
class GPTTwin(_TrainingTwin):
    def __init__(self, w: W.GPTTraining):
        model, batch = w.initial()
        super().__init__(model, batch)
        lr, wd, (b1, b2), eps = w.lr, w.weight_decay, (0.9, 0.999), 1e-8
        loss_fn = partial(_gpt_loss, w=w)

        @partial(jax.jit, donate_argnums=(0, 1, 2))
        def step(params, m, v, t, idx, targets):
            loss, grads = jax.value_and_grad(loss_fn)(params, idx, targets)
            t = t + 1
            # torch's AdamW (single-tensor): decoupled decay, then the bias-corrected Adam step
            m = jax.tree.map(lambda m, g: m + (g - m) * (1 - b1), m, grads)
            v = jax.tree.map(lambda v, g: v * b2 + g * g * (1 - b2), v, grads)
            step_size = lr / (1 - b1 ** t)
            c2 = jnp.sqrt(1 - b2 ** t)
            params = jax.tree.map(
                lambda p, m, v: p * (1 - lr * wd) - step_size * m / (jnp.sqrt(v) / c2 + eps),
                params, m, v)
            return params, m, v, t, loss

        self.fn = step
        self.m = jax.tree.map(jnp.zeros_like, self.params)
        self.v = jax.tree.map(jnp.zeros_like, self.params)
        self.t = jnp.zeros((), jnp.float32)

    @property
    def args(self):
        return (self.params, self.m, self.v, self.t, *self.batch)

    def step(self) -> None:
        self.params, self.m, self.v, self.t, self.loss = self.fn(*self.args)


# ----------------------------------------------------------------------------------------------

@twin_of(W.KVCacheDecode)
class KVTwin(_Twin):
    """32 in-place updates of one donated buffer: ``.at[].set`` and ``.at[].add`` per position."""

    def __init__(self, w: W.KVCacheDecode):
        init = w.initial()
        self.cache, self.kv = _jnp(init["cache"]), _jnp(init["kv"])

        @partial(jax.jit, donate_argnums=0)
        def step(cache, kv):
            for t in range(w.positions):
                cache = cache.at[:, :, :, t:t + 1].set(kv[:, :, :, t:t + 1])
                cache = cache.at[:, :, :, t, :].add(0.5)   # == cache.transpose(3, 4)[..., t]
            return cache, cache.sum()

        self.fn = step
        self.total = None

    @property
    def args(self):
        return (self.cache, self.kv)

    @property
    def out(self):
        return (self.cache, self.total)

    def step(self) -> None:
        self.cache, self.total = self.fn(*self.args)

    def result(self):
        return {"sum": _torch(self.total), "cache": _torch(self.cache)}
