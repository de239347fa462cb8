"""The benchmark programs cannot rot: every workload, at tiny sizes, runs one warm-up and one timed
step on torch eager, both hlo paths and its JAX twin, and each result matches torch eager."""
from __future__ import annotations

import pytest
import torch

from benchmarks import measure, workloads
from benchmarks.report import detail_table, summary_table


@pytest.mark.parametrize("workload", workloads.TINY, ids=lambda w: w.name)
def test_every_variant_of_the_workload_runs_and_matches_torch_eager(workload):
    results = measure.run_workload(workload, measure.VARIANTS, warmup=1, iters=1,
                                   log=lambda line: None)
    assert [m.variant for m in results] == list(measure.VARIANTS)
    for m in results:
        assert not m.error, f"{workload.name} on {m.variant} failed: {m.error}"
        assert m.check == "ok", f"{workload.name} on {m.variant} differs from eager: {m.check}"
        assert m.median > 0
    lazy = [m for m in results if m.variant in measure.LAZY]
    for m in lazy:
        assert m.graph_nodes and all(n > 0 for n in m.graph_nodes), m
        assert m.hlo_ops and all(n > 0 for n in m.hlo_ops), m
        assert m.fallbacks == (), f"{m.variant} fell back to the CPU: {m.fallbacks}"
    if workload.name in ("W1", "W4"):
        # one graph whatever the step: warm-up compiled it, the timed step only hits the cache
        assert all(m.new_compiles == 0 for m in results), [(m.variant, m.new_compiles)
                                                           for m in results]
    if workload.name == "W4":
        assert all(m.donated_per_step >= 1 for m in lazy), "the KV cache buffer is not donated"
    table = summary_table(results, [workload])
    assert table.count(f"| {workload.name}:") == 1 and "FAILED" not in table


def test_a_result_that_differs_from_eager_is_reported_not_passed():
    expected = {"loss": torch.tensor(1.0), "w": torch.zeros(3)}
    worst, check = measure._compare({"loss": torch.tensor(1.0), "w": torch.tensor([0, 0, 1e-3])},
                                    expected, rtol=1e-5, atol=1e-5)
    assert worst == pytest.approx(1e-3) and check.startswith("w: max abs err")
    _, check = measure._compare({"loss": torch.tensor(1.0)}, expected, rtol=1e-5, atol=1e-5)
    assert "w: got None" in check


def test_a_failing_variant_is_recorded_with_its_error_line():
    class Broken(workloads.ElementwiseChain):
        def torch_program(self, device):
            raise RuntimeError("no lowering for aten.frobnicate\nsecond line")

    m, result = measure.run_variant(Broken(ops=2, shape=(2,)), "legacy", 1, 1)
    assert result is None and m.error == "RuntimeError: no lowering for aten.frobnicate"
    assert "`RuntimeError: no lowering for aten.frobnicate`" in detail_table([m])


def test_hlo_ops_are_counted_by_name():
    hlo = """
    func.func public @main(%arg0: tensor<4xf32>) -> (tensor<4xf32>) {
      %0 = stablehlo.constant dense<1.0> : tensor<f32>
      %1 = stablehlo.transpose %arg0, dims = [0] : (tensor<4xf32>) -> tensor<4xf32>
      %2 = "stablehlo.scatter"(%1, %0, %0) ({
        stablehlo.return %0 : tensor<f32>
      }) : (tensor<4xf32>) -> tensor<4xf32>
      %3 = call @relu(%2) : (tensor<4xf32>) -> tensor<4xf32>
      return %3 : tensor<4xf32>
    }"""
    assert measure.count_ops(hlo) == {"stablehlo.constant": 1, "stablehlo.transpose": 1,
                                      "stablehlo.scatter": 1, "call": 1}
