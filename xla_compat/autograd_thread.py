"""Backward of hlo tensors runs on the thread that calls it.

PyTorch's autograd engine gives every non-CPU device (PrivateUse1 ``hlo`` included) a worker
thread: ``loss.backward()`` on hlo tensors queues the graph there and parks the calling thread
until the worker is done, so each backward pays two thread hand-offs, and every op the worker
traces takes the GIL from a thread that just woke up. On this project's 2-core machines a
hand-off measured 80-110 us, and the MLP step of ``benchmarks/`` (W2) spent 1.4 ms in backward
against 0.85 ms on the calling thread. The worker buys nothing here: hlo is one device and a
backward only traces ops on the host, so nothing runs beside the calling thread anyway.

So the first hlo tensor a thread makes (and its first sync) switches off autograd's device
threads for that thread (``torch.autograd.set_multithreading_enabled(False)``, which is
thread-local). Once per thread only: a later ``with torch.autograd.set_multithreading_enabled(True)``
in user code wins inside its block. The switch also moves other accelerators' backward (CUDA)
in that thread onto the caller; ``XLA_AUTOGRAD_CALLER_THREAD=0`` keeps autograd's own threads.
"""
from __future__ import annotations

import threading

import torch

from . import settings

_seen = threading.local()


def claim() -> None:
    """Run this thread's backward passes on the thread itself (once per thread; see above)."""
    if getattr(_seen, "done", False):
        return
    _seen.done = True
    if settings.get().autograd_caller_thread:
        torch._C._set_multithreading_enabled(False)


def forget() -> None:
    """Tests: let the next ``claim()`` in this thread decide again."""
    _seen.done = False
