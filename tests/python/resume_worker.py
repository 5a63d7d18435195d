"""One rank of a run that stops and resumes, alone or under `gasloc launch -n N`:

    resume_worker.py RUN_DIR STOP OUT SETTINGS [resume | resume=STEP]

trains a 2-layer MLP with dropout (it draws from torch's global generator) from run.start_step to
step STOP with gasloc.Run(settings=SETTINGS (JSON), state=(get, set)), and saves its parameters,
its optimizer's state and its state= value to OUT.rankR.pt.
"""
import json
import sys

import torch

import gasloc


def main() -> None:
    run_dir, stop, out, settings = sys.argv[1], int(sys.argv[2]), sys.argv[3], json.loads(sys.argv[4])
    resume = False
    if len(sys.argv) > 5:  # "resume" (the newest checkpoint) or "resume=STEP"
        resume = True if sys.argv[5] == "resume" else int(sys.argv[5].split("=")[1])
    torch.manual_seed(7)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Dropout(0.2), torch.nn.Linear(16, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    mine = {"seen": 0, "history": [], "last": torch.zeros(2)}

    def set_state(value):
        mine.update(value)

    with gasloc.Run(model, opt, settings={"train.run_dir": run_dir, **settings}, state=(lambda: mine, set_state),
                    resume=resume) as run:
        for step in range(run.start_step, stop):
            g = torch.Generator().manual_seed(1000 * run.rank + step)
            x = torch.randn(16, 8, generator=g)
            y = x.sum(dim=1, keepdim=True).sin()
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            mine["seen"] += 16
            mine["history"].append(step)
            mine["last"] = torch.tensor([float(step), loss.item()])
            run.step(loss=loss.item())
        rank = run.rank
    torch.save({"params": {k: v.detach().clone() for k, v in model.state_dict().items()},
                "optimizer": opt.state_dict(), "state": mine, "rng": torch.get_rng_state()}, f"{out}.rank{rank}.pt")


if __name__ == "__main__":
    main()
