"""The user script `benchmarks/wire.py` runs: one loader of 224 px ImageNet-like batches, a sleep for a step.

    dpurun --host-ranks 1 --dpu-ranks 1 --dpu-cores 1 --host-threads 1 --dpu-threads 1 -- \
        --mode da --wire uint8|float --log-dir DIR --no-progress benchmarks/wire_script.py --out FILE

The data set is held in memory: `--images` distinct random 256x256 RGB PIL images (fixed seed),
reused by index modulo, `--batches` x `--batch-size` samples, with the ImageNet training transform
cut down to its cheap part (`TRANSFORM`: crop, flip, ToTensor, Normalize), so that what differs
between the two wires is the wire itself: under `--wire uint8` the DPU rank sends the cropped and
flipped uint8 images and this host rank runs ToTensor + Normalize on each whole batch; under
`--wire float` the DPU rank runs them per sample and sends float32.

The script walks one epoch of `job.loader(ds, batch_size, epochs=1)` and sleeps `--step` seconds
after each batch (the emulated training step): the DPU rank's ring is full whenever the script asks
for a batch, so the time inside `next()` is what the wire costs the host (receive + the float steps
for uint8; receive + the copy out of the receive buffer for float). Host rank 0 writes per batch the
wall and CPU seconds inside `next()` (process and thread CPU time) and a sha256 over every batch's
bytes (samples and labels) as JSON to `--out`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset
from torchvision import transforms as T

import dpuoffload as dpu

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
SIZE, CROP = 256, 224
# Module level, so that it pickles to the DPU rank with the data set (no lambdas).
TRANSFORM = T.Compose([T.RandomCrop(CROP), T.RandomHorizontalFlip(), T.ToTensor(),
                       T.Normalize(IMAGENET_MEAN, IMAGENET_STD)])


def make_images(n: int, seed: int = 0) -> list[Image.Image]:
    """`n` distinct random 256x256 RGB images (smooth blobs plus noise, so they are not all alike)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        base = rng.integers(0, 256, size=(8, 8, 3), dtype=np.uint8)
        smooth = np.asarray(Image.fromarray(base).resize((SIZE, SIZE), Image.BILINEAR), dtype=np.int16)
        noise = rng.integers(-24, 25, size=(SIZE, SIZE, 3), dtype=np.int16)
        out.append(Image.fromarray(np.clip(smooth + noise, 0, 255).astype(np.uint8), "RGB"))
    return out


class InMemoryImages(Dataset):
    """`length` samples over a few distinct PIL images (index modulo), labels 0..999, torchvision style:
    `transform` applied to the PIL image in `__getitem__` (what `--wire uint8` splits)."""

    def __init__(self, images: list[Image.Image], length: int, transform=TRANSFORM) -> None:
        self.images, self.length, self.transform = images, length, transform

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return self.transform(self.images[i % len(self.images)]), (i * 7919) % 1000


def dataset(images: int, batches: int, batch_size: int) -> InMemoryImages:
    return InMemoryImages(make_images(images), batches * batch_size)


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batches", type=int, default=60, help="batches in the epoch (default: 60)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--images", type=int, default=32, help="distinct images, reused by index modulo (default: 32)")
    p.add_argument("--step", type=float, default=0.15, help="emulated training step, seconds of sleep (default: 0.15)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, required=True, help="host rank 0's timings and digest (JSON)")
    return p.parse_args()


def main() -> None:
    args = parse()
    job = dpu.init()
    loader = job.loader(dataset(args.images, args.batches, args.batch_size), args.batch_size, seed=args.seed,
                        epochs=1)
    digest = hashlib.sha256()
    wall, cpu, thread = [], [], []
    shape, dtype = None, None
    batches = iter(loader.epoch(0))
    t_start = time.perf_counter()
    while True:
        w0, c0, t0 = time.perf_counter(), time.process_time(), time.thread_time()
        try:
            x, y = next(batches)
        except StopIteration:
            break
        wall.append(time.perf_counter() - w0)
        cpu.append(time.process_time() - c0)
        thread.append(time.thread_time() - t0)
        shape, dtype = list(x.shape), str(x.dtype)
        digest.update(x.contiguous().numpy().tobytes())
        digest.update(y.contiguous().numpy().tobytes())
        time.sleep(args.step)  # the training step: the DPU rank fills its ring meanwhile
    epoch_s = time.perf_counter() - t_start
    job.finish()
    if job.rank == 0:
        info = {"mode": str(job.mode), "batches": len(wall), "batch_shape": shape, "dtype": dtype,
                "threads": torch.get_num_threads(), "step_s": args.step, "epoch_s": epoch_s,
                "next_wall_s": wall, "next_cpu_s": cpu, "next_thread_s": thread, "sha256": digest.hexdigest()}
        args.out.write_text(json.dumps(info) + "\n")
        print(f"wire script: {len(wall)} batches {shape} {dtype}, next() median "
              f"{1e3 * sorted(wall)[len(wall) // 2]:.1f} ms, sha256 {digest.hexdigest()[:16]}", flush=True)


if __name__ == "__main__":
    main()
