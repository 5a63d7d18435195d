"""What run.step() costs on the steps where no round ends (docs/performance.md, "The Python
API's step"), against the training step it follows: examples/python/nanogpt.py's model, one
process, one thread. The same loop runs in alternating turns without gasloc and inside
gasloc.Run (DiLoCo with H larger than the steps timed, so no round ends); the figures are the
medians of the turns.

    PYTHONPATH=build/python /usr/bin/python3 bench/python_step_cost.py [--steps 200] [--turns 5]
"""
import argparse
import importlib.util
import pathlib
import statistics
import tempfile
import time

import torch

import gasloc

spec = importlib.util.spec_from_file_location(
    "nanogpt", pathlib.Path(__file__).resolve().parent.parent / "examples" / "python" / "nanogpt.py")
nanogpt = importlib.util.module_from_spec(spec)
spec.loader.exec_module(nanogpt)


def train_step(model, opt, x, y) -> float:
    loss = model(x, y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss.item()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--turns", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    data = torch.randint(256, (100_000,), generator=gen)
    x, y = nanogpt.batch(data, gen)
    plain, with_run, in_step = [], [], []
    for turn in range(args.turns):
        torch.manual_seed(0)
        model = nanogpt.GPT()
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        t0 = time.perf_counter()
        for _ in range(args.steps):
            train_step(model, opt, x, y)
        plain.append((time.perf_counter() - t0) / args.steps)

        torch.manual_seed(0)
        model = nanogpt.GPT()
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        settings = {"algo.name": "diloco", "algo.H": 10 * args.steps, "train.run_dir": tempfile.mkdtemp(),
                    "train.checkpoint_every": 0, "train.log_every": 10 * args.steps}
        with gasloc.Run(model, opt, settings=settings) as run:
            spent, t0 = 0.0, time.perf_counter()
            for _ in range(args.steps):
                loss = train_step(model, opt, x, y)
                t1 = time.perf_counter()
                run.step(loss=loss)
                spent += time.perf_counter() - t1
            with_run.append((time.perf_counter() - t0) / args.steps)
            in_step.append(spent / args.steps)
    p, w, s = statistics.median(plain), statistics.median(with_run), statistics.median(in_step)
    print(f"python_step_cost: torch {torch.__version__}, {sum(q.numel() for q in model.parameters())} parameters, "
          f"{args.steps} steps x {args.turns} turns")
    print(f"training step without gasloc   {p * 1e3:9.3f} ms")
    print(f"training step inside gasloc.Run {w * 1e3:8.3f} ms ({(w / p - 1) * 100:+.2f}%)")
    print(f"run.step() (no round ends)     {s * 1e6:9.1f} us ({s / p * 100:.3f}% of a step)")


if __name__ == "__main__":
    main()
