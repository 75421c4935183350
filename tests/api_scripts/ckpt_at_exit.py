"""A script that checkpoints after each of 4 steps and returns without `job.finish()` (tests/jobs/test_api_jobs.py).

The job finishes at exit; a checkpoint the keeper could not write must still make the job's exit
code non-zero, from the exit hook. A resumed run prints what `job.restore` returned and trains the
steps after it.
"""

from __future__ import annotations

import json

import torch

import dpuoffload as dpu


def main() -> None:
    job = dpu.init()
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    start = job.restore(model, opt)
    print("restored", json.dumps(None if start is None else [start.epoch, start.step, start.global_step, start.extra]),
          flush=True)
    for step in range(1 + (start.global_step if start else 0), 5):
        opt.zero_grad()
        model(torch.ones(8, 4)).sum().backward()
        opt.step()
        job.checkpoint(model, opt, epoch=0, step=step, global_step=step, extra={"step": step})


if __name__ == "__main__":
    main()
