#!/usr/bin/env python3
"""PyTorch references for scripts/gpu_check.sh (needs torch, and CUDA for the figures; never used
by tests or CI).

The model is gasloc's Llama written again in PyTorch, op for op as src/gasloc/model/llama.cpp's
reference path runs it under bf16 autocast: RMSNorm in fp32 on the residual stream, rotate-half
RoPE, GQA by repeat_interleave, SwiGLU, untied head through matmul, logits upcast to fp32 for the
cross-entropy. Its weights are gasloc's (LlamaImpl::init_weights: normal draws from a CPU
generator seeded SEED, in gasloc's parameter order, norm gains 1), its batches are bench_gpu's
(make_batch: arithmetic progressions modulo V, CPU generator seeded SEED + 1), and its step is
gasloc's: fp32 parameters and gradients in two flat buffers (matrices first), clip to 1.0 on the
flat norm, AdamW's reference ops in gasloc's order (lr 1e-3, betas 0.9/0.95, eps 1e-8, decay 0.1
on the matrices).

  parity     [--seeds 1234,1235] [--steps 50] [--batch 8] [--seq 128] [--cpu-seeds 1234]
    Loss curves of the tiny preset: fp32 on the CPU (bench_gpu parity's reference, when this
    replica is exact), fp32 on CUDA (TF32 off), and bf16 autocast on CUDA in four variants:
    RoPE in bf16 (gasloc: the tables are cast to q's dtype) or in fp32 (bench/torch_eager.py: fp32
    tables promote), attention through SDPA (gasloc) or matmul + softmax, which autocast runs in
    fp32 (bench/torch_eager.py). Prints each curve's max |d| against the fp32 curves.
  throughput [--preset 134m] [--seq 1024] [--batches 128,256] [--steps 10] [--modes mirror,torch]
    Full bf16 steps, median of STEPS after 3 warm-ups, tokens/s and MFU as bench_gpu prints them.
    mirror: gasloc's step (flat buffers, clip with .item(), AdamW reference ops, SDPA, bf16 RoPE).
    torch: the same model with PyTorch's idioms (per-tensor parameters, clip_grad_norm_ without a
    host sync, torch.optim.AdamW(fused=True)). compile: torch, with the loss under torch.compile.
  profile    [--preset 134m] [--batch 64]
    torch.profiler over 3 mirror steps: the CUDA kernels by device time, grouped.
  ablate     [--preset 134m] [--batch 64] [--steps 10]
    The mirror step with one piece swapped at a time: ATen's fused rms_norm, or RMSNorm, RoPE,
    the SwiGLU activation or the output layer with the loss under torch.compile, then all four.
"""
import argparse
import math
import statistics
import sys
import time

import torch
import torch.nn.functional as F

PRESETS = {  # dim, layers, heads, kv_heads, vocab, multiple_of, max_seq (LlamaConfig::preset)
    "nano": (64, 2, 4, 2, 512, 32, 128),
    "tiny": (256, 4, 8, 4, 8192, 256, 256),
    "small": (512, 8, 8, 4, 8192, 256, 512),
    "134m": (768, 12, 12, 12, 32000, 256, 1024),
}


class Cfg:
    def __init__(self, preset, seq):
        self.dim, self.layers, self.heads, self.kv, self.vocab, mult, max_seq = PRESETS[preset]
        hidden = 2 * (4 * self.dim) // 3
        self.ffn = mult * ((hidden + mult - 1) // mult)
        self.max_seq = max(max_seq, seq)
        self.eps, self.theta, self.std = 1e-5, 500000.0, 0.02
        self.D = self.dim // self.heads

    def shapes(self):
        """gasloc's named_parameters() order and shapes."""
        C, D, F_ = self.dim, self.D, self.ffn
        out = [("model.embed_tokens.weight", (self.vocab, C))]
        for i in range(self.layers):
            p = f"model.layers.{i}."
            out += [(p + "self_attn.q_proj.weight", (self.heads * D, C)), (p + "self_attn.k_proj.weight", (self.kv * D, C)),
                    (p + "self_attn.v_proj.weight", (self.kv * D, C)), (p + "self_attn.o_proj.weight", (C, self.heads * D)),
                    (p + "mlp.gate_proj.weight", (F_, C)), (p + "mlp.up_proj.weight", (F_, C)),
                    (p + "mlp.down_proj.weight", (C, F_)), (p + "input_layernorm.weight", (C,)),
                    (p + "post_attention_layernorm.weight", (C,))]
        out += [("model.norm.weight", (C,)), ("lm_head.weight", (self.vocab, C))]
        return out

    def num_params(self):
        return sum(math.prod(s) for _, s in self.shapes())

    def flops_per_token(self, T):  # LlamaConfig::flops_per_token (untied head)
        non_matmul = self.vocab * self.dim + self.layers * 2 * self.dim + self.dim
        return 6.0 * (self.num_params() - non_matmul) + 6.0 * self.layers * T * self.dim


def rope_tables(T, D, theta, device):
    inv_freq = 1.0 / torch.pow(theta, torch.arange(0, D, 2, dtype=torch.float64) / D)
    freqs = torch.outer(torch.arange(T, dtype=torch.float64), inv_freq)
    emb = torch.cat([freqs, freqs], -1)
    return emb.cos().float().to(device), emb.sin().float().to(device)


def apply_rope(x, cos, sin):
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], -1) * sin


def rms_norm(x, w, eps):
    reduced = x.dtype in (torch.bfloat16, torch.float16)
    xf = x.float() if reduced else x
    return w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def rms_norm_aten(x, w, eps):  # ablate: ATen's rms_norm (x is the fp32 residual stream here)
    return F.rms_norm(x, (x.shape[-1],), w, eps)


def rope_bf16(q, k, cos, sin):  # gasloc: the tables in q's dtype
    return apply_rope(q, cos.to(q.dtype), sin.to(q.dtype)), apply_rope(k, cos.to(k.dtype), sin.to(k.dtype))


def rope_fp32(q, k, cos, sin):  # fp32 tables: bf16 * fp32 promotes to fp32
    return apply_rope(q, cos, sin), apply_rope(k, cos, sin)


def swiglu_act(a, b):
    return F.silu(a) * b


def head_loss(x, g, w, targets, eps):
    logits = torch.matmul(rms_norm(x, g, eps), w.t())
    if logits.dtype in (torch.bfloat16, torch.float16):
        logits = logits.float()
    return F.cross_entropy(logits.reshape(-1, w.shape[0]), targets.reshape(-1))


class Llama(torch.nn.Module):
    def __init__(self, cfg, seed, device, rope="bf16", attn="sdpa"):
        super().__init__()
        self.cfg, self.rope, self.attn = cfg, rope, attn
        # The pieces bench/gpu_ref.py ablate swaps (for ATen's fused op, or torch.compile).
        self.parts = {"norm": rms_norm, "rope": rope_bf16 if rope == "bf16" else rope_fp32, "act": swiglu_act,
                      "head": head_loss}
        gen = torch.Generator().manual_seed(seed)
        resid = cfg.std / math.sqrt(2.0 * cfg.layers)
        ps = []
        for name, shape in cfg.shapes():
            if len(shape) == 1:
                t = torch.ones(shape)
            else:
                std = resid if ("o_proj" in name or "down_proj" in name) else cfg.std
                t = torch.normal(0.0, std, shape, generator=gen)
            ps.append(torch.nn.Parameter(t.to(device)))
        self.ps = torch.nn.ParameterList(ps)
        cos, sin = rope_tables(cfg.max_seq, cfg.D, cfg.theta, device)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        self.register_buffer("mask", torch.ones(cfg.max_seq, cfg.max_seq, dtype=torch.bool, device=device).triu(1),
                             persistent=False)

    def flatten(self):
        """gasloc's FlatParams: matrices first, then the gains; parameters and gradients are views."""
        order = sorted(range(len(self.ps)), key=lambda i: self.ps[i].dim() < 2)  # stable
        total = sum(self.ps[i].numel() for i in order)
        dev = self.ps[0].device
        self.flat_p = torch.empty(total, device=dev)
        self.flat_g = torch.zeros(total, device=dev)
        self.decay_numel, off = 0, 0
        for i in order:
            p, n = self.ps[i], self.ps[i].numel()
            self.flat_p[off:off + n].copy_(p.detach().reshape(-1))
            q = torch.nn.Parameter(self.flat_p[off:off + n].view(p.shape))
            q.grad = self.flat_g[off:off + n].view(p.shape)
            self.ps[i] = q
            off += n
            if q.dim() >= 2:
                self.decay_numel = off

    def attention(self, x, wq, wk, wv, wo, T):
        c = self.cfg
        B = x.shape[0]
        q = F.linear(x, wq).view(B, T, c.heads, c.D).transpose(1, 2)
        k = F.linear(x, wk).view(B, T, c.kv, c.D).transpose(1, 2)
        v = F.linear(x, wv).view(B, T, c.kv, c.D).transpose(1, 2)
        q, k = self.parts["rope"](q, k, self.cos[:T], self.sin[:T])
        rep = c.heads // c.kv
        if rep > 1:
            k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
        if self.attn == "sdpa" and hasattr(F, "scaled_dot_product_attention"):  # torch 2.x
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # bench/torch_eager.py: autocast runs softmax in fp32
            s = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(c.D)
            y = torch.matmul(torch.softmax(s.masked_fill(self.mask[:T, :T], float("-inf")), -1), v)
        return F.linear(y.transpose(1, 2).reshape(B, T, c.heads * c.D), wo)

    def forward(self, tokens, targets):
        c, ps, norm, act = self.cfg, self.ps, self.parts["norm"], self.parts["act"]
        T = tokens.shape[1]
        x = F.embedding(tokens, ps[0])
        for i in range(c.layers):
            wq, wk, wv, wo, wg, wu, wd, g1, g2 = [ps[1 + 9 * i + j] for j in range(9)]
            h = x + self.attention(norm(x, g1, c.eps), wq, wk, wv, wo, T)
            n = norm(h, g2, c.eps)
            x = h + F.linear(act(F.linear(n, wg), F.linear(n, wu)), wd)
        return self.parts["head"](x, ps[1 + 9 * c.layers], ps[2 + 9 * c.layers], targets, c.eps)


class MirrorStep:
    """gasloc's Replica::step: zero the flat gradient, loss under autocast, backward, clip with a
    host read of the norm, AdamW's reference ops on the flat buffers."""

    def __init__(self, model, dtype, wd=0.1, b1=0.9, b2=0.95, eps=1e-8):
        model.flatten()
        self.m, self.dtype = model, dtype
        self.mom1, self.mom2 = torch.zeros_like(model.flat_p), torch.zeros_like(model.flat_p)
        self.k, self.wd, self.b1, self.b2, self.eps = 0, wd, b1, b2, eps

    def __call__(self, x, y, lr):
        m = self.m
        m.flat_g.zero_()
        with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=self.dtype == "bf16"):
            loss = m(x, y)
        loss.backward()
        with torch.no_grad():
            norm = m.flat_g.norm().item()
            if norm > 1.0:
                m.flat_g.mul_(1.0 / (norm + 1e-6))
            self.k += 1
            bc1, bc2 = 1.0 - self.b1 ** self.k, 1.0 - self.b2 ** self.k
            if self.wd and m.decay_numel:
                m.flat_p[:m.decay_numel].mul_(1.0 - lr * self.wd)
            self.mom1.mul_(self.b1).add_(m.flat_g, alpha=1.0 - self.b1)
            self.mom2.mul_(self.b2).addcmul_(m.flat_g, m.flat_g, value=1.0 - self.b2)
            denom = (self.mom2.sqrt() / math.sqrt(bc2)).add_(self.eps)
            m.flat_p.addcdiv_(self.mom1, denom, value=-lr / bc1)
        return loss


class TorchStep:
    """The same model with PyTorch's idioms: clip_grad_norm_ (no host read), fused AdamW."""

    def __init__(self, model, dtype, compiled=False):
        self.m, self.dtype = model, dtype
        decay = [p for p in model.parameters() if p.dim() >= 2]
        rest = [p for p in model.parameters() if p.dim() < 2]
        kw = {"fused": True} if next(model.parameters()).is_cuda else {}
        self.opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                                     lr=1e-3, betas=(0.9, 0.95), eps=1e-8, **kw)
        self.fwd = torch.compile(model) if compiled else model

    def __call__(self, x, y, lr):
        for g in self.opt.param_groups:
            g["lr"] = lr
        self.opt.zero_grad(set_to_none=True)
        with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=self.dtype == "bf16"):
            loss = self.fwd(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.m.parameters(), 1.0)
        self.opt.step()
        return loss


def make_batch(B, T, V, g):  # bench_gpu's make_batch
    start = torch.randint(0, V, (B, 1), generator=g, dtype=torch.int64)
    stride = torch.randint(1, 17, (B, 1), generator=g, dtype=torch.int64)
    seq = (start + stride * torch.arange(T + 1, dtype=torch.int64).unsqueeze(0)).remainder(V)
    return seq[:, :T].contiguous(), seq[:, 1:].contiguous()


def curve(cfg, seed, steps, B, T, device, dtype, rope="bf16", attn="sdpa", lr=1e-3):
    step = MirrorStep(Llama(cfg, seed, device, rope, attn), dtype)
    g = torch.Generator().manual_seed(seed + 1)
    out = []
    for _ in range(steps):
        x, y = make_batch(B, T, cfg.vocab, g)
        out.append(step(x.to(device), y.to(device), lr).item())
    return out


def parity(a):
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    cfg = Cfg("tiny", a.seq)
    dev = torch.device(a.device)
    pts = [k for k in (1, 10, 20, 30, 40, 50) if k <= a.steps]
    show = lambda c: " ".join(f"{k}:{c[k - 1]:.4f}" for k in pts)
    drift = lambda c, r: max(abs(u - v) if math.isfinite(u - v) else math.inf for u, v in zip(c, r))
    print(f"torch parity: torch {torch.__version__}, device {a.device}, tiny ({cfg.num_params() / 1e6:.2f}M), batch "
          f"{a.batch}x{a.seq}, {a.steps} steps, lr 1e-3; gasloc's weights, batches and step (bench/gpu_ref.py)", flush=True)
    variants = [("bf16", "bf16", "sdpa", "gasloc's ops: RoPE in bf16, SDPA"), ("bf16", "fp32", "sdpa", "RoPE in fp32, SDPA"),
                ("bf16", "bf16", "math", "RoPE in bf16, matmul+fp32 softmax"),
                ("bf16", "fp32", "math", "RoPE in fp32, matmul+fp32 softmax (torch_eager.py)")]
    summary = {v[3]: [] for v in variants}
    for seed in a.seeds:
        t0 = time.time()
        ref_cpu = curve(cfg, seed, a.steps, a.batch, a.seq, torch.device("cpu"), "fp32") if seed in a.cpu_seeds else None
        if ref_cpu:
            print(f"torch parity seed {seed} fp32 cpu  : {show(ref_cpu)} ({time.time() - t0:.1f} s)", flush=True)
        ref = curve(cfg, seed, a.steps, a.batch, a.seq, dev, "fp32")
        line = f"; max |d| vs CPU fp32 {drift(ref, ref_cpu):.3e}" if ref_cpu else ""
        print(f"torch parity seed {seed} fp32 {a.device}: {show(ref)}{line}", flush=True)
        for dt, rope, attn, label in variants:
            c = curve(cfg, seed, a.steps, a.batch, a.seq, dev, dt, rope, attn)
            d = drift(c, ref)
            summary[label].append(d)
            line = f"; vs CPU fp32 {drift(c, ref_cpu):.3e}" if ref_cpu else ""
            print(f"torch parity seed {seed} bf16 {a.device} [{label}]: {show(c)}; max |d| vs {a.device} fp32 {d:.3e}{line}",
                  flush=True)
    for label, ds in summary.items():
        print(f"torch parity bf16 [{label}] max |d| vs fp32 over seeds {','.join(map(str, a.seeds))}: "
              + " ".join(f"{d:.3f}" for d in ds) + f" (largest {max(ds):.3f})")


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def timed(step, x, y, steps, dev):
    for _ in range(3):
        loss = step(x, y, 1e-4)
    sync(dev)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        loss = step(x, y, 1e-4)
        sync(dev)
        times.append(time.perf_counter() - t0)
    return statistics.median(times), loss.item()


def throughput(a):
    cfg = Cfg(a.preset, a.seq)
    dev = torch.device(a.device)
    fpt = cfg.flops_per_token(a.seq)
    print(f"torch throughput: torch {torch.__version__}, preset {a.preset} ({cfg.num_params() / 1e6:.1f}M), seq {a.seq}, "
          f"bf16 autocast, FLOPs/token {fpt:.4g}, peak {a.peak_tflops:g}, measured GEMM {a.gemm_tflops:g} TFLOP/s",
          flush=True)
    g = torch.Generator().manual_seed(1234)
    for mode in a.modes:
        for B in a.batches:
            try:
                t0 = time.time()
                model = Llama(cfg, 1234, dev)
                step = MirrorStep(model, "bf16") if mode == "mirror" else TorchStep(model, "bf16", mode == "compile")
                x, y = make_batch(B, a.seq, cfg.vocab, g)
                s, loss = timed(step, x.to(dev), y.to(dev), a.steps, dev)
                tps = B * a.seq / s
                tf = tps * fpt / 1e12
                print(f"torch {mode:>7} batch {B:>4} x {a.seq}: {s:.3f} s/step (median of {a.steps}), {tps:.0f} tokens/s, "
                      f"{tf:.1f} TFLOP/s model, MFU {100 * tf / a.peak_tflops:.1f}% of peak, "
                      f"{100 * tf / a.gemm_tflops if a.gemm_tflops else 0:.1f}% of measured GEMM, loss {loss:.3f}, "
                      f"peak memory {torch.cuda.max_memory_allocated(dev) / 2**30 if dev.type == 'cuda' else 0:.1f} GiB "
                      f"({time.time() - t0:.0f} s with set-up)",
                      flush=True)
            except torch.cuda.OutOfMemoryError as e:
                print(f"torch {mode:>7} batch {B:>4} x {a.seq}: does not fit ({str(e).splitlines()[0][:160]})", flush=True)
            finally:
                model = step = None
                if dev.type == "cuda":
                    torch.cuda.empty_cache()
                    torch.cuda.reset_peak_memory_stats(dev)


def ablate(a):
    """gasloc's step in PyTorch with one piece swapped at a time: ATen's rms_norm, or one piece
    under torch.compile (its backward too), then all pieces compiled; tokens/s against eager."""
    cfg = Cfg(a.preset, a.seq)
    dev = torch.device(a.device)
    fpt = cfg.flops_per_token(a.seq)
    if hasattr(torch, "_dynamo"):
        torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
    x, y = make_batch(a.batch, a.seq, cfg.vocab, torch.Generator().manual_seed(1234))
    x, y = x.to(dev), y.to(dev)
    comp = lambda f: torch.compile(f, dynamic=False)
    variants = [("eager (gasloc's ops)", lambda: {}), ("ATen rms_norm", lambda: {"norm": rms_norm_aten}),
                ("compiled RMSNorm", lambda: {"norm": comp(rms_norm)}), ("compiled RoPE", lambda: {"rope": comp(rope_bf16)}),
                ("compiled SwiGLU act", lambda: {"act": comp(swiglu_act)}),
                ("compiled head+loss", lambda: {"head": comp(head_loss)}),
                ("all four compiled", lambda: {"norm": comp(rms_norm), "rope": comp(rope_bf16), "act": comp(swiglu_act),
                                               "head": comp(head_loss)})]
    print(f"torch ablate: torch {torch.__version__}, preset {a.preset}, batch {a.batch} x {a.seq}, gasloc's step in "
          f"PyTorch (bf16 autocast, SDPA), one piece swapped; median of {a.steps} after 3 warm-ups", flush=True)
    base = None
    for label, parts in variants:
        if label not in a.only and a.only != ["all"]:
            continue
        t0 = time.time()
        try:
            model = Llama(cfg, 1234, dev)
            model.parts.update(parts())
            s, loss = timed(MirrorStep(model, "bf16"), x, y, a.steps, dev)
        except Exception as e:  # noqa: BLE001 - report and go on
            print(f"torch ablate [{label}]: failed ({type(e).__name__}: {str(e).splitlines()[0][:160]})", flush=True)
            continue
        finally:
            model = None
            if dev.type == "cuda":
                torch.cuda.empty_cache()
        base = base or s
        tf = a.batch * a.seq / s * fpt / 1e12
        print(f"torch ablate [{label}]: {s * 1e3:.1f} ms/step, {a.batch * a.seq / s:.0f} tokens/s, {base / s:.2f}x eager, "
              f"{100 * tf / a.gemm_tflops if a.gemm_tflops else 0:.1f}% of measured GEMM, loss {loss:.4f} "
              f"({time.time() - t0:.0f} s with set-up and compilation)", flush=True)


def profile(a):
    from torch.profiler import ProfilerActivity, profile as prof_ctx
    cfg = Cfg(a.preset, a.seq)
    dev = torch.device(a.device)
    step = MirrorStep(Llama(cfg, 1234, dev), "bf16")
    x, y = make_batch(a.batch, a.seq, cfg.vocab, torch.Generator().manual_seed(1234))
    x, y = x.to(dev), y.to(dev)
    for _ in range(3):
        step(x, y, 1e-4)
    sync(dev)
    n = 3
    t0 = time.perf_counter()
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    with prof_ctx(activities=acts) as prof:
        for _ in range(n):
            step(x, y, 1e-4)
        sync(dev)
    wall = (time.perf_counter() - t0) / n
    kern = {}
    for e in prof.events():
        if "CUDA" not in str(getattr(e, "device_type", "")) and dev.type == "cuda":
            continue  # on CPU (a dry run), the operators stand in for kernels
        us = e.time_range.elapsed_us()
        c, t = kern.get(e.name, (0, 0.0))
        kern[e.name] = (c + 1, t + us)
    total = sum(t for _, t in kern.values()) or 1.0

    def group(name):
        s = name.lower()
        if any(k in s for k in ("flash", "fmha", "attention", "efficient", "sdpa")):
            return "attention"  # first: cuDNN's SDPA kernels carry sm90_ in their names
        if any(k in s for k in ("gemm", "nvjet", "cutlass", "xmma", "cublas", "sm90_")):
            return "GEMM"
        if "memcpy" in s or "memset" in s:
            return "memcpy/memset"
        if any(k in s for k in ("reduce", "norm", "softmax", "nll", "cross_entropy", "log_softmax")):
            return "reductions (norms, softmax, loss)"
        return "elementwise and other"

    groups = {}
    for name, (c, t) in kern.items():
        groups[group(name)] = groups.get(group(name), 0.0) + t
    print(f"torch profile: mirror step, preset {a.preset}, batch {a.batch} x {a.seq}, {n} steps: wall {wall * 1e3:.1f} ms/step "
          f"(profiler on), CUDA kernel time {total / n / 1e3:.1f} ms/step ({100 * total / n / 1e6 / wall:.0f}% of wall), "
          f"{sum(c for c, _ in kern.values()) // n} kernels/step")
    for gname, t in sorted(groups.items(), key=lambda kv: -kv[1]):
        print(f"torch profile group {gname}: {t / n / 1e3:.2f} ms/step, {100 * t / total:.1f}%")
    for name, (c, t) in sorted(kern.items(), key=lambda kv: -kv[1][1])[:a.top]:
        print(f"torch profile kernel {100 * t / total:5.1f}% {t / n / 1e3:7.2f} ms/step x{c // n:<4d} {name[:150]}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["parity", "throughput", "profile", "ablate"])
    ints = lambda s: [int(v) for v in s.split(",") if v]
    ap.add_argument("--preset", default="134m")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--seeds", type=ints, default=[1234])
    ap.add_argument("--cpu-seeds", type=ints, default=[1234])
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--batch", type=int, default=None)
    ap.add_argument("--seq", type=int, default=None)
    ap.add_argument("--batches", type=ints, default=[128, 256])
    ap.add_argument("--modes", type=lambda s: s.split(","), default=["mirror", "torch"])
    ap.add_argument("--peak-tflops", type=float, default=989.4)
    ap.add_argument("--gemm-tflops", type=float, default=0.0)
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--only", type=lambda s: s.split(","), default=["all"], help="ablate: variant labels to run")
    a = ap.parse_args()
    if a.what == "parity":
        a.steps, a.batch, a.seq = a.steps or 50, a.batch or 8, a.seq or 128
        parity(a)
    else:
        a.steps, a.batch, a.seq = a.steps or 10, a.batch or 64, a.seq or 1024
        {"throughput": throughput, "profile": profile, "ablate": ablate}[a.what](a)


if __name__ == "__main__":
    sys.exit(main())
