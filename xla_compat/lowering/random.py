"""Random ops. Each rule receives ``key``: a fresh jax PRNG key split off the device RNG state."""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from . import _meta
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
def normal_tensor(mean, std=1.0, *, generator=None, key, aval):
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
    return uniform_(x, key=key, aval=aval)      # (complex: both parts drawn, as uniform_)


@lowering(aten.randint_like.default, aten.randint_like.generator, aten.randint_like.Tensor,
          aten.randint_like.Tensor_generator, random=True, meta=True)
def randint_like(x, high, *, generator=None, key, aval, **_):
    return randint_like_low(x, 0, high, key=key, aval=aval)


@lowering(aten.randint_like.low_dtype, aten.randint_like.low_generator_dtype, random=True,
          meta=True)
def randint_like_low(x, low, high, *, generator=None, key, aval, **_):
    r = randint(key, aval.shape, cast(low, jnp.int64), cast(high, jnp.int64), dtype=jnp.int64)
    return cast(r, aval.dtype)


@lowering(aten.rand.out, aten.rand.generator_out, random=True, static=True, meta=True)
def rand_out(size, *, generator=None, key, aval, **_):
    return uniform_(None, key=key, aval=aval)


@lowering(aten.randn.out, aten.randn.generator_out, random=True, static=True, meta=True)
def randn_out(size, *, generator=None, key, aval, **_):
    return cast(normal(key, aval.shape, _float(aval)), aval.dtype)


@lowering(aten.randint.out, aten.randint.generator_out, random=True, static=True, meta=True)
def randint_out(high, size, *, generator=None, key, aval, **_):
    return randint_low_out(0, high, size, key=key, aval=aval)


@lowering(aten.randint.low_out, aten.randint.low_generator_out, random=True, static=True,
          meta=True)
def randint_low_out(low, high, size, *, generator=None, key, aval, **_):
    return cast(randint(key, aval.shape, low, high, dtype=jnp.int64), aval.dtype)


# -- samplers of torch.distributions: drawn as eager draws them in distribution (the numbers
# come from the device's generator, as every device random op's do) --------------------------

@lowering(aten.poisson.default, random=True, meta=True)
def poisson(rate, generator=None, *, key, aval):
    counts = jax.random.poisson(key, rate.astype(jnp.float64), rate.shape, dtype=jnp.int64)
    return cast(counts, aval.dtype)


_meta.like_first("binomial", "_sample_dirichlet", "_standard_gamma_grad")   # (none upstream)


@lowering(aten.binomial.default, random=True)
def binomial(count, prob, generator=None, *, key):
    draws = jax.random.binomial(key, count.astype(jnp.float64), prob.astype(jnp.float64),
                                count.shape)
    return draws.astype(count.dtype)


@lowering(aten._standard_gamma.default, random=True, meta=True)
def standard_gamma(alpha, generator=None, *, key, aval):
    """Gamma(alpha, 1) draws; float16/bfloat16 draw in float32 (eager's accumulation type)."""
    return cast(jax.random.gamma(key, alpha.astype(_float(aval)), alpha.shape), aval.dtype)


@lowering(aten._standard_gamma_grad.default)
def standard_gamma_grad(alpha, sample):
    """d sample / d alpha of a Gamma(alpha, 1) draw (reparameterised ``rsample``), as eager's
    CPU kernel approximates -(d cdf / d alpha) / pdf, in float64: a Taylor series for x < 0.8,
    Rice's saddle point expansion for alpha > 8, a bivariate rational approximation otherwise.
    (jax's ``random_gamma_grad`` is another approximation: up to 3% away in the tails.)"""
    a, x = alpha.astype(jnp.float64), sample.astype(jnp.float64)
    out = jnp.where(x < 0.8, _gamma_grad_small_x(a, x),
                    jnp.where(a > 8.0, _gamma_grad_large_alpha(a, x), _gamma_grad_rational(a, x)))
    return out.astype(alpha.dtype)


def _gamma_grad_small_x(a, x):
    numer, denom = jnp.ones_like(x), a
    series1, series2 = numer / denom, numer / (denom * denom)
    for i in range(1, 6):
        numer = numer * -x / i
        denom = denom + 1
        series1 = series1 + numer / denom
        series2 = series2 + numer / (denom * denom)
    pow_x_a = jnp.power(x, a)
    pdf = jnp.power(x, a - 1) * jnp.exp(-x)
    cdf = pow_x_a * series1
    cdf_a = (jnp.log(x) - jax.scipy.special.digamma(a)) * cdf - pow_x_a * series2
    out = -cdf_a / pdf
    return jnp.where(jnp.isnan(out), 0.0, out)


def _gamma_grad_large_alpha(a, x):
    near = (0.9 * a <= x) & (x <= 1.1 * a)
    n1 = 1 + 24 * a * (1 + 12 * a)
    n2 = 1440 * (a * a) + 6 * x * (53 - 120 * x) - 65 * x * x / a + a * (107 + 3600 * x)
    at_mode = n1 * n2 / (1244160 * (a * a) * (a * a))
    denom = jnp.sqrt(8 * a)
    term2 = denom / (a - x)
    term3 = jnp.power(x - a - a * jnp.log(x / a), -1.5)
    term23 = jnp.where(x < a, term2 - term3, term2 + term3)
    term1 = jnp.log(x / a) * term23 - jnp.sqrt(2 / a) * (a + x) / ((a - x) * (a - x))
    stirling = 1 + 1 / (12 * a) * (1 + 1 / (24 * a))
    return jnp.where(near, at_mode, -stirling * x * term1 / denom)


# eager's coefficients of the rational approximation in u = log(x / alpha), v = log(alpha)
_GAMMA_GRAD_UV = np.array([
    [0.16009398, -0.094634809, 0.025146376, -0.0030648343,
     1, 0.32668115, 0.10406089, 0.0014179084],
    [0.53487893, 0.1298071, 0.065735949, -0.0015649758,
     0.16639465, 0.020070113, -0.0035938915, -0.00058392623],
    [0.040121004, -0.0065914022, -0.0026286047, -0.0013441777,
     0.017050642, -0.0021309326, 0.00085092367, -1.5247877e-07]])


def _gamma_grad_rational(a, x):
    u, v = jnp.log(x / a), jnp.log(a)
    c = [_GAMMA_GRAD_UV[0, i] + u * (_GAMMA_GRAD_UV[1, i] + u * _GAMMA_GRAD_UV[2, i])
         for i in range(8)]
    p = c[0] + v * (c[1] + v * (c[2] + v * c[3]))
    q = c[4] + v * (c[5] + v * (c[6] + v * c[7]))
    return jnp.exp(p / q)


@lowering(aten._sample_dirichlet.default, random=True)
def sample_dirichlet(alpha, generator=None, *, key):
    """Dirichlet(alpha) over the last dimension: Gamma draws, normalised (eager's route)."""
    acc = jnp.promote_types(alpha.dtype, jnp.float32)
    g = jax.random.gamma(key, alpha.astype(acc), alpha.shape)
    g = jnp.maximum(g, jnp.finfo(acc).tiny)
    return (g / jnp.sum(g, axis=-1, keepdims=True)).astype(alpha.dtype)
