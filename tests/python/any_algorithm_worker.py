"""One rank of any algorithm over one loop, under `gasloc launch -n N`:

    any_algorithm_worker.py RUN_DIR ALGO

trains a 2-layer MLP for 60 steps with the loop every algorithm shares (should_compute,
sync_gradients, step) and writes the mean loss of its first and last 10 steps to
RUN_DIR/losses.rankR.txt.
"""
import os
import sys

import torch

import gasloc


def main() -> None:
    run_dir, algo = sys.argv[1], sys.argv[2]
    rank = int(os.environ["RANK"])
    torch.set_num_threads(1)
    torch.manual_seed(rank)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    with gasloc.Run(model, opt, settings={"algo.name": algo, "algo.H": 5, "train.run_dir": run_dir}) as run:
        for step in range(run.start_step, 60):
            if run.should_compute():
                g = torch.Generator().manual_seed(1000 * rank + step)
                x = torch.randn(32, 8, generator=g)
                loss = torch.nn.functional.mse_loss(model(x), x[:, :3].sum(dim=1, keepdim=True).sin())
                opt.zero_grad()
                loss.backward()
                run.sync_gradients()
                opt.step()
                losses.append(loss.item())
            run.step(loss=losses[-1] if losses else None)
    with open(os.path.join(run_dir, f"losses.rank{rank}.txt"), "w") as f:
        f.write(f"{sum(losses[:10]) / 10} {sum(losses[-10:]) / 10}\n")


if __name__ == "__main__":
    main()
