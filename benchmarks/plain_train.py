"""The same tiny job as `dpurun -- --preset debug --epochs 1 --train-subset N --val-subset N`, written
the way a user would without this project: torchvision + DataLoader, one process, no MPI.

    python benchmarks/plain_train.py --data .cache/data/cifar10 [--train-subset 64] [--val-subset 64]

Same model (the project's resnet20, the only CIFAR ResNet-20 at hand), same data, transforms,
batch size, optimizer, LR schedule and step count; one torch thread, like a host rank. It is the
baseline `benchmarks/startup.py` compares dpurun's wall time with.
"""

from __future__ import annotations

import argparse
import math
import sys
import time

import torch
import torchvision
from torch.utils.data import DataLoader, Subset
from torchvision import transforms as T

from dpuoffload.common.models.resnet_cifar import CifarResNet

MEAN, STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)


class LocalCIFAR10(torchvision.datasets.CIFAR10):
    """torchvision's CIFAR10 without its md5 checks (the bundled files are generated, not the originals)."""

    train_list = [[name, None] for name, _ in torchvision.datasets.CIFAR10.train_list]
    test_list = [[name, None] for name, _ in torchvision.datasets.CIFAR10.test_list]
    meta = {**torchvision.datasets.CIFAR10.meta, "md5": None}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", required=True, help="CIFAR-10 root (torchvision layout)")
    p.add_argument("--train-subset", type=int, default=64)
    p.add_argument("--val-subset", type=int, default=64)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--lr", type=float, default=0.05)
    return p


def loaders(args: argparse.Namespace) -> tuple[DataLoader, DataLoader]:
    train_tf = T.Compose([T.RandomCrop(32, padding=4), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)])
    val_tf = T.Compose([T.ToTensor(), T.Normalize(MEAN, STD)])
    train = Subset(LocalCIFAR10(args.data, train=True, transform=train_tf), range(args.train_subset))
    val = Subset(LocalCIFAR10(args.data, train=False, transform=val_tf), range(args.val_subset))
    return (DataLoader(train, batch_size=args.batch_size, shuffle=True),
            DataLoader(val, batch_size=128))


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    train, val = loaders(args)
    model = CifarResNet(20, 10)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=5e-4)
    total = args.epochs * len(train)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5 * (1 + math.cos(math.pi * s / total)))
    loss_fn = torch.nn.CrossEntropyLoss()
    for epoch in range(args.epochs):
        t0 = time.perf_counter()
        model.train()
        for x, y in train:
            opt.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            sched.step()
        model.eval()
        correct = count = 0
        with torch.no_grad():
            for x, y in val:
                correct += int((model(x).argmax(1) == y).sum())
                count += len(y)
        print(f"epoch {epoch + 1}/{args.epochs} | train loss {float(loss.detach()):.4f} | "
              f"val acc {correct / count:.1%} | {time.perf_counter() - t0:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
