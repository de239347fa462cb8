"""Issue 8, functional path: in-place ops and copy_ into views go through the view's root wrapper
(functional/direct.py), as ONE update of the root without regenerating views. Every program here
is checked against eager on the CPU (and runs on both paths); reads of the base, of views made
before and after the writes, autograd, syncs in between, and the cases that must take upstream's
kernel instead (with eager's errors) are all pinned."""
import random

import pytest
import torch

import xla_compat as xc
from xla_compat.functional import direct

from .conftest import assert_same


@pytest.fixture
def taken(monkeypatch):
    """Records, per call of the direct route, whether it took the write (True) or left it to
    upstream's kernel (False)."""
    seen = []

    def spy(real):
        def call(*args):
            out = real(*args)
            seen.append(out is not None)
            return out
        return call
    monkeypatch.setattr(direct, "in_place", spy(direct.in_place))
    monkeypatch.setattr(direct, "copy", spy(direct.copy))
    return seen


def _both(program, *cpu, dev, **tol):
    """``program`` on CPU tensors and on device copies of them; outputs and inputs compared."""
    on_dev = [t.to(dev) for t in cpu]
    expected = program(*cpu)
    actual = program(*on_dev)
    assert_same([actual, on_dev], [expected, list(cpu)], **tol)     # (one sync for both)
    xc.sync()
    assert_same(actual, expected, **tol)
    assert_same(on_dev, list(cpu), **tol)
    return on_dev


def _randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


# -- writes through views of views -----------------------------------------------------------------

def test_writes_through_views_of_views_match_eager(path, dev):
    def program(x, y):
        x.t()[1:3][:, 0] += 1.5
        x.transpose(0, 1)[2].mul_(-2)
        x[1:4, ::2].t()[1] -= y[:, 0][0:3]
        x.permute(1, 0)[3, 1:5].div_(4)
        x.t()[0][2:4] = y[1, 1:3]
        return x.sum(), x * 1
    _both(program, _randn(5, 4), _randn(3, 6, seed=1), dev=dev)


def test_kv_cache_loop_twice_matches_eager(path, dev):
    def program(cache, kv):
        for _ in range(2):
            for t in range(5):
                cache[:, :, t:t + 1] = kv[:, :, t:t + 1]
                cache.transpose(2, 3)[..., t] += 0.5
        return cache.sum()
    _both(program, _randn(2, 3, 8, 4), _randn(2, 3, 5, 4, seed=1), dev=dev, atol=1e-4)


def test_the_functional_kv_cache_write_takes_the_direct_route(dev, taken):
    with xc.use_path("functional"):
        def program(cache, kv):
            for t in range(3):
                cache[:, :, t:t + 1] = kv[:, :, t:t + 1]
                cache.transpose(2, 3)[..., t] += 0.5
            return cache
        _both(program, _randn(2, 3, 8, 4), _randn(2, 3, 5, 4, seed=1), dev=dev)
    assert taken and all(taken)


def test_reads_of_the_base_and_of_older_and_newer_views_after_writes_match_eager(path, dev):
    def program(x):
        older = x[1]                  # made before the writes
        older_t = x.t()[:, 2]
        x.t()[1] += 10                # a view's write changes every alias
        x[2].copy_(x[0] * 3)
        newer = x.transpose(0, 1)[1]  # made after
        reads = [older * 1, older_t.sum(), newer + 0, x[2:4].clone()]
        newer += 1                    # written again through the newer view
        reads += [older.clone(), older_t * 2, x.clone()]
        return reads
    _both(program, _randn(4, 5), dev=dev)


def test_a_view_kept_across_writes_and_syncs_matches_eager(path, dev):
    def program(x, steps):
        t = x.transpose(0, 1)
        for i in range(steps):
            t[i % 3] += i
            x[:, i % 3].mul_(2)
            if i == 1 and x.device.type == "hlo":
                xc.sync()
        return t.clone(), x.sum()
    _both(lambda x: program(x, 4), _randn(4, 3), dev=dev)


def test_an_upstream_write_pending_under_a_direct_one_keeps_eager_order(path, dev):
    def program(x):
        x.diagonal().add_(100)        # a view kind the direct route does not know: upstream's
        x.t()[0] += 1                 # then a direct write over some of the same elements
        x.view(12)[0:3] = 5           # then upstream again (a view copy of the flat tensor)
        x[0].mul_(2)
        return x.clone(), x.diagonal() * 1
    _both(program, _randn(4, 3), dev=dev)


def test_copy_between_views_and_roots_matches_eager(path, dev):
    def program(x, y):
        x.copy_(y.t()[0:4])           # a root from a view of another storage
        y[1].copy_(x.t()[2])          # a view from a view of another storage
        x[1:3].copy_(x[0:2].clone())
        x.t()[0].copy_(x.t()[0])      # the same elements: nothing changes
        v, w = x.t()[1], x.t()[1]
        v.copy_(w)
        return x * 1, y * 1
    _both(program, _randn(4, 5), _randn(5, 4, seed=1), dev=dev)


def test_other_dtypes_and_tensor_operands_match_eager(path, dev):
    for dtype in (torch.float64, torch.float16, torch.int64, torch.int32):
        def program(x, y):
            x.t()[1] += 3
            x[2:4].t()[1] *= 2
            x.t()[0].sub_(y[0])        # an operand from another storage
            x.t()[2].add_(y[1, 0])     # a 0-dim operand, broadcast
            x.t()[3].mul_(torch.tensor(2, dtype=dtype).to(x.device))
            return x.clone()
        x = (_randn(4, 5) * 10).to(dtype)
        y = (_randn(2, 4, seed=1) * 10).to(dtype)
        _both(program, x, y, dev=dev, atol=1e-2, rtol=1e-3)


# -- autograd ---------------------------------------------------------------------------------------

def test_autograd_through_written_views_matches_eager(path, dev):
    def run(device):
        w = _randn(3, 4, seed=2).to(device).requires_grad_()
        u = _randn(4, seed=3).to(device).requires_grad_()
        x = w * 2
        x.t()[1] += u[0:3]            # views of a tensor that requires grad
        x[2].mul_(u)
        y = torch.zeros(4, 3, device=device)
        y.t()[0].copy_(u * 3)         # copy_ of a source that requires grad
        y[1:3] += 1
        loss = (x * x).sum() + (y * torch.arange(12.0, device=device).view(4, 3)).sum()
        loss.backward()
        return [loss.detach(), w.grad, u.grad, y.detach()]
    expected = run("cpu")
    actual = run(dev)
    assert_same(actual, expected, atol=1e-4)


def test_writes_needing_autograd_take_upstreams_kernel(dev, taken):
    with xc.use_path("functional"):
        w = _randn(3, 4).to(dev).requires_grad_()
        x = w * 1
        x.t()[1] += 2
        x.t()[0].copy_(w.t()[2])
    assert taken == [False, False]


def test_a_copy_of_the_same_elements_writes_nothing_like_eager(path, dev):
    def program(x):
        x.t()[1].copy_(x.t()[1])
        x[0:1].expand(3, 5).copy_(x[0:1].expand(3, 5))   # eager returns before its checks
        v = x.transpose(0, 1)[2]
        v += 1                        # += on an index stores the view back: the same elements
        x.transpose(0, 1)[2] = v
        return x * 1
    _both(program, _randn(4, 5), dev=dev)
    with xc.use_path("functional"):
        x = _randn(4, 5).to(dev)
        xc.sync()
        held = torch._from_functional_tensor(x)
        x.t()[1].copy_(x.t()[1])
        x[2] = x[2]
        assert torch._from_functional_tensor(x) is held    # no update was committed


def test_optimizer_like_updates_under_no_grad_take_the_direct_route_and_match_eager(dev, taken):
    def run(device):
        p = _randn(4, 6, seed=4).to(device).requires_grad_()
        buf = torch.zeros(4, 6, device=device)
        g = _randn(4, 6, seed=5).to(device)
        for lr in (0.1, 0.05):
            with torch.no_grad():
                buf.mul_(0.9).add_(g)
                p.add_(buf, alpha=-lr)            # a root that requires grad, under no_grad
                p.t()[1].mul_(1 - lr)             # and a view of it
                p[2].sub_(g[0], alpha=2)
        return [p.detach() * 1, buf * 1]
    expected = run("cpu")
    with xc.use_path("functional"):
        actual = run(dev)
        assert_same(actual, expected)
    assert taken and all(taken)


def test_in_place_ops_on_roots_match_eager(path, dev):
    for dtype in (torch.float32, torch.float64, torch.int64):
        def program(x, y):
            x.mul_(3).add_(2)
            x.sub_(y, alpha=2)
            x.add_(y[0])                          # broadcast
            r = x.t().clone()                     # a root laid out transposed
            r.mul_(2)
            return x * 1, r.add_(1)
        x = (_randn(3, 4) * 10).to(dtype)
        y = (_randn(3, 4, seed=1) * 10).to(dtype)
        _both(program, x, y, dev=dev)


# -- what stays upstream's ---------------------------------------------------------------------------

@pytest.mark.parametrize("case", [
    "int_view_plus_float", "expanded_view", "partial_overlap_copy",
    "broadcast_resizes_view", "view_of_an_expand"])
def test_writes_eager_refuses_are_refused(path, dev, case):
    def program(x):
        if case == "int_view_plus_float":
            x.to(torch.int64).t()[0].add_(0.5)
        elif case == "expanded_view":
            x[0:1].expand(3, 5)[1].add_(1)
            x[0].expand(2, 5).add_(1)
        elif case == "partial_overlap_copy":
            x.view(20)[0:6].copy_(x.view(20)[2:8])
        elif case == "broadcast_resizes_view":
            x.t()[0:1].add_(torch.ones(3, 4, device=x.device))
        elif case == "view_of_an_expand":
            x[0].expand(4, 5).t()[1].mul_(2)
        return x
    with pytest.raises(RuntimeError) as eager:
        program(_randn(4, 5))
    with pytest.raises(RuntimeError) as ours:
        program(_randn(4, 5).to(dev))
    words = str(eager.value).split()[:3]
    assert str(ours.value).split()[:3] == words


def test_cases_the_direct_route_leaves_to_upstream_match_eager(dev, taken):
    def program(x, y):
        x.t()[1].add_(x.t()[2])                  # an operand of the same storage
        x.diagonal().mul_(3)                     # a view kind it does not know
        x.view(30)[3:7].add_(1)
        x.t()[3].add_(torch.tensor(2.0))         # a 0-dim CPU operand
        x.t()[4].div_(2, rounding_mode="floor")  # another overload
        r = y.t().clone()                        # a view of a root not laid out contiguously
        r[1].add_(4)
        with torch.inference_mode():
            z = torch.ones(3, 5, device=x.device)
            z.t()[1].add_(2)
        return x * 1, r * 1, z.clone()
    with xc.use_path("functional"):
        _both(program, _randn(5, 6), _randn(4, 5, seed=1), dev=dev)
    assert taken and not any(taken)


def test_a_view_whose_base_is_a_view_itself_matches_eager(path, dev):
    def program(x):
        d = x.detach()                # an alias that is not an autograd view
        d.t()[1] += 3
        x.t()[2] *= 2
        s = x[1:3]
        s.transpose_(0, 1)            # the base of later views is itself a view now
        s[0] += 1
        return x.clone(), d.clone(), s.clone()
    _both(program, _randn(4, 5), dev=dev)


# -- random programs ---------------------------------------------------------------------------------

def _random_program(seed):
    """A program of writes through random chains of select/slice/transpose views, with views
    kept from earlier steps and read at the end (the same for CPU and device tensors)."""
    rng = random.Random(seed)
    plan = []
    for _ in range(8):
        chain = []
        shape = [4, 5, 6]
        for _ in range(rng.randint(1, 3)):
            if len(shape) > 1 and rng.random() < 0.3:
                d = rng.randrange(len(shape))
                chain.append(("select", d, rng.randrange(shape[d])))
                shape.pop(d)
            elif len(shape) > 1 and rng.random() < 0.5:
                a, b = rng.sample(range(len(shape)), 2)
                chain.append(("transpose", a, b))
                shape[a], shape[b] = shape[b], shape[a]
            else:
                d = rng.randrange(len(shape))
                start = rng.randrange(shape[d])
                end = rng.randint(start + 1, shape[d])
                step = rng.choice([1, 1, 2])
                chain.append(("slice", d, start, end, step))
                shape[d] = len(range(start, end, step))
        plan.append((chain, rng.choice(["add", "mul", "sub_other", "copy_other", "copy_self",
                                        "keep"]), rng.random()))

    def view(x, chain):
        for step in chain:
            if step[0] == "select":
                x = x.select(step[1], step[2])
            elif step[0] == "transpose":
                x = x.transpose(step[1], step[2])
            else:
                d, start, end, step_ = step[1:]
                x = x[(slice(None),) * d + (slice(start, end, step_),)]
        return x

    def program(x, y):
        kept, reads = [], []
        for chain, action, r in plan:
            v = view(x, chain)
            if action == "add":
                v += r
            elif action == "mul":
                v.mul_(1 + r)
            elif action == "sub_other":
                v.sub_(y.flatten()[: v.numel()].view(v.shape))
            elif action == "copy_other":
                v.copy_(y.flatten()[: v.numel()].view(v.shape) * r)
            elif action == "copy_self":
                v.copy_(view(x, chain))
            else:
                kept.append(v)
            reads.append(v.sum())
        return reads + [k * 1 for k in kept] + [x.clone()]
    return program


@pytest.mark.parametrize("seed", range(12))
def test_random_view_writes_match_eager(path, dev, seed):
    _both(_random_program(seed), _randn(4, 5, 6, seed=seed), _randn(200, seed=seed + 100),
          dev=dev, atol=1e-4)
