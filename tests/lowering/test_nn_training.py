"""A small CNN trains on hlo exactly as on the CPU: same loss every step, same final weights."""
from __future__ import annotations

import copy

import torch
import torch.nn as nn
import torch.nn.functional as F

import xla_compat as xc
from xla_compat import metrics, paths, settings
from tests.conftest import tolerance


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 16, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(16)
        self.fc = nn.Linear(16 * 2 * 2, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)
        return self.fc(torch.flatten(x, 1))


def _train(model, x, y, device, steps=10):
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    x, y = x.to(device), y.to(device)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        if device != "cpu":
            xc.sync()
        losses.append(loss.item())
    return losses


def test_small_cnn_trains_like_cpu_eager():
    torch.manual_seed(0)
    cpu_model = SmallCNN()
    x, y = torch.randn(8, 3, 8, 8), torch.randint(0, 10, (8,))
    metrics.reset()
    with paths.activated("core"), settings.override(cpu_fallback="error"):
        dev = xc.device()
        dev_model = copy.deepcopy(cpu_model).to(dev)
        dev_losses = _train(dev_model, x, y, dev)
        dev_state = {k: v.cpu() for k, v in dev_model.state_dict().items()}
    cpu_losses = _train(cpu_model, x, y, "cpu")
    assert metrics.fallback_ops() == []      # every op ran as XLA, none on the CPU
    torch.testing.assert_close(torch.tensor(dev_losses), torch.tensor(cpu_losses),
                               **tolerance(1e-5, 1e-6))
    assert cpu_losses[-1] < cpu_losses[0]
    for name, value in cpu_model.state_dict().items():
        torch.testing.assert_close(dev_state[name], value, **tolerance(1e-5, 1e-6), msg=name)
