#!/usr/bin/python3
"""DiLoCo in Python over torch.distributed Gloo, the side-by-side row of bench/launch_side_by_side.sh
(never used by tests or CI).

One rank per process, started by `gasloc launch -n N -- /usr/bin/python3 bench/python_diloco.py ...` (the
launcher hosts a c10d TCPStore for commands that are not gasloc's, as torchrun's agent does).
Each rank trains the gasloc Llama of bench/torch_eager.py in PyTorch eager with AdamW (clip 1.0,
warmup then cosine), H inner steps, then all-reduces its pseudo-gradient and takes the outer
Nesterov step: the update of src/gasloc/algo (docs/algorithms.md, DiLoCo). Data: random tokens
(the speed does not depend on them). Rank 0 prints one line of JSON with tokens/s over the whole
run, every rank's tokens counted, from the first step to the last.

  gasloc launch -n 4 -- /usr/bin/python3 bench/python_diloco.py --dim 128 --layers 4 --heads 4 --kv-heads 2 \
      --ffn 352 --vocab 1024 --batch 8 --seq 64 --steps 120 --H 30 --threads 1
"""
import argparse
import json
import math
import os
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_eager import Llama  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for k, d in [("dim", 128), ("layers", 4), ("heads", 4), ("kv-heads", 2), ("ffn", 352), ("vocab", 1024),
                 ("batch", 8), ("seq", 64), ("steps", 120), ("H", 30), ("threads", 1)]:
        ap.add_argument("--" + k, type=int, default=d)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--outer-lr", type=float, default=1.0)
    ap.add_argument("--outer-momentum", type=float, default=0.5)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    dist.init_process_group("gloo", init_method="env://")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)  # the same initial model everywhere
    m = Llama(a)
    params = list(m.parameters())
    decay = [p for p in params if p.dim() >= 2]
    rest = [p for p in params if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8)
    warmup = 30
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: (s + 1) / warmup if s < warmup else 0.5 * (1 + math.cos(math.pi * (s - warmup) / max(1, a.steps - warmup))))
    anchor = [p.detach().clone() for p in params]
    momentum = [torch.zeros_like(p) for p in params]
    gen = torch.Generator().manual_seed(1000 + rank)
    dist.barrier()
    t0 = time.perf_counter()
    for step in range(1, a.steps + 1):
        x = torch.randint(0, a.vocab, (a.batch, a.seq + 1), generator=gen)
        opt.zero_grad(set_to_none=False)
        m.loss(x[:, :-1], x[:, 1:]).backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        if step % a.H == 0:  # the outer step on the mean pseudo-gradient
            with torch.no_grad():
                flat = torch.cat([(t - p).reshape(-1) for t, p in zip(anchor, params)])
                dist.all_reduce(flat)
                flat /= world
                at = 0
                for t, p, b in zip(anchor, params, momentum):
                    delta = flat[at:at + p.numel()].view_as(p)
                    at += p.numel()
                    b.mul_(a.outer_momentum).add_(delta)
                    t.sub_(a.outer_lr * (delta + a.outer_momentum * b))
                    p.copy_(t)
    dist.barrier()
    seconds = time.perf_counter() - t0
    if rank == 0:
        print(json.dumps({"ranks": world, "steps": a.steps, "seconds": seconds,
                          "tokens_per_s": world * a.steps * a.batch * a.seq / seconds,
                          "torch_threads": torch.get_num_threads(), "torch": torch.__version__}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
