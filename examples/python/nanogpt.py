"""A nanoGPT-style model in plain PyTorch, trained with gasloc's GASLoC (2-peer random rings) on
the default corpus that scripts/setup.sh fetched (data/corpus/nlp-corpus), one rank per process:

    PYTHONPATH=build/python build/gasloc launch -n 4 -- /usr/bin/python3 examples/python/nanogpt.py

Nothing here is gasloc's but the four lines marked "gasloc": the model, the byte-level data, the
optimizer and the loop are the user's own. Each rank reads its own slice of the corpus's documents.
Options: --steps N (default 300), --run-dir DIR (default runs/nanogpt), --algo NAME (gasloc),
--resume (continue the run's last checkpoint).
"""
import argparse
import glob
import json
import math
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

import gasloc  # gasloc

CONTEXT, DIM, HEADS, LAYERS, VOCAB = 64, 128, 4, 2, 256  # bytes


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.qkv, self.proj = nn.Linear(DIM, 3 * DIM), nn.Linear(DIM, DIM)
        self.mlp = nn.Sequential(nn.Linear(DIM, 4 * DIM), nn.GELU(), nn.Linear(4 * DIM, DIM))

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, HEADS, DIM // HEADS).transpose(1, 3).unbind(2)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(DIM // HEADS)
        att = att.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf")).softmax(-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, t, DIM))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok, self.pos = nn.Embedding(VOCAB, DIM), nn.Embedding(CONTEXT, DIM)
        self.blocks = nn.Sequential(*[Block() for _ in range(LAYERS)])
        self.ln, self.head = nn.LayerNorm(DIM), nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, idx, targets):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
        logits = self.head(self.ln(self.blocks(x)))
        return F.cross_entropy(logits.view(-1, VOCAB), targets.view(-1))


def documents() -> list:
    files = sorted(glob.glob("data/corpus/nlp-corpus/builds/doc-*.json"), key=lambda f: int(f.split("-")[-1][:-5]))
    if len(files) < 2:
        raise SystemExit("the default corpus is missing: run scripts/setup.sh (it fetches data/corpus/nlp-corpus)")
    return files


def as_bytes(files: list) -> torch.Tensor:
    text = "\n".join(s for f in files for s in json.load(open(f, encoding="utf-8")))
    return torch.frombuffer(bytearray(text.encode("utf-8")), dtype=torch.uint8).long()


def batch(data: torch.Tensor, gen: torch.Generator, size: int = 16):
    start = torch.randint(len(data) - CONTEXT - 1, (size,), generator=gen)
    x = torch.stack([data[s : s + CONTEXT] for s in start])
    y = torch.stack([data[s + 1 : s + CONTEXT + 1] for s in start])
    return x, y


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--run-dir", default="runs/nanogpt")
    ap.add_argument("--algo", default="gasloc")
    ap.add_argument("--resume", action="store_true")
    args = ap.parse_args()
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = GPT()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1)
    files = documents()
    train, val = as_bytes(files[:-1][rank::world]), as_bytes(files[-1:])  # each rank its own documents; the last for validation
    gen = torch.Generator().manual_seed(1000 + rank)
    val_batch = batch(val, torch.Generator().manual_seed(7), 64)
    # The unigram baseline: a model that learned only how often each byte occurs scores this.
    p = torch.bincount(train, minlength=VOCAB).double() / len(train)
    unigram = float(-(p[p > 0] * p[p > 0].log()).sum())

    def evaluate():
        model.eval()
        with torch.no_grad():
            loss = model(*val_batch)
        model.train()
        return loss

    settings = {"algo.name": args.algo, "algo.topology": "2peer", "algo.H": 20, "train.run_dir": args.run_dir,
                "train.eval_every": 100, "train.log_every": 20, "train.checkpoint_every": 100}
    with gasloc.Run(model, opt, settings=settings, evaluate=evaluate,  # gasloc
                    state=(gen.get_state, gen.set_state), resume=args.resume) as run:  # gasloc
        for step in range(run.start_step, args.steps):
            loss = model(*batch(train, gen))
            opt.zero_grad()
            loss.backward()
            run.sync_gradients()  # gasloc: nothing for GASLoC; the gradients' mean for allreduce
            opt.step()
            run.step(loss=loss.item())  # gasloc
            if rank == 0 and (step + 1) % 50 == 0:
                print(f"step {step + 1:4d} | loss {loss.item():.3f} (unigram baseline {unigram:.3f})", flush=True)
    if rank == 0:
        print(f"done: gasloc report {args.run_dir}")


if __name__ == "__main__":
    main()
