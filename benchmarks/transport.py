"""Host<->DPU batch transport vs raw mpi4py Send/Recv of the same bytes between the same two cores.

    python benchmarks/transport.py [--steps 200] [--reps 3] [--quick]

Starts `mpirun` with 2 ranks pinned to cores 0 (receiver, "host") and 1 (sender, "DPU"). For each
batch size it measures, interleaved rep by rep: (raw) blocking `Send`/`Recv` of a preallocated
buffer of the batch message's size (the batch already collated: a peer's lower bound); (ours) the `--mode da` path end to end — the sender packs a
batch's samples straight into a `SendRing` buffer (`BatchLayout.pack_items`: the collate copy,
header, labels) and `Isend`s
it, the receiver takes it from `RemoteFeed` (double-buffered `Irecv`, header checks, zero-copy
views). Bandwidth = payload bytes / receiver time; target: ours >= 0.8 x raw.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.harness import BIN, RESULTS, Section, job_env, machine, table, write_json  # noqa: E402

# (label, batch, sample shape): CIFAR batch 16 / 64, Tiny-ImageNet 64x64 batch 64, ImageNet 224 batch 32
SIZES = [("cifar 16x3x32x32", 16, (3, 32, 32)), ("cifar 64x3x32x32", 64, (3, 32, 32)),
         ("tiny 64x3x64x64", 64, (3, 64, 64)), ("imagenet 32x3x224x224", 32, (3, 224, 224))]


def worker(steps: int, reps: int, sizes: list) -> None:
    import numpy as np
    import torch
    from mpi4py import MPI

    from dpuoffload.common.batches import layout_for
    from dpuoffload.dpu.augment import SendRing
    from dpuoffload.host.feed import RemoteFeed

    world = MPI.COMM_WORLD
    rank = world.Get_rank()
    results = []
    for label, batch, shape in sizes:
        items = [(torch.rand(*shape), i) for i in range(batch)]
        layout = layout_for(items[0][0], batch)
        nbytes = layout.nbytes(batch)
        raw_bw, ours_bw = [], []
        for _ in range(reps):
            buf = np.zeros(nbytes, dtype=np.uint8)
            world.Barrier()
            t0 = time.perf_counter()
            for _ in range(steps):
                world.Recv(buf, source=1, tag=7) if rank == 0 else world.Send(buf, dest=0, tag=7)
            raw_bw.append(nbytes * steps / (time.perf_counter() - t0))
            world.Barrier()
            t0 = time.perf_counter()
            if rank == 0:
                for x, y in RemoteFeed(world, 1, "sender", layout, steps, 60).epoch(0):
                    pass
            else:
                ring = SendRing(world, layout, 4, 60)
                for step in range(steps):
                    slot, sbuf = ring.acquire()
                    ring.send(slot, layout.pack_items(sbuf, 0, step, items), 0)
                slot, sbuf = ring.acquire()
                ring.send(slot, layout.pack_end(sbuf, 0), 0)
                ring.drain()
            ours_bw.append(nbytes * steps / (time.perf_counter() - t0))
        if rank == 0:
            raw, ours = statistics.median(raw_bw), statistics.median(ours_bw)
            results.append({"size": label, "message_bytes": nbytes, "raw_GBps": raw / 1e9, "ours_GBps": ours / 1e9,
                            "ratio": ours / raw})
    if rank == 0:
        print(json.dumps(results))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="2 sizes, 100 steps, 1 rep")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", type=Path, default=RESULTS / "transport.json")
    return p


def run(args: argparse.Namespace) -> Section:
    steps, reps = (100, 1) if args.quick else (args.steps, args.reps)
    me = [sys.executable, __file__, "--worker", "--steps", str(steps), "--reps", str(reps)] + (["--quick"] if args.quick else [])
    cmd = [str(BIN / "mpirun"), "--bind-to", "none", "-np", "1", "taskset", "-c", "0", *me,
           ":", "-np", "1", "taskset", "-c", "1", *me]
    res = subprocess.run(cmd, capture_output=True, text=True, env=job_env())
    if res.returncode != 0:
        sys.exit(f"transport benchmark failed:\n{res.stderr[-3000:]}")
    results = json.loads([ln for ln in res.stdout.splitlines() if ln.startswith("[")][-1])
    payload = {"machine": machine(), "steps": steps, "reps": reps, "results": results}
    write_json(args.out, payload)
    md = "Target: ours / raw >= 0.8.\n\n" + table(["batch message", "bytes", "raw Send/Recv GB/s", "ours GB/s", "ours / raw"],
               [[r["size"], f"{r['message_bytes']:,}", f"{r['raw_GBps']:.2f}", f"{r['ours_GBps']:.2f}",
                 f"{r['ratio']:.2f} {'met' if r['ratio'] >= 0.8 else 'missed'}"] for r in results])
    return Section("transport", payload, md)


def main() -> int:
    args = build_parser().parse_args()
    if args.worker:
        worker(*((100, 1) if args.quick else (args.steps, args.reps)), SIZES[:2] if args.quick else SIZES)
        return 0
    print(run(args).markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
