"""A small GPT-style character model trained on the Python standard library's own source.

Real language-model training on text every Python install ships (a fixed list of stdlib
modules, so the corpus is the same on every machine with the same Python): a causal
transformer, AdamW, linear warm-up then cosine decay, gradient clipping at 1.0, and every
``--eval-every`` steps a validation loss on held-out text, sent both as an ``eval`` event
and as a ``val_loss`` metric. Faults (from ``--fault-at``):

- ``hang``: the training thread blocks for ``--hang-s`` seconds inside the live process
  (a deadlocked collective, a stuck data loader); the agent's thread keeps sending heartbeats.
- ``repeat_batch``: the same batch every step from then on (memorisation).
- ``lr_x30``: the learning rate jumps to 30x its schedule and stays there.

Run by the recorder (``python -m bench.corpus.record --only gpt-clean``), or by hand
beside a daemon: ``VIGIL_RUN_ID=gpt python -m bench.corpus.gpt --steps 500``.
"""

from __future__ import annotations

import sysconfig
import threading
import time
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

import trainvigil

from ._common import FaultLog, parser, set_lr, setup, warmup_cosine

MODULES = (
    "argparse.py", "difflib.py", "textwrap.py", "pprint.py", "fractions.py", "statistics.py",
    "calendar.py", "shlex.py", "heapq.py", "bisect.py", "csv.py", "string.py", "dataclasses.py",
    "functools.py", "enum.py", "configparser.py",
)  # fmt: skip
"""Standard-library files whose text is the corpus (about 700 kB)."""


def load_text() -> str:
    """The corpus: the listed stdlib sources, characters outside printable ASCII as ``?``."""
    root = Path(sysconfig.get_paths()["stdlib"])
    text = "\n".join((root / name).read_text(encoding="utf-8") for name in MODULES)
    return "".join(c if c == "\n" or 32 <= ord(c) < 127 else "?" for c in text)


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attn.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    def __init__(self, vocab: int, ctx: int, dim: int, heads: int, layers: int) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, dim), nn.Embedding(ctx, dim)
        self.blocks = nn.Sequential(*(Block(dim, heads) for _ in range(layers)))
        self.ln, self.head = nn.LayerNorm(dim), nn.Linear(dim, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
        return self.head(self.ln(self.blocks(x)))


def batch(data: torch.Tensor, ctx: int, size: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    starts = torch.randint(0, len(data) - ctx - 1, (size,), generator=gen)
    x = torch.stack([data[s : s + ctx] for s in starts.tolist()])
    y = torch.stack([data[s + 1 : s + ctx + 1] for s in starts.tolist()])
    return x, y


def main() -> None:
    p = parser(__doc__.splitlines()[0], steps=11_000, faults=("hang", "repeat_batch", "lr_x30"))
    p.add_argument("--ctx", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--eval-every", type=int, default=200)
    p.add_argument("--hang-s", type=float, default=150.0)
    args = p.parse_args()
    setup(args.seed)
    faults = FaultLog(args.fault_log)

    text = load_text()
    chars = sorted(set(text))
    data = _encode(text, chars)
    cut = int(0.9 * len(data))
    train, held_out = data[:cut], data[cut:]
    gen = torch.Generator().manual_seed(args.seed)
    val_batches = [batch(held_out, args.ctx, 32, torch.Generator().manual_seed(1000 + i)) for i in range(4)]

    model = TinyGPT(len(chars), args.ctx, args.dim, heads=4, layers=args.layers)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1, betas=(0.9, 0.95))
    vigil = trainvigil.init()
    repeated: tuple[torch.Tensor, torch.Tensor] | None = None
    tokens = args.ctx * args.batch_size
    for step in range(args.steps):
        start = time.perf_counter()
        lr = warmup_cosine(step, args.steps, warmup=200, peak=args.lr, floor=args.lr / 10)
        at_fault = args.fault != "none" and step >= args.fault_at
        if at_fault:
            faults.inject(args.fault, step)
            if args.fault == "lr_x30":
                lr *= 30
            elif args.fault == "hang" and step == args.fault_at:
                threading.Event().wait(args.hang_s)  # blocked like a stuck collective: no step, no CPU
        set_lr(optimizer, lr)
        if at_fault and args.fault == "repeat_batch":
            repeated = repeated or batch(train, args.ctx, args.batch_size, gen)
            x, y = repeated
        else:
            x, y = batch(train, args.ctx, args.batch_size, gen)
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
        optimizer.step()
        vigil.log(
            step, loss=loss.item(), grad_norm=float(grad_norm), lr=lr, step_time=time.perf_counter() - start,
            tokens=tokens,
        )  # fmt: skip
        if (step + 1) % args.eval_every == 0:
            val = evaluate(model, val_batches)
            vigil.log(step, val_loss=val)
            vigil.event("eval", step=step, val_loss=val)
            print(f"step {step + 1}/{args.steps} loss {loss.item():.3f} val_loss {val:.3f}", flush=True)
    faults.done(args.steps)
    vigil.close(timeout=30)


def _encode(text: str, chars: list[str]) -> torch.Tensor:
    index = {c: i for i, c in enumerate(chars)}
    return torch.tensor([index[c] for c in text], dtype=torch.long)


@torch.no_grad()
def evaluate(model: nn.Module, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> float:
    model.eval()
    losses = [F.cross_entropy(model(x).flatten(0, 1), y.flatten()).item() for x, y in batches]
    model.train()
    return sum(losses) / len(losses)


if __name__ == "__main__":
    main()
