"""A plain PyTorch loop that trains from WebDataset tar shards or a Hugging Face Arrow folder, loaded on a DPU rank.

    dpurun make-data /tmp/dpudata
    dpurun -- --mode da examples/streams_loop.py --shards '/tmp/dpudata/tinyimagenet/shards/train-{000000..000005}.tar'
    dpurun -- --mode da examples/streams_loop.py --arrow /tmp/dpudata/tinyimagenet-arrow \
        --arrow-from '/tmp/dpudata/tinyimagenet/shards/train-*.tar'     # writes the Arrow folder first if missing
    dpurun -- --mode none examples/streams_loop.py --shards ...         # loading on the host rank: the same losses

The lines that make it a dpuoffload script are marked `# dpu`. The tar shards are a stream
(`dpu.webdataset`: read in shard order through a shuffle buffer, never indexed); the Arrow folder is a
map-style Hugging Face data set (`dpu.huggingface`; `datasets` must be installed). Either way the
DPU rank builds the batches this host rank would build itself (docs/batches.md, "Streams").
"""

from __future__ import annotations

import argparse
import glob
import os

import torch
import torch.nn.functional as F
from torchvision import transforms as T
from workload import SmallNet

import dpuoffload as dpu  # dpu

CLASSES = 10  # the bundled Tiny ImageNet set's digit classes


def augment() -> T.Compose:
    return T.Compose([T.RandomResizedCrop(32, antialias=True), T.RandomHorizontalFlip(), T.ToTensor(),
                      T.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))])


def arrow_set(folder: str, source: str | None):
    """The Arrow folder as a map-style data set; written from tar shards first when it is missing."""
    import datasets

    if not os.path.isdir(folder):
        if source is None:
            raise SystemExit(f"no Arrow data set at {folder}; pass --arrow-from 'SHARDS-*.tar' to write it")
        files = sorted(glob.glob(source))
        datasets.load_dataset("webdataset", data_files={"train": files}, split="train").save_to_disk(folder)
    return datasets.load_from_disk(folder)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--shards", help="WebDataset tar shards, a brace pattern")
    src.add_argument("--arrow", help="a Hugging Face Arrow folder (save_to_disk)")
    p.add_argument("--arrow-from", help="tar shards (a glob) to write the Arrow folder from, if it is missing")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=32, help="per host rank")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    job = dpu.init()  # dpu
    if args.shards:
        data = dpu.webdataset(args.shards, augment())  # dpu: a stream of tar shards
    else:
        data = dpu.huggingface(arrow_set(args.arrow, args.arrow_from), augment(), image="jpg", label="cls")  # dpu
    loader = job.loader(data, batch_size=args.batch_size, seed=args.seed)  # dpu
    torch.manual_seed(args.seed)
    model = SmallNet(CLASSES)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    for epoch in range(args.epochs):
        losses = []
        for x, y in loader.epoch(epoch):
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        print(f"epoch {epoch}: mean loss {sum(losses) / len(losses):.4f} ({len(losses)} steps)", flush=True)
    job.finish()  # dpu


if __name__ == "__main__":
    main()
