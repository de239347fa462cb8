"""Writes eager allows into views whose elements share memory (expand, overlapping as_strided and
unfold), on both paths against CPU eager (functional/shared_writes.py on the functional path)."""
from __future__ import annotations

import warnings

import pytest
import torch

import xla_compat as xc
from tests.conftest import assert_same
from tests.sampling import all_pairs

pytestmark = pytest.mark.filterwarnings("ignore:Use of index_put_ on expanded tensors")


def _idx(t, rows):
    return torch.tensor(rows, device=t.device)


VIEWS = {
    "expand": lambda t: t.expand(3, 4),
    "slice then expand": lambda t: t[1:3].expand(2, 2),
    "select, unsqueeze, expand": lambda t: t[2].unsqueeze(0).unsqueeze(0).expand(2, 3, 1),
    "expand of a detached view": lambda t: t.detach().expand(2, 4),
    "as_strided with a zero stride": lambda t: t.as_strided((3, 2), (0, 1), 1),
    "overlapping unfold": lambda t: t.unfold(0, 3, 1),
}

WRITES = {
    "fill_": lambda v: v.fill_(7),
    "zero_": lambda v: v.zero_(),
    "masked_fill_ of some": lambda v: v.masked_fill_(
        (torch.arange(v.numel(), device=v.device) % 3 == 1).reshape(v.shape), 5),
    "masked_fill_ of a 0-dim tensor": lambda v: v.masked_fill_(
        (torch.arange(v.numel(), device=v.device) % 2 == 0).reshape(v.shape),
        torch.tensor(9, device=v.device)),
    "index_fill_": lambda v: v.index_fill_(v.dim() - 1, _idx(v, [0]), 4),
    "index_put_ of one value": lambda v: v.index_put_((_idx(v, [v.shape[0] - 1]),),
                                                      torch.tensor(3, dtype=v.dtype,
                                                                   device=v.device)),
}


@pytest.mark.parametrize("view,write,dtype",
                         all_pairs(list(VIEWS), list(WRITES), [torch.float32, torch.int64]))
def test_a_write_into_a_view_of_shared_elements_matches_eager(path, dev, view, write, dtype):
    def program(base):
        v = VIEWS[view](base)
        WRITES[write](v)
        w = VIEWS[view](base)          # the written view again, and the view itself, read back
        return base, v * 1, w * 1
    for _ in range(2):                 # the second call replays what the first one traced
        want = program(torch.arange(1, 5, dtype=dtype))
        got = program(torch.arange(1, 5, dtype=dtype).to(dev))
        xc.sync()
        for g, w in zip(got, want):
            assert_same(g, w, rtol=0, atol=0)


def test_a_changed_element_is_told_bit_for_bit(path, dev):
    for start, fill in ((-0.0, 0.0), (0.0, -0.0), (float("nan"), float("nan"))):
        cpu = torch.tensor([start, 1.0])
        cpu.expand(3, 2).fill_(fill)
        t = torch.tensor([start, 1.0]).to(dev)
        t.expand(3, 2).fill_(fill)
        got = t.cpu()
        assert torch.equal(torch.signbit(got), torch.signbit(cpu))
        assert torch.allclose(got, cpu, equal_nan=True)


def test_a_bool_view_of_shared_elements_takes_a_masked_fill(path, dev):
    def program(t):
        t.expand(2, 3).masked_fill_(torch.tensor([[False, True, False]] * 2, device=t.device),
                                    True)
        return t
    assert_same(program(torch.zeros(3, dtype=torch.bool).to(dev)),
                program(torch.zeros(3, dtype=torch.bool)))


def test_eagers_own_errors_come_first(path, dev):
    t = torch.zeros(2).to(dev)
    for tensor in (torch.zeros(2), t):       # eager refuses fill_ of a tensor value here
        with pytest.raises(RuntimeError, match="more than one element of the written-to"):
            tensor.expand(3, 2).fill_(torch.tensor(1., device=tensor.device))
    with pytest.raises(RuntimeError, match="only supports boolean masks"):
        t.expand(3, 2).masked_fill_(torch.ones(3, 2, device=dev), 1.)
    with pytest.raises(RuntimeError):
        torch.zeros(2).expand(3, 2).masked_fill_(torch.ones(3, 2), 1.)
    assert torch.equal(t.cpu(), torch.zeros(2))


def test_an_index_put_of_several_values_is_eager_on_legacy_and_a_clear_limit_on_functional(
        path, dev):
    # Which of two values written to one memory element survives is eager's iteration order.
    def program(t):
        t.expand(3, 2).index_put_((torch.tensor([0, 2], device=t.device),),
                                  torch.tensor([[1., 2.], [3., 4.]], device=t.device))
        return t
    want = program(torch.zeros(2))
    t = torch.zeros(2).to(dev)
    if path == "functional":
        from xla_compat.functional import FunctionalizationLimit
        with pytest.raises(FunctionalizationLimit, match="overlap"):
            program(t)
        assert torch.equal(t.cpu(), torch.zeros(2))
    else:
        assert_same(program(t), want)


def test_an_accumulating_index_put_adds_every_contribution(path, dev):
    def program(t):
        t.expand(3, 2).index_put_((torch.tensor([0, 2], device=t.device),),
                                  torch.tensor(1., device=t.device), accumulate=True)
        return t
    assert_same(program(torch.zeros(2).to(dev)), program(torch.zeros(2)))


def test_a_write_under_no_grad_into_a_parameters_expanded_view(path, dev):
    def program(p):
        with torch.no_grad():
            p.expand(3, 2).masked_fill_(torch.tensor([[True, False]] * 3, device=p.device), 4.)
        return p.detach()
    assert_same(program(torch.nn.Parameter(torch.ones(2).to(dev))),
                program(torch.nn.Parameter(torch.ones(2))))


def test_the_write_is_made_on_the_root_without_upstreams_sum(dev):
    # Functional only: upstream's write-back of an expanded view is a sum over the copies.
    with xc.use_path("functional"):
        t = torch.arange(4.).to(dev)
        xc.sync()
        t.expand(5, 4).fill_(1.)
        text = xc.hlo_text([t])
    assert "stablehlo.reduce" not in text and text.count("stablehlo.scatter") <= 2, text
    assert torch.equal(t.cpu(), torch.ones(4))
