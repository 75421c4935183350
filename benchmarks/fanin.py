"""Fan-in: K worker processes building one host rank's batches (`--dpu-workers K`), samples/s vs K.

    python benchmarks/fanin.py [--reps 2] [--workers 1 2] [--dataset tinyimagenet] [--batch 64]
                               [--steps 8] [--epochs 4] [--quick]

What a DPU augmentation rank does for one stream, outside MPI (the send is the transport
benchmark's): build the batches of `--epochs` epochs of `--steps` steps each, the way `dpu/serve.py`
builds them, side by side in one process:

- **in-process**: `--dpu-workers 0`, the rank's own thread (`RankLoader`, epoch by epoch);
- **workers K**: `common.data.workers.WorkerPool`, K forked workers fed one plan across every epoch;
- **DataLoader K per epoch**: what a user's loop over epochs does with the same K workers
  (`persistent_workers=True`): the iterator ends with each epoch, so the pipeline drains at each
  edge; with short epochs this is the stall `--dpu-workers` avoids.

Each configuration's batches are compared with the in-process ones (sha256 of every batch): the
run fails if any differs. Timings start at the first batch (worker start-up excluded: it is paid
once per job) and are interleaved rep by rep. On the 2-core box, K = 2 can at best double a
single core; on a BlueField (8-16 Arm cores) or the 16-core GPU node, K goes further.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.harness import DATA, Section, bench_parser, machine, make_data, settings, spread, table  # noqa: E402


def _digest(batch: Any, layout: Any, buf: Any) -> str:
    """sha256 of the message's labels and samples: packed here (in-process) or by a worker."""
    from dpuoffload.common.data.batches import HEADER_BYTES

    if isinstance(batch, list):  # the in-process path packs into its send buffer, as serve.py does
        raw = buf.raw[:layout.pack_items(buf, 0, -1, batch)]
    else:
        raw = batch.numpy()
    return hashlib.sha256(raw[HEADER_BYTES:].tobytes()).hexdigest()


def _setup(args: argparse.Namespace) -> tuple[Any, Any, Any]:
    from dpuoffload.common.config import RunConfig
    from dpuoffload.common.data.datasets import build_datasets
    from dpuoffload.common.data.loaders import RankLoader, Sampling, probe_layout
    from dpuoffload.common.data.sampling import PerSampleSeeded

    cfg = RunConfig(dataset=args.dataset, data=str(DATA / args.dataset), train_subset=args.batch * args.steps)
    train = PerSampleSeeded(build_datasets(cfg).train, 0)
    loader = RankLoader(Sampling(args.batch), train, collate=False)
    return train, loader, probe_layout(train, loader.sampling)


def in_process(train: Any, loader: Any, layout: Any, args: argparse.Namespace) -> Iterator[list]:
    for epoch in range(args.epochs):
        loader.set_epoch(epoch)
        yield from loader.batches()


def pool(k: int) -> Callable[[Any, Any, argparse.Namespace], Iterator[list]]:
    def run(train: Any, loader: Any, layout: Any, args: argparse.Namespace) -> Iterator[list]:
        from dpuoffload.common.data.workers import WorkerPool

        p = WorkerPool(train, loader, layout, k)
        try:
            yield from p.batches(0, 0, args.epochs)
        finally:
            p.close()
    return run


def per_epoch(k: int) -> Callable[[Any, Any, argparse.Namespace], Iterator[list]]:
    def run(train: Any, loader: Any, layout: Any, args: argparse.Namespace) -> Iterator[list]:
        from torch.utils.data import DataLoader

        from dpuoffload.common.data.workers import Packing, PlannedKeys

        keys = PlannedKeys(loader)
        dl = DataLoader(Packing(train, layout), batch_sampler=keys, num_workers=k, collate_fn=lambda b: b,
                        persistent_workers=True, prefetch_factor=2)
        for epoch in range(args.epochs):
            keys.plan(epoch, 0, epoch + 1)
            yield from dl
    return run


def measure(variant: Callable, train: Any, loader: Any, layout: Any,
            args: argparse.Namespace) -> tuple[float, list[str]]:
    """Samples/s from the first batch on, and the batches' digests."""
    batches, buf = variant(train, loader, layout, args), layout.buffer()
    digests = [_digest(next(batches), layout, buf)]
    t0, n = time.perf_counter(), 0
    for batch in batches:
        digests.append(_digest(batch, layout, buf))
        n += args.batch
    return n / (time.perf_counter() - t0), digests


def run_all(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    torch.set_num_threads(1)
    train, loader, layout = _setup(args)
    variants = {"in-process": in_process}
    for k in args.workers:
        variants[f"workers {k}"] = pool(k)
        variants[f"DataLoader {k} per epoch"] = per_epoch(k)
    rates: dict[str, list[float]] = {name: [] for name in variants}
    reference = None
    for rep in range(args.reps):
        for name, variant in variants.items():
            rate, digests = measure(variant, train, loader, layout, args)
            reference = reference or digests
            if digests != reference:
                sys.exit(f"fanin: {name} built other batches than the in-process loader")
            rates[name].append(rate)
            print(f"rep {rep + 1}/{args.reps} {name}: {rate:.0f} samples/s", file=sys.stderr, flush=True)
    base = rates["in-process"]
    return {name: {"samples_per_s": spread(r), "vs_in_process": spread([a / b for a, b in zip(r, base)])}
            for name, r in rates.items()}


def markdown(report: dict[str, Any], s: dict[str, Any]) -> str:
    rows = [[name, f"{r['samples_per_s']['median']:.0f} ({r['samples_per_s']['min']:.0f}–"
                   f"{r['samples_per_s']['max']:.0f})", f"{r['vs_in_process']['median']:.2f}"]
            for name, r in report.items()]
    return (f"{s['dataset']}, batch {s['batch']}, {s['epochs']} epochs of {s['steps']} steps, {s['reps']} "
            f"interleaved repetitions, {os.cpu_count()} logical CPUs; every configuration's batches equal the "
            "in-process ones (sha256 per batch).\n\n"
            + table(["batches built by", "samples/s median (min–max)", "vs in-process"], rows))


def build_parser() -> argparse.ArgumentParser:
    p = bench_parser(__doc__, "fanin", "K = 1, 1 rep, cifar10, 3 epochs of 4 steps of 32", epochs=False,
                     dpu_speed=False, plots=False)
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    p.add_argument("--dataset", default="tinyimagenet", choices=("cifar10", "tinyimagenet"))
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--steps", type=int, default=8, help="steps per epoch (short epochs show the edge stall)")
    p.add_argument("--epochs", type=int, default=4)
    return p


def run(args: argparse.Namespace) -> Section:
    if args.quick:
        args.reps, args.workers, args.dataset, args.batch, args.steps, args.epochs = 1, [1], "cifar10", 32, 4, 3
    make_data([args.dataset])
    report = run_all(args)
    payload = {"machine": machine(), "settings": settings(args), "report": report}
    from benchmarks.harness import write_json

    write_json(args.out, payload)
    return Section("fanin", payload, markdown(report, settings(args)))


def main() -> int:
    print(run(build_parser().parse_args()).markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
