"""One rank of DiLoCo on a 2-layer MLP and synthetic data, under `gasloc launch -n N`:

    diloco_worker.py gasloc OUT RUN_DIR SETTINGS   # gasloc.Run with these settings (JSON) over algo.*
    diloco_worker.py torch OUT                     # by hand with torch.distributed (gloo), the reference

Both train the same model from the same seeds on the same batches: inner AdamW, and every H steps
the outer step, SGD with Nesterov momentum on the averaged pseudo-gradient theta - mean_i phi_i
(gasloc's algo/outer.hpp: b <- mu b + Delta; theta <- theta - lr (Delta + mu b), which is
torch.optim.SGD(nesterov=True, dampening=0)). Each rank saves its final parameters to OUT.rankR.pt.
"""
import json
import os
import sys

import torch

H, STEPS = 5, 20
OUTER_LR, OUTER_MOMENTUM = 0.7, 0.9  # gasloc's defaults (algo.outer_lr, algo.outer_momentum)


def make_model(rank: int) -> torch.nn.Module:
    torch.manual_seed(100 + rank)  # ranks seed differently: both sides take rank 0's parameters at the start
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))


def batch(rank: int, step: int):
    g = torch.Generator().manual_seed(1000 * rank + step)
    x = torch.randn(32, 8, generator=g)
    y = x.sum(dim=1, keepdim=True).sin() + 0.1 * torch.randn(32, 1, generator=g)
    return x, y


def inner_step(model, opt, rank, step) -> float:
    x, y = batch(rank, step)
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss.item()


def with_gasloc(model, opt, rank, run_dir, algo) -> None:
    import gasloc

    settings = {**algo, "algo.H": H, "train.run_dir": run_dir, "train.log_every": 1}
    with gasloc.Run(model, opt, settings=settings) as run:
        assert run.rank == rank and run.world == int(os.environ["WORLD_SIZE"])
        for step in range(run.start_step, STEPS):
            ended = run.step(loss=inner_step(model, opt, rank, step))
            assert ended == ((step + 1) % H == 0), f"step {step + 1}: round ended {ended}"


def by_hand(model, opt, rank) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo")  # env://: the launcher's variables and store
    world = dist.get_world_size()
    with torch.no_grad():
        for p in model.parameters():
            dist.broadcast(p, 0)
    outer = [p.detach().clone() for p in model.parameters()]
    outer_opt = torch.optim.SGD(outer, lr=OUTER_LR, momentum=OUTER_MOMENTUM, nesterov=True)
    for step in range(STEPS):
        inner_step(model, opt, rank, step)
        if (step + 1) % H == 0:
            with torch.no_grad():
                for p, theta in zip(model.parameters(), outer):
                    mean = p.detach().clone()
                    dist.all_reduce(mean)
                    mean /= world
                    theta.grad = theta - mean
                outer_opt.step()
                for p, theta in zip(model.parameters(), outer):
                    p.copy_(theta)
    dist.destroy_process_group()


def main() -> None:
    mode, out = sys.argv[1], sys.argv[2]
    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    model = make_model(rank)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
    if mode == "gasloc":
        with_gasloc(model, opt, rank, sys.argv[3], json.loads(sys.argv[4]))
    else:
        by_hand(model, opt, rank)
    torch.save({k: v.detach().clone() for k, v in model.state_dict().items()}, f"{out}.rank{rank}.pt")


if __name__ == "__main__":
    main()
