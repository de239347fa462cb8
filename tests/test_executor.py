"""The executor: compile cache, runtime scalars, RNG state, HLO text, fallback, failure safety."""
from __future__ import annotations

import pytest
import torch

import xla_compat as xc
from xla_compat import executor, metrics, settings
from xla_compat.lowering import registry
from tests.conftest import assert_same

aten = torch.ops.aten


def _step(w, x, lr):
    y = (x @ w).relu().sum()
    w.sub_(x.t() @ torch.ones(x.shape[0], w.shape[1], device=w.device) * lr)
    return y


def test_identical_steps_compile_once_then_hit_the_cache(path, dev):
    w = torch.randn(4, 3, device=dev)
    x = torch.randn(5, 4, device=dev)
    xc.sync()
    compiles = []
    for i in range(4):
        _step(w, x, 0.1)
        xc.sync()
        compiles.append((metrics.counter("CompileTime"), metrics.counter("CachedCompile")))
    # Step 1 compiles; later steps hit: CompileTime constant, CachedCompile +1 per step.
    assert compiles[1][0] == compiles[2][0] == compiles[3][0]
    assert compiles[2][1] == compiles[1][1] + 1 and compiles[3][1] == compiles[2][1] + 1


def test_changing_python_scalars_do_not_recompile(path, dev):
    x = torch.ones(8, device=dev)
    ref = torch.ones(8)
    xc.sync()
    for i, lr in enumerate([0.1, 0.2, 0.35, 1e-3]):
        x.mul_(1 + lr).add_(lr, alpha=-2)
        ref.mul_(1 + lr).add_(lr, alpha=-2)
        xc.sync()
        if i == 0:
            first = metrics.counter("CompileTime")
    assert metrics.counter("CompileTime") == first
    assert_same(x, ref)


def test_dropout_masks_differ_between_steps_and_repeat_under_manual_seed(path, dev):
    def masks():
        x = torch.ones(256, device=dev)
        out = []
        for _ in range(3):
            out.append(torch.nn.functional.dropout(x, 0.5, training=True).cpu())
            xc.sync()
        return out

    xc.manual_seed(7)
    a = masks()
    xc.manual_seed(7)
    b = masks()
    assert not torch.equal(a[0], a[1]) and not torch.equal(a[1], a[2])
    for m1, m2 in zip(a, b):
        assert torch.equal(m1, m2)
    assert set(a[0].unique().tolist()) <= {0.0, 2.0}
    assert 60 < int((a[0] == 0).sum()) < 196


def test_draws_read_back_without_a_step_compile_once(path, dev):
    """A partial sync (``.cpu()``) materialises the drawn key too: left pending, each graph took
    every earlier draw's key chain as input, grew, and compiled anew at every draw."""
    q = torch.randn(8, 2, 5, 4).to(dev)
    compiles = []
    for _ in range(4):
        torch.nn.functional.scaled_dot_product_attention(q, q, q, dropout_p=0.5).cpu()
        torch.rand(3, 4, device=dev).sum().item()
        compiles.append(metrics.counter("CompileTime"))
    assert compiles[1] == compiles[2] == compiles[3], compiles
    xc.manual_seed(5)
    a = [torch.rand(6, device=dev).cpu() for _ in range(2)]
    xc.manual_seed(5)
    b = [torch.rand(6, device=dev) for _ in range(2)]
    xc.sync()
    assert not torch.equal(a[0], a[1])
    assert all(torch.equal(x, y.cpu()) for x, y in zip(a, b))   # one stream either way


def test_the_same_computation_has_one_key_whatever_order_its_nodes_were_made_in(path, dev):
    x, y = torch.randn(4, 4).to(dev), torch.randn(4, 4).to(dev)
    ref = (x.cpu() * 2).exp() + (y.cpu() * 3).tanh()
    (x * 2).exp().sum().cpu()                          # warm every op's trace plan
    outs = []
    for first_x in (True, False, True, False):
        if first_x:
            a = (x * 2).exp()
            b = (y * 3).tanh()
        else:
            b = (y * 3).tanh()
            a = (x * 2).exp()
        outs.append((a + b).cpu())
        if len(outs) == 1:
            compiled = metrics.counter("CompileTime")
    assert metrics.counter("CompileTime") == compiled
    assert all(torch.allclose(o, ref) for o in outs)


def test_a_draw_of_any_rank_is_one_flat_draw_with_the_same_numbers(path, dev):
    """jax's threefry compiles in time growing with the rank on XLA:CPU, so draws are made flat
    and reshaped: the counters are one flat iota, and the numbers are jax's for that shape."""
    import re
    import jax
    import numpy as np
    xc.manual_seed(11)
    r = torch.rand(4, 3, 5, 2, device=dev)
    iotas = re.findall(r"stablehlo.iota dim = \d+ : tensor<([0-9x]+)x\w+>", xc.hlo_text([r]))
    assert "120" in iotas and not any("x" in shape for shape in iotas), iotas
    _, sub = jax.random.split(jax.random.wrap_key_data(np.array([0, 11], np.uint32)))
    want = np.asarray(jax.random.uniform(sub, (4, 3, 5, 2), np.float32))
    assert np.array_equal(r.cpu().numpy(), want)


def test_torch_manual_seed_also_seeds_the_device(path, dev):
    torch.manual_seed(3)
    a = torch.rand(16, device=dev).cpu()
    torch.manual_seed(3)
    b = torch.rand(16, device=dev).cpu()
    assert torch.equal(a, b)


def test_hlo_text_of_a_matmul_has_a_dot_general(path, dev):
    a = torch.randn(4, 5, device=dev)
    b = torch.randn(5, 6, device=dev)
    text = xc.hlo_text([a @ b])
    assert "dot_general" in text and "stablehlo" in text


def test_op_without_lowering_falls_back_to_cpu_and_is_counted(path, dev):
    undo = _hide_rule(aten.atan2.default)
    try:
        with settings.override(cpu_fallback="silent"):
            a, b = torch.randn(5), torch.randn(5)
            out = torch.atan2(a.to(dev), b.to(dev))
            assert_same(out, torch.atan2(a, b))
        assert metrics.counter("aten::atan2") == 1
        assert "aten::atan2" in metrics.report()
    finally:
        undo()


def test_fallback_warns_once_with_the_documented_message(path, dev):
    from xla_compat.lazy import tracer
    undo = _hide_rule(aten.atan2.default)
    tracer._warned.discard(aten.atan2.default)
    try:
        a = torch.randn(3, device=dev)
        with pytest.warns(UserWarning, match=r"no lowering for aten.atan2.default .*"
                                             r"counted as aten::atan2"):
            torch.atan2(a, a)
    finally:
        undo()


def test_fallback_error_mode_raises_naming_op_shapes_and_dtypes(path, dev):
    undo = _hide_rule(aten.atan2.default)
    try:
        a = torch.randn(1024, device=dev)
        with settings.override(cpu_fallback="error"):
            with pytest.raises(xc.UnsupportedOpError) as err:
                torch.atan2(a, a).cpu()
        text = str(err.value)
        assert "aten.atan2.default" in text and "float32[1024]" in text
        assert "XLA_CPU_FALLBACK=error" in text and f"{path} path" in text
    finally:
        undo()


def _hide_rule(op):
    """Remove one rule for a test (and any decomposition route stays as PyTorch has it)."""
    before = registry._RULES.pop(op)

    def undo():
        registry._RULES[op] = before
    return undo


def test_failed_lowering_leaves_every_tensor_with_its_old_value(path, dev):
    w = torch.arange(6.0, device=dev)
    xc.sync()

    def broken(x, *a, **k):
        raise ValueError("planted")

    undo = registry.override(aten.sin.default, broken)
    try:
        w.add_(1)
        fresh = torch.sin(w)
        with pytest.raises(xc.LoweringError) as err:
            xc.sync()
        assert "aten.sin.default" in str(err.value) and "planted" in str(err.value)
        assert "test_executor.py" in str(err.value)  # the Python line that created the op
    finally:
        undo()
    assert_same(w, torch.arange(6.0))       # rolled back to its last materialised value
    with pytest.raises(RuntimeError, match="sync failed"):
        fresh.cpu()                           # no earlier value: a clear error, not garbage
    w * w                                     # a trace plan for mul of this geometry...
    with pytest.raises(RuntimeError, match="sync failed"):
        fresh * fresh                         # ...replayed on the lost value: the same error
    w.mul_(2)                                 # and the next step works
    xc.sync()
    assert_same(w, torch.arange(6.0) * 2)
    assert metrics.counter("FailedSync") == 1


def test_interrupt_during_execution_rolls_back(path, dev):
    w = torch.ones(4, device=dev)
    xc.sync()

    def interrupt(graph):
        raise KeyboardInterrupt

    executor._fault_hooks.append(interrupt)
    try:
        w.add_(5)
        with pytest.raises(KeyboardInterrupt):
            xc.sync()
    finally:
        executor._fault_hooks.remove(interrupt)
    assert_same(w, torch.ones(4))
    w.add_(1)
    xc.sync()
    assert_same(w, torch.ones(4) * 2)


def test_graph_dump_holds_ir_and_stablehlo(path, dev, tmp_path):
    dump = tmp_path / "graphs.txt"
    with settings.override(dump_path=str(dump)):
        x = torch.randn(3, 3, device=dev)
        (x @ x + 1).cpu()
    text = dump.read_text()
    assert "aten.mm.default" in text and "## StableHLO" in text and "dot_general" in text


def test_compile_cache_is_bounded_lru_and_counts_evictions(path, dev):
    executor.clear_cache()
    with settings.override(compile_cache_size=2):
        for n in range(2, 6):
            (torch.ones(n, device=dev) * 3).cpu()
        assert len(executor.cache) == 2
        assert metrics.counter("CompileCacheEviction") >= 2



def _compiles() -> tuple:
    return (metrics.counter("CompileTime"), metrics.counter("UncachedCompile"),
            metrics.counter("CompileSameModuleReused"))


def test_graphs_of_one_program_compile_once(path, dev):
    # t, transpose and permute are three graph keys on the functional path (t_copy,
    # transpose_copy, permute_copy nodes) and one program: it compiles once, and the other keys
    # share its executable. (Legacy makes the three one view chain: one key, cache hits.)
    executor.clear_cache()
    x = torch.arange(6.0).reshape(2, 3)
    d = x.to(dev)
    xc.sync()
    before = _compiles()
    outs = [(f(d) + 1).cpu() for f in (lambda t: t.t(), lambda t: t.transpose(0, 1),
                                        lambda t: t.permute(1, 0))]
    compiled, missed, reused = (a - b for a, b in zip(_compiles(), before))
    assert compiled == 1 and missed - reused == 1, (compiled, missed, reused)
    for out in outs:
        assert torch.equal(out, x.t() + 1)


def test_a_cleared_cache_forgets_the_programs_it_held(path, dev):
    executor.clear_cache()
    d = torch.arange(6.0).reshape(2, 3).to(dev)
    xc.sync()
    (d.t() + 1).cpu()
    executor.clear_cache()
    before = _compiles()
    (d.transpose(0, 1) + 1).cpu()
    assert [a - b for a, b in zip(_compiles(), before)] == [1, 1, 0]


def test_an_evicted_entry_takes_its_program_out_of_the_index(path, dev):
    executor.clear_cache()
    d = torch.arange(6.0).reshape(2, 3).to(dev)
    xc.sync()
    with settings.override(compile_cache_size=1):
        (d.t() + 1).cpu()
        (d * 5).cpu()                 # evicts the first graph
        assert len(executor.cache._by_module) == 1
        before = _compiles()
        (d.transpose(0, 1) + 1).cpu()
        assert [a - b for a, b in zip(_compiles(), before)][0] == 1


def test_donation_is_part_of_the_program_a_graph_key_shares():
    import jax
    import jax.numpy as jnp
    a = jnp.ones(4)

    def f(x, y):
        return x + y
    plain = executor._module_digest(jax.jit(f).lower(a, a))
    donated = executor._module_digest(jax.jit(f, donate_argnums=(0,)).lower(a, a))
    assert plain != donated
    assert plain == executor._module_digest(jax.jit(f).lower(a, a))


def test_a_program_with_an_argument_it_does_not_use_is_never_shared():
    # jax drops an unused argument from the module and remembers which it dropped outside the
    # text: two graphs whose modules read the same but dropped different arguments would swap
    # inputs (a matmul gradient read the wrong operand before this was checked).
    import jax
    import jax.numpy as jnp
    a = jnp.ones(4)
    assert executor._module_digest(jax.jit(lambda x, y: x * 2).lower(a, a)) is None
    assert executor._module_digest(jax.jit(lambda x, y: y * 2).lower(a, a)) is None
    assert executor._module_digest(jax.jit(lambda x: x * 2).lower(a)) is not None

def test_metrics_report_has_the_torch_xla_sections(path, dev):
    executor.clear_cache()  # an earlier test may have compiled this very graph
    x = torch.randn(4).to(dev)
    (x * 2).cpu()
    xc.sync()
    report = xc.metrics.report()
    for name in ("Metric: CompileTime", "Metric: ExecuteTime", "Counter: MarkStep",
                 "TransferToDevice", "TransferFromDevice", "IrNodes"):
        assert name in report, name
    c = xc.metrics.counters()
    assert c["CompileTime"] >= 1 and c["ExecuteTime"] >= 1 and c["MarkStep"] == 1


def test_sync_donates_overwritten_buffers(path, dev):
    w = torch.randn(64, device=dev)
    xc.sync()
    for _ in range(3):
        w.mul_(0.5)
        xc.sync()
    assert metrics.counter("InputOutputAliasCount") >= 3


def test_metrics_file_is_written_at_exit(tmp_path):
    import subprocess
    import sys
    out = tmp_path / "metrics.txt"
    code = ("import torch, xla_compat as xc\n"
            "x = torch.ones(3, device=xc.device()) * 2\n"
            "xc.sync()\n")
    env = {**__import__("os").environ, "XLA_METRICS_FILE": str(out)}
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=300)
    text = out.read_text()
    assert "Metric: CompileTime" in text and "Counter: MarkStep" in text


def test_wait_device_ops_waits_for_every_output_even_ones_only_a_path_holds(path, dev, monkeypatch):
    seen = []
    note = executor._note_dispatched
    monkeypatch.setattr(executor, "_note_dispatched", lambda outs: (seen.extend(outs), note(outs)))
    x = torch.randn(256, 256, device=dev)
    xc.sync()
    for _ in range(3):
        x[0].add_(1.0)          # a write through a view: legacy keeps the base in its alias
        x.mul_(0.5)
        xc.sync()
    xc.wait_device_ops()
    assert seen and all(a.is_deleted() or a.is_ready() for a in seen)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool, torch.bfloat16])
def test_a_syncs_output_leaves_are_what_the_arrays_say(path, dev, dtype):
    """A sync makes each output's leaf from the value's aval (``ir.output_leaf``) rather than
    reading the array: the leaf must be indistinguishable from one made by reading it (shape,
    dtype, placement, signature), whatever the dtype, or later graphs would key differently."""
    from xla_compat import paths
    from xla_compat.lazy import ir
    x = torch.arange(12).reshape(3, 4).to(dtype).to(dev)
    y = ((x + x) if dtype is not torch.bool else (x | x)).t().contiguous()
    z = y.sum(0, keepdim=True) if dtype is not torch.bool else y.any(0, keepdim=True)
    xc.sync()
    for t in (y, z):
        node = paths.inner_tensor(t)._value.node
        assert type(node) is ir.DeviceData
        read = ir.DeviceData(node.array)
        assert node.avals == read.avals and node.placement is read.placement is None
        assert node.sig_id() == read.sig_id()
    executor.CHECK_OUTPUTS = False       # the test suite's check, off: the leaves alone
    try:
        w = (y * 2).cpu() if dtype is not torch.bool else (~y).cpu()
    finally:
        executor.CHECK_OUTPUTS = True
    ref = torch.arange(12).reshape(3, 4).to(dtype)
    ref = ((ref + ref) if dtype is not torch.bool else (ref | ref)).t()
    assert_same(w, ref * 2 if dtype is not torch.bool else ~ref)


@pytest.mark.parametrize("optimizer", ["sgd-momentum", "adamw"])
def test_each_donated_buffer_goes_to_its_own_tensors_new_value(path, dev, monkeypatch, optimizer):
    """jax pairs the k-th donated input of a shape with the k-th output of that shape. A weight's
    buffer paired with its gradient makes XLA copy the weight (it is still read after the
    gradient is written); so every donated buffer must meet the new value of the tensor that
    held it, optimizer state included (on the functional path upstream makes those wrappers,
    which no boundary of ours sees)."""
    from xla_compat import paths
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.ReLU(),
                                torch.nn.Linear(6, 6)).to(dev)
    opt = (torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
           if optimizer == "sgd-momentum" else torch.optim.AdamW(model.parameters(), lr=0.01))
    x = torch.randn(4, 6).to(dev)

    def named_tensors():
        out = {}
        for i, p in enumerate(model.parameters()):
            out[f"param{i}"] = p
            for k, v in opt.state.get(p, {}).items():
                if isinstance(v, torch.Tensor) and v.device.type == dev.type and v.dim():
                    out[f"{k}{i}"] = v
        return out

    graphs = []
    collect = executor.collect
    monkeypatch.setattr(executor, "collect",
                        lambda *a, **k: graphs.append(collect(*a, **k)) or graphs[-1])
    checked = 0
    for step in range(4):
        xc.sync()
        held = {id(paths.inner_tensor(t)._value.node): name for name, t in named_tensors().items()}
        opt.zero_grad()
        model(x).square().sum().backward()
        opt.step()
        new = {paths.inner_tensor(t)._value: name for name, t in named_tensors().items()}
        graphs.clear()
        xc.sync()
        (graph,) = graphs
        outputs_of: dict = {}
        for v in graph.roots:
            outputs_of.setdefault(v.aval, []).append(v)
        taken: dict = {}
        for i in graph.donate:
            leaf = graph.leaves[i]
            k = taken[leaf.avals[0]] = taken.get(leaf.avals[0], -1) + 1
            if id(leaf) in held:
                paired = outputs_of[leaf.avals[0]][k]
                assert new.get(paired) == held[id(leaf)], (step, held[id(leaf)], new.get(paired))
                checked += 1
    assert checked >= 8, checked


def test_nested_recordings_each_keep_their_own_list(path, dev):
    """A recording inside another (an ``xc.compile`` step recorded under a test's or a tool's
    recording) sees the same syncs, so the two lists compare equal; leaving the inner block
    must stop the inner list, not the outer one."""
    w = torch.randn(4, 3, device=dev)
    xc.sync()
    outer, inner = [], []
    with executor.recording(outer):
        with executor.recording(inner):
            w.add_(1)
            xc.sync()
        assert inner == outer and len(outer) == 1
        w.add_(1)
        xc.sync()
    assert len(outer) == 2 and len(inner) == 1


def test_dispatched_outputs_are_compacted_once_the_list_doubles(monkeypatch):
    """A job that never calls wait_device_ops keeps every dispatched output listed; when they
    are all alive (its state), dropping dead references on every sync would cost the whole
    list per sync. The list is compacted again only once it has doubled."""
    class Out:
        pass
    monkeypatch.setattr(executor, "_dispatched", [])
    monkeypatch.setattr(executor, "_compact_at", 4096)
    alive = [Out() for _ in range(5000)]
    executor._note_dispatched(alive)              # over 4096: compacted, all alive
    assert len(executor._dispatched) == 5000 and executor._compact_at == 10000
    for k in range(100):                           # 100 syncs of 40 live outputs: no walk
        more = [Out() for _ in range(40)]
        alive += more
        executor._note_dispatched(more)
    assert len(executor._dispatched) == 9000 and executor._compact_at == 10000
    del alive[:6000]                               # dead ones go at the next compaction
    executor._note_dispatched([Out() for _ in range(1001)])   # (alive during the call)
    assert len(executor._dispatched) == 4001 and executor._compact_at == 8002


def test_a_per_sync_walk_runs_once_in_a_sync_and_every_time_outside(path, dev):
    """``executor.per_sync``: the legacy path's hooks walk its live tensors through it (five
    walks a sync became one); outside a sync, and in the next sync, it computes afresh."""
    calls = []

    @executor.per_sync
    def walk():
        calls.append(1)
        return [len(calls)]

    seen = []

    def roots():
        seen.append((walk(), walk()))
        return []
    w = torch.randn(3, device=dev)
    xc.sync()
    with executor.extra_roots(roots):
        for _ in range(2):
            w.add_(1)
            xc.sync()
    assert [a is b for a, b in seen] == [True, True] and seen[0][0] != seen[1][0]
    n = len(calls)
    walk(), walk()
    assert len(calls) == n + 2


def _empty_and_full(d):
    x = torch.arange(6.0, device=d).reshape(2, 3)
    e = torch.ones(0, 3, device=d, dtype=torch.bfloat16)
    outs = [(e * 2).t()[1:], e.sum(0), x[:, 3:] + 1, torch.cat([e.float(), x]), x.new_zeros(4, 0)]
    e.add_(1)
    return outs + [e, x * 2]


def test_results_holding_no_element_are_not_compiled(path, dev):
    """A sync gives zero-size results their empty arrays without compiling them: a graph of
    empty results compiles nothing, and a mixed one compiles only the rest."""
    xc.sync()
    metrics.reset()
    outs = _empty_and_full(dev)
    empties = [t for t in outs if t.numel() == 0]
    xc.sync(empties)
    assert metrics.counter("UncachedCompile") == 0
    assert metrics.counter("EmptyOutputsNotCompiled") >= 1
    assert_same(outs, _empty_and_full("cpu"))          # (the rest: one graph)
    assert metrics.counter("UncachedCompile") == 1


def test_a_captured_step_with_empty_results_replays_them(path, dev):
    """Capture records the graph a step ran: its empty results stay in it, so every replay
    gives them too."""
    w = torch.ones(3, device=dev)

    @xc.compile
    def step(w):
        w.mul_(2)
        return w[3:], w.sum()

    for _ in range(3):
        empty, total = step(w)
        xc.sync()
        assert empty.shape == (0,) and empty.cpu().shape == (0,)
    assert_same(total, torch.tensor(24.0))
