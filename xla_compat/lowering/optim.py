"""Fused optimizer steps and mixed-precision loss scaling: what ``torch.optim``'s ``fused=True``
and ``torch.amp.GradScaler`` call.

``_fused_adam_``/``_fused_adamw_``/``_fused_sgd_``/``_fused_adagrad_`` update parameters, their
gradients (unscaled in place when ``grad_scale`` is given) and optimizer state; they trace
through their functional variants and return the new value of each written list. Each follows
eager's CPU kernel step by step: the scalar coefficients (bias corrections, step sizes) in
float64 and then rounded to the working type; float16/bfloat16 tensors computed in float32 and
each stored value rounded once; ``found_inf == 1`` leaves every tensor as it was (eager returns
before touching anything). The learning rate and the other float hyper-parameters are run-time
parameters (``lift_floats``): a scheduler changing ``lr`` every step compiles once.

``_amp_foreach_non_finite_check_and_unscale_`` and ``_amp_update_scale_`` are GradScaler's two
kernels; neither reads a value back to the host.
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import torch

from . import _meta
from .opmath import store as _store, work as _work
from .registry import aten, lowering

F32, F64 = np.dtype(np.float32), np.dtype(np.float64)


def _c(x, work):
    """A double coefficient as the kernel's working type (``opmath_t(coef)``)."""
    return jnp.asarray(x, F64).astype(work)


def _keep_if_inf(found_inf, new, old):
    """Eager returns before writing anything when ``found_inf`` is 1."""
    if found_inf is None:
        return new
    skip = jnp.asarray(found_inf).reshape(()) == 1.0
    return [jnp.where(skip, o, n) for n, o in zip(new, old)]


def _operands(param, grad, grad_scale, maximize):
    """(working type, the parameter and the step's gradient in it, the value written back into
    the gradient): eager's first steps, the gradient unscaled (and stored so) then negated."""
    work = _work(param.dtype)
    g = grad.astype(work)
    g_out = grad
    if grad_scale is not None:
        g = g / jnp.asarray(grad_scale).reshape(()).astype(work)
        g_out = _store(g, grad.dtype)
    return work, param.astype(work), -g if maximize else g, g_out


def _l2(gw, pw, weight_decay, work):
    """``grad += weight_decay * param`` where the decay is not 0 (eager skips it at 0)."""
    return jnp.where(weight_decay != 0, gw + pw * _c(weight_decay, work), gw)


# -- Adam / AdamW -----------------------------------------------------------------------------------

def _adam(adamw, params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, lr, beta1,
          beta2, weight_decay, eps, amsgrad, maximize, grad_scale, found_inf):
    lr, beta1, beta2 = (jnp.asarray(v, F64).reshape(()) for v in (lr, beta1, beta2))
    weight_decay, eps = jnp.asarray(weight_decay, F64), jnp.asarray(eps, F64)
    outs = ([], [], [], [], [])
    for i, (p, g, m, v, step) in enumerate(zip(params, grads, exp_avgs, exp_avg_sqs,
                                               state_steps)):
        step = step.astype(F32).astype(F64).reshape(())     # (eager: state_step.item<float>())
        bias1 = 1 - beta1 ** step
        bias2_sqrt = jnp.sqrt(1 - beta2 ** step)
        step_size = lr / bias1
        work, pw, gw, g_out = _operands(p, g, grad_scale, maximize)
        if adamw:
            pw = jnp.where(weight_decay != 0, pw * _c(1 - lr * weight_decay, work), pw)
        else:
            gw = _l2(gw, pw, weight_decay, work)
        # exp_avg.lerp_(grad, 1 - beta1), in lerp's two forms
        weight = _c(1 - beta1, work)
        mw = m.astype(work)
        mw = jnp.where(jnp.abs(weight) < 0.5, mw + weight * (gw - mw),
                       gw - (gw - mw) * (1 - weight))
        vw = v.astype(work) * _c(beta2, work) + _c(1 - beta2, work) * gw * gw
        new, old = [None, g_out, _store(mw, m.dtype), _store(vw, v.dtype)], [p, g, m, v]
        if amsgrad:
            vmax = max_exp_avg_sqs[i]
            vw = jnp.maximum(vmax.astype(work), vw)
            new.append(_store(vw, vmax.dtype))
            old.append(vmax)
        denom = jnp.sqrt(vw) / _c(bias2_sqrt, work) + _c(eps, work)
        new[0] = _store(pw + _c(-step_size, work) * mw / denom, p.dtype)
        for k, x in enumerate(_keep_if_inf(found_inf, new, old)):
            outs[k].append(x)
    if not amsgrad:
        outs[4].extend(max_exp_avg_sqs)
    return _flat(outs)


def _adam_rule(adamw: bool):
    def rule(self, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, *, lr, beta1,
             beta2, weight_decay, eps, amsgrad, maximize, grad_scale=None, found_inf=None):
        return _adam(adamw, self, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps,
                     lr, beta1, beta2, weight_decay, eps, amsgrad, maximize, grad_scale,
                     found_inf)
    rule.__name__ = "fused_adamw" if adamw else "fused_adam"
    return rule


lowering(aten._fused_adam.default, aten._fused_adam.tensor_lr, lift_floats=True)(
    _adam_rule(False))
lowering(aten._fused_adamw.default, aten._fused_adamw.tensor_lr, lift_floats=True)(
    _adam_rule(True))


# -- SGD --------------------------------------------------------------------------------------------

@lowering(aten._fused_sgd.default, aten._fused_sgd.tensor_lr, lift_floats=True)
def fused_sgd(self, grads, momentum_buffer_list, *, weight_decay, momentum, lr, dampening,
              nesterov, maximize, is_first_step, grad_scale=None, found_inf=None):
    lr = jnp.asarray(lr, F64).reshape(())
    weight_decay, momentum = jnp.asarray(weight_decay, F64), jnp.asarray(momentum, F64)
    dampening = jnp.asarray(dampening, F64)
    has_buffers = len(momentum_buffer_list) > 0     # (eager: empty exactly when momentum == 0)
    outs = ([], [], [])
    for i, (p, g) in enumerate(zip(self, grads)):
        work, pw, gw, g_out = _operands(p, g, grad_scale, maximize)
        gw = _l2(gw, pw, weight_decay, work)
        new, old = [None, g_out], [p, g]
        if has_buffers:
            buf = momentum_buffer_list[i]
            bw = gw if is_first_step else (buf.astype(work) * _c(momentum, work)
                                           + gw * _c(1 - dampening, work))
            new.append(_store(bw, buf.dtype))
            old.append(buf)
            gw = gw + bw * _c(momentum, work) if nesterov else bw
        new[0] = _store(pw - gw * _c(lr, work), p.dtype)
        for k, x in enumerate(_keep_if_inf(found_inf, new, old)):
            outs[k].append(x)
    return _flat(outs)


# -- Adagrad ----------------------------------------------------------------------------------------

def _adagrad(self, grads, state_sums, state_steps, lr, lr_decay, weight_decay, eps, maximize,
             grad_scale, found_inf):
    lr = jnp.asarray(lr, F64).reshape(())
    lr_decay, weight_decay = jnp.asarray(lr_decay, F64), jnp.asarray(weight_decay, F64)
    eps = jnp.asarray(eps, F64)
    outs = ([], [], [])
    for p, g, s, step in zip(self, grads, state_sums, state_steps):
        step = step.astype(F32).astype(F64).reshape(())
        clr = lr / (1 + (step - 1) * lr_decay)
        work, pw, gw, g_out = _operands(p, g, grad_scale, maximize)
        gw = _l2(gw, pw, weight_decay, work)
        sw = s.astype(work) + gw * gw
        std = jnp.sqrt(sw) + _c(eps, work)
        pw = pw - _c(clr, work) * gw / std
        new = [_store(pw, p.dtype), g_out, _store(sw, s.dtype)]
        for k, x in enumerate(_keep_if_inf(found_inf, new, [p, g, s])):
            outs[k].append(x)
    return _flat(outs)


@lowering(aten._fused_adagrad.default, lift_floats=True)
def fused_adagrad(self, grads, state_sums, state_steps, *, lr, lr_decay, weight_decay, eps,
                  maximize, grad_scale=None, found_inf=None):
    # (this overload's in-place form also lists state_steps as written: they come back as is)
    return _adagrad(self, grads, state_sums, state_steps, lr, lr_decay, weight_decay, eps,
                    maximize, grad_scale, found_inf) + list(state_steps)


@lowering(aten._fused_adagrad.tensor_lr, lift_floats=True)
def fused_adagrad_tensor_lr(self, grads, state_sums, state_steps, *, lr, lr_decay,
                            weight_decay, eps, maximize, grad_scale=None, found_inf=None):
    return _adagrad(self, grads, state_sums, state_steps, lr, lr_decay, weight_decay, eps,
                    maximize, grad_scale, found_inf)


# -- GradScaler -------------------------------------------------------------------------------------

@lowering(aten._amp_foreach_non_finite_check_and_unscale.default)
def amp_non_finite_check_and_unscale(self, found_inf, inv_scale):
    inv = jnp.asarray(inv_scale).reshape(())
    found = jnp.zeros((), jnp.bool_)
    out = []
    for g in self:
        work = _work(g.dtype)
        found = found | ~jnp.all(jnp.isfinite(g))
        out.append(_store(g.astype(work) * inv.astype(work), g.dtype))
    return [*out, jnp.where(found, jnp.ones_like(found_inf), found_inf)]


@lowering(aten._amp_update_scale.default, static=True)
def amp_update_scale(self, growth_tracker, found_inf, scale_growth_factor, scale_backoff_factor,
                     growth_interval):
    scale = self.astype(F64)
    inf = found_inf.reshape(self.shape) != 0
    successful = growth_tracker + 1
    grow = successful == growth_interval
    grown = (scale * scale_growth_factor).astype(F32)
    new_scale = jnp.where(inf, (scale * scale_backoff_factor).astype(F32),
                          jnp.where(grow & jnp.isfinite(grown), grown, self))
    tracker = jnp.where(inf | grow, jnp.zeros_like(growth_tracker), successful)
    return new_scale.astype(self.dtype), tracker.astype(growth_tracker.dtype)


# -- meta kernels (torch 2.13 ships them for some of these ops only) ---------------------------------

def _check_lists(op: str, params, *lists) -> None:
    """Eager's checks: every list as long as the parameters (or empty where it may be), each
    tensor shaped like its parameter."""
    for name, xs, may_be_empty in lists:
        if may_be_empty and not xs:
            continue
        if len(xs) != len(params):
            raise RuntimeError(f"{op}: expected {len(params)} tensors in {name}, got {len(xs)}")
        for p, x in zip(params, xs):
            if x.shape != p.shape:
                raise RuntimeError(f"{op}: a tensor of {name} has shape {tuple(x.shape)}, its "
                                   f"parameter {tuple(p.shape)}")


def _flat(lists) -> list:
    """The executor takes a rule's outputs flat: the written lists one after another."""
    return [x for xs in lists for x in xs]


def _copies(*lists):
    return tuple([torch.empty_like(t) for t in xs] for xs in lists)


def _adam_meta(op):
    def check(self, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, amsgrad):
        _check_lists(op, self, ("grads", grads, False), ("exp_avgs", exp_avgs, False),
                     ("exp_avg_sqs", exp_avg_sqs, False),
                     ("max_exp_avg_sqs", max_exp_avg_sqs, not amsgrad))
        if len(state_steps) != len(self):
            raise RuntimeError(f"{op}: expected {len(self)} tensors in state_steps, got "
                               f"{len(state_steps)}")

    def in_place(self, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, *, lr, beta1,
                 beta2, weight_decay, eps, amsgrad, maximize, grad_scale=None, found_inf=None):
        check(self, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, amsgrad)

    def functional(self, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, *, lr,
                   beta1, beta2, weight_decay, eps, amsgrad, maximize, grad_scale=None,
                   found_inf=None):
        check(self, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, amsgrad)
        return _copies(self, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs)
    return in_place, functional


def _sgd_meta():
    def check(self, grads, bufs):
        _check_lists("_fused_sgd_", self, ("grads", grads, False),
                     ("momentum_buffer_list", bufs, True))

    def in_place(self, grads, momentum_buffer_list, *, weight_decay, momentum, lr, dampening,
                 nesterov, maximize, is_first_step, grad_scale=None, found_inf=None):
        check(self, grads, momentum_buffer_list)

    def functional(self, grads, momentum_buffer_list, *, weight_decay, momentum, lr, dampening,
                   nesterov, maximize, is_first_step, grad_scale=None, found_inf=None):
        check(self, grads, momentum_buffer_list)
        return _copies(self, grads, momentum_buffer_list)
    return in_place, functional


def _adagrad_meta(with_steps: bool):
    def check(self, grads, state_sums, state_steps):
        _check_lists("_fused_adagrad_", self, ("grads", grads, False),
                     ("state_sums", state_sums, False))
        if len(state_steps) != len(self):
            raise RuntimeError(f"_fused_adagrad_: expected {len(self)} tensors in state_steps, "
                               f"got {len(state_steps)}")

    def in_place(self, grads, state_sums, state_steps, *, lr, lr_decay, weight_decay, eps,
                 maximize, grad_scale=None, found_inf=None):
        check(self, grads, state_sums, state_steps)

    def functional(self, grads, state_sums, state_steps, *, lr, lr_decay, weight_decay, eps,
                   maximize, grad_scale=None, found_inf=None):
        check(self, grads, state_sums, state_steps)
        lists = (self, grads, state_sums) + ((state_steps,) if with_steps else ())
        return _copies(*lists)
    return in_place, functional


def _amp_unscale_meta(self, found_inf, inv_scale):
    return [torch.empty_like(t) for t in self], torch.empty_like(found_inf)


def _amp_update_meta(self, growth_tracker, found_inf, scale_growth_factor, scale_backoff_factor,
                     growth_interval):
    return torch.empty_like(self), torch.empty_like(growth_tracker)


def _register_metas() -> None:
    adam, adamw = _adam_meta("_fused_adam_"), _adam_meta("_fused_adamw_")
    sgd, adagrad, adagrad_lr = _sgd_meta(), _adagrad_meta(True), _adagrad_meta(False)
    kernels = {}
    for name, (in_place, functional) in (("_fused_adam", adam), ("_fused_adamw", adamw),
                                         ("_fused_sgd", sgd)):
        for overload in ("", ".tensor_lr"):
            kernels[f"{name}_{overload}"] = in_place
            kernels[f"{name}{overload}"] = functional
    kernels["_fused_adagrad_"], kernels["_fused_adagrad"] = adagrad
    kernels["_fused_adagrad_.tensor_lr"], kernels["_fused_adagrad.tensor_lr"] = adagrad_lr
    kernels["_amp_foreach_non_finite_check_and_unscale"] = _amp_unscale_meta
    kernels["_amp_update_scale"] = _amp_update_meta
    _meta.where_missing(kernels)


_register_metas()
