"""A round's exchange from Python against the CLI trainer's (docs/performance.md, "The Python API's
round"): the same DiLoCo job over 2 Gloo ranks on loopback, run by `gasloc train` and by the Python
loop of tests/python/parts_worker.py over gasloc.models.llama, gasloc.optim and gasloc.data (which
gives its bits), in alternating turns. A round's exchange is the wall time of a step that ended a
round minus the time that step computed, from each rank's train lines in metrics.jsonl (both
sides write wall_time_s and compute_s there: the CLI worker's compute laps, and for Python the time
outside run.step()); the figures are medians over the rounds of every rank and turn, rounds after
the first (the first pays the connection's warm-up).

    PYTHONPATH=build/python /usr/bin/python3 bench/python_round_cost.py [--preset tiny] [--rounds 6] [--H 5] [--turns 3]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import gasloc

ROOT = Path(__file__).resolve().parent.parent
WORKER = ROOT / "tests" / "python" / "parts_worker.py"


def corpus(dir: Path, gasloc_bin: str) -> Path:
    """tests/lib.sh's small corpus, byte-level."""
    lines = [f"Line {i} of a small corpus about foxes and dogs number {i % 17}.\n\n" for i in range(1, 3001)]
    (dir / "corpus.txt").write_text("".join(lines))
    subprocess.run([gasloc_bin, "prepare", "--input", "corpus.txt", "--out", "data", "--byte-level", "--val-fraction",
                    "0.1"], cwd=dir, check=True, capture_output=True)
    return dir / "data"


def exchanges(run_dir: Path) -> list:
    """Per rank and round after the first: the round step's seconds outside its compute, and the
    communicator's blocked seconds in it (idle_s)."""
    out = []
    lines = [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines()]
    for worker in sorted({l["worker"] for l in lines if l["event"] == "train"}):
        train = sorted((l for l in lines if l["event"] == "train" and l["worker"] == worker), key=lambda l: l["step"])
        rounds = [(a, b) for a, b in zip(train, train[1:]) if b["round_done"]]
        out += [((b["wall_time_s"] - a["wall_time_s"]) - (b["compute_s"] - a["compute_s"]), b["idle_s"] - a["idle_s"])
                for a, b in rounds[1:]]
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--H", type=int, default=5)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--gasloc", default=str(ROOT / "build" / "gasloc"))
    args = ap.parse_args()
    steps = args.rounds * args.H
    job = {"model.preset": args.preset, "data.seq_len": 64, "data.batch_size": 4, "train.steps": steps,
           "algo.name": "diloco", "algo.H": args.H, "optim.name": "adamw"}
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": str(Path(gasloc.__file__).resolve().parent.parent)}
    sides = {"gasloc train": [], "Python loop": []}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        data = corpus(tmp, args.gasloc)
        params = gasloc.models.llama(args.preset, vocab_size=gasloc.data.open(str(data)).vocab_size).config["num_params"]
        sets = [a for k, v in job.items() for a in ("--set", f"{k}={v}")]
        for turn in range(args.turns):
            for side in (sides if turn % 2 == 0 else reversed(list(sides))):
                run_dir = tmp / f"{side.split()[0]}{turn}"
                if side == "gasloc train":
                    cmd = [args.gasloc, "train", *sets, "--set", f"data.dir={data}", "--set", "train.threads=1",
                           "--set", "train.blas_threads=1", "--set", "train.streams=1", "--set", "train.log_every=1",
                           "--set", "train.eval_every=0", "--set", "cluster.backend=gloo",
                           "--set", f"train.run_dir={run_dir}"]
                else:
                    cmd = [sys.executable, str(WORKER), str(data), str(run_dir), json.dumps(job)]
                t = time.monotonic()
                subprocess.run([args.gasloc, "launch", "-n", "2", "--", *cmd], cwd=tmp, env=env, check=True,
                               capture_output=True)
                print(f"turn {turn}: {side} {time.monotonic() - t:.1f} s", file=sys.stderr)
                sides[side] += exchanges(run_dir)
    med = {side: [statistics.median(x[i] for x in v) for i in (0, 1)] for side, v in sides.items()}
    (cli, cli_idle), (py, py_idle) = med["gasloc train"], med["Python loop"]
    print(f"DiLoCo over 2 Gloo ranks on loopback, {args.preset} preset ({params:,} parameters), H = {args.H}, "
          f"{args.rounds} rounds, {args.turns} turns ({len(sides['gasloc train'])} and {len(sides['Python loop'])} "
          "round exchanges)")
    print("| | round step outside compute (median) | communicator blocked (idle_s, median) |\n| --- | ---: | ---: |")
    print(f"| `gasloc train` | {cli * 1e3:.2f} ms | {cli_idle * 1e3:.2f} ms |")
    print(f"| Python loop under `gasloc.Run` | {py * 1e3:.2f} ms ({(py / cli - 1) * 100:+.1f}%) | "
          f"{py_idle * 1e3:.2f} ms ({(py_idle / cli_idle - 1) * 100 if cli_idle else 0:+.1f}%) |")

if __name__ == "__main__":
    main()
