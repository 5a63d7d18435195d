"""One rank of DiLoCo with evaluate= under `gasloc launch -n N`:

    eval_worker.py RUN_DIR OUT

H = 5 and train.eval_every = 7, so the evaluation at step 7 falls inside a round, where the
workers' models differ. Every call of evaluate() records the parameters it saw and the loss it
returned; the rank saves them with its parameters after the evaluation to OUT.rankR.pt.
"""
import os
import sys

import torch

import gasloc


def main() -> None:
    run_dir, out = sys.argv[1], sys.argv[2]
    rank = int(os.environ["RANK"])
    torch.set_num_threads(1)
    torch.manual_seed(rank)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x_val = torch.randn(64, 8, generator=torch.Generator().manual_seed(99))
    y_val = x_val.sum(dim=1, keepdim=True).sin()
    seen = []

    def evaluate():
        with torch.no_grad():
            loss = torch.nn.functional.mse_loss(model(x_val), y_val)
        seen.append((torch.cat([p.detach().flatten().clone() for p in model.parameters()]), loss.item()))
        return loss

    settings = {"algo.name": "diloco", "algo.H": 5, "train.eval_every": 7, "train.run_dir": run_dir}
    after = None
    with gasloc.Run(model, opt, settings=settings, evaluate=evaluate) as run:
        for step in range(run.start_step, 10):
            g = torch.Generator().manual_seed(1000 * rank + step)
            x = torch.randn(16, 8, generator=g)
            loss = torch.nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True).sin())
            opt.zero_grad()
            loss.backward()
            opt.step()
            run.step(loss=loss.item())
            if step + 1 == 7:
                after = torch.cat([p.detach().flatten().clone() for p in model.parameters()])
    torch.save({"seen": seen, "after": after}, f"{out}.rank{rank}.pt")


if __name__ == "__main__":
    main()
