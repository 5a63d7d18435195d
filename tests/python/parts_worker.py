"""One rank of the CLI trainer's job written as a Python loop over gasloc's own parts (gasloc.models,
gasloc.optim, gasloc.data) under gasloc.Run, for test_parts.py:

    parts_worker.py DATA_DIR RUN_DIR SETTINGS   # SETTINGS: JSON of the job file's keys, as `gasloc train --set`

The loop is the CLI worker's step (src/gasloc/train/worker.cpp): the rank's next batch, zero_grad,
the loss, backward, the clipped optimizer step at the schedule's lr, then the algorithm's step.
"""
import json
import sys

import torch

import gasloc


def split(settings: dict, section: str) -> dict:
    """The keys of one section, without the section's name."""
    return {k.split(".", 1)[1]: v for k, v in settings.items() if k.startswith(section + ".")}


def main(data_dir: str, run_dir: str, settings: dict) -> None:
    torch.set_num_threads(1)  # train.threads = 1 in the CLI job
    data, optim, train = split(settings, "data"), split(settings, "optim"), split(settings, "train")
    dataset = gasloc.data.open(data_dir)
    model = gasloc.models.llama(settings["model.preset"], vocab_size=dataset.vocab_size)
    name = optim.pop("name", "adamw")
    opt = getattr(gasloc.optim, name)(model.parameters(), **optim)
    steps = train.pop("steps")
    schedule = gasloc.optim.Schedule(opt, total_steps=steps)
    algo = {k: v for k, v in settings.items() if k.startswith("algo.")}
    with gasloc.Run(model, opt, settings={**algo, "train.run_dir": run_dir, "train.log_every": 1}) as run:
        batches = dataset.sampler(run.rank, run.world, batch_size=data["batch_size"], seq_len=data["seq_len"])
        for _ in range(run.start_step, steps):
            inputs, targets = batches.next()
            opt.zero_grad()
            loss = model.loss(inputs, targets)
            loss.backward()
            opt.step()
            schedule.step()
            run.step(loss=loss.item())


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], json.loads(sys.argv[3]))
