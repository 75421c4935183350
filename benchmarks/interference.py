"""Emulation fidelity: how much work on the emulated DPU core slows the host core.

    python benchmarks/interference.py [--reps 3] [--dpu-speed 0.5] [--augment-busy 0.28] [--quick]

On a real node a DPU's ARM cores are separate silicon with their own memory. In the emulation
they are other cores of the same machine, which share the last-level cache and memory bandwidth
with the host's cores (and in a VM may be hyper-threads of one physical core). Then anything the
DPU rank computes slows the host rank a little, a cost a real DPU would not impose, and the
offload modes that keep the DPU busy (mv: evaluation) look worse here than they would on a
cluster.

This measures host forward/backward throughput (resnet20, batch 16, one thread, pinned to core
0) while core 1 is idle, runs an evaluation loop (what an `mv` DPU rank does) throttled to
`--dpu-speed` like `dpurun --dpu-speed` would, runs it unthrottled, and builds training batches
(what a `da` DPU rank does: the resnet20/cifar10 workload's transform, batches of 16 collated)
inside the same cgroup for `--augment-busy` of core 1's time, sleeping the rest as a DPU rank
does when its host consumes slower. Its default, 0.28, is the busy share of core 1 measured
while the workloads' resnet20 `da` job trained (2026-11-27, RESULTS.md "Measurements by hand"),
whose host forward/backward ran 5-16 % slower than `none`'s. The host is timed once the load
says it runs: a fixed 2 s sleep, before, let a throttled load still be importing torch while the
host was timed (it read 1 % at half a core, where waiting reads 5-10 %). Variants interleaved per
repetition; medians with min–max.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.harness import Section, bench_parser, machine, table, write_json  # noqa: E402
from benchmarks.workloads import throttle_cgroup  # noqa: E402

# core 1's busy share while the workloads' resnet20/cifar10 da job trained (2026-11-27, by hand)
AUGMENT_BUSY = 0.28


def augment_forever(busy: float) -> None:
    """Build resnet20/cifar10 training batches of 16 (load, the workload's transform, collate) for
    `busy` of this process's time: after each batch, sleep until its CPU time is that share of the
    time since the batch began (a cgroup's throttling stretches the batch, not the share)."""
    from benchmarks.harness import make_data
    from dpuoffload.common.config import parse_run_config
    from dpuoffload.common.data.datasets import build_datasets
    from dpuoffload.common.data.sampling import PerSampleSeeded, collated

    cfg = parse_run_config(["--model", "resnet20", "--dataset", "cifar10",
                            "--data", str(make_data(("cifar10",)) / "cifar10")])
    train = PerSampleSeeded(build_datasets(cfg).train, cfg.seed)
    start = 0
    print("ready", flush=True)
    while True:
        t0, c0 = time.perf_counter(), time.thread_time()
        collated(train, start, 16)
        start += 16
        time.sleep(max(0.0, (time.thread_time() - c0) / busy - (time.perf_counter() - t0)))


def probe(kind: str, steps: int, busy: float = 1.0) -> None:
    """`train`: print forward/backward samples/s over `steps` steps; `load`: evaluate forever;
    `augment`: build training batches forever, `busy` of the time (`augment_forever`)."""
    if kind == "augment":
        augment_forever(busy)
        return
    import torch

    from dpuoffload.common.models.resnet_cifar import CifarResNet

    torch.set_num_threads(1)
    model = CifarResNet(20, num_classes=10)
    x, y = torch.rand(16, 3, 32, 32), torch.randint(0, 10, (16,))
    loss_fn = torch.nn.CrossEntropyLoss()
    if kind == "load":
        model.eval()
        print("ready", flush=True)
        with torch.no_grad():
            while True:
                model(x)
    for i in range(steps + 3):  # 3 warm-up steps
        if i == 3:
            t0 = time.perf_counter()
        model.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
    print(json.dumps({"samples_per_s": steps * 16 / (time.perf_counter() - t0)}), flush=True)


def start_load(cgroup: Optional[str], augment_busy: Optional[float] = None) -> subprocess.Popen:
    """The evaluation loop on core 1, or with `augment_busy` the batch building, inside `cgroup`
    when given (entered before exec)."""
    kind = ["--probe", "load"] if augment_busy is None else ["--probe", "augment", "--busy", str(augment_busy)]
    cmd = ["taskset", "-c", "1", sys.executable, __file__, *kind]
    if cgroup:
        cmd = ["sh", "-c", f'echo $$ > {cgroup}/cgroup.procs && exec "$@"', "load", *cmd]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    if proc.stdout.readline().strip() != "ready":  # (imports done: the host side may start timing)
        proc.kill()
        raise RuntimeError(f"interference.py: the load on core 1 ({' '.join(kind)}) ended before it started")
    time.sleep(0.5)  # (its first steps' warm-up)
    return proc


def host_rate(steps: int) -> float:
    out = subprocess.run(["taskset", "-c", "0", sys.executable, __file__, "--probe", "train", "--steps", str(steps)],
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])["samples_per_s"]


def measure(args: argparse.Namespace) -> dict[str, list[float]]:
    steps = 10 if args.quick else 150
    # variant -> None (core 1 idle), or (in the cgroup, the batch building's busy share; None: evaluation)
    loads: dict[str, Optional[tuple[bool, Optional[float]]]] = {
        "idle": None, f"load at {args.dpu_speed}": (True, None), "load at 1.0": (False, None),
        augment_variant(args): (True, args.augment_busy)}
    runs: dict[str, list[float]] = {v: [] for v in loads}
    with throttle_cgroup(args.dpu_speed, 1) as cgroup:
        for rep in range(args.reps):
            for v, how in loads.items():
                load = None if how is None else start_load(cgroup if how[0] else None, how[1])
                try:
                    runs[v].append(host_rate(steps))
                finally:
                    if load is not None:
                        load.kill()
                        load.wait()
                print(f"rep {rep + 1}/{args.reps} {v}: {runs[v][-1]:.0f} samples/s", file=sys.stderr, flush=True)
    return runs


def markdown(runs: dict[str, list[float]], args: argparse.Namespace) -> str:
    idle = statistics.median(runs["idle"])
    rows = [[v, f"{statistics.median(x):.0f} ({min(x):.0f}–{max(x):.0f})", f"{statistics.median(x) / idle:.3f}",
             f"{idle / statistics.median(x):.3f}"] for v, x in runs.items()]
    return (f"Host: resnet20 forward/backward, batch 16, 1 thread on core 0; core 1: idle, an evaluation loop "
            f"(cgroup at --dpu-speed {args.dpu_speed}, or unthrottled), or building resnet20/cifar10 training "
            f"batches {args.augment_busy:.0%} of the time in the same cgroup (a da DPU rank's work); {args.reps} "
            "interleaved repetitions.\n\n"
            + table(["core 1", "host samples/s (min–max)", "vs idle", "host step time factor"], rows))


def build_parser() -> argparse.ArgumentParser:
    p = bench_parser(__doc__, "interference", "10 steps, 1 rep", reps=3, epochs=False, plots=False)
    p.add_argument("--probe", choices=("train", "load", "augment"), help=argparse.SUPPRESS)
    p.add_argument("--steps", type=int, default=150, help=argparse.SUPPRESS)
    p.add_argument("--busy", type=float, default=1.0, help=argparse.SUPPRESS)
    p.add_argument("--augment-busy", type=float, default=AUGMENT_BUSY, metavar="SHARE",
                   help="the share of core 1's time the batch-building load runs (default: %(default)s, what the "
                        "workloads' resnet20 da job's DPU rank used)")
    return p


def augment_variant(args: argparse.Namespace) -> str:
    return f"augmentation at {args.dpu_speed}, {args.augment_busy:.0%} busy"


def run(args: argparse.Namespace) -> Section:
    if not 0 < args.augment_busy <= 1:
        sys.exit(f"interference.py: --augment-busy {args.augment_busy} is not a share of a core; give one in (0, 1]")
    if args.quick:
        args.reps = 1
    runs = measure(args)
    payload: dict[str, Any] = {"machine": machine(), "dpu_speed": args.dpu_speed, "reps": args.reps, "runs": runs,
                               "slowdown": {v: statistics.median(runs["idle"]) / statistics.median(x)
                                            for v, x in runs.items()}}
    write_json(args.out, payload)
    return Section("interference", payload, markdown(runs, args))


def main() -> int:
    args = build_parser().parse_args()
    if args.probe:
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        probe(args.probe, args.steps, args.busy)
        return 0
    print(run(args).markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
