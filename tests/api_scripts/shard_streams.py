"""A user script that trains from streams of shards (tests/jobs/test_stream_jobs.py runs it under dpurun).

Five loaders over the same kind of data: WebDataset tar shards (`dpuoffload.webdataset`, with a
torchvision augmentation the uint8 wire splits), the same shards through the user's own webdataset
pipeline (`pipeline=`: it augments as it reads), a stream of the user's own (`JsonShards`, below:
the shard protocol, defined in this script so the DPU rank imports it from here), a Hugging Face
Arrow data set (map-style, `set_transform`) and the same tar files streamed by Hugging Face. For each
it records a sha256 per batch of epochs 0, 1 and 2 and of epoch 2 again from step 2 (a resumed epoch), so a
`--mode da` run can be compared with `--mode none`, and the stream's sizes and shard counts.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os

import torch
from torch.utils.data import IterableDataset
from torchvision import transforms as T

import dpuoffload as dpu


class JsonShards(IterableDataset):
    """The user's own stream, an IterableDataset: each shard a JSON-lines file of {"value", "label"},
    the sample draws noise. Iterated as it is, it reads every shard in order; `job.loader` takes it
    by its shard protocol (`shards`, `open_shard`, `sample`)."""

    def __init__(self, folder: str) -> None:
        self.shards = sorted(glob.glob(os.path.join(folder, "*.jsonl")))
        self.transform = None

    def __iter__(self):
        for shard in self.shards:
            yield from map(self.sample, self.open_shard(shard))

    def open_shard(self, shard: str):
        with open(shard) as f:
            for line in f:
                yield json.loads(line)

    def sample(self, record: dict) -> tuple[torch.Tensor, int]:
        return torch.rand(3, 6, 6) + record["value"], record["label"]


def augment() -> T.Compose:
    return T.Compose([T.RandomResizedCrop(16, antialias=True), T.RandomHorizontalFlip(), T.ToTensor(),
                      T.Normalize((0.5, 0.5, 0.5), (0.25, 0.25, 0.25))])


def wds_pipeline(name: str):
    """The user's own webdataset pipeline for one shard (it augments as it reads)."""
    import webdataset as wds

    return (wds.WebDataset(name, shardshuffle=False, nodesplitter=None, workersplitter=None, empty_check=False)
            .decode("pil").to_tuple("jpg", "cls").map_tuple(augment(), int))


def hf_row_transform(batch: dict) -> dict:
    """Hugging Face `set_transform`: batch of rows in, batch out; draws from torch's RNG."""
    tf = augment()
    return {"image": [tf(im.convert("RGB")) for im in batch["image"]], "label": batch["label"]}


def digest(x: torch.Tensor, y: torch.Tensor) -> str:
    return hashlib.sha256(x.numpy().tobytes() + y.numpy().tobytes()).hexdigest()[:16]


def loaders(job, data: str, which: list[str]) -> dict:
    out = {}
    shards = os.path.join(data, "train-{000000..000006}.tar")
    if "wds" in which:
        out["wds"] = job.loader(dpu.webdataset(shards, augment(), shuffle_buffer=24), batch_size=8, seed=5)
    if "wdspipe" in which:
        out["wdspipe"] = job.loader(dpu.webdataset(shards, pipeline=wds_pipeline, shuffle_buffer=24), batch_size=8,
                                    seed=6)
    if "own" in which:
        out["own"] = job.loader(JsonShards(os.path.join(data, "json")), batch_size=4, seed=2)
    if "hf" in which or "hfstream" in which:
        import datasets

        files = sorted(glob.glob(os.path.join(data, "train-*.tar")))
        if "hf" in which:
            arrow = datasets.load_dataset("webdataset", data_files={"train": files}, split="train",
                                          cache_dir=os.path.join(data, "hf-cache"))
            arrow = arrow.rename_columns({"jpg": "image", "cls": "label"})
            arrow.set_transform(hf_row_transform)
            out["hf"] = job.loader(dpu.huggingface(arrow), batch_size=8, seed=1)
        if "hfstream" in which:
            stream = datasets.load_dataset("webdataset", data_files={"train": files}, split="train", streaming=True)
            out["hfstream"] = job.loader(dpu.huggingface(stream, augment(), image="jpg", label="cls",
                                                         shuffle_buffer=16), batch_size=8, seed=4)
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--which", default="wds,wdspipe,own,hf,hfstream")
    args = p.parse_args()
    job = dpu.init()
    seen: dict[str, dict[str, list[str]]] = {}
    for name, loader in loaders(job, args.data, args.which.split(",")).items():
        walk = {f"e{e}": [digest(x, y) for x, y in loader.epoch(e)] for e in (0, 1, 2)}
        walk["e2-from-2"] = [digest(x, y) for x, y in loader.epoch(2, start=2)]
        walk["steps"] = [str(len(loader))]
        seen[name] = walk
    with open(f"{args.out}-{job.rank}.json", "w") as f:
        json.dump(seen, f)
    job.finish()


if __name__ == "__main__":
    main()
