"""Threads: two threads training their own models on the device at the same time get exactly
what running them one after the other gets (migration_guide/threads.md says what is shared)."""
from __future__ import annotations

import threading

import torch
import torch.nn as nn
import torch.nn.functional as F

import xla_compat as xc

STEPS = 8


def _job(seed: int):
    """A model and data built on the CPU (no randomness once training starts)."""
    g = torch.Generator().manual_seed(seed)
    model = nn.Sequential(nn.Linear(6, 12), nn.ReLU(), nn.Linear(12, 3))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return model, torch.randn(10, 6, generator=g), torch.randint(0, 3, (10,), generator=g)


def _train(path: str, seed: int, dev, barrier=None, sync_every=1):
    with xc.use_path(path):        # the path is chosen per thread
        model, x, y = _job(seed)
        model = model.to(dev)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        x, y = x.to(dev), y.to(dev)
        if barrier is not None:
            barrier.wait()
        losses = []
        for i in range(STEPS):
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            if i % sync_every == 0:
                xc.sync()
            losses.append(loss.detach())
        return [l.cpu() for l in losses], [p.detach().cpu() for p in model.parameters()]


def _in_threads(path, dev, seeds, sync_every):
    results, errors = {}, []
    barrier = threading.Barrier(len(seeds))

    def work(seed):
        try:
            results[seed] = _train(path, seed, dev, barrier, sync_every)
        except BaseException as e:   # reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=work, args=(s,)) for s in seeds]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors, errors
    assert not any(t.is_alive() for t in threads)
    return results


def _assert_identical(a, b, what):
    # The same values up to float rounding: another thread's sync may cut this thread's graph at
    # another op, and XLA fuses (so rounds) the two shorter graphs differently from the one
    # graph. Measured: at most 6e-8 apart on both paths; a race would be far off, not an ulp.
    (la, pa), (lb, pb) = a, b
    for i, (x, y) in enumerate(zip(la, lb)):
        torch.testing.assert_close(x, y, rtol=1e-6, atol=1e-7,
                                   msg=lambda m: f"{what}: loss at step {i}: {m}")
    for i, (x, y) in enumerate(zip(pa, pb)):
        torch.testing.assert_close(x, y, rtol=1e-6, atol=1e-7,
                                   msg=lambda m: f"{what}: parameter {i}: {m}")


def test_two_threads_training_at_once_match_running_one_after_the_other(path, dev):
    sequential = {seed: _train(path, seed, dev) for seed in (1, 2)}
    concurrent = _in_threads(path, dev, (1, 2), sync_every=1)
    for seed in (1, 2):
        _assert_identical(concurrent[seed], sequential[seed], f"thread {seed}")
    assert not torch.equal(sequential[1][0][-1], sequential[2][0][-1])   # two different jobs


def test_a_sync_in_one_thread_materialises_the_other_threads_pending_work_correctly(path, dev):
    # Thread 1 syncs every step, thread 2 only every third: thread 1's syncs cut thread 2's
    # graphs at arbitrary points. Values must not depend on where the cuts fall.
    sequential = {seed: _train(path, seed, dev) for seed in (1, 2)}
    results, errors = {}, []
    barrier = threading.Barrier(2)

    def work(seed, every):
        try:
            results[seed] = _train(path, seed, dev, barrier, sync_every=every)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=work, args=(1, 1)), threading.Thread(target=work, args=(2, 3))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors, errors
    for seed in (1, 2):
        (la, pa), (lb, pb) = results[seed], sequential[seed]
        for x, y in zip(la + pa, lb + pb):
            torch.testing.assert_close(x, y, rtol=1e-6, atol=1e-6)
