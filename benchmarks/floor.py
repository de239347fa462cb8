"""The least a step can cost when every ATen op is dispatched to Python (issue 8's "lazily traced"
targets are judged against it).

A lazy tracer written in Python receives each op through ``__torch_dispatch__`` of a wrapper
subclass and returns a new wrapper tensor: that alone, with no IR at all, is the floor per op.
Measured here in the same run as the workloads, and multiplied by the number of ATen ops the
step dispatches (counted on torch eager with a dispatch mode: what any dispatch-level tracer
sees), it gives the fastest any such tracer could run the step, against torch eager's own time.

That product leaves out what a whole step costs around the dispatches (autograd's bookkeeping,
the detaches of saved tensors, the module and optimizer Python, and the caches XLA's threads
evicted while the previous step ran). So each traced step is also set beside a null tracer
(``_NullTracer``): a wrapper subclass that runs the same program, takes every op through
``__torch_dispatch__`` and answers it from a shape cache, building no IR and holding no value.
Run in turn with the traced step, after each of its executions, it meets the same conditions.
"""
from __future__ import annotations

import gc
import statistics
import sys
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode


class _Bare(torch.Tensor):
    """A wrapper subclass whose every op only makes its output wrapper: no tracing at all."""

    @staticmethod
    def __new__(cls, shape):
        return torch.Tensor._make_wrapper_subclass(cls, shape, dtype=torch.float32)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return cls(args[0].shape)

    __torch_function__ = torch._C._disabled_torch_function_impl


def dispatch_floor_us(ops: int = 20_000, rounds: int = 5) -> float:
    """Median over ``rounds`` of the per-op cost of ``a + b`` on bare wrappers, in us."""
    a, b = _Bare((64, 64)), _Bare((64, 64))
    per_op = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(ops):
            a + b
        per_op.append((time.perf_counter() - start) / ops * 1e6)
    return statistics.median(per_op)


def _geometry(t) -> tuple:
    g = getattr(t, "_null_geo", None)
    return g if g is not None else (tuple(t.shape), t.stride(), t.storage_offset(), t.dtype,
                                    t.device.type)


class _NullTracer(torch.Tensor):
    """A tracer that does nothing: a wrapper subclass (on the meta device) whose every op returns
    output wrappers from a cache keyed by the op and its arguments' geometry, the first call's
    answer from the meta kernels. In-place and ``out=`` ops return the tensor they write. It
    builds no IR and holds no value: the least a tracer that sees ops through Python dispatch
    and remembers their shapes does per op."""

    _memo: dict = {}

    @staticmethod
    def __new__(cls, shape, stride, offset, dtype, requires_grad=False):
        t = torch.Tensor._make_wrapper_subclass(cls, shape, strides=stride, storage_offset=offset,
                                                dtype=dtype, device="meta",
                                                requires_grad=requires_grad)
        t._null_geo = (shape, stride, offset, dtype, "meta")
        return t

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        parts = [func]
        for a in args:
            ta = type(a)
            if ta is cls:
                parts.append(a._null_geo)
            elif ta is float:             # (a float decides no shape in these programs: a
                parts.append(float)       # learning rate or bias correction changes each step)
            elif ta is int or ta is bool:
                parts.append((ta, a))
            else:
                parts.append(_null_key(a))
        if kwargs:
            parts.append(_null_key(tuple(sorted(kwargs.items()))))
        key = tuple(parts)
        answer = cls._memo.get(key)
        if answer is None:
            out = func(*_on_meta(args), **{k: _on_meta(v) for k, v in (kwargs or {}).items()})
            answer = cls._memo[key] = _answer(func, out)
        return _null_outputs(answer, func, args, kwargs)

    __torch_function__ = torch._C._disabled_torch_function_impl


def _null_key(x):
    if isinstance(x, torch.Tensor):
        return _geometry(x)
    if type(x) in (list, tuple):
        return tuple(_null_key(e) for e in x)
    if type(x) is float:
        return float
    if type(x) in (int, bool):
        return (type(x), x)
    return x


def _on_meta(x):
    if type(x) is _NullTracer:
        from xla_compat.functional.strides import meta_like
        return meta_like(x)
    if type(x) in (list, tuple):
        return type(x)(_on_meta(e) for e in x)
    return x


def _answer(func, out):
    """What the op returns, as ``_null_outputs`` rebuilds it: per return, the argument it writes
    (its name) or a new tensor's geometry."""
    written = {frozenset(a.alias_info.before_set): a.name for a in func._schema.arguments
               if a.alias_info is not None and a.alias_info.is_write}
    returns = func._schema.returns
    if not returns:
        return None, ()
    outs = out if isinstance(out, (list, tuple)) else (out,)
    if len(returns) == 1 and not isinstance(out, (list, tuple)):
        kind = None
    else:
        kind = type(out)
    items = []
    for k, o in enumerate(outs):
        info = returns[min(k, len(returns) - 1)].alias_info
        if info is not None and info.is_write and frozenset(info.before_set) in written:
            items.append(("arg", written[frozenset(info.before_set)]))
        elif isinstance(o, torch.Tensor):
            items.append(("new", _geometry(o)[:4]))
        elif o is None:
            items.append(("none", None))
        else:
            raise NotImplementedError(f"the null tracer cannot answer {func} (it returns {o!r})")
    return kind, tuple(items)


def _null_outputs(answer, func, args, kwargs):
    kind, items = answer
    names = None
    outs = []
    for what, x in items:
        if what == "new":
            outs.append(_NullTracer(*x))
        elif what == "none":
            outs.append(None)
        else:
            if names is None:
                names = [a.name for a in func._schema.arguments]
            i = names.index(x)
            outs.append(args[i] if i < len(args) else kwargs[x])
    if kind is None:
        return outs[0] if outs else None
    return kind(outs)


def _to_null(t):
    if not isinstance(t, torch.Tensor) or type(t) is _NullTracer:
        return t
    size, stride, offset, dtype = _geometry(t)[:4]
    return _NullTracer(size, stride, offset, dtype, requires_grad=t.requires_grad)


def null_program(workload, like=None):
    """``workload``'s program on null tracer tensors: built on the meta device, its tensors and
    modules' parameters and buffers wrapped, its optimizer (if any) made again for them and
    taking the foreach kernels where ``like`` (the traced program) takes them (torch chooses
    them by device)."""
    program = workload.torch_program("meta")
    for name, value in list(vars(program).items()):
        if isinstance(value, torch.Tensor):
            setattr(program, name, _to_null(value))
        elif isinstance(value, torch.nn.Module):
            value._apply(_to_null)
    if getattr(program, "opt", None) is not None:
        program.opt = workload.make_opt(program.model.parameters())
        if like is not None:
            from torch.optim.optimizer import _default_to_fused_or_foreach
            foreach = _default_to_fused_or_foreach(list(like.model.parameters()), False)[1]
            for group in program.opt.param_groups:
                group["foreach"] = foreach
    return program


class _Count(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += 1
        return func(*args, **(kwargs or {}))


def aten_ops_per_step(workload) -> int:
    """ATen ops one eager step of ``workload`` dispatches (after a warm-up step)."""
    program = workload.torch_program("cpu")
    program.step()
    counter = _Count()
    with counter:
        program.step()
    return counter.n


def python_dispatches_per_step(workload, path: str) -> int:
    """``__torch_dispatch__`` calls one lazily traced step of ``workload`` makes on ``path``
    (after a warm-up step): the ops that cross into Python. Functionalization dispatches more
    than eager's ATen ops (it regenerates views and writes them back), legacy about as many.
    Counted on the calling thread (``sys.setprofile``), where backward runs too since session
    13 (``xla_compat.autograd_thread``); before, its ops ran on autograd's worker thread and
    the W2/W3 counts left them out."""
    import xla_compat as xc
    from benchmarks.measure import _wait_lazy
    calls = [0]

    def count(frame, event, arg):
        if event == "call" and frame.f_code.co_name == "__torch_dispatch__":
            calls[0] += 1
    with xc.use_path(path):
        program = workload.torch_program(xc.device())
        program.step()
        _wait_lazy()
        sys.setprofile(count)
        try:
            program.step()
        finally:
            sys.setprofile(None)
        _wait_lazy()
    return calls[0]


def traced_parts(workload, path: str, steps: int = 30, warmup: int = 5) -> tuple:
    """Medians, in the workload's unit, of a lazily traced step's three parts on ``path``:
    tracing the step, ``xc.sync()`` (collecting the graph, the cache lookup, dispatching the
    executable) and ``xc.wait_device_ops()`` (the rest of the execution); and fourth, a step of
    the null tracer (``null_program``) run before each traced step, after the previous one's
    execution."""
    import xla_compat as xc
    from benchmarks.measure import _wait_lazy
    parts: list = [[], [], [], []]
    gc.collect()          # (as run_variant and profile: no earlier variant's tensors linger)
    with xc.use_path(path):
        program = workload.torch_program(xc.device())
        null = null_program(workload, like=program)
        _wait_lazy()
        for i in range(warmup + steps):
            t0 = time.perf_counter()
            null.step()
            t1 = time.perf_counter()
            program.step()
            t2 = time.perf_counter()
            xc.sync()
            t3 = time.perf_counter()
            xc.wait_device_ops()
            t4 = time.perf_counter()
            if i >= warmup:
                for part, seconds in zip(parts, (t2 - t1, t3 - t2, t4 - t3, t1 - t0)):
                    part.append(seconds)
    return tuple(workload.per_step(statistics.median(p)) for p in parts)


PATHS = ("legacy", "functional")


def table(workloads, eager_medians: dict, twin_medians: dict | None = None) -> str:
    """Markdown: per workload, its ATen ops per step (eager), the Python dispatches a traced
    step makes on each path, the floor per step for each and eager's median; then where a traced
    step's time goes on each path, beside the null tracer's step in the same conditions and, with
    ``twin_medians``, the ratio to the JAX twin that the null tracer alone would cost."""
    floor = dispatch_floor_us()
    twin_medians = twin_medians or {}
    rows = ["| workload | ATen ops per step (eager) | Python dispatches, legacy | functional | "
            "dispatch floor per step: eager's ops | legacy's | functional's | torch eager | "
            "floor (eager's ops) / eager |", "|---|---|---|---|---|---|---|---|---|"]
    split = ["| workload | path | tracing | `sync()` | `wait_device_ops()` | total | "
             "dispatch floor of its dispatches | null tracer's step | tracing / null tracer | "
             "(null tracer + JAX twin) / JAX twin |", "|---|---|---|---|---|---|---|---|---|---|"]
    for w in workloads:
        n = aten_ops_per_step(w)
        counts = {p: python_dispatches_per_step(w, p) for p in PATHS}
        floors = [w.per_step(k * floor * 1e-6) for k in (n, *counts.values())]
        eager = eager_medians.get(w.name)
        cells = ([f"{eager:.3g} {w.unit}", f"{floors[0] / eager:.2f}x"] if eager else ["–", "–"])
        rows.append(f"| {w.name} | {n} | {counts['legacy']} | {counts['functional']} | "
                    + " | ".join(f"{f:.3g} {w.unit}" for f in floors) + " | "
                    + " | ".join(cells) + " |")
        twin = twin_medians.get(w.name)
        for p in PATHS:
            trace, sync, wait, null = traced_parts(w, p)
            least = f"{(null + twin) / twin:.2f}x" if twin else "–"
            split.append(f"| {w.name} | {p} | {trace:.3g} | {sync:.3g} | {wait:.3g} | "
                         f"{trace + sync + wait:.3g} {w.unit} | "
                         f"{w.per_step(counts[p] * floor * 1e-6):.3g} {w.unit} | "
                         f"{null:.3g} {w.unit} | {trace / null:.2f}x | {least} |")
    head = (f"Python dispatch floor, measured in this run: {floor:.2f} us per op (`a + b` on a "
            f"wrapper subclass whose `__torch_dispatch__` only makes its output wrapper). Times "
            f"the ops a step dispatches to Python, it is the fastest any tracer that sees ops "
            f"through Python dispatch could run the step, before building any IR, syncing or "
            f"executing. Eager's ATen ops are counted with a dispatch mode on CPU; each path's "
            f"Python dispatches by counting `__torch_dispatch__` calls in one traced step "
            f"(functionalization regenerates views and writes them back through more ops).")
    tail = ("Where a lazily traced step's time goes (medians of 30 steps after 5, measured "
            "after the main table, in each workload's unit): tracing the step's ops, `sync()` "
            "(graph collection, cache lookup, dispatching the executable; on the CPU client part "
            "of the execution runs inside the call) and `wait_device_ops()` (the rest of the "
            "execution). Before each traced step a null tracer runs the same program "
            "(`floor._NullTracer`: every op through `__torch_dispatch__`, answered from a shape "
            "cache, no IR, no values, eager's ops and torch's choice of optimizer kernels), so "
            "it meets the same conditions: the interpreter's caches as the previous step's "
            "execution left them. Its step is the cost of reaching Python for every op of the "
            "program with autograd, module and optimizer code around it; the last column is "
            "the ratio to the JAX twin (main table) that tracing at that cost, with a free sync "
            "and the twin's own execution, would give.")
    return head + "\n\n" + "\n".join(rows) + "\n\n" + tail + "\n\n" + "\n".join(split)
