"""SPMD over 8 simulated host devices, on both paths: the examples train like one device, XLA adds
the collectives, each device holds only its shard, and layouts survive in-place writes.

jax fixes its device count when its first device is used, so the checks run in a subprocess
(this file, run as a script, which asks for 8 devices with ``xs.simulate_host_devices(8)``) that
reports what it saw as JSON; one subprocess per path, the tests below assert on its report.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STALE_COUNT = "--xla_force_host_platform_device_count=2"


# ----------------------------------------------------------------------------------------------
# The subprocess side (runs with 8 devices).

def _load_example(name: str):
    import importlib.util
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "examples", name + ".py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _max_diff(a, b) -> float:
    return max((x - y).abs().max().item() for x, y in zip(a, b))


def _layout(t) -> dict:
    """How ``t``'s buffer lies on the devices: its partition spec and every shard's shape."""
    import xla_compat.distributed.spmd as xs
    arr = xs.device_array(t)
    return {"spec": [None if p is None else p for p in tuple(arr.sharding.spec)]
            if hasattr(arr.sharding, "spec") else None,
            "devices": len(arr.sharding.device_set),
            "shards": sorted({tuple(s.data.shape) for s in arr.addressable_shards}),
            "n_shards": len(arr.addressable_shards)}


def _train_example(name: str, mesh_shape, axes) -> dict:
    import copy

    import xla_compat as xc
    from xla_compat import executor, metrics
    ex = _load_example(name)
    model, batches = ex.make_model(), ex.make_batches()
    cpu_losses, cpu_w, _ = ex.train(copy.deepcopy(model), batches, device="cpu")
    one_hlo = []
    one_losses, one_w, _ = ex.train(
        copy.deepcopy(model), batches,
        on_step=lambda i: one_hlo.append(executor.compiled_text()) if i == 0 else None)
    one_hlo = one_hlo[0]
    mesh = xc.Mesh(mesh_shape, axes)
    compiles, hlo = [metrics.counter("UncachedCompile")], []

    def on_step(i):
        compiles.append(metrics.counter("UncachedCompile"))
        if i == len(batches) - 1:
            hlo.append(executor.compiled_text())      # the step graph, as XLA compiled it
    losses, w, m = ex.train(copy.deepcopy(model), batches, mesh, on_step=on_step)
    out = {
        "steps": len(losses),
        "loss_vs_one": max(abs(a - b) for a, b in zip(losses, one_losses)),
        "weights_vs_one": _max_diff(w, one_w),
        "loss_vs_cpu": max(abs(a - b) for a, b in zip(losses, cpu_losses)),
        "weights_vs_cpu": _max_diff(w, cpu_w),
        "compiles_per_step": [b - a for a, b in zip(compiles, compiles[1:])],
        "hlo_all_reduce": "all-reduce" in hlo[0],
        "one_device_hlo_all_reduce": "all-reduce" in one_hlo,
        "layouts": {n: _layout(p) for n, p in m.named_parameters()},
    }
    return out


def _survival(path: str) -> dict:
    """A (8, 4) tensor split by rows over 8 devices keeps that layout through each write."""
    import torch

    import xla_compat as xc
    import xla_compat.distributed.spmd as xs
    from xla_compat import metrics
    dev = xc.device()
    mesh = xc.Mesh((8,), ("data",))
    base = torch.arange(32.0).reshape(8, 4)
    ref = base.clone()
    w = base.to(dev)
    xs.mark_sharding(w, mesh, ("data", None))
    res = {"marked": _layout(w)}

    def check(name):
        xc.sync()
        res[name] = dict(_layout(w), values=bool(torch.equal(w.cpu(), ref)),
                         spec_kept=xs.get_sharding(w) is not None)

    w.add_(1)
    ref.add_(1)
    check("add_")
    w.copy_(torch.full((8, 4), 3.0))                    # from the host
    ref.copy_(torch.full((8, 4), 3.0))
    check("copy_host")
    src = torch.linspace(0, 1, 32).reshape(8, 4)
    w.copy_(src.to(dev))                                 # from another device tensor
    ref.copy_(src)
    check("copy_device")
    idx, vals = torch.tensor([0, 5, 7]), torch.tensor([[-1.0, -2.0], [-3.0, -4.0], [-5.0, -6.0]])
    w[:, 1:3].index_put_((idx.to(dev),), vals.to(dev))  # through a view of w
    ref[:, 1:3].index_put_((idx,), vals)
    check("index_put_view")
    w.t().mul_(2)                                        # in place through a transposed view
    ref.t().mul_(2)
    check("mul_transposed_view")
    res["view_read"] = bool(torch.equal(w[2:6, 1].cpu(), ref[2:6, 1]))

    # An optimizer step on a parameter split by columns on a 2-D mesh.
    mesh2 = xc.Mesh((2, 4), ("data", "model"))
    torch.manual_seed(0)
    p_cpu = torch.nn.Parameter(torch.randn(4, 8))
    p = torch.nn.Parameter(p_cpu.detach().to(dev))
    xs.mark_sharding(p, mesh2, (None, "model"))
    opts = [torch.optim.SGD([q], lr=0.1, momentum=0.9) for q in (p_cpu, p)]
    for _ in range(3):
        for q, opt in zip((p_cpu, p), opts):
            opt.zero_grad()
            (q * q).sum().backward()
            opt.step()
        xc.sync()
    res["optimizer"] = dict(_layout(p), values=float((p.detach().cpu() - p_cpu.detach()).abs().max()))

    # The cache key includes shardings: the same graph over another layout compiles anew and
    # still computes the same values.
    x = torch.arange(64.0).reshape(8, 8)
    outs = []
    for spec in (("data", None), (None, "data"), ("data", None)):
        a = x.to(dev)
        xs.mark_sharding(a, mesh, spec)
        before = metrics.counter("UncachedCompile")
        y = (a * 2).sum(0)
        xc.sync()
        outs.append({"compiled": metrics.counter("UncachedCompile") - before,
                     "values": bool(torch.equal(y.cpu(), (x * 2).sum(0)))})
    res["cache"] = outs

    # A marked pending value (an activation) is constrained inside its graph.
    h = x.to(dev) @ x.to(dev)
    xs.mark_sharding(h, mesh2, ("data", "model"))
    res["intermediate"] = dict(_layout(h), values=bool(torch.allclose(h.cpu(), x @ x)))

    # A dimension that does not split evenly is an error that names the sizes.
    try:
        xs.mark_sharding(torch.ones(5, device=dev), mesh, ("data",))
        res["uneven"] = "no error"
    except ValueError as e:
        res["uneven"] = str(e)

    # clear_sharding: the value is replicated again (every device holds all of it).
    xs.clear_sharding(w)
    xc.sync()
    res["cleared"] = dict(_layout(w), values=bool(torch.equal(w.cpu(), ref)),
                          annotation_gone=xs.get_sharding(w) is None)
    return res


def _worker(path: str, out: str) -> None:
    import xla_compat  # noqa: F401  (before the paths: registers the device)
    import xla_compat.distributed.spmd as xs
    from xla_compat import paths
    import importlib
    importlib.import_module(f"xla_compat.{path}")
    xs.simulate_host_devices(8)          # after the imports, before the first device
    import jax
    report = {"devices": len(jax.devices()), "xla_flags": os.environ["XLA_FLAGS"]}
    with paths.activated(path):
        report["dp"] = _train_example("spmd_data_parallel", (8,), ("data",))
        report["2d"] = _train_example("spmd_2d", (2, 4), ("data", "model"))
        report["survival"] = _survival(path)
    with open(out, "w") as f:
        json.dump(report, f)


# ----------------------------------------------------------------------------------------------
# The pytest side.

PATHS = ("legacy", "functional")
_reports: dict = {}


def _run_worker(path: str, out: str) -> None:
    # The worker asks for 8 devices itself (xs.simulate_host_devices); the count given here is
    # replaced and the suite's other flags are kept.
    env = dict(os.environ, XLA_FLAGS=f"{os.environ.get('XLA_FLAGS', '')} {STALE_COUNT}".strip(),
               JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), path, out + ".tmp"],
                          env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)
    if proc.returncode != 0:
        with open(out + ".err", "w") as f:
            f.write(proc.stderr[-4000:])
    else:
        os.replace(out + ".tmp", out)


def _shared_report(path: str, base) -> dict:
    """Run the worker once per path per test session, even under pytest-xdist: the first test
    process to take the lock runs it, the others wait for its report."""
    out = str(base / f"spmd_{path}.json")
    try:
        os.close(os.open(out + ".lock", os.O_CREAT | os.O_EXCL))
        _run_worker(path, out)
    except FileExistsError:
        pass
    deadline = time.time() + 660
    while not os.path.exists(out) and not os.path.exists(out + ".err"):
        if time.time() > deadline:
            pytest.fail(f"timed out waiting for the 8-device worker of the {path} path")
        time.sleep(0.5)
    if os.path.exists(out + ".err"):
        with open(out + ".err") as f:
            pytest.fail(f"8-device worker for the {path} path failed:\n{f.read()}")
    with open(out) as f:
        return json.load(f)


@pytest.fixture(params=PATHS)
def report(request, tmp_path_factory):
    path = request.param
    if path not in _reports:
        # The parent of the base temp dir is shared by the xdist workers of one session.
        base = tmp_path_factory.getbasetemp()
        if os.environ.get("PYTEST_XDIST_WORKER"):
            base = base.parent
        _reports[path] = _shared_report(path, base)
    return _reports[path]


F32 = 1e-5


def test_worker_sees_eight_devices(report):
    assert report["devices"] == 8


def test_simulated_devices_replace_a_given_count_and_keep_the_other_flags(report):
    flags = report["xla_flags"].split()
    assert [f for f in flags if "device_count" in f] == ["--xla_force_host_platform_device_count=8"]
    assert [f for f in flags if "device_count" not in f] == \
        [f for f in os.environ.get("XLA_FLAGS", "").split() if "device_count" not in f]


@pytest.mark.parametrize("example", ["dp", "2d"])
def test_example_trains_ten_steps_like_one_device(report, example):
    r = report[example]
    assert r["steps"] == 10
    assert r["loss_vs_one"] < F32, r
    assert r["weights_vs_one"] < F32, r
    assert r["loss_vs_cpu"] < 1e-4 and r["weights_vs_cpu"] < 1e-4, r


@pytest.mark.parametrize("example", ["dp", "2d"])
def test_no_recompile_per_step_after_warm_up(report, example):
    per_step = report[example]["compiles_per_step"]
    assert sum(per_step[:2]) >= 1                     # the step graph compiles during warm-up
    assert per_step[2:] == [0] * (len(per_step) - 2), per_step


@pytest.mark.parametrize("example", ["dp", "2d"])
def test_compiled_step_all_reduces_gradients(report, example):
    assert report[example]["hlo_all_reduce"]
    assert not report[example]["one_device_hlo_all_reduce"]


def test_data_parallel_parameters_are_replicated(report):
    for name, lay in report["dp"]["layouts"].items():
        assert lay["devices"] == 8 and lay["n_shards"] == 8, name
        assert all(p is None for p in lay["spec"]), (name, lay)


def test_2d_each_device_holds_only_its_shard_of_the_weights(report):
    lay = report["2d"]["layouts"]
    assert lay["fc1.weight"]["shards"] == [[16, 16]] and lay["fc1.weight"]["n_shards"] == 8
    assert lay["fc1.bias"]["shards"] == [[16]]
    assert lay["fc2.weight"]["shards"] == [[8, 16]]
    assert lay["fc2.bias"]["shards"] == [[8]]              # replicated: whole on every device
    assert lay["fc1.weight"]["spec"] == ["model", None]
    assert lay["fc2.weight"]["spec"] == [None, "model"]


def test_marking_device_data_splits_its_buffer(report):
    m = report["survival"]["marked"]
    assert m["spec"] == ["data", None] and m["shards"] == [[1, 4]] and m["n_shards"] == 8


@pytest.mark.parametrize("write", ["add_", "copy_host", "copy_device", "index_put_view",
                                   "mul_transposed_view"])
def test_layout_survives_in_place_writes(report, write):
    r = report["survival"][write]
    assert r["values"], f"{write}: values differ from CPU eager"
    assert r["spec"] == ["data", None] and r["shards"] == [[1, 4]], (write, r)
    assert r["spec_kept"]


def test_views_of_a_sharded_tensor_read_correctly(report):
    assert report["survival"]["view_read"]


def test_layout_survives_optimizer_steps(report):
    r = report["survival"]["optimizer"]
    assert r["spec"] == [None, "model"] and r["shards"] == [[4, 2]], r
    assert r["values"] < F32


def test_cache_key_includes_the_layout(report):
    first, other, again = report["survival"]["cache"]
    assert all(c["values"] for c in (first, other, again))
    assert other["compiled"] == 1        # same graph, another layout: compiled anew
    assert again["compiled"] == 0        # the first layout again: cached


def test_marked_intermediate_value_is_constrained(report):
    r = report["survival"]["intermediate"]
    assert r["values"] and r["spec"] == ["data", "model"] and r["shards"] == [[4, 2]], r


def test_uneven_split_is_an_error(report):
    assert "cannot be split 8 ways" in report["survival"]["uneven"]


def test_clear_sharding_replicates(report):
    r = report["survival"]["cleared"]
    assert r["values"] and r["annotation_gone"], r
    assert r["spec"] == [None, None] and r["shards"] == [[8, 4]] and r["n_shards"] == 8, r


if __name__ == "__main__":
    sys.path.insert(0, ROOT)
    _worker(sys.argv[1], sys.argv[2])
