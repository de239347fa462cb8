"""Random ops. Each rule receives ``key``: a fresh jax PRNG key split off the device RNG state."""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax import lax

from ._helpers import cast, is_float
from .registry import aten, lowering


def _flat(sample):
    """``sample`` drawing over one flat axis and reshaping. jax's partitionable threefry numbers
    the elements by an iota over every axis, and XLA:CPU's compile time grows with the rank: a
    (64, 2, 5, 5) uniform compiles in 2.9 s, a (3200,) one in 0.27 s. The numbers are the same
    (each element's counter is its flat index either way)."""
    def draw(key, shape, *args, **kwargs):
        shape = tuple(shape)
        if len(shape) <= 1:
            return sample(key, shape, *args, **kwargs)
        return sample(key, (math.prod(shape),), *args, **kwargs).reshape(shape)
    draw.__name__ = sample.__name__
    return draw


uniform = _flat(jax.random.uniform)
normal = _flat(jax.random.normal)
randint = _flat(jax.random.randint)
exponential = _flat(jax.random.exponential)
cauchy = _flat(jax.random.cauchy)
gumbel = _flat(jax.random.gumbel)


def _float(aval):
    return aval.dtype if is_float(aval.dtype) else jnp.float32


@lowering(aten.normal_.default, aten.normal_functional.default, random=True, static=True, meta=True)
def normal_(x, mean=0.0, std=1.0, *, generator=None, key, aval):
    z = normal(key, aval.shape, _float(aval))
    return cast(z * std + mean, aval.dtype)


@lowering(aten.normal.Tensor_float, aten.normal.float_Tensor, aten.normal.Tensor_Tensor,
          random=True, meta=True)
def normal_tensor(mean, std, *, generator=None, key, aval):
    z = normal(key, aval.shape, _float(aval))
    return cast(z * std + mean, aval.dtype)


@lowering(aten.uniform_.default, aten.uniform.default, random=True, static=True, meta=True)
def uniform_(x, from_=0.0, to=1.0, *, generator=None, key, aval):
    if jnp.issubdtype(aval.dtype, jnp.complexfloating):
        # eager fills the real and imaginary parts alike (uniform_ of ``view_as_real``)
        part = jnp.zeros((), aval.dtype).real.dtype
        u = uniform(key, aval.shape + (2,), part, minval=from_, maxval=to)
        return lax.complex(u[..., 0], u[..., 1])
    u = uniform(key, aval.shape, _float(aval), minval=from_, maxval=to)
    return cast(u, aval.dtype)


@lowering(aten.bernoulli_.float, aten.bernoulli.p, random=True, static=True, meta=True)
def bernoulli_p(x, p=0.5, *, generator=None, key, aval):
    return cast(uniform(key, aval.shape, jnp.float32) < p, aval.dtype)


@lowering(aten.bernoulli_.Tensor, aten.bernoulli.default, aten.bernoulli.Tensor, random=True,
          meta=True)
def bernoulli_t(x, p=None, *, generator=None, key, aval):
    prob = x if p is None else p
    return cast(uniform(key, aval.shape, jnp.float32) < prob, aval.dtype)


@lowering(aten.native_dropout.default, random=True, static=True, meta=True)
def native_dropout(x, p, train, *, key, aval):
    if not train or p == 0:
        return x, jnp.ones(x.shape, jnp.bool_)
    keep = uniform(key, x.shape, jnp.float32) >= p
    scale = 0.0 if p == 1 else 1.0 / (1.0 - p)
    return jnp.where(keep, x * jnp.asarray(scale, x.dtype), jnp.zeros((), x.dtype)), keep


@lowering(aten.native_dropout_backward.default, meta=True)
def native_dropout_backward(grad, mask, scale, *, aval):
    # in the output dtype: a bool/int grad times a float scale promotes to float in eager
    return cast(grad, aval.dtype) * cast(mask, aval.dtype) * cast(scale, aval.dtype)


@lowering(getattr(aten.random_, "from"), aten.random_.to, aten.random_.default,
          getattr(aten.random, "from"), aten.random.to, aten.random.default, random=True,
          static=True, meta=True)
def random_(x, from_=None, to=None, *, generator=None, key, aval):
    if from_ is None:
        hi = 2 ** 24 if is_float(aval.dtype) else (
            2 if aval.dtype == jnp.bool_ else int(jnp.iinfo(aval.dtype).max) + 1)
        from_, to = 0, min(hi, 2 ** 63 - 1)
    if to is None:
        to = 2 ** 63 - 1
    r = randint(key, aval.shape, from_, to, dtype=jnp.int64)
    return cast(r, aval.dtype)


@lowering(aten.exponential_.default, aten.exponential.default, random=True, static=True, meta=True)
def exponential_(x, lambd=1.0, *, generator=None, key, aval):
    return cast(exponential(key, aval.shape, _float(aval)) / lambd, aval.dtype)


@lowering(aten.randperm.default, aten.randperm.generator, aten.randperm.out,
          aten.randperm.generator_out, random=True, static=True, meta=True)
def randperm(n, *, key, aval, generator=None, **_):
    return cast(jax.random.permutation(key, n), aval.dtype)


@lowering(aten.multinomial.default, random=True, static=True, meta=True)
def multinomial(probs, num_samples, replacement=False, *, generator=None, key, aval):
    logits = jnp.log(probs)
    if replacement:
        keys = jax.random.split(key, num_samples)
        draws = jax.vmap(lambda k: jax.random.categorical(k, logits, axis=-1))(keys)
        return jnp.moveaxis(draws, 0, -1).astype(aval.dtype)
    g = gumbel(key, probs.shape, jnp.float32)
    scores = jnp.where(probs > 0, logits + g, -jnp.inf)
    return jnp.argsort(-scores, axis=-1)[..., :num_samples].astype(aval.dtype)


@lowering(aten.cauchy_.default, aten.cauchy.default, random=True, static=True, meta=True)
def cauchy_(x, median=0.0, sigma=1.0, *, generator=None, key, aval):
    return cast(median + sigma * cauchy(key, aval.shape, _float(aval)), aval.dtype)


@lowering(aten.log_normal_.default, aten.log_normal.default, random=True, static=True, meta=True)
def log_normal_(x, mean=1.0, std=2.0, *, generator=None, key, aval):
    z = normal(key, aval.shape, _float(aval))
    return cast(jnp.exp(z * std + mean), aval.dtype)


@lowering(aten.geometric_.default, aten.geometric.default, random=True, static=True, meta=True)
def geometric_(x, p, *, generator=None, key, aval):
    """Trials up to the first success: ceil(log(u) / log1p(-p)) for u in (0, 1], as eager draws."""
    u = 1.0 - uniform(key, aval.shape, jnp.float64)
    return cast(jnp.ceil(jnp.log(u) / jnp.log1p(-p)), aval.dtype)


@lowering(aten.randn_like.default, aten.randn_like.generator, random=True, meta=True)
def randn_like(x, *, generator=None, key, aval, **_):
    return cast(normal(key, aval.shape, _float(aval)), aval.dtype)


@lowering(aten.rand_like.default, aten.rand_like.generator, random=True, meta=True)
def rand_like(x, *, generator=None, key, aval, **_):
    return cast(uniform(key, aval.shape, _float(aval)), aval.dtype)


@lowering(aten.randint_like.default, aten.randint_like.generator, aten.randint_like.Tensor,
          aten.randint_like.Tensor_generator, random=True, meta=True)
def randint_like(x, high, *, generator=None, key, aval, **_):
    return randint_like_low(x, 0, high, key=key, aval=aval)


@lowering(aten.randint_like.low_dtype, aten.randint_like.low_generator_dtype, random=True,
          meta=True)
def randint_like_low(x, low, high, *, generator=None, key, aval, **_):
    r = randint(key, aval.shape, cast(low, jnp.int64), cast(high, jnp.int64), dtype=jnp.int64)
    return cast(r, aval.dtype)
