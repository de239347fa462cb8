"""Function-level dual run: training steps agree on both paths, planted bugs and shadow failures
are caught and recorded, the authoritative result is exactly what a plain run gives."""
from __future__ import annotations

import contextlib
import copy
import json

import pytest
import torch
import torch.nn.functional as F

import xla_compat as xc
from xla_compat import metrics, settings
from xla_compat.dualrun import last_result, modes
from xla_compat.lowering import registry
from tests.conftest import assert_same
from tests.models import GPT, MLP

aten = torch.ops.aten
STEPS = 20


@contextlib.contextmanager
def planted_select_scatter_bug():
    """Perturb the select_scatter lowering. Only the functional path lowers select_scatter (the
    legacy path writes through a selected view with its own Select.write_back), so exactly one
    path computes wrong values."""
    good = registry.lookup(aten.select_scatter.default)

    def select_scatter_off_by_one(x, src, dim, index):
        return good.fn(x, src + 1.0, dim, index)

    undo = registry.override(aten.select_scatter.default, select_scatter_off_by_one)
    try:
        yield
    finally:
        undo()


def write_through_row(x):
    x[1].mul_(2)          # a write through a selected view: select_scatter on the functional path
    return x.sum(0)


def _mlp():
    torch.manual_seed(0)
    return (MLP(), (torch.randn(24, 16), torch.randint(0, 4, (24,))),
            lambda m: torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9),
            lambda m, x, y: F.cross_entropy(m(x), y))


def _gpt():
    torch.manual_seed(0)
    idx = torch.randint(0, 64, (2, 8))
    return (GPT(d=16, heads=2, layers=1, seq=8), (idx, torch.roll(idx, -1, dims=1)),
            lambda m: torch.optim.AdamW(m.parameters(), lr=3e-3, weight_decay=0.1),
            lambda m, x, y: m(x, y)[1])


def _train(model, data, make_opt, loss_fn, dev, dual: bool):
    model = model.to(dev)
    opt = make_opt(model)
    x, y = (t.to(dev) for t in data)

    def step(model, opt, x, y):
        opt.zero_grad()
        loss = loss_fn(model, x, y)
        loss.backward()
        opt.step()
        xc.sync()
        return loss.detach()

    losses, results = [], []
    for _ in range(STEPS):
        if dual:
            r = xc.dual_run(step, model, opt, x, y)
            results.append(r)
            loss = r.value
        else:
            loss = step(model, opt, x, y)
        losses.append(loss.cpu())
    return model, losses, results


# One authoritative path per model keeps the suite fast; between them both directions are covered.
@pytest.mark.parametrize("setup,path_name", [(_mlp, "legacy"), (_gpt, "functional")],
                         ids=["mlp-legacy-authoritative", "gpt-functional-authoritative"])
def test_training_step_dual_runs_20_steps_matching_and_bit_identical_to_a_plain_run(
        dev, setup, path_name):
    with xc.use_path(path_name):
        _check_training(dev, setup, path_name)


def _check_training(dev, setup, path):
    model, data, make_opt, loss_fn = setup()
    twin = copy.deepcopy(model)
    plain_model, plain_losses, _ = _train(model, data, make_opt, loss_fn, dev, dual=False)
    dual_model, dual_losses, results = _train(twin, data, make_opt, loss_fn, dev, dual=True)

    assert len(results) == STEPS
    for i, r in enumerate(results):
        assert r.match, f"step {i}: {[str(m) for m in r.mismatches]}"
        assert r.authoritative == path and r.shadow != path
        assert set(r.wall_s) == set(r.graph_nodes) == {"legacy", "functional"}
        assert all(n > 0 for n in r.graph_nodes.values())
    # The authoritative results are exactly (bit for bit) those of running without dual-run.
    for i, (a, b) in enumerate(zip(dual_losses, plain_losses)):
        assert torch.equal(a, b), f"loss at step {i}: {a} != {b}"
    for (name, p), q in zip(dual_model.state_dict().items(), plain_model.state_dict().values()):
        assert torch.equal(p.cpu(), q.cpu()), name
    assert metrics.counter("DualRunMatch") == STEPS and metrics.counter("DualRunMismatch") == 0


def test_dual_run_compares_mutated_inputs_and_aliasing(path, dev):
    x = torch.arange(12.0).reshape(3, 4).to(dev)
    r = xc.dual_run(lambda t: t[1], x)                 # returns a view of its input
    assert r.match, [str(m) for m in r.mismatches]
    assert_same(r.value, torch.arange(12.0).reshape(3, 4)[1])

    def bump(t, k):
        t.add_(k)
        return t.sum()

    r = xc.dual_run(bump, x, 1)
    assert r.match
    assert_same(x, torch.arange(12.0).reshape(3, 4) + 1)   # the authoritative input was mutated


def test_planted_bug_on_one_path_is_caught_at_function_level(path, dev):
    base = torch.arange(12.0).reshape(3, 4)
    expected_x = base.clone()
    expected_out = write_through_row(expected_x)
    with planted_select_scatter_bug():
        # The plant perturbs one path only: legacy still matches CPU eager, functional does not.
        for name, ok in (("legacy", True), ("functional", False)):
            with xc.use_path(name):
                x = base.to(dev)
                out = write_through_row(x)
                xc.sync()
                assert torch.equal(x.cpu(), expected_x) is ok, name
        x = base.to(dev)
        r = xc.dual_run(write_through_row, x)
    assert not r.match
    names = {m.name for m in r.mismatches}
    assert "output" in names and "input args[0]" in names, names
    worst = next(m for m in r.mismatches if m.name == "input args[0]")
    assert worst.max_abs_err == 1.0 and worst.worst_index[0] == 1   # row 1 is off by one
    # Whichever path is authoritative, the caller gets its values unchanged.
    good = path == "legacy"
    assert torch.equal(r.value.cpu(), expected_out) is good
    assert torch.equal(x.cpu(), expected_x) is good
    assert r.first_divergence["level"] == "function"
    assert metrics.counter("DualRunMismatch") == 1


def test_shadow_exception_is_recorded_and_caller_gets_the_authoritative_result(dev, tmp_path):
    def failing_select_scatter(x, src, dim, index):
        raise RuntimeError("planted: select_scatter is broken")

    report = tmp_path / "dual.jsonl"
    base = torch.arange(12.0).reshape(3, 4)
    expected_x = base.clone()
    expected = write_through_row(expected_x)
    undo = registry.override(aten.select_scatter.default, failing_select_scatter)
    try:
        with xc.use_path("legacy"), settings.override(dual_run_report=str(report)):
            x = base.to(dev)
            r = xc.dual_run(write_through_row, x)        # shadow (functional) fails at its sync
    finally:
        undo()
    assert r.authoritative == "legacy" and r.shadow == "functional"
    assert torch.equal(r.value.cpu(), expected) and torch.equal(x.cpu(), expected_x)
    assert not r.match and r.authoritative_exception is None
    assert "planted: select_scatter is broken" in r.shadow_exception
    assert r.mismatches[0].kind == "exception"
    line = json.loads(report.read_text().splitlines()[-1])
    assert line["match"] is False and "planted" in line["shadow_exception"]
    assert line["decision"]["path"] == xc.explain().path


def test_authoritative_exception_is_reraised_and_same_exception_on_both_paths_matches(path, dev):
    x = torch.ones(3).to(dev)

    def bad_shape(t):
        return t + torch.ones(4, device=t.device)

    with pytest.raises(RuntimeError, match="broadcast") as raised:
        xc.dual_run(bad_shape, x)
    assert "raised by aten.add.Tensor" in str(raised.value)
    r = last_result()
    assert r.match and r.authoritative_exception.startswith("RuntimeError")
    assert r.shadow_exception == r.authoritative_exception


def test_strict_mode_raises_mismatch_error(dev):
    @xc.dual_run_step(mode="strict")
    def step(x):
        return write_through_row(x)

    with planted_select_scatter_bug(), xc.use_path("legacy"):
        with pytest.raises(xc.MismatchError, match="input args\\[0\\]"):
            step(torch.arange(12.0).reshape(3, 4).to(dev))


def test_device_rng_is_identical_on_both_paths_and_continues_as_without_dual_run(path, dev):
    def noisy(x):
        return x + torch.rand(8, device=x.device)

    x = torch.zeros(8).to(dev)
    xc.manual_seed(7)
    plain = [noisy(x).cpu() for _ in range(2)]
    xc.manual_seed(7)
    results = [xc.dual_run(noisy, x) for _ in range(2)]
    assert all(r.match for r in results)               # the shadow drew the same numbers
    for r, p in zip(results, plain):
        assert torch.equal(r.value.cpu(), p)           # and the program's stream is unchanged


def test_sampling_a_tenth_of_steps_is_deterministic(dev):
    modes.steps.reset()

    @xc.dual_run_step(mode="sample", rate=0.1, name="tenth")
    def step(x):
        return x * 2 + 1

    x = torch.ones(4).to(dev)

    def run():
        modes.steps.reset()
        checked = []
        for i in range(120):
            before = metrics.counter("DualRunMatch")
            out = step(x)
            if metrics.counter("DualRunMatch") > before:
                checked.append(i)
        assert torch.equal(out.cpu(), torch.full((4,), 3.0))
        return checked

    first, second = run(), run()
    assert first == second                                  # the same steps on a rerun
    assert 4 <= len(first) <= 24, first                     # about a tenth of 120
    assert first == [i for i in range(120) if modes.sampled("tenth", i, 0.1)]
    assert metrics.counter("DualRunSkipped") == 2 * (120 - len(first))
    hits = sum(modes.sampled("tenth", i, 0.1) for i in range(20000))
    assert 1800 <= hits <= 2200


def test_off_mode_runs_the_step_once(dev):
    calls = []

    @xc.dual_run_step(mode="off")
    def step(x):
        calls.append(xc.path())
        return x + 1

    step(torch.zeros(2).to(dev))
    assert len(calls) == 1 and metrics.counter("DualRunMatch") == 0
