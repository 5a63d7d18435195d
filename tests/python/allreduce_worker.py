"""One rank of All-Reduce AdamW on a 2-layer MLP under `gasloc launch -n N`:

    allreduce_worker.py gasloc OUT RUN_DIR   # gasloc.Run(algo.name = allreduce) with run.sync_gradients()
    allreduce_worker.py torch OUT            # by hand: torch.distributed's all_reduce of every gradient / N

Both zero the gradients with set_to_none=True (backward() then writes fresh tensors, outside
gasloc's flat buffer), take rank 0's parameters at the start, and save the final parameters.
"""
import os
import sys

import torch

STEPS = 12


def batch(rank: int, step: int):
    g = torch.Generator().manual_seed(1000 * rank + step)
    x = torch.randn(32, 8, generator=g)
    return x, x.sum(dim=1, keepdim=True).sin()


def loss_of(model, rank, step):
    x, y = batch(rank, step)
    return torch.nn.functional.mse_loss(model(x), y)


def with_gasloc(model, opt, rank, run_dir) -> None:
    import gasloc

    with gasloc.Run(model, opt, settings={"algo.name": "allreduce", "train.run_dir": run_dir}) as run:
        for step in range(run.start_step, STEPS):
            opt.zero_grad(set_to_none=True)
            loss_of(model, rank, step).backward()
            assert run.sync_gradients()
            opt.step()
            run.step()


def by_hand(model, opt, rank) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo")
    world = dist.get_world_size()
    with torch.no_grad():
        for p in model.parameters():
            dist.broadcast(p, 0)
    for step in range(STEPS):
        opt.zero_grad(set_to_none=True)
        loss_of(model, rank, step).backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= world
        opt.step()
    dist.destroy_process_group()


def main() -> None:
    mode, out = sys.argv[1], sys.argv[2]
    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    torch.manual_seed(100 + rank)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
    if mode == "gasloc":
        with_gasloc(model, opt, rank, sys.argv[3])
    else:
        by_hand(model, opt, rank)
    torch.save({k: v.detach().clone() for k, v in model.state_dict().items()}, f"{out}.rank{rank}.pt")


if __name__ == "__main__":
    main()
