"""One rank of DiLoCo on an MLP (8-256-256-1) and synthetic data, three ways, for bench/torchft_side_by_side.sh
(never used by tests or CI). Started by `gasloc launch -n N [--netns] -- PYTHON bench/torchft_diloco.py MODE OUT`:

    torchft   torchft's DiLoCo wrapper: every rank is a replica group of one, with its own TCPStore
              and Manager over torchft's ProcessGroupGloo; rank 0 also hosts torchft's Lighthouse
              (its address reaches the others through the launcher's store)
    gasloc    gasloc.Run(model, opt, settings={"algo.name": "diloco", ...})
    torch     by hand over torch.distributed Gloo: tests/python/diloco_worker.py's by_hand(), the reference

All three train the same model from the same initial parameters on diloco_worker.py's batches:
inner AdamW, every H steps the outer step, SGD with Nesterov momentum (lr 0.7, momentum 0.9,
gasloc's defaults) on the averaged pseudo-gradient theta - mean_i phi_i. Each rank saves its final
parameters to OUT.rankR.pt and prints one line of JSON: seconds per round and the bytes its
network interfaces sent per round (from /proc/net/dev, which a process reads for its own
network namespace: under `--netns` only its eth0's traffic; on loopback every process's), both
from the end of the first round to the end of the last but one (the first round holds the
connections' set-up: torchft configures its process group at its first quorum).
"""
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "python"))
import diloco_worker as reference  # noqa: E402  its batches, inner step and hand-written DiLoCo

H = int(os.environ.get("BENCH_H", "10"))
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "12"))
WIDTH = int(os.environ.get("BENCH_WIDTH", "256"))
OUTER_LR, OUTER_MOMENTUM = reference.OUTER_LR, reference.OUTER_MOMENTUM


def make_model() -> torch.nn.Module:
    torch.manual_seed(100)  # every rank starts from the same parameters (gasloc and by hand broadcast rank 0's)
    return torch.nn.Sequential(torch.nn.Linear(8, WIDTH), torch.nn.Tanh(), torch.nn.Linear(WIDTH, WIDTH),
                               torch.nn.Tanh(), torch.nn.Linear(WIDTH, 1))


def tx_bytes() -> int:
    """Bytes sent by the interfaces of this process's network namespace (eth0 under --netns, lo on loopback)."""
    total = 0
    with open("/proc/net/dev") as f:
        for line in f.readlines()[2:]:
            total += int(line.split(":", 1)[1].split()[8])
    return total


class RoundClock:
    """Time and bytes between the ends of rounds, seen at the start of the step after each round
    (nothing runs in between), so that one hook serves the three loops: from the end of the first
    round to the end of the last but one."""

    def __init__(self):
        self.t0 = self.b0 = None
        self.rounds = 0

    def before_step(self, step: int) -> None:
        if step == 0 or step % H:
            return
        self.rounds += 1
        if self.rounds == 1:
            self.t0, self.b0 = time.perf_counter(), tx_bytes()
        self.t1, self.b1 = time.perf_counter(), tx_bytes()

    def result(self):
        n = self.rounds - 1
        return {"rounds_timed": n, "s_per_round": (self.t1 - self.t0) / n, "tx_bytes_per_round": (self.b1 - self.b0) / n}


def timed_inner_steps(clock: RoundClock) -> None:
    """The reference's inner step, ticking the clock first; its by_hand() calls it too."""
    inner_step = reference.inner_step

    def timed(model, opt, rank, step):
        clock.before_step(step)
        return inner_step(model, opt, rank, step)

    reference.inner_step = timed


def with_gasloc(model, opt, rank, out) -> None:
    import gasloc

    # train.checkpoint_every = 0: one checkpoint, at close (after the timed rounds), as the others write none
    settings = {"algo.name": "diloco", "algo.H": H, "train.run_dir": f"{out}.run", "train.log_every": H * ROUNDS,
                "train.checkpoint_every": 0}
    with gasloc.Run(model, opt, settings=settings) as run:
        for step in range(H * ROUNDS):
            run.step(loss=reference.inner_step(model, opt, rank, step))


def own_address() -> str:
    """The address this rank's traffic to the launcher's store leaves from (eth0's under --netns)."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])))
        return s.getsockname()[0]


def with_torchft(model, opt, rank) -> None:
    from datetime import timedelta

    from torch.distributed import TCPStore
    from torchft import Manager, ProcessGroupGloo
    from torchft.local_sgd import DiLoCo

    world = int(os.environ["WORLD_SIZE"])
    me = own_address()
    launcher_store = TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                              wait_for_workers=False)
    lighthouse = None
    if rank == 0:
        from torchft._torchft import LighthouseServer

        lighthouse = LighthouseServer(bind="[::]:0", min_replicas=world,
                                      quorum_tick_ms=int(os.environ.get("BENCH_QUORUM_TICK_MS", "100")))
        port = lighthouse.address().rsplit(":", 1)[1]
        launcher_store.set("torchft_lighthouse", f"http://{me}:{port}")
    lighthouse_addr = launcher_store.get("torchft_lighthouse").decode()
    own_store = TCPStore(me, 0, is_master=True, wait_for_workers=False)  # this replica group's (of one)
    # init_sync=False: torchft's first quorum comes after the first H steps (DiLoCo's first sync), where
    # healing would replace the replicas' trained parameters; every rank builds rank 0's model instead.
    manager = Manager(pg=ProcessGroupGloo(timeout=timedelta(seconds=60)), load_state_dict=None, state_dict=None,
                      min_replica_size=world, use_async_quorum=False, replica_id=f"replica{rank}",
                      store_addr=me, store_port=own_store.port, rank=0, world_size=1,
                      lighthouse_addr=lighthouse_addr, hostname=me, timeout=timedelta(seconds=60), init_sync=False)
    outer_opt = torch.optim.SGD(model.parameters(), lr=OUTER_LR, momentum=OUTER_MOMENTUM, nesterov=True)
    with DiLoCo(manager, [model], opt, outer_opt, sync_every=H, pin_memory=False):
        for step in range(H * ROUNDS):
            reference.inner_step(model, opt, rank, step)  # the wrapper's hook on opt.step() syncs every H steps
        assert manager.current_step() == ROUNDS, f"{manager.current_step()} of {ROUNDS} rounds committed"
    launcher_store.set(f"torchft_done{rank}", "1")  # the lighthouse outlives every replica's last quorum
    if lighthouse is not None:
        launcher_store.wait([f"torchft_done{r}" for r in range(world)])
    manager.shutdown(wait=False)
    if lighthouse is not None:
        lighthouse.shutdown()


def main() -> None:
    mode, out = sys.argv[1], sys.argv[2]
    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    model = make_model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
    clock = RoundClock()
    timed_inner_steps(clock)
    reference.H, reference.STEPS = H, H * ROUNDS
    {"gasloc": lambda: with_gasloc(model, opt, rank, out), "torch": lambda: reference.by_hand(model, opt, rank),
     "torchft": lambda: with_torchft(model, opt, rank)}[mode]()
    torch.save({k: v.detach().clone() for k, v in model.state_dict().items()}, f"{out}.rank{rank}.pt")
    print("BENCH " + json.dumps({"mode": mode, "rank": rank, "H": H, "rounds": ROUNDS,
                                 "params": sum(p.numel() for p in model.parameters()), **clock.result()}), flush=True)


if __name__ == "__main__":
    main()
