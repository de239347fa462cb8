"""A training script written the torch_xla way. Only the two imports below differ from torch_xla:

    import torch_xla.core.xla_model as xm     ->  import xla_compat.core.xla_model as xm
    import torch_xla.debug.metrics as met     ->  import xla_compat.debug.metrics as met
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

import xla_compat.core.xla_model as xm
import xla_compat.debug.metrics as met


def train(device=None, steps=8, checkpoint=None):
    device = device or xm.xla_device()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 32), nn.Tanh(), nn.Linear(32, 3)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    gen = torch.Generator().manual_seed(1)
    losses = []
    for step in range(steps):
        x = torch.randn(16, 10, generator=gen).to(device)
        y = torch.randint(0, 3, (16,), generator=gen).to(device)
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        xm.optimizer_step(opt)
        xm.mark_step()
        losses.append(loss.item())
    if checkpoint is not None:
        xm.save(model.state_dict(), checkpoint)
    if xm.is_xla_tensor(next(model.parameters())):
        xm.master_print(met.short_metrics_report())
    return losses, {k: v.cpu() for k, v in model.state_dict().items()}


if __name__ == "__main__":
    print(train()[0])
