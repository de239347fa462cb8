"""scaled_dot_product_attention with dropout: the mask comes from the device RNG, so values are
compared with eager by statistics (the OpInfo's dropout samples are skipped for that reason)."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def test_attention_dropout_keeps_the_expected_value_and_drops_about_p(path, dev):
    torch.manual_seed(0)
    q, k, v = (torch.randn(64, 2, 5, 8) for _ in range(3))
    exact = F.scaled_dot_product_attention(q, k, v)
    qd, kd, vd = (t.to(dev) for t in (q, k, v))
    runs = torch.stack([F.scaled_dot_product_attention(qd, kd, vd, dropout_p=0.5).cpu()
                        for _ in range(8)])
    # Unbiased overall: the mean of every output element over the draws matches eager's mean
    # (each draw is a random +-100% perturbation per element; their average over 8 x 5120
    # elements is tight).
    assert abs(runs.mean().item() - exact.mean().item()) < 0.05 * exact.abs().mean().item()
    # Each draw differs from the exact output and from the next draw.
    assert not torch.allclose(runs[0], exact) and not torch.equal(runs[0], runs[1])
    # With v = identity rows the output is the (dropped, rescaled) attention matrix itself:
    # about half of its entries are zero, the rest are probabilities times 2.
    eye = torch.eye(5).expand(64, 2, 5, 5).contiguous()
    a = F.scaled_dot_product_attention(qd[..., :5, :], kd[..., :5, :], eye.to(dev),
                                       dropout_p=0.5).cpu()
    zero = (a == 0).float().mean().item()
    assert 0.4 < zero < 0.6
    kept = F.scaled_dot_product_attention(q[..., :5, :], k[..., :5, :], eye) * 2
    assert torch.allclose(a[a != 0], kept[a != 0], rtol=1e-4, atol=1e-5)
