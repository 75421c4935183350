"""A user's own training script, as `benchmarks/own_loop.py` runs it: one loop, two loaders.

    dpurun [emulated node] -- --mode da   benchmarks/own_loop_script.py --workload resnet20 --loader dpu ...
    dpurun [emulated node] -- --mode none benchmarks/own_loop_script.py --workload resnet20 --loader torch \
        --worker-cores 1 [--worker-cgroup DIR] ...

The model, data set, optimizer, loss and loop are the script's own, built the way a user would build
them (torchvision data sets and transforms, a model from torchvision or the project's zoo, SGD,
cross-entropy). Only the loader differs:

- `--loader dpu`: `job.loader(...)`, whose batches the DPU rank builds in `--mode da`;
- `--loader torch`: torch's `DataLoader(num_workers=1, persistent_workers=True, prefetch_factor=4)`
  over `dpu.seeded(...)` (the same batches), its single worker pinned to the spare core
  (`--worker-cores`) and, when the benchmark throttles that core, in the same kind of CPU cgroup as
  the DPU rank (`--worker-cgroup`).

`--shards PATTERN` trains from WebDataset tar shards instead (`benchmarks/streams.py`): `dpu` is
`job.loader(dpu.webdataset(PATTERN, augment))`, `torch` webdataset's own pipeline (shard shuffle,
shuffle buffer, decode, the same augmentation) in the same one-worker DataLoader.

`--step-sleep S` replaces forward/backward/step by `time.sleep(S)`: the producer gets ahead, so the
time in `next()` is only what the host side of the loader costs to hand over a batch that is ready.
Per epoch the script writes its wall time and each step's time in `next()` (the data wait) as JSON
to `--times`.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, Subset
from torchvision import datasets
from torchvision import transforms as T

import dpuoffload as dpu

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.peer_host import EpochTagged, TaggedBatches, WorkerPlacement  # noqa: E402

Batches = Callable[[int], Iterator[tuple[torch.Tensor, torch.Tensor]]]
PREFETCH = 4  # batches the DataLoader worker prefetches; the benchmark gives the DPU rank --da-buffers 4


def cifar10(root: str) -> datasets.CIFAR10:
    """resnet20's data: CIFAR-10 with crop + flip. The bundled CIFAR-10-format files are generated,
    so torchvision's CIFAR10 would reject them on its md5 check: `BundledCIFAR10` is torchvision's
    class with the checksums switched off, nothing more."""
    from dpuoffload.common.data.datasets import BundledCIFAR10

    augment = T.Compose([T.RandomCrop(32, padding=4), T.RandomHorizontalFlip(), T.ToTensor(),
                         T.Normalize((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616))])
    return BundledCIFAR10(root, train=True, transform=augment)


def tinyimagenet(root: str) -> datasets.ImageFolder:
    """shufflenet_v2's data: Tiny-ImageNet JPEG folders with random resized crop + flip."""
    augment = T.Compose([T.RandomResizedCrop(64), T.RandomHorizontalFlip(), T.ToTensor(),
                         T.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))])
    return datasets.ImageFolder(f"{root}/train", transform=augment)


def resnet20(classes: int) -> nn.Module:
    from dpuoffload.common.models.zoo import MODELS

    return MODELS["resnet20"](classes)


def shufflenet_v2(classes: int) -> nn.Module:
    import torchvision

    return torchvision.models.shufflenet_v2_x1_0(weights=None, num_classes=classes)


WORKLOADS = {"resnet20": (cifar10, resnet20), "shufflenet_v2": (tinyimagenet, shufflenet_v2)}


def torch_loader(data: Any, args: argparse.Namespace, rank: int, size: int) -> tuple[Batches, int]:
    """DataLoader with one persistent worker on the spare core; the same batches as `job.loader`.

    A persistent worker keeps its own copy of the data set, so a `seeded(...).set_epoch` in this
    process would never reach it: every sample index carries its epoch instead (`EpochTagged`).
    """
    sampler = DistributedSampler(data, num_replicas=size, rank=rank, shuffle=True, seed=args.seed)
    tagged = TaggedBatches(sampler, args.batch_size, drop_last=False)
    cores = {int(c) for c in args.worker_cores.split(",")}
    loader = DataLoader(EpochTagged(dpu.seeded(data, args.seed)), batch_sampler=tagged, num_workers=1,
                        persistent_workers=True, prefetch_factor=PREFETCH,
                        worker_init_fn=WorkerPlacement(cores, args.worker_cgroup))

    def epoch(e: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        tagged.set_epoch(e)
        return iter(loader)
    return epoch, len(tagged)


def shard_augment() -> T.Compose:
    """The tar shards' augmentation: Tiny-ImageNet's, on the decoded PIL image."""
    return T.Compose([T.RandomResizedCrop(64), T.RandomHorizontalFlip(), T.ToTensor(),
                      T.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))])


def wds_loader(pattern: str, args: argparse.Namespace) -> tuple[Batches, int]:
    """The peer from shards: webdataset's own pipeline (seeded shard shuffle, a 1000-sample buffer,
    PIL decode, the same augmentation) in a DataLoader with one persistent worker on the spare core.
    One host rank: the node split is trivial."""
    import webdataset as wds

    from dpuoffload.common.data.tarshards import count_records, expand

    shards = expand(pattern)
    total = sum(count_records(s) for s in shards)
    data = (wds.WebDataset(shards, shardshuffle=len(shards), seed=args.seed, empty_check=False)
            .shuffle(1000).decode("pil").to_tuple("jpg", "cls").map_tuple(shard_augment(), int))
    cores = {int(c) for c in args.worker_cores.split(",")}
    loader = DataLoader(data, batch_size=args.batch_size, num_workers=1, persistent_workers=True,
                        prefetch_factor=PREFETCH, worker_init_fn=WorkerPlacement(cores, args.worker_cgroup))
    return (lambda e: iter(loader)), -(-total // args.batch_size)


def train_epoch(batches: Iterator[Any], step: Callable[[torch.Tensor, torch.Tensor], None]) -> list[float]:
    """One epoch of the user's loop; returns the seconds each step spent in the loader's `next()`."""
    waits = []
    while True:
        t0 = time.perf_counter()
        try:
            x, y = next(batches)
        except StopIteration:
            return waits
        waits.append(time.perf_counter() - t0)
        step(x, y)


def make_step(model: nn.Module, lr: float, sleep: Optional[float]) -> Callable[[torch.Tensor, torch.Tensor], None]:
    """The user's step: forward, cross-entropy, backward, SGD (or a sleep, for the micro-measurement)."""
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, weight_decay=5e-4)

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        if sleep is not None:
            time.sleep(sleep)
            return
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return step


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workload", choices=tuple(WORKLOADS), required=True)
    p.add_argument("--data", required=True, help="the data set root (bundled CIFAR-10 or Tiny-ImageNet format)")
    p.add_argument("--shards", help="train from these WebDataset tar shards (a brace pattern) instead: "
                                    "dpu.webdataset for --loader dpu, webdataset's own pipeline for torch")
    p.add_argument("--loader", choices=("dpu", "torch"), required=True)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--train-subset", type=int, help="train on the first N samples (default: all)")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--worker-cores", default="1", help="cores the DataLoader worker pins itself to")
    p.add_argument("--worker-cgroup", help="CPU cgroup directory the DataLoader worker enters (default: none)")
    p.add_argument("--step-sleep", type=float, help="sleep this many seconds instead of training (micro)")
    p.add_argument("--times", type=Path, required=True, help="write per-epoch wall and data-wait times here")
    return p.parse_args()


def main() -> None:
    args = parse()
    job = dpu.init()
    make_data, make_model = WORKLOADS[args.workload]
    data = make_data(args.data)
    classes = len(data.classes)
    if args.shards:
        data = dpu.webdataset(args.shards, shard_augment())
    elif args.train_subset is not None:
        data = Subset(data, range(args.train_subset))
    torch.manual_seed(args.seed)
    model = make_model(classes)
    if args.loader == "dpu":
        loader = job.loader(data, batch_size=args.batch_size, seed=args.seed)
        batches, steps = loader.epoch, len(loader)
    elif args.shards:
        batches, steps = wds_loader(args.shards, args)
    else:
        batches, steps = torch_loader(data, args, job.rank, job.size)
    step = make_step(model, args.lr, args.step_sleep)
    epochs = []
    for epoch in range(args.epochs):
        t0 = time.perf_counter()
        waits = train_epoch(iter(batches(epoch)), step)
        epochs.append({"epoch": epoch, "wall_s": time.perf_counter() - t0, "steps": len(waits), "next_s": waits})
    job.finish()
    if job.rank == 0:
        info = {"loader": args.loader, "mode": str(job.mode), "steps_per_epoch": steps,
                "threads": torch.get_num_threads(), "epochs": epochs}
        args.times.write_text(json.dumps(info) + "\n")
        walls = ", ".join(f"{e['wall_s']:.2f}" for e in epochs)
        print(f"{args.workload} {args.loader}: epochs {walls} s ({steps} steps, "
              f"{math.fsum(epochs[-1]['next_s']) * 1e3:.1f} ms in next() in the last)", flush=True)


if __name__ == "__main__":
    main()
