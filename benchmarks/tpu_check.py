"""On a TPU (benchmarks/tpu_run.sh): both paths train a small MLP with SGD momentum for 20 steps;
losses and weights against CPU eager, compiles and CPU fallbacks."""
import copy, time
import jax
import torch, torch.nn as nn
import xla_compat as xc
import xla_compat.legacy, xla_compat.functional  # noqa
from xla_compat import paths, metrics
jax.config.update("jax_default_matmul_precision", "highest")
print("jax backend:", jax.default_backend(), jax.devices())
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))

def train(m, dev, steps=20):
    m = copy.deepcopy(m).to(dev)
    opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
    xd, yd = x.to(dev), y.to(dev)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(m(xd), yd)
        loss.backward()
        opt.step()
        if dev != "cpu":
            xc.sync()
        losses.append(loss.detach())
    return torch.stack([l.cpu() for l in losses]), [p.detach().cpu() for p in m.parameters()]

ref_l, ref_p = train(model, "cpu")
for p in ["legacy", "functional"]:
    with paths.activated(p):
        metrics.reset()
        t = time.time()
        l, ps = train(model, xc.device())
        dl = (l - ref_l).abs().max().item()
        dp = max((a - b).abs().max().item() for a, b in zip(ps, ref_p))
        print(f"{p}: loss {l[0]:.4f} -> {l[-1]:.4f} (eager {ref_l[-1]:.4f}), max|dloss| {dl:.2e}, "
              f"max|dparam| {dp:.2e}, compiles {metrics.counter('UncachedCompile')}, "
              f"fallbacks {metrics.fallback_ops()}, {time.time() - t:.1f} s")
