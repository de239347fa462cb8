"""LSTM and GRU layers and cells match CPU eager on both paths, forward and backward.

On a PrivateUse1 device ATen runs them through the fused cells ``_thnn_fused_lstm_cell`` and
``_thnn_fused_gru_cell`` (CUDA-only kernels): every ``nn.LSTM`` / ``nn.GRU`` on the device failed
before session 25 ("Could not run 'aten::_thnn_fused_lstm_cell' with arguments from the 'CPU'
backend"). ``nn.RNN`` (tanh/relu) takes the unfused route and is checked alongside.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import xla_compat as xc
from tests.conftest import assert_same
from tests.sampling import one_path_each

LAYERS = {
    "LSTM": (lambda: nn.LSTM(6, 5, 2), (3, 2, 6)),
    "LSTM batch_first": (lambda: nn.LSTM(6, 5, batch_first=True), (3, 2, 6)),
    "LSTM bidirectional no bias": (lambda: nn.LSTM(6, 5, bias=False, bidirectional=True),
                                   (3, 2, 6)),
    "LSTM proj_size": (lambda: nn.LSTM(6, 5, 2, proj_size=3), (3, 2, 6)),
    "LSTM unbatched": (lambda: nn.LSTM(6, 5), (3, 6)),
    "GRU": (lambda: nn.GRU(6, 5, 2), (3, 2, 6)),
    "GRU bidirectional": (lambda: nn.GRU(6, 5, bidirectional=True, batch_first=True), (3, 2, 6)),
    "GRU no bias": (lambda: nn.GRU(6, 5, bias=False), (3, 2, 6)),
    "RNN tanh": (lambda: nn.RNN(6, 5, 2), (3, 2, 6)),
    "RNN relu": (lambda: nn.RNN(6, 5, nonlinearity="relu"), (3, 2, 6)),
}


def _flat(out):
    if isinstance(out, torch.Tensor):
        return [out]
    return [t for o in out for t in _flat(o)]


def _run(make, inputs, device):
    torch.manual_seed(1)
    m = make().to(device)
    xs = [x.detach().clone().to(device).requires_grad_() for x in inputs]
    outs = _flat(m(*xs))
    sum((o * o).sum() for o in outs).backward()
    if device != "cpu":
        xc.sync()            # one graph for every output and gradient (each read would cut one)
    return outs, [p.grad for p in m.parameters()], [x.grad for x in xs]


def _compare(make, inputs, dev, tol=2e-5):
    want = _run(make, inputs, "cpu")
    got = _run(make, inputs, dev)
    for g, w in zip(got, want):
        assert len(g) == len(w)
        for a, b in zip(g, w):
            assert_same(a, b, rtol=tol, atol=tol)
    assert xc.metrics.fallback_ops() == []


@pytest.mark.parametrize("path,name", one_path_each(LAYERS), indirect=["path"])
def test_recurrent_layers_match_eager_forward_and_backward(path, dev, name):
    make, shape = LAYERS[name]
    torch.manual_seed(0)
    _compare(make, [torch.randn(shape)], dev)


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_initial_states_get_their_gradients(path, dev, kind):
    torch.manual_seed(0)
    x, h0, c0 = torch.randn(3, 2, 6), torch.randn(2, 2, 5), torch.randn(2, 2, 5)
    if kind == "LSTM":
        layer = _Unpacked(lambda: nn.LSTM(6, 5, 2), lambda x, h, c: (x, (h, c)))
        _compare(layer, [x, h0, c0], dev)
    else:
        layer = _Unpacked(lambda: nn.GRU(6, 5, 2), lambda x, h, c: (x, h))
        _compare(layer, [x, h0, c0], dev)


class _Unpacked:
    """A factory of modules taking (x, h0, c0) as separate tensors (so each gets a gradient)."""

    def __init__(self, make, pack):
        self.make, self.pack = make, pack

    def __call__(self):
        make, pack = self.make, self.pack

        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.rnn = make()

            def forward(self, x, h, c):
                args = pack(x, h, c)
                return self.rnn(*args) if c is not None else self.rnn(args[0])
        return M()


@pytest.mark.parametrize("cell", ["LSTMCell", "GRUCell", "LSTMCell no bias", "GRUCell no bias"])
def test_cells_match_eager(path, dev, cell):
    make = {"LSTMCell": lambda: nn.LSTMCell(6, 5), "GRUCell": lambda: nn.GRUCell(6, 5),
            "LSTMCell no bias": lambda: nn.LSTMCell(6, 5, bias=False),
            "GRUCell no bias": lambda: nn.GRUCell(6, 5, bias=False)}[cell]
    torch.manual_seed(0)
    _compare(make, [torch.randn(3, 6)], dev)


# make test trains this LSTM language model on legacy; the functional path's LSTM steps are
# test_trace_plans' "lstm sgd" and this module's layer and packed-sequence tests.
SLOW_CASES = {"test_a_language_model_trains_as_on_the_cpu[functional]"}


def test_a_language_model_trains_as_on_the_cpu(path, dev):
    """Embedding -> 2-layer LSTM -> linear, cross-entropy, Adam: three steps (the second and
    third reuse Adam's state), the same losses and weights as CPU eager."""
    def make():
        torch.manual_seed(3)
        return nn.ModuleDict({"emb": nn.Embedding(20, 8), "rnn": nn.LSTM(8, 16, 2),
                              "out": nn.Linear(16, 20)})

    def train(device):
        m = make().to(device)
        opt = torch.optim.Adam(m.parameters(), lr=1e-2)
        g = torch.Generator().manual_seed(4)
        tokens = torch.randint(0, 20, (5, 3), generator=g).to(device)
        losses = []
        for _ in range(3):
            opt.zero_grad()
            h, _ = m["rnn"](m["emb"](tokens[:-1]))
            loss = nn.functional.cross_entropy(m["out"](h).flatten(0, 1), tokens[1:].flatten())
            loss.backward()
            opt.step()
            xc.sync() if device != "cpu" else None
            losses.append(loss.item())
        return losses, [p.detach() for p in m.parameters()]

    want_losses, want = train("cpu")
    got_losses, got = train(dev)
    assert got_losses == pytest.approx(want_losses, rel=1e-5)
    for a, b in zip(got, want):
        assert_same(a, b, rtol=1e-4, atol=1e-5)
    assert xc.metrics.fallback_ops() == []


@pytest.mark.parametrize("path,batch_first", [
    ("legacy", False), ("functional", True),
    pytest.param("legacy", True, marks=pytest.mark.slow),
    pytest.param("functional", False, marks=pytest.mark.slow)], indirect=["path"])
def test_packed_sequences_match_eager(path, dev, batch_first):
    """``pack_padded_sequence`` keeps ``batch_sizes`` on the CPU, as eager does on any device
    (PackedSequence refuses another); its data, the LSTM over it, ``pad_packed_sequence`` and
    the gradients match eager."""
    from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

    def run(device):
        torch.manual_seed(0)
        lstm = nn.LSTM(4, 3, batch_first=batch_first).to(device)
        x = (torch.randn(3, 5, 4) if batch_first else torch.randn(5, 3, 4)).to(device)
        x.requires_grad_()
        packed = pack_padded_sequence(x, [5, 3, 2], batch_first=batch_first)
        out, (h, c) = lstm(packed)
        y, lengths = pad_packed_sequence(out, batch_first=batch_first)
        (y.sum() + h.sum()).backward()
        return packed, [y, h, c, x.grad, lstm.weight_ih_l0.grad], lengths

    want_packed, want, want_lengths = run("cpu")
    packed, got, lengths = run(dev)
    assert packed.batch_sizes.device.type == "cpu" and lengths.device.type == "cpu"
    assert torch.equal(packed.batch_sizes, want_packed.batch_sizes)
    assert torch.equal(lengths, want_lengths)
    assert_same(packed.data, want_packed.data, rtol=0, atol=0)
    for a, b in zip(got, want):
        assert_same(a, b, rtol=2e-5, atol=2e-5)
    assert xc.metrics.fallback_ops() == []


def test_pack_sequence_unsorted_and_eagers_length_error(path, dev):
    from torch.nn.utils.rnn import pack_padded_sequence, pack_sequence
    seqs = [torch.randn(n, 4) for n in (2, 5, 3)]
    want = pack_sequence(seqs, enforce_sorted=False)
    got = pack_sequence([s.to(dev) for s in seqs], enforce_sorted=False)
    assert_same(got.data, want.data, rtol=0, atol=0)
    assert torch.equal(got.batch_sizes, want.batch_sizes)
    assert_same(got.sorted_indices, want.sorted_indices, rtol=0, atol=0)
    with pytest.raises(RuntimeError, match="has to be greater than 0"):
        pack_padded_sequence(torch.randn(5, 3, 4).to(dev), [5, 3, 0])
