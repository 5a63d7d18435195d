"""Elastic Python runs (docs/python.md, "Elastic runs"): `gasloc launch --elastic -n 3` over
tests/python/elastic_worker.py, with the gasloc program of the same build (GASLOC_BIN): under
PyPI's torch 2.x a launcher built against Debian's 1.13 could not host the store its ranks meet at."""
import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from test_run import gasloc_bin

HERE = Path(__file__).resolve().parent
WORKER = str(HERE / "elastic_worker.py")


def launch(run_dir: Path, mode: str) -> subprocess.CompletedProcess:
    run_dir.mkdir(parents=True)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    out = subprocess.run([gasloc_bin(), "launch", "--elastic", "-n", "3", "--max-restarts", "1", "--",
                          sys.executable, WORKER, str(run_dir), mode],
                         capture_output=True, text=True, env=env, timeout=240)
    return out


def views(run_dir: Path):
    lines = [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [l for l in lines if l["event"] == "view"]


def mean_losses(run_dir: Path, rank: int, inc: int):
    first = float((run_dir / f"first.rank{rank}.inc0.txt").read_text())
    start, last = (run_dir / f"last.rank{rank}.inc{inc}.txt").read_text().split()
    return first, int(start), float(last)


# A killed rank is restarted and heals from a donor: its gasloc.Run returns at the donor's step
# with the donor's parameters, AdamW state and state= value; every rank finishes below its start.
def test_a_killed_rank_rejoins_with_its_donors_optimizer_state(tmp_path):
    run_dir = tmp_path / "kill"
    out = launch(run_dir, "kill")
    log = out.stdout + out.stderr
    assert out.returncode == 0, log[-4000:]
    assert "rank 1 (incarnation 0) failed with signal 9" in log, log[-4000:]
    assert "rank 1 (incarnation 1) rejoined" in log, log[-4000:]
    joined = torch.load(run_dir / "joined.rank1.inc1.pt")
    step = joined["step"]
    assert step > 13 and step % 5 == 0, f"the joiner started at step {step}, not at a round's end after its death"
    donors = [d for d in (0, 2) if (run_dir / f"round.rank{d}.inc0.step{step}.pt").exists()]
    assert donors, f"no survivor wrote its state at step {step}"
    donor = torch.load(run_dir / f"round.rank{donors[0]}.inc0.step{step}.pt")
    got, want = joined["optimizer"]["state"], donor["optimizer"]["state"]
    assert sorted(got) == sorted(want) and len(want) == 4
    for i in want:
        for key in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(torch.as_tensor(got[i][key]), torch.as_tensor(want[i][key])), (i, key)
    assert joined["optimizer"]["param_groups"] == donor["optimizer"]["param_groups"]
    assert all(torch.equal(a, b) for a, b in zip(joined["params"], donor["params"]))
    assert joined["counter"] == donor["counter"] == step, "state=(get, set) came from the donor"
    # The joiner's own optimizer would differ: the state is the donor's, not one it built.
    assert any(r["joined"] == [1] for r in views(run_dir)), views(run_dir)
    for rank, inc in ((0, 0), (1, 1), (2, 0)):
        first, start, last = mean_losses(run_dir, rank, inc)
        assert start == (step if rank == 1 else 0)
        assert last < 0.7 * first, f"rank {rank}: mean loss of its first 10 steps {first:.4f}, of its last 10 {last:.4f}"


# An exception inside the `with` block of an elastic member: it writes its checkpoint and leaves;
# the launcher does not count it as a death nor restart it, the others' views list it as left,
# and they finish below their starting loss.
def test_an_exception_in_the_block_is_a_clean_leave(tmp_path):
    run_dir = tmp_path / "leave"
    out = launch(run_dir, "leave")
    log = out.stdout + out.stderr
    assert out.returncode == 0, log[-4000:]
    assert "rank 2 leaves the job on purpose" in log
    assert "rank 2 (incarnation 0) left the job after step 22" in log, log[-4000:]
    assert "rank(s) 2 left it before the end" in log, log[-4000:]
    assert "incarnation 1" not in log, "the rank that left was restarted"
    assert "rank 2 (incarnation 0) failed" not in log
    assert (run_dir / "checkpoints" / "step-00000022" / "rank2.pt").exists(), sorted(os.listdir(run_dir / "checkpoints"))
    vs = views(run_dir)
    assert any(2 in v.get("left", []) for v in vs), vs
    assert not any(2 in v["died"] for v in vs), vs
    for rank in (0, 1):
        first, _, last = mean_losses(run_dir, rank, 0)
        assert last < 0.7 * first, f"rank {rank}: {first:.4f} -> {last:.4f}"
