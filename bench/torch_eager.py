#!/usr/bin/python3
"""The gasloc Llama in PyTorch eager, for bench/side_by_side.sh (never used by tests or CI).

Same architecture as src/gasloc/model/llama.cpp's reference path (RMSNorm in fp32, rotate-half
RoPE, GQA by repeat_interleave, causal softmax attention, SwiGLU, untied LM head), the same
initialisation scale, and the same full step: forward, backward, clip to 1.0, AdamW with decay on
the matrices only. Prints one line of JSON: parameters, tokens/s (median of the timed steps).

  bench/torch_eager.py --dim 256 --layers 4 --heads 8 --kv-heads 4 --ffn 768 --vocab 8192 \
      --batch 8 --seq 128 --steps 6 --threads 1
"""
import argparse
import json
import math
import time

import torch
import torch.nn.functional as F


class RMSNorm(torch.nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def rope_tables(T, D, theta):
    inv_freq = 1.0 / torch.pow(theta, torch.arange(0, D, 2, dtype=torch.float64) / D)
    freqs = torch.outer(torch.arange(T, dtype=torch.float64), inv_freq)
    emb = torch.cat([freqs, freqs], -1)
    return emb.cos().float(), emb.sin().float()


def apply_rope(x, cos, sin):
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], -1)
    return x * cos + rotated * sin


class Block(torch.nn.Module):
    def __init__(self, a):
        super().__init__()
        D = a.dim // a.heads
        self.H, self.K, self.D = a.heads, a.kv_heads, D
        lin = lambda i, o: torch.nn.Linear(i, o, bias=False)
        self.q_proj, self.k_proj = lin(a.dim, a.heads * D), lin(a.dim, a.kv_heads * D)
        self.v_proj, self.o_proj = lin(a.dim, a.kv_heads * D), lin(a.heads * D, a.dim)
        self.gate_proj, self.up_proj, self.down_proj = lin(a.dim, a.ffn), lin(a.dim, a.ffn), lin(a.ffn, a.dim)
        self.ln1, self.ln2 = RMSNorm(a.dim, 1e-5), RMSNorm(a.dim, 1e-5)

    def forward(self, x, cos, sin, mask):
        B, T, _ = x.shape
        h = self.ln1(x)
        q = self.q_proj(h).view(B, T, self.H, self.D).transpose(1, 2)
        k = self.k_proj(h).view(B, T, self.K, self.D).transpose(1, 2)
        v = self.v_proj(h).view(B, T, self.K, self.D).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        rep = self.H // self.K
        if rep > 1:
            k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
        s = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(self.D)
        p = torch.softmax(s.masked_fill(mask, float("-inf")), -1)
        y = torch.matmul(p, v).transpose(1, 2).reshape(B, T, self.H * self.D)
        x = x + self.o_proj(y)
        h = self.ln2(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class Llama(torch.nn.Module):
    def __init__(self, a):
        super().__init__()
        self.a = a
        self.embed = torch.nn.Embedding(a.vocab, a.dim)
        self.layers = torch.nn.ModuleList([Block(a) for _ in range(a.layers)])
        self.norm = RMSNorm(a.dim, 1e-5)
        self.lm_head = torch.nn.Linear(a.dim, a.vocab, bias=False)
        with torch.no_grad():
            for n, p in self.named_parameters():
                if p.dim() >= 2:
                    std = 0.02 / math.sqrt(2 * a.layers) if ("o_proj" in n or "down_proj" in n) else 0.02
                    p.normal_(0.0, std)

    def loss(self, x, y):
        T = x.shape[1]
        cos, sin = rope_tables(T, self.a.dim // self.a.heads, 500000.0)
        mask = torch.ones(T, T, dtype=torch.bool).triu(1)
        h = self.embed(x)
        for layer in self.layers:
            h = layer(h, cos, sin, mask)
        logits = self.lm_head(self.norm(h))
        return F.cross_entropy(logits.reshape(-1, self.a.vocab), y.reshape(-1))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for k, d in [("dim", 256), ("layers", 4), ("heads", 8), ("kv-heads", 4), ("ffn", 768), ("vocab", 8192),
                 ("batch", 8), ("seq", 128), ("steps", 6), ("threads", 0)]:
        ap.add_argument("--" + k, type=int, default=d)
    a = ap.parse_args()
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    m = Llama(a)
    decay = [p for p in m.parameters() if p.dim() >= 2]
    rest = [p for p in m.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.95), eps=1e-8)
    x = torch.randint(0, a.vocab, (a.batch, a.seq))
    y = x.roll(1, 1)
    times = []
    for i in range(a.steps + 1):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=False)
        m.loss(x, y).backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        opt.step()
        if i > 0:
            times.append(time.perf_counter() - t0)
    times.sort()
    print(json.dumps({"params": sum(p.numel() for p in m.parameters()), "tokens_per_s": a.batch * a.seq / times[len(times) // 2],
                      "torch_threads": torch.get_num_threads(), "torch": torch.__version__}))


if __name__ == "__main__":
    main()
