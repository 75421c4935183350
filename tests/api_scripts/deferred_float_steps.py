"""A script run under dpurun by `tests/jobs/test_wire.py`: two loaders over one data set on the uint8
wire, one handing its float steps to the script (`loader.defer_float_steps()`, what the built-in
trainer does on a GPU host rank, which then runs them on the GPU after the copy), one running them
on this host rank as usual. The script runs the handed steps on whole batches (`HostSteps.batch`,
here on the CPU) and prints one JSON line: whether every batch matched to the bit, and what came."""

from __future__ import annotations

import json
import sys

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset
from torchvision import transforms as T

import dpuoffload as dpu


class Photos(Dataset):
    """48 random RGB images, cropped, flipped and normalized as CIFAR is."""

    def __init__(self) -> None:
        gen = np.random.default_rng(7)
        self.raw = [gen.integers(0, 256, (36, 36, 3), dtype=np.uint8) for _ in range(48)]
        self.transform = T.Compose([T.RandomCrop(32), T.RandomHorizontalFlip(), T.ToTensor(),
                                    T.Normalize((0.49, 0.48, 0.45), (0.25, 0.24, 0.26))])

    def __len__(self) -> int:
        return len(self.raw)

    def __getitem__(self, i: int):
        return self.transform(Image.fromarray(self.raw[i])), i % 10


def main() -> None:
    job = dpu.init()
    data = Photos()
    deferred, usual = job.loader(data, 8, seed=3, copy=False), job.loader(data, 8, seed=3)
    steps = deferred.defer_float_steps()
    same, dtypes = True, set()
    for epoch in range(2):
        for (xd, yd), (x, y) in zip(deferred.epoch(epoch), usual.epoch(epoch)):
            dtypes.add(str(xd.dtype))
            same = same and torch.equal(yd, y) and steps.batch(xd).numpy().tobytes() == x.numpy().tobytes()
    job.finish()
    print("RESULT " + json.dumps({"same": same, "deferred_dtypes": sorted(dtypes), "steps": repr(steps)}), flush=True)


if __name__ == "__main__":
    sys.exit(main())
