"""On a TPU (benchmarks/tpu_run.sh): both paths train a small MLP with SGD momentum for 20 steps
(the benchmarks' own training program); losses and weights against CPU eager, compiles and CPU
fallbacks."""
import time

import jax
import torch

import xla_compat as xc
import xla_compat.functional  # noqa: F401 (registers the path)
import xla_compat.legacy  # noqa: F401
from xla_compat import metrics, paths
from benchmarks.workloads import MLP, _TrainingProgram

jax.config.update("jax_default_matmul_precision", "highest")
print("jax backend:", jax.default_backend(), jax.devices())
torch.manual_seed(0)
model = MLP((64, 128, 10))
batch = torch.randn(32, 64), torch.randint(0, 10, (32,))


def train(device, steps=20):
    program = _TrainingProgram(model, lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9), batch,
                               device)
    losses = []
    for _ in range(steps):
        program.step()
        if device != "cpu":
            xc.sync()
        losses.append(program.loss)
    return torch.stack([loss.cpu() for loss in losses]), program.result()


ref_losses, ref_state = train("cpu")
for name in ["legacy", "functional"]:
    with paths.activated(name):
        metrics.reset()
        start = time.time()
        losses, state = train(xc.device())
        dl = (losses - ref_losses).abs().max().item()
        dp = max((state[k] - ref_state[k]).abs().max().item() for k in ref_state)
        print(f"{name}: loss {losses[0]:.4f} -> {losses[-1]:.4f} (eager {ref_losses[-1]:.4f}), "
              f"max|dloss| {dl:.2e}, max|dparam| {dp:.2e}, "
              f"compiles {metrics.counter('UncachedCompile')}, "
              f"fallbacks {metrics.fallback_ops()}, {time.time() - start:.1f} s")
