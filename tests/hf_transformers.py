#!/usr/bin/env python3
"""gasloc's Hugging Face export and import against the real thing: PyPI's transformers.

    .venv/bin/python tests/hf_transformers.py path/to/gasloc

1. Export: a model gasloc trained (nano shape, a 300-token SentencePiece vocabulary) is exported
   with `gasloc export` and loaded by transformers' LlamaForCausalLM. On the first validation
   batch, transformers' logits and loss equal gasloc's forward (`gasloc eval --logits-out`), and
   greedy decoding gives the same tokens (`gasloc generate --temperature 0 --json`).
2. Import: a Llama written by transformers' save_pretrained (random init, a small GQA config with
   rms_norm_eps 1e-6 and rope_theta 10000, untied) is read by `gasloc eval --model` with the same
   logits, and `gasloc train --init-from DIR` starts from it (the run's model before any update
   scores transformers' validation loss on the same batches) and continues pretraining it. A config.json that does not
   match the weights is refused naming the tensor.

Tolerances (fp32 on the CPU; the two differ only in kernels and summation order): logits within
2e-4 absolute (values of order 1-10), the loss within 1e-5 relative.
CI runs it from build-torch2 (scripts/test.sh), where .venv has transformers.
"""
import json
import math
import os
import subprocess
import sys
import tempfile

import torch
from safetensors.torch import load_file
from transformers import LlamaConfig, LlamaForCausalLM

LOGIT_TOL = 2e-4
LOSS_RTOL = 1e-5
G = os.path.abspath(sys.argv[1])


def run(*args, expect_fail=False):
    r = subprocess.run([G, *args], capture_output=True, text=True)
    if expect_fail:
        if r.returncode != 2:
            sys.exit(f"FAIL: expected exit 2 from gasloc {' '.join(args)}, got {r.returncode}: {r.stdout}{r.stderr}")
        return r.stdout + r.stderr
    if r.returncode != 0:
        sys.exit(f"FAIL: gasloc {' '.join(args)} exited {r.returncode}:\n{r.stdout}\n{r.stderr}")
    return r.stdout


def check(ok, what):
    print(("ok    " if ok else "FAIL  ") + what, flush=True)
    if not ok:
        sys.exit(1)


def hf_logits(model_dir, inputs, targets):
    model = LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager").eval()
    with torch.no_grad():
        logits = model(input_ids=inputs).logits.float()
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1)).item()
    return model, logits, loss


def compare_forward(model_dir, data_dir, what):
    """gasloc's logits on the first validation batch against transformers' on the same tokens."""
    out = os.path.join(os.path.dirname(model_dir), os.path.basename(model_dir) + "-logits.safetensors")
    run("eval", "--model", model_dir, "--data", data_dir, "--batch-size", "4", "--seq-len", "32", "--batches", "1",
        "--logits-out", out, "--json")
    g = load_file(out)
    with open(out, "rb") as f:  # the loss is in the file's metadata
        n = int.from_bytes(f.read(8), "little")
        g_loss = float(json.loads(f.read(n))["__metadata__"]["loss"])
    model, logits, loss = hf_logits(model_dir, g["inputs"], g["targets"])
    diff = (logits - g["logits"]).abs().max().item()
    check(diff < LOGIT_TOL, f"{what}: logits max |diff| {diff:.2e} < {LOGIT_TOL} (values up to {logits.abs().max():.2f})")
    check(abs(loss - g_loss) <= LOSS_RTOL * abs(loss), f"{what}: loss transformers {loss:.6f}, gasloc {g_loss:.6f}")
    return model, loss


def corpus(path):
    words = "the quick brown fox jumps over a lazy dog while seven small birds sing about rivers hills and rain".split()
    with open(path, "w") as f:
        for i in range(400):
            f.write(" ".join(words[(i * 7 + k * 3) % len(words)] for k in range(5 + i % 9)).capitalize() + ".\n\n")


def main():
    tmp = tempfile.mkdtemp(prefix="gasloc-hf-")
    os.chdir(tmp)
    corpus("corpus.txt")
    run("prepare", "--input", "corpus.txt", "--out", "data", "--vocab-size", "300", "--val-fraction", "0.2")
    vocab = json.load(open("data/dataset.json"))["tokenizer"]["vocab_size"]
    common = ["--set", "data.dir=data", "--set", "data.seq_len=32", "--set", "data.batch_size=8",
              "--set", "data.val_batches=2", "--set", "train.threads=1", "--set", "train.log_every=10"]

    # 1. gasloc -> transformers
    run("train", "--config", CONFIG, "--set", "model.preset=nano", "--set", "train.steps=40",
        "--set", "train.eval_every=40", "--set", "train.run_dir=run", *common)
    run("export", "--run", "run", "--out", "hf")
    model, _ = compare_forward(os.path.abspath("hf"), "data", "export")
    gen = json.loads(run("generate", "--model", "hf", "--prompt", "The quick", "--max-tokens", "20",
                         "--temperature", "0", "--no-stop", "--json"))
    with torch.no_grad():
        ids = model.generate(torch.tensor([gen["prompt_ids"]]), max_new_tokens=20, do_sample=False,
                             eos_token_id=None, pad_token_id=0)
    new = ids[0, len(gen["prompt_ids"]):].tolist()
    check(new == gen["new_ids"], f"export: greedy decoding, transformers {new} vs gasloc {gen['new_ids']}")

    # 2. transformers -> gasloc
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-6,
                      rope_theta=10000.0, tie_word_embeddings=False)
    LlamaForCausalLM(cfg).save_pretrained("hf_in", safe_serialization=True)
    _, loss0 = compare_forward(os.path.abspath("hf_in"), "data", "import")
    # The model a run starts from: one step at a learning rate far below fp32's resolution of the
    # weights leaves every weight as it was, and the run's evaluation at its last step scores it.
    def evals(run_dir):
        return [e for e in map(json.loads, open(f"{run_dir}/metrics.jsonl")) if e.get("event") == "eval"]
    run("train", "--init-from", "hf_in", "--config", CONFIG, "--set", "train.steps=1", "--set", "optim.lr=1e-30",
        "--set", "optim.warmup_steps=0", "--set", "train.run_dir=start", *common)
    start = evals("start")[-1]["val_loss"]
    # The trainer's evaluation scores data.val_batches batches; transformers scores the same ones.
    from_hf = hf_val_loss("hf_in", "data", 8, 32, 2)
    check(abs(start - from_hf) <= LOSS_RTOL * from_hf,
          f"--init-from: the run starts from transformers' model: validation loss {start:.6f}, transformers {from_hf:.6f}")
    run("train", "--init-from", "hf_in", "--config", CONFIG, "--set", "train.steps=30", "--set", "train.eval_every=30",
        "--set", "train.run_dir=cont", "--set", "optim.warmup_steps=5", *common)
    last = evals("cont")[-1]["val_loss"]
    check(last < start - 0.05, f"--init-from: pretraining continues ({start:.4f} -> {last:.4f} after 30 steps)")
    bad = json.load(open("hf_in/config.json"))
    bad["intermediate_size"] = 192
    os.makedirs("hf_bad", exist_ok=True)
    json.dump(bad, open("hf_bad/config.json", "w"))
    os.link("hf_in/model.safetensors", "hf_bad/model.safetensors")
    err = run("train", "--init-from", "hf_bad", "--config", CONFIG, "--set", "train.run_dir=bad", *common,
              expect_fail=True)
    check("model.layers.0.mlp.gate_proj.weight" in err, "--init-from: a config that does not match the weights "
          f"names the tensor: {err.strip().splitlines()[0][:160]}")
    print("hf_transformers: all checks passed")


def hf_val_loss(model_dir, data_dir, batch, seq, batches):
    """transformers' mean loss over gasloc eval's batches (written by --logits-out one at a time)."""
    losses = []
    model = LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager").eval()
    out = "val-batches.safetensors"
    for b in range(batches):
        run("eval", "--model", model_dir, "--data", data_dir, "--batch-size", str(batch), "--seq-len", str(seq),
            "--batches", str(b + 1), "--logits-out", out, "--logits-batch", str(b))
        g = load_file(out)
        with torch.no_grad():
            logits = model(input_ids=g["inputs"]).logits.float()
        losses.append(torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)),
                                                        g["targets"].reshape(-1)).item())
    return sum(losses) / len(losses)


CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "configs", "tiny.toml")

if __name__ == "__main__":
    main()
