"""A user script that walks its loaders the awkward ways (tests/jobs/test_api_jobs.py runs it under dpurun).

It records a sha256 of every batch it receives, per access, so a `--mode da` run (batches from the
DPU rank, over plans and markers) can be compared with a `--mode none` run (built here). Accesses:
epochs in order (the DPU runs on across the edge), an early break, a resumed epoch (start > 0), a
jump back, a partial epoch (stop), a second loader with other settings and copy=False, and plain
iteration of the loader. `--fail host|dpu` raises in the script or in the data set on the DPU rank.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os

import torch
from torch.utils.data import Dataset

import dpuoffload as dpu


class Noise(Dataset):
    """Defined in the script itself: the DPU rank finds it by importing the script (as `__mp_main__`)."""

    def __init__(self, n: int, fail_on_dpu: bool = False) -> None:
        self.n, self.fail_on_dpu = n, fail_on_dpu

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        if self.fail_on_dpu and os.environ.get("DPUOFFLOAD_ARGS") is None and i % 7 == 3:
            raise ValueError(f"sample {i} is corrupt")
        return torch.rand(3, 4, 4) + i, i % 5  # torch.rand: per-sample seeds make it reproducible


def digest(x: torch.Tensor, y: torch.Tensor) -> str:
    return hashlib.sha256(x.numpy().tobytes() + y.numpy().tobytes()).hexdigest()[:16]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--fail", choices=("host", "dpu"))
    args = p.parse_args()
    job = dpu.init()
    a = job.loader(Noise(50, fail_on_dpu=args.fail == "dpu"), batch_size=4, seed=3)
    b = job.loader(Noise(21), batch_size=5, seed=1, shuffle=False, drop_last=True, copy=False)
    seen: dict[str, list[str]] = {}

    def record(name: str, batches) -> None:
        seen[name] = [digest(x, y) for x, y in batches]

    record("a0", a.epoch(0))
    record("a1", a.epoch(1))
    for i, (x, y) in enumerate(a.epoch(2)):
        if i == 2:
            break
    record("a2-rest", a.epoch(2, start=3))
    if args.fail == "host":
        raise RuntimeError("the user's loop failed")
    record("a0-again", a.epoch(0))
    record("a5-part", a.epoch(5, start=1, stop=4))
    record("b0", b.epoch(0))
    record("b-iter0", iter(b))
    record("b-iter1", iter(b))
    record("a6", a.epoch(6))
    seen["sizes"] = [str(len(a)), str(len(b)), str(job.size), str(job.rank)]
    with open(f"{args.out}-{job.rank}.json", "w") as f:
        json.dump(seen, f)
    job.finish()


if __name__ == "__main__":
    main()
