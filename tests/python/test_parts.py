"""gasloc's own parts from Python (docs/python.md, "gasloc's model, optimizers and data"): the
Llama, the inner optimizers and the prepared data in a Python loop give the CLI trainer's bits."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import gasloc
from gasloc import _core

HERE = Path(__file__).resolve().parent


def gasloc_bin() -> str:
    path = os.environ.get("GASLOC_BIN")
    if not path:
        pytest.fail("set GASLOC_BIN to the gasloc program (ctest's python_api test does)")
    return os.path.abspath(path)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    """A byte-level dataset of a small corpus (tests/lib.sh's prepare_corpus)."""
    root = tmp_path_factory.mktemp("parts_data")
    lines = [f"Line {i} of a small corpus about foxes and dogs number {i % 17}.\n\n" for i in range(1, 301)]
    (root / "corpus.txt").write_text("".join(lines))
    subprocess.run([gasloc_bin(), "prepare", "--input", "corpus.txt", "--out", "data", "--byte-level",
                    "--val-fraction", "0.1"], cwd=root, check=True, capture_output=True)
    return root / "data"


# The job both sides run: the nano model on the corpus, one thread and one BLAS thread per product
# (another count may change a product's last bits: core/blas_threads.hpp).
JOB = {"model.preset": "nano", "data.seq_len": 32, "data.batch_size": 4, "train.steps": 15, "algo.name": "diloco",
       "algo.H": 5}
ONE_THREAD = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1",
              "PYTHONPATH": str(Path(gasloc.__file__).resolve().parent.parent)}


def run(cmd: list, cwd: Path) -> None:
    r = subprocess.run(cmd, cwd=cwd, env=ONE_THREAD, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"{' '.join(map(str, cmd))}\n{r.stdout}\n{r.stderr}"


def checkpoint(run_dir: Path, step: int, rank: int):
    """A checkpoint file's meta and tensors."""
    meta, tensors = _core._load_checkpoint(str(run_dir / "checkpoints" / f"step-{step:08d}" / f"rank{rank}.pt"))
    return json.loads(meta), tensors


def optimizer_state(meta: dict, tensors: dict) -> dict:
    """The optimizer's state_dict()["state"] in a gasloc.Run's checkpoint (the user's share, packed)."""
    user = {k[len("user."):]: v for k, v in tensors.items() if k.startswith("user.")}
    return gasloc._state.unpack(meta["user"]["optimizer"], user)["state"]


def losses(run_dir: Path) -> list:
    lines = [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return sorted((l["worker"], l["step"], l["train_loss"]) for l in lines if l["event"] == "train")


# Item 6 of issue 65: DiLoCo over 2 ranks under gasloc launch, `gasloc train` against the Python loop
# over gasloc.models.llama, gasloc.optim and gasloc.data (tests/python/parts_worker.py). Same model,
# same batches, same clipped AdamW (or GPA, whose model x the rounds exchange) at the same lr, same
# outer steps: the same bits, every step's loss and the final parameters and outer state.
@pytest.mark.parametrize("optim", ["adamw", "gpa"])
def test_python_loop_over_gaslocs_parts_gives_the_cli_trainers_bits(tmp_path, data_dir, optim):
    job = {**JOB, "optim.name": optim}
    sets = [a for k, v in job.items() for a in ("--set", f"{k}={v}")]
    run([gasloc_bin(), "launch", "-n", "2", "--", gasloc_bin(), "train", *sets, "--set", f"data.dir={data_dir}",
         "--set", "train.threads=1", "--set", "train.blas_threads=1", "--set", "train.streams=1",
         "--set", "train.log_every=1", "--set", "cluster.backend=gloo", "--set", "train.run_dir=cli"], tmp_path)
    run([gasloc_bin(), "launch", "-n", "2", "--", sys.executable, str(HERE / "parts_worker.py"), str(data_dir),
         "py", json.dumps(job)], tmp_path)
    cli, py = losses(tmp_path / "cli"), losses(tmp_path / "py")
    assert len(cli) == 2 * JOB["train.steps"]
    assert py == cli
    for rank in range(2):
        (_, a), (meta, b) = checkpoint(tmp_path / "cli", 15, rank), checkpoint(tmp_path / "py", 15, rank)
        # The CLI's checkpoint holds the model x as params and the training point as optim.y (GPA);
        # a gasloc.Run's holds the buffer as it trains (y) and the optimizer's state_dict().
        assert torch.equal(a.get("optim.y", a["params"]), b["params"]), f"rank {rank}: the final parameters differ"
        state = optimizer_state(meta, b)
        assert sorted(f"optim.{k}" for k in state) == sorted(k for k in a if k.startswith("optim."))
        for k, t in state.items():
            assert torch.equal(a[f"optim.{k}"], t), f"rank {rank}: optimizer state {k} differs"
        sync = sorted(k for k in a if k.startswith("sync."))
        assert sync and sync == sorted(k for k in b if k.startswith("sync."))
        for k in sync:
            assert torch.equal(a[k], b[k]), f"rank {rank}: {k} differs"
