"""A plain PyTorch training loop whose batches are loaded and augmented on DPU ranks.

The lines that differ from the same loop with torch's DataLoader are marked `# dpu`. Run it:

    dpurun -- --mode da examples/plain_loop.py --epochs 2          # augmentation on a DPU rank
    dpurun -- --mode none examples/plain_loop.py --epochs 2        # loading on the host rank
    python examples/plain_loop.py --epochs 2                       # no dpurun: loads here, warns
    dpurun -- --mode none examples/plain_loop.py --loader torch    # torch's DataLoader, same batches

Data: an ImageFolder of JPEGs (the bundled Tiny-ImageNet-format set by default), random resized
crop + flip, a small CNN, SGD with a cosine schedule; `--accum N` accumulates gradients over N
batches and `--amp bf16` trains under autocast, to show that the loop is entirely the script's.
"""

from __future__ import annotations

import argparse
import json
import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler
from torchvision import datasets
from torchvision import transforms as T

import dpuoffload as dpu  # dpu

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def train_set(root: str) -> datasets.ImageFolder:
    augment = T.Compose([T.RandomResizedCrop(64), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)])
    return datasets.ImageFolder(f"{root}/train", transform=augment)


class SmallNet(nn.Module):
    def __init__(self, classes: int) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, stride=2, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
            nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.head = nn.Linear(32, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def torch_batches(data: datasets.ImageFolder, batch_size: int, seed: int, rank: int, size: int):
    """The reference: torch's DataLoader over the same per-sample seeds (what job.loader reproduces)."""
    seeded = dpu.seeded(data, seed)
    sampler = DistributedSampler(data, num_replicas=size, rank=rank, shuffle=True, seed=seed)
    loader = DataLoader(seeded, batch_size=batch_size, sampler=sampler)

    def epoch(e: int):
        sampler.set_epoch(e)
        seeded.set_epoch(e)
        return iter(loader)
    return epoch


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default=".cache/data/tinyimagenet")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--accum", type=int, default=1, help="accumulate gradients over this many batches")
    p.add_argument("--amp", choices=("off", "bf16"), default="off")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--loader", choices=("dpu", "torch"), default="dpu")
    p.add_argument("--losses", metavar="FILE", help="write the step losses here as JSON")
    args = p.parse_args()

    job = dpu.init()  # dpu
    torch.manual_seed(args.seed)
    data = train_set(args.data)
    model = SmallNet(len(data.classes))
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=5e-4)
    if args.loader == "dpu":
        loader = job.loader(data, batch_size=args.batch_size, seed=args.seed)  # dpu
        batches, steps = loader.epoch, len(loader)
    else:
        batches = torch_batches(data, args.batch_size, args.seed, job.rank, job.size)
        steps = math.ceil(math.ceil(len(data) / job.size) / args.batch_size)
    updates = args.epochs * math.ceil(steps / args.accum)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=updates)
    losses = []
    for epoch in range(args.epochs):
        for i, (x, y) in enumerate(batches(epoch)):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.amp == "bf16"):
                loss = F.cross_entropy(model(x), y)
            (loss / args.accum).backward()
            if (i + 1) % args.accum == 0 or i + 1 == steps:
                opt.step()
                opt.zero_grad()
                sched.step()
            losses.append(loss.item())
        print(f"epoch {epoch}: mean loss {sum(losses[-steps:]) / steps:.4f} ({steps} steps)", flush=True)
    if args.losses:
        with open(args.losses, "w") as f:
            json.dump(losses, f)
    job.finish()  # dpu


if __name__ == "__main__":
    main()
