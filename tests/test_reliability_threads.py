"""Threads: two threads training their own models on the device at the same time get exactly
what running them one after the other gets (migration_guide/threads.md says what is shared)."""
from __future__ import annotations

import dataclasses
import importlib
import sys
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


def test_writes_through_views_are_kept_while_another_thread_syncs(path, dev):
    # A full sync in one thread while another writes through views: legacy's pre-sync fold of
    # each storage's pending writes ran outside the device lock, and the functional path's sync
    # touched the other thread's wrappers in the middle of their ops in torch's C++. Switching
    # threads as often as the interpreter can opens those windows wide: at 3,000 writes the old
    # code lost some in 4 of 5 runs on legacy and 1 of 5 on functional; these 300 keep the test
    # short, so it is a smoke test and the two tests below pin what fixed it.
    n = 300
    x = torch.zeros(16, device=dev)
    stop, errors = threading.Event(), []

    def syncer():
        with xc.use_path(path):
            while not stop.is_set():
                try:
                    xc.sync()
                except BaseException as e:   # reported by the main thread
                    errors.append(e)
                    return

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    thread = threading.Thread(target=syncer)
    thread.start()
    try:
        for i in range(n):
            x[i % 16] += 1
    finally:
        stop.set()
        thread.join(60)
        sys.setswitchinterval(interval)
    assert not errors, errors
    expected = torch.bincount(torch.arange(n) % 16, minlength=16).float()
    assert torch.equal(x.cpu(), expected), x.cpu()


def test_the_paths_pre_sync_work_holds_the_device_lock(path, dev, monkeypatch):
    # What keeps the test above from losing writes, checked directly (its race is rare): legacy
    # folds every storage's pending writes before a sync, and an op of another thread may not
    # land in the middle.
    from xla_compat import paths
    from xla_compat.lazy.tensor import lock
    held = []
    impl = paths.get(path)

    def spy(tensors=None):
        held.append(lock._is_owned())
        return before(tensors)

    before = impl.before_sync
    monkeypatch.setitem(paths._registry, path, dataclasses.replace(impl, before_sync=spy))
    x = torch.zeros(4, device=dev)
    x[1] += 1
    xc.sync()
    xc.sync([x])
    assert held and all(held), held


def test_a_functional_full_sync_leaves_another_live_threads_wrappers_alone():
    # torch runs a functionalized op in C++ without the GIL or the device lock: a sync that
    # applied another thread's pending view updates meanwhile raced with its op. A full sync
    # settles the wrappers its own thread made, and those of threads that have ended.
    wrap = importlib.import_module("xla_compat.functional.wrap")
    with xc.use_path("functional"):
        mine = torch.zeros(3, device=xc.device())
        made, release = threading.Event(), threading.Event()
        theirs = []

        def other():
            with xc.use_path("functional"):
                theirs.append(torch.ones(3, device=xc.device()))
            made.set()
            release.wait(60)

        thread = threading.Thread(target=other)
        thread.start()
        made.wait(60)
        try:
            settled = [w for _, w in wrap.settled_by_this_thread()]
            assert any(w is mine for w in settled)
            assert not any(w is theirs[0] for w in settled)
        finally:
            release.set()
            thread.join(60)
        assert any(w is theirs[0] for _, w in wrap.settled_by_this_thread())
        theirs[0].add_(1)          # an ended thread's tensor is this thread's to settle
        xc.sync()
        assert torch.equal(theirs[0].cpu(), torch.full((3,), 2.0))
        assert torch.equal(mine.cpu(), torch.zeros(3))
