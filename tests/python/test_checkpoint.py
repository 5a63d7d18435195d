"""Checkpoints and resume of a Python run (docs/python.md, "Checkpoints"): a run stopped and
resumed ends with the bits of a run that never stopped, alone and over Gloo ranks."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import gasloc

HERE = Path(__file__).resolve().parent
WORKER = str(HERE / "resume_worker.py")


def gasloc_bin() -> str:
    path = os.environ.get("GASLOC_BIN")
    if not path:
        pytest.fail("set GASLOC_BIN to the gasloc program (ctest's python_api test does)")
    return os.path.abspath(path)


def run(world: int, args: list, cwd: Path, expect_ok: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(Path(gasloc.__file__).resolve().parent.parent)}
    cmd = [sys.executable, WORKER, *args]
    if world > 1:
        cmd = [gasloc_bin(), "launch", "-n", str(world), "--", *cmd]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, env=env, timeout=240)
    if expect_ok:
        assert r.returncode == 0, f"{r.stdout}\n{r.stderr}"
    return r


def assert_same_bits(a, b, where: str) -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            assert_same_bits(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same_bits(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


# A run of 20 steps stopped at 12 (mid-round: H = 5) and resumed ends bit for bit where the
# uninterrupted run ends: parameters, the optimizer's state, the user's state= and the generator
# that dropout draws from. Alone, DiLoCo over 2 Gloo ranks, and GASLoC's 1peer over 3.
@pytest.mark.parametrize(
    "world, algo",
    [
        (1, {"algo.name": "none"}),
        (2, {"algo.name": "diloco", "algo.H": 5}),
        (3, {"algo.name": "gasloc", "algo.topology": "1peer", "algo.H": 5}),
    ],
)
def test_a_resumed_run_ends_with_the_bits_of_one_that_never_stopped(tmp_path, world, algo):
    settings = json.dumps({**algo, "train.checkpoint_every": 4, "train.log_every": 2})
    run(world, [str(tmp_path / "whole"), "20", str(tmp_path / "whole"), settings], tmp_path)
    run(world, [str(tmp_path / "split"), "12", str(tmp_path / "first"), settings], tmp_path)
    run(world, [str(tmp_path / "split"), "20", str(tmp_path / "split"), settings, "resume"], tmp_path)
    for rank in range(world):
        whole = torch.load(tmp_path / f"whole.rank{rank}.pt")
        split = torch.load(tmp_path / f"split.rank{rank}.pt")
        assert_same_bits(whole, split, f"rank {rank}")
        assert split["state"]["history"] == list(range(20))
    # The resumed run's metrics continue the first part's: one train line per logged step.
    lines = [json.loads(l) for l in (tmp_path / "split" / "metrics.jsonl").read_text().splitlines()]
    steps = sorted(l["step"] for l in lines if l["event"] == "train" and l["worker"] == 0)
    assert steps == list(range(2, 21, 2))
    committed = (tmp_path / "split" / "checkpoints" / "rank0.committed").read_text()
    assert "20" in committed


def test_resume_without_a_checkpoint_and_a_new_run_over_one_are_refused(tmp_path):
    settings = json.dumps({"algo.name": "none"})
    r = run(1, [str(tmp_path / "empty"), "4", str(tmp_path / "o"), settings, "resume"], tmp_path, expect_ok=False)
    assert r.returncode != 0 and "holds no committed checkpoint" in r.stderr and "resume=True" in r.stderr
    run(1, [str(tmp_path / "r"), "4", str(tmp_path / "o"), settings], tmp_path)
    r = run(1, [str(tmp_path / "r"), "4", str(tmp_path / "o"), settings], tmp_path, expect_ok=False)
    assert r.returncode != 0 and "already holds checkpoints" in r.stderr and "resume=True" in r.stderr


def test_a_checkpoint_of_another_model_or_algorithm_is_refused_naming_it(tmp_path):
    d = str(tmp_path / "r")
    run(1, [d, "4", str(tmp_path / "o"), json.dumps({"algo.name": "none"})], tmp_path)
    model = torch.nn.Linear(8, 3)
    opt = torch.optim.AdamW(model.parameters())
    with pytest.raises(RuntimeError, match=r"differs from this job: model\.(weight|bias)"):
        gasloc.Run(model, opt, settings={"train.run_dir": d}, resume=True)
    r = run(1, [d, "8", str(tmp_path / "o"), json.dumps({"algo.name": "diloco"}), "resume"], tmp_path, expect_ok=False)
    assert r.returncode != 0 and "algo is" in r.stderr


def test_what_cannot_go_into_a_checkpoint_is_a_value_error(tmp_path):
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="nothing is pickled"):
        with gasloc.Run(model, opt, settings={"train.run_dir": str(tmp_path / "r")},
                        state=(lambda: {"f": object()}, lambda v: None)) as r:
            r.step()
    with pytest.raises(ValueError, match="pair of callables"):
        gasloc.Run(model, opt, settings={"train.run_dir": str(tmp_path / "s")}, state=lambda: 1)


def test_the_packing_round_trips_an_optimizers_state():
    from gasloc import _state
    value = {"state": {0: {"step": torch.tensor(3.0), "exp_avg": torch.randn(4)}}, "param_groups": [
        {"lr": 0.1, "betas": (0.9, 0.999), "foreach": None, "params": [0], "eps": float("inf")}]}
    tensors = {}
    text = _state.dumps(_state.pack(value, "o.", tensors))
    assert "inf" in text and sorted(tensors) == ["o.0", "o.1"]
    assert_same_bits(value, _state.unpack(json.loads(text), tensors), "value")


# Ctrl+C (SIGINT) stops the run after a step every rank agrees on, with a committed checkpoint of
# it; the process then ends as Python does after Ctrl+C (under gasloc launch, which forwards it:
# status 130), and resume=True continues from that step.
@pytest.mark.parametrize("world", [1, 2])
def test_ctrl_c_checkpoints_the_step_every_rank_stops_after(tmp_path, world):
    import signal
    import time
    run_dir = tmp_path / "r"
    settings = json.dumps({"algo.name": "diloco" if world > 1 else "none", "algo.H": 5, "train.log_every": 2,
                           "train.checkpoint_every": 0})
    env = {**os.environ, "PYTHONPATH": str(Path(gasloc.__file__).resolve().parent.parent)}
    cmd = [sys.executable, WORKER, str(run_dir), "100000000", str(tmp_path / "o"), settings]
    if world > 1:
        cmd = [gasloc_bin(), "launch", "-n", str(world), "--", *cmd]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path, env=env)
    metrics = run_dir / "metrics.jsonl"
    deadline = time.monotonic() + 60
    while not (metrics.exists() and '"train"' in metrics.read_text()):
        assert p.poll() is None and time.monotonic() < deadline, p.communicate()
        time.sleep(0.1)
    p.send_signal(signal.SIGINT)
    out, _ = p.communicate(timeout=60)
    assert p.returncode == (130 if world > 1 else -signal.SIGINT), out
    assert "stopped after step" in out and "resume=True" in out
    stopped = int(out.split("stopped after step ")[1].split()[0])
    assert stopped % 2 == 0
    for rank in range(world):
        assert json.loads((run_dir / "checkpoints" / f"rank{rank}.committed").read_text())["steps"][0] == stopped
    # The resumed run starts there: its history holds the steps from `stopped` on.
    run(world, [str(run_dir), str(stopped + 3), str(tmp_path / "again"), settings, "resume"], tmp_path)
    for rank in range(world):
        state = torch.load(tmp_path / f"again.rank{rank}.pt")["state"]
        assert state["history"][-3:] == [stopped, stopped + 1, stopped + 2]


# A run of 2 resumed on 3 ranks is refused on every rank from its run.json, naming both worlds. A
# damaged newest checkpoint names the previous committed step, which resume=STEP continues from
# (and the abandoned later step is forgotten).
def test_another_world_and_a_damaged_checkpoint_are_refused_with_what_to_do(tmp_path):
    settings = json.dumps({"algo.name": "diloco", "algo.H": 5, "train.checkpoint_every": 4})
    d = str(tmp_path / "r")
    run(2, [d, "10", str(tmp_path / "o"), settings], tmp_path)  # commits 4, 8 (and 10 at close)
    r = run(3, [d, "12", str(tmp_path / "o"), settings, "resume"], tmp_path, expect_ok=False)
    assert r.returncode != 0 and "saved by 2 workers, and this job has 3" in r.stdout + r.stderr
    newest = tmp_path / "r" / "checkpoints" / "step-00000010" / "rank1.pt"
    data = bytearray(newest.read_bytes())
    data[len(data) // 2] ^= 0xFF
    newest.write_bytes(bytes(data))
    r = run(2, [d, "12", str(tmp_path / "o"), settings, "resume"], tmp_path, expect_ok=False)
    assert r.returncode != 0 and "resume=8" in r.stdout + r.stderr, r.stdout + r.stderr
    run(2, [d, "12", str(tmp_path / "again"), settings, "resume=8"], tmp_path)
    for rank in range(2):
        assert torch.load(tmp_path / f"again.rank{rank}.pt")["state"]["history"][-4:] == [8, 9, 10, 11]
        committed = json.loads((tmp_path / "r" / "checkpoints" / f"rank{rank}.committed").read_text())["steps"]
        assert 10 not in committed and committed[0] == 12, committed
