"""What the example scripts share and a user's script already has: the data set, the model, flags.

Kept apart from the loops so each example shows only its loop; it also shows that a script's own
modules work on the DPU ranks (they import it from the script's folder, as `python train.py` does).
"""

from __future__ import annotations

import argparse
import itertools
import json
from typing import Callable, Iterator, Optional

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Subset
from torchvision import datasets
from torchvision import transforms as T

import dpuoffload as dpu

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
Batches = Callable[..., Iterator[tuple[torch.Tensor, torch.Tensor]]]  # (epoch, start=0) -> batches


def train_set(root: str, subset: Optional[int] = None) -> Dataset:
    """JPEGs in class folders, decoded and augmented per sample (the work the DPU ranks take over)."""
    augment = T.Compose([T.RandomResizedCrop(64), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)])
    images = datasets.ImageFolder(f"{root}/train", transform=augment)
    return Subset(images, range(min(subset, len(images)))) if subset else images


def val_set(root: str, subset: Optional[int] = None) -> Dataset:
    """The validation images, resized and centre-cropped (no randomness)."""
    plain = T.Compose([T.Resize(64), T.CenterCrop(64), T.ToTensor(), T.Normalize(MEAN, STD)])
    images = datasets.ImageFolder(f"{root}/val", transform=plain)
    return Subset(images, range(min(subset, len(images)))) if subset else images


def classes(data: Dataset) -> int:
    return len((data.dataset if isinstance(data, Subset) else data).classes)


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


def parser(doc: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--data", default=".cache/data/tinyimagenet", help="an ImageFolder root with train/")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=32, help="per host rank")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--loader", choices=("dpu", "torch"), default="dpu",
                   help="dpu: job.loader; torch: torch's DataLoader over the same per-sample seeds (the reference)")
    p.add_argument("--subset", type=int, metavar="N", help="train on the first N images only (quick runs)")
    p.add_argument("--record", metavar="FILE",
                   help="write the step losses and validation results here as JSON ({rank}: this host rank)")
    return p


def batches(job: dpu.Job, data: Dataset, args: argparse.Namespace) -> tuple[Batches, int]:
    """`(epoch, start=0) -> batches` and the batches per epoch, from `job.loader` or from torch's
    DataLoader (which has no start: it skips the first `start` batches by loading them)."""
    if args.loader == "dpu":
        loader = job.loader(data, batch_size=args.batch_size, seed=args.seed)
        return loader.epoch, len(loader)
    seeded = dpu.seeded(data, args.seed)
    sampler = DistributedSampler(data, num_replicas=job.size, rank=job.rank, shuffle=True, seed=args.seed)
    loader = DataLoader(seeded, batch_size=args.batch_size, sampler=sampler)

    def epoch(e: int, start: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        sampler.set_epoch(e)
        seeded.set_epoch(e)
        return itertools.islice(loader, start, None)
    return epoch, len(loader)


def save_record(path: Optional[str], rank: int, losses: list[float], validation: dict, **more: object) -> None:
    if path:
        with open(path.format(rank=rank), "w") as f:
            json.dump({"losses": losses, "validation": {str(k): v for k, v in validation.items()}, **more}, f)
