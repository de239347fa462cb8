"""Modules whose eager code takes a fused kernel on any CPU/CUDA/PrivateUse1 tensor run on the
device and match CPU eager, on both paths. Before session 26 the inference fast paths of
``nn.MultiheadAttention`` / ``nn.TransformerEncoderLayer`` and weight norm's backward ran on the
CPU, ``nn.TransformerEncoder`` with a padding mask crashed (nested tensors), and ``ctc_loss``
with the usual CPU length tensors failed (mixed devices)."""
from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import xla_compat as xc
from tests.conftest import assert_same
from tests.sampling import one_path_each


def _x(*shape, seed=1):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


PAD = torch.tensor([[False] * 5, [False] * 3 + [True] * 2, [True] * 5])   # (a fully padded row)
CAUSAL = torch.ones(5, 5, dtype=torch.bool).triu(1)

MHA = {
    "no mask": dict(),
    "key padding": dict(key_padding_mask=PAD),
    "attn mask": dict(attn_mask=CAUSAL),
    "both masks, per-head weights": dict(attn_mask=CAUSAL, key_padding_mask=PAD,
                                         average_attn_weights=False),
    "no weights": dict(need_weights=False),
}


@pytest.mark.parametrize("path,name", one_path_each(MHA), indirect=["path"])
def test_multi_head_attention_fast_path(path, dev, name):
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(8, 2, batch_first=True).eval()
    x = _x(3, 5, 8)
    kwargs = MHA[name]
    with torch.no_grad():
        want = mha(x, x, x, **kwargs)
        mha.to(dev)
        got = mha(x.to(dev), x.to(dev), x.to(dev),
                  **{k: v.to(dev) if isinstance(v, torch.Tensor) else v
                     for k, v in kwargs.items()})
    # (a fully padded row attends to nothing: eager's fused kernel gives NaN there too)
    assert_same(got[0], want[0], rtol=1e-5, atol=1e-5)
    assert (got[1] is None) == (want[1] is None)
    if want[1] is not None:
        assert_same(got[1], want[1], rtol=1e-5, atol=1e-6)
    assert xc.metrics.fallback_ops() == []


def test_native_multi_head_attention_cross_attention(path, dev):
    """The fused op called directly with distinct key/value tensors (eager's separate
    projections) and a mask of the scores' own shape."""
    d, h = 8, 2
    args = [_x(2, 4, d, seed=s) for s in (1, 2, 3)]
    weights = [_x(3 * d, d, seed=4), _x(3 * d, seed=5), _x(d, d, seed=6), _x(d, seed=7)]
    mask = _x(2, h, 4, 4, seed=8) > 0.5
    want = torch._native_multi_head_attention(*args, d, h, *weights, mask, True, False, 2)
    got = torch._native_multi_head_attention(*[a.to(dev) for a in args], d, h,
                                             *[w.to(dev) for w in weights], mask.to(dev),
                                             True, False, 2)
    assert_same(got[0], want[0], rtol=1e-5, atol=1e-5)
    assert_same(got[1], want[1], rtol=1e-5, atol=1e-6)
    assert xc.metrics.fallback_ops() == []


@pytest.mark.parametrize("path,norm_first", [("legacy", False), ("functional", True)],
                         indirect=["path"])
def test_transformer_encoder_layer_fast_path(path, dev, norm_first):
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(8, 2, 16, batch_first=True, norm_first=norm_first,
                                       activation="gelu" if norm_first else "relu").eval()
    x = _x(3, 5, 8)
    with torch.no_grad():
        want = layer(x, src_mask=CAUSAL)
        layer.to(dev)
        got = layer(x.to(dev), src_mask=CAUSAL.to(dev))
    assert_same(got, want, rtol=1e-5, atol=1e-5)
    assert xc.metrics.fallback_ops() == []


def test_transformer_encoder_with_padding_mask(path, dev):
    """Eager turns the padded batch into a nested tensor; on hlo the layers run on the padded
    batch with the mask instead: eager's values at every valid position, and at padded ones
    eager's own values without nested tensors (``enable_nested_tensor=False``)."""
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")     # (enable_nested_tensor with norm_first: a warning)
        encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(8, 2, 16, batch_first=True),
                                        2).eval()
    x, pad = _x(3, 5, 8), PAD.clone()
    pad[2, :2] = False                      # (the nested path needs one valid token per row)
    with torch.no_grad():
        nested = encoder(x, src_key_padding_mask=pad)
        encoder.use_nested_tensor = False
        padded = encoder(x, src_key_padding_mask=pad)
        encoder.use_nested_tensor = True
        encoder.to(dev)
        got = encoder(x.to(dev), src_key_padding_mask=pad.to(dev)).cpu()
    assert_same(got[~pad], nested[~pad], rtol=1e-5, atol=1e-5)
    assert_same(got, padded, rtol=1e-5, atol=1e-5)
    assert xc.metrics.fallback_ops() == []


def test_weight_norm_training(path, dev):
    """Both weight-norm APIs, dims 0 and last: gradients through ``_weight_norm_interface``."""
    grads = []
    for device in ("cpu", dev):
        torch.manual_seed(0)
        a = nn.utils.parametrizations.weight_norm(nn.Linear(4, 3)).to(device)
        b = nn.utils.weight_norm(nn.Conv1d(2, 3, 2), dim=2).to(device)
        x = _x(2, 4).to(device)
        loss = a(x).pow(2).sum() + b(x.reshape(2, 2, 2)).pow(2).sum()
        loss.backward()
        grads.append([p.grad.cpu() for m in (a, b) for p in m.parameters()])
    assert_same(grads[1], grads[0], rtol=1e-5, atol=1e-6)
    assert xc.metrics.fallback_ops() == []


@pytest.mark.parametrize("path,reduction", one_path_each(["mean", "sum", "none"]),
                         indirect=["path"])
def test_ctc_loss_with_cpu_length_tensors(path, dev, reduction):
    log_probs = _x(6, 2, 4).log_softmax(2)
    targets = torch.tensor([[1, 2, 2], [3, 1, 0]])
    lengths = (torch.tensor([6, 5]), torch.tensor([3, 2]))
    want = F.ctc_loss(log_probs, targets, *lengths, reduction=reduction)
    lp = log_probs.to(dev).requires_grad_()
    got = F.ctc_loss(lp, targets.to(dev), *lengths, reduction=reduction)
    assert_same(got, want, rtol=1e-5, atol=1e-5)
    got.sum().backward()
    ref = log_probs.clone().requires_grad_()
    F.ctc_loss(ref, targets, *lengths, reduction=reduction).sum().backward()
    assert_same(lp.grad, ref.grad, rtol=1e-5, atol=1e-5)
