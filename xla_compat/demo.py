"""``make demo``: train a small GPT-style language model on the hlo device, end to end.

Prints the dispatch decision, trains with a progress line (step, loss, steps/s), dual-runs a few
sampled steps on the other path, prints the metrics summary, saves a checkpoint and reloads it.

    python -m xla_compat.demo [--path legacy|functional] [--steps N] [--dual-run off|sample|strict]
"""
from __future__ import annotations

import argparse
import math
import os
import random
import sys
import tempfile
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import xla_compat as xc


# -- data: a synthetic corpus with learnable structure ---------------------------------------

_NAMES = ["ada", "bob", "cy", "dee", "eve", "fay", "gus", "hal"]
_VERBS = ["sees", "likes", "helps", "calls", "meets", "finds"]


def corpus(n_sentences: int = 4000, seed: int = 0) -> str:
    """Sentences like "ada likes bob. 7 plus 5 is 12." (a little grammar, a little arithmetic)."""
    rnd = random.Random(seed)
    out = []
    for _ in range(n_sentences):
        if rnd.random() < 0.5:
            a, b = rnd.sample(_NAMES, 2)
            out.append(f"{a} {rnd.choice(_VERBS)} {b}.")
        else:
            x, y = rnd.randrange(10), rnd.randrange(10)
            out.append(f"{x} plus {y} is {x + y}.")
    return " ".join(out)


class CharData:
    """Character-level tokens and random (input, target) windows."""

    def __init__(self, text: str, seq: int, seed: int):
        self.vocab = sorted(set(text))
        self.stoi = {c: i for i, c in enumerate(self.vocab)}
        self.ids = torch.tensor([self.stoi[c] for c in text], dtype=torch.long)
        self.seq = seq
        self.gen = torch.Generator().manual_seed(seed)

    def batch(self, size: int):
        start = torch.randint(0, len(self.ids) - self.seq - 1, (size,), generator=self.gen)
        x = torch.stack([self.ids[s:s + self.seq] for s in start.tolist()])
        y = torch.stack([self.ids[s + 1:s + self.seq + 1] for s in start.tolist()])
        return x, y


# -- model ------------------------------------------------------------------------------------

class Block(nn.Module):
    def __init__(self, d: int, heads: int, dropout: float):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.proj = nn.Linear(d, d)
        self.ff = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
        self.drop = nn.Dropout(dropout)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.heads)
        causal = torch.triu(torch.ones(t, t, dtype=torch.bool, device=x.device), diagonal=1)
        att = self.drop(att.masked_fill(causal, float("-inf")).softmax(dim=-1))
        y = (att @ v).transpose(1, 2).contiguous().view(b, t, d)
        x = x + self.drop(self.proj(y))
        return x + self.drop(self.ff(self.ln2(x)))


class GPT(nn.Module):
    def __init__(self, vocab: int, d: int = 64, heads: int = 4, layers: int = 2, seq: int = 64,
                 dropout: float = 0.1):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(Block(d, heads, dropout) for _ in range(layers))
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)

    def forward(self, idx, targets):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        logits = self.head(self.ln(x))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


# -- the job ----------------------------------------------------------------------------------

def _progress(step: int, total: int, loss: float, rate: float, tty: bool) -> None:
    width = 30
    done = int(width * step / total)
    line = (f"step {step:4d}/{total} [{'#' * done}{'.' * (width - done)}] "
            f"loss {loss:.4f}  {rate:.1f} steps/s")
    if tty:
        sys.stdout.write("\r" + line)
        if step == total:
            sys.stdout.write("\n")
    elif step == 1 or step % max(total // 10, 1) == 0 or step == total:
        sys.stdout.write(line + "\n")
    sys.stdout.flush()


def train(args) -> dict:
    torch.manual_seed(args.seed)
    xc.manual_seed(args.seed)
    data = CharData(corpus(seed=args.seed), args.seq, args.seed)
    dev = xc.device()
    model = GPT(len(data.vocab), seq=args.seq).to(dev)
    # Captured, AdamW keeps its step counter on the device (capturable), so every step replays.
    capture = getattr(args, "capture", False)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01,
                            capturable=capture)

    def step(x, y):
        opt.zero_grad()
        loss = model(x, y)
        loss.backward()
        opt.step()
        return loss

    if capture:
        step = xc.compile(step)        # trace twice, then replay the recorded graph

    losses = []
    start = time.perf_counter()
    tty = sys.stdout.isatty()
    for i in range(1, args.steps + 1):
        x, y = (t.to(dev) for t in data.batch(args.batch))
        loss = step(x, y)
        xc.sync()
        losses.append(loss.item())
        _progress(i, args.steps, losses[-1], i / (time.perf_counter() - start), tty)
    elapsed = time.perf_counter() - start
    return {"model": model, "data": data, "losses": losses, "elapsed": elapsed, "dev": dev,
            "step": step}


def dual_run_check(args, job) -> str:
    """Run a few sampled training steps on both paths and compare them."""
    if args.dual_run == "off" or not hasattr(xc, "dual_run"):
        return "dual-run: off"
    data, dev = job["data"], job["dev"]
    lines = []
    torch.manual_seed(args.seed + 1)
    probe = GPT(len(data.vocab), seq=args.seq, dropout=0.0).to(dev)
    opt = torch.optim.SGD(probe.parameters(), lr=0.05)

    def step(model, optimizer, x, y):
        optimizer.zero_grad()
        loss = model(x, y)
        loss.backward()
        optimizer.step()
        return loss

    for i in range(args.dual_run_steps):
        x, y = (t.to(dev) for t in data.batch(args.batch))
        r = xc.dual_run(step, probe, opt, x, y)
        lines.append(f"  sampled step {i}: {'match' if r.match else 'MISMATCH'}"
                     + ("" if r.match else f" (first divergence: {r.first_divergence})"))
        if not r.match and args.dual_run == "strict":
            raise SystemExit("dual-run found a mismatch (strict mode)\n" + "\n".join(lines))
    return "dual-run:\n" + "\n".join(lines)


def checkpoint_round_trip(job, args) -> str:
    model, data, dev = job["model"], job["data"], job["dev"]
    x, y = (t.to(dev) for t in CharData(corpus(seed=args.seed + 7), args.seq, 1).batch(8))
    model.eval()
    with torch.no_grad():
        before = model(x, y).item()
    folder = args.checkpoint_dir or tempfile.mkdtemp(prefix="xla_compat_demo_")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "gpt.pt")
    torch.save(model.state_dict(), path)
    fresh = GPT(len(data.vocab), seq=args.seq).to(dev)
    fresh.load_state_dict(torch.load(path))
    fresh.eval()
    with torch.no_grad():
        after = fresh(x, y).item()
    status = "identical" if before == after else f"DIFFERENT ({after:.6f})"
    return f"checkpoint: saved {path}; held-out loss {before:.6f}, reloaded: {status}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m xla_compat.demo", description=__doc__.split("\n")[0])
    p.add_argument("--path", choices=["legacy", "functional"], default=None,
                   help="force a path (default: what the dispatch layer decides)")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--capture", action="store_true",
                   help="replay the training step with xc.compile (no per-op tracing after the "
                        "first steps)")
    p.add_argument("--dual-run", choices=["off", "sample", "strict"], default="sample")
    p.add_argument("--dual-run-steps", type=int, default=3)
    p.add_argument("--checkpoint-dir", default=None)
    args = p.parse_args(argv)

    decision = xc.explain()
    print("== dispatch decision ==")
    print(decision)
    scope = xc.use_path(args.path) if args.path else _nullcontext()
    with scope:
        print(f"== training a GPT on the {xc.path()} path ==")
        job = train(args)
        first, last = job["losses"][0], sum(job["losses"][-10:]) / min(10, len(job["losses"]))
        print(f"loss {first:.4f} -> {last:.4f} (mean of last 10) in {job['elapsed']:.1f}s")
        if args.capture:
            print(f"== step capture: {job['step'].stats}"
                  + (f" ({job['step'].reason})" if job["step"].reason else ""))
        print("== " + dual_run_check(args, job))
        print("== " + checkpoint_round_trip(job, args))
    print("== metrics ==")
    print(xc.metrics.short_report())
    print(f"final loss: {job['losses'][-1]:.6f}")
    return 0 if last < first else 1


class _nullcontext:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


if __name__ == "__main__":
    sys.exit(main())
