"""One rank of an elastic job under `gasloc launch --elastic -n 3`:

    elastic_worker.py RUN_DIR kill|leave

DiLoCo (H = 5) over a 2-layer MLP with AdamW for 60 steps, every rank from the same seed (an
elastic job's founding ranks must start alike), its own batches, and a `state=` counter.
kill:  rank 1's first incarnation SIGKILLs itself at step 13 (mid-round); the launcher restarts
       it and its gasloc.Run returns healed. The survivors slow down (a sleep per step) until
       the joiner says it joined, so that the job is still running when it arrives (the test
       fails, not hangs, if it never does).
leave: rank 2 raises inside the `with` block at step 23: it leaves with its checkpoint.
Each incarnation writes RUN_DIR/<what>.rank<R>.inc<I>.*: its first and last losses; a donor
writes its optimizer state, parameters and state= value at every round's end (round.*.step<S>.pt),
and a joiner what it received (joined.*.pt).
"""
import os
import signal
import sys
import time

import torch

import gasloc

STEPS, H = 60, 5


def main() -> None:
    run_dir, mode = sys.argv[1], sys.argv[2]
    rank, inc = int(os.environ["RANK"]), int(os.environ["GASLOC_INCARNATION"])
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    counter = {"steps": 0}
    state = (lambda: {"steps": counter["steps"], "marker": torch.tensor([float(counter["steps"])])},
             lambda v: counter.update(steps=v["steps"]))
    tag = f"rank{rank}.inc{inc}"
    joined_flag = os.path.join(run_dir, "joined.flag")
    losses = []
    settings = {"algo.name": "diloco", "algo.H": H, "train.run_dir": run_dir, "train.log_every": 5,
                "cluster.timeout_s": 60}
    with gasloc.Run(model, opt, settings=settings, state=state) as run:
        if run.start_step > 0:  # a joiner: healed from a donor before Run returned
            torch.save({"step": run.start_step, "optimizer": opt.state_dict(), "counter": counter["steps"],
                        "params": [p.detach().clone() for p in model.parameters()]},
                       os.path.join(run_dir, f"joined.{tag}.pt"))
            open(joined_flag, "w").close()
        for step in range(run.start_step, STEPS):
            g = torch.Generator().manual_seed(1000 * rank + step)
            x = torch.randn(32, 8, generator=g)
            loss = torch.nn.functional.mse_loss(model(x), x[:, :3].sum(dim=1, keepdim=True).sin())
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
            counter["steps"] = step + 1
            if len(losses) == 10:
                with open(os.path.join(run_dir, f"first.{tag}.txt"), "w") as f:
                    f.write(f"{sum(losses) / 10}\n")
            if mode == "kill" and rank == 1 and inc == 0 and step + 1 == 13:
                os.kill(os.getpid(), signal.SIGKILL)
            if mode == "leave" and rank == 2 and step + 1 == 23:
                raise RuntimeError("rank 2 leaves the job on purpose (the test's exception)")
            if run.step(loss=loss.item()) and step + 1 >= 15:
                torch.save({"optimizer": opt.state_dict(), "counter": counter["steps"],
                            "params": [p.detach().clone() for p in model.parameters()]},
                           os.path.join(run_dir, f"round.{tag}.step{step + 1}.pt"))
            if mode == "kill" and rank != 1 and step + 1 >= 15 and not os.path.exists(joined_flag):
                # Pace the survivors until the restarted rank has joined (its interpreter and torch
                # take seconds to start): rounds must go on for it to be healed at one's end.
                time.sleep(0.1 if step + 1 < 50 else 1.0)
    with open(os.path.join(run_dir, f"last.{tag}.txt"), "w") as f:
        f.write(f"{run.start_step} {sum(losses[-10:]) / len(losses[-10:])}\n")


if __name__ == "__main__":
    main()
