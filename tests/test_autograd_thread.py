"""Backward of hlo tensors runs on the thread that calls it (xla_compat/autograd_thread.py):
autograd's device worker thread would cost two thread hand-offs per backward and buy nothing on
one host-traced device. Where a backward runs is seen from a gradient hook, which autograd calls
on the thread that executes the node."""
from __future__ import annotations

import threading

import pytest
import torch
import torch.utils.checkpoint as ckpt

import xla_compat as xc
from xla_compat import autograd_thread, settings


def _hook_threads(dev) -> set:
    """Thread ids that ran a gradient hook of one small backward on ``dev``."""
    seen = set()
    w = torch.randn(4, 4).to(dev).requires_grad_()
    h = torch.tanh(w * 2.0)
    h.register_hook(lambda g: seen.add(threading.get_ident()))
    h.sum().backward()
    xc.sync()
    return seen


def _in_fresh_thread(path: str, fn):
    """``fn()``'s result and this thread's id, run in a new thread on ``path``."""
    out, errors = {}, []

    def work():
        try:
            with xc.use_path(path):
                out["result"] = fn()
                out["tid"] = threading.get_ident()
        except BaseException as e:          # reported by the caller
            errors.append(e)
    t = threading.Thread(target=work)
    t.start()
    t.join(120)
    assert not errors, errors
    return out["result"], out["tid"]


def test_backward_runs_on_the_calling_thread(path, dev):
    assert _hook_threads(dev) == {threading.get_ident()}


def test_a_new_thread_runs_its_backward_on_itself(path):
    seen, tid = _in_fresh_thread(path, lambda: _hook_threads(xc.device()))
    assert seen == {tid}


def test_switched_off_autograd_keeps_its_device_thread(path):
    with settings.override(autograd_caller_thread=False):
        seen, tid = _in_fresh_thread(path, lambda: _hook_threads(xc.device()))
    assert len(seen) == 1 and tid not in seen


def test_the_users_own_multithreading_choice_wins_inside_its_block(path, dev):
    _hook_threads(dev)                 # this thread is claimed by now
    with torch.autograd.set_multithreading_enabled(True):
        seen = _hook_threads(dev)
    assert seen and threading.get_ident() not in seen
    assert _hook_threads(dev) == {threading.get_ident()}      # back to the caller after it


def test_forget_lets_a_thread_decide_again():
    def run():
        autograd_thread.claim()
        first = torch._C._is_multithreading_enabled()
        torch._C._set_multithreading_enabled(True)
        autograd_thread.claim()               # once per thread: leaves the user's choice
        kept = torch._C._is_multithreading_enabled()
        autograd_thread.forget()
        autograd_thread.claim()
        return first, kept, torch._C._is_multithreading_enabled()
    assert _in_fresh_thread("legacy", run)[0] == (False, True, False)


@pytest.mark.parametrize("reentrant", [True, False])
def test_checkpointed_backward_matches_cpu(path, dev, reentrant):
    g = torch.Generator().manual_seed(3)
    w1, w2 = torch.randn(8, 8, generator=g), torch.randn(8, 8, generator=g)
    x = torch.randn(5, 8, generator=g)

    def grads(device):
        a = w1.to(device).requires_grad_()
        b = w2.to(device).requires_grad_()
        block = lambda z, a, b: torch.tanh(z @ a) @ b
        y = ckpt.checkpoint(block, x.to(device), a, b, use_reentrant=reentrant)
        (y.sin().sum()).backward()
        return a.grad.cpu(), b.grad.cpu()

    for got, want in zip(grads(dev), grads("cpu")):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
