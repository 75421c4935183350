"""Thread and batch sweeps for host and DPU ranks: samples/s vs torch threads per rank and batch size.

    python benchmarks/sweep.py [--reps 2] [--threads 1 2] [--batches 8 16 32 64] [--dpu-speed 0.5] [--quick]


Each (side, threads) point is one process pinned with taskset to the first `threads` cores; a
"DPU" process also enters a `launch.throttle` cgroup limiting it to `--dpu-speed` of those cores,
exactly as `dpurun --dpu-speed` throttles DPU ranks. In it, for every batch size: training
samples/s (forward + backward of resnet20 on bundled CIFAR-format batches, measured with
`common.naive.train_seconds_per_sample`, the cost `--mode auto` profiles) and load + augment +
collate samples/s (what a `da` DPU rank does per batch). Points are interleaved rep by rep;
medians and min–max over repetitions. On this 2-core machine "2 threads" means both cores.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.harness import (  # noqa: E402
    DATA,
    Section,
    bench_parser,
    job_env,
    legend_outside,
    machine,
    make_data,
    pyplot,
    save_figure,
    settings,
    spread,
    table,
    write_json,
)

SIDES = ("host", "dpu")


def worker(threads: int, batches: list[int], min_seconds: float) -> list[dict[str, Any]]:
    """Runs inside the pinned (and for DPU, throttled) process. Every timing spans at least
    `min_seconds`: a CFS quota throttles only over whole 100 ms periods, so a burst shorter than
    the quota runs at full speed and a short timing would miss the throttle entirely."""
    import torch
    from torch.utils.data import default_collate

    from dpuoffload.common.config import RunConfig
    from dpuoffload.common.data.datasets import build_datasets
    from dpuoffload.common.data.sampling import PerSampleSeeded
    from dpuoffload.common.models.zoo import build_model
    from dpuoffload.common.train.naive import train_seconds_per_sample

    torch.set_num_threads(threads)
    cfg = RunConfig(model="resnet20", dataset="cifar10", data=str(DATA / "cifar10"), train_subset=max(batches) * 2)
    data = build_datasets(cfg)
    train = PerSampleSeeded(data.train, 0)
    model = build_model(cfg, data.num_classes)
    out = []
    for b in batches:
        estimate = train_seconds_per_sample(model, train, b, steps=1)
        train_s = train_seconds_per_sample(model, train, b, steps=max(2, math.ceil(min_seconds / (estimate * b))))
        default_collate(train.__getitems__(list(range(b))))  # warm-up
        t0, n = time.perf_counter(), 0
        while time.perf_counter() - t0 < min_seconds:
            default_collate(train.__getitems__(list(range(b))))
            n += b
        aug_s = (time.perf_counter() - t0) / n
        out.append({"batch": b, "train_samples_per_s": 1 / train_s, "augment_samples_per_s": 1 / aug_s})
    return out


def run_point(side: str, threads: int, args: argparse.Namespace, cgroup: str | None) -> list[dict[str, Any]]:
    from dpuoffload.launch.command import cgexec_prefix

    cores = ",".join(str(c) for c in sorted(os.sched_getaffinity(0))[:threads])
    cmd = ["taskset", "-c", cores, *cgexec_prefix(cgroup if side == "dpu" else None), sys.executable, __file__,
           "--worker", "--threads", str(threads), "--batches", *map(str, args.batches),
           "--min-seconds", str(args.min_seconds)]
    env = {**job_env(), "OMP_NUM_THREADS": str(threads)}
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    if res.returncode != 0:
        sys.exit(f"sweep point failed ({side}, {threads} threads): {' '.join(cmd)}\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.splitlines()[-1])


def measure(args: argparse.Namespace) -> dict[str, dict[int, list[list[dict[str, Any]]]]]:
    from benchmarks.workloads import throttle_cgroup

    runs: dict[str, dict[int, list]] = {s: {t: [] for t in args.threads} for s in SIDES}
    for rep in range(args.reps):
        for t in args.threads:
            with throttle_cgroup(args.dpu_speed, t) as cgroup:
                for side in SIDES:
                    runs[side][t].append(run_point(side, t, args, cgroup))
                    print(f"rep {rep + 1}/{args.reps} {side} {t} thread(s) done", file=sys.stderr, flush=True)
    return runs


def analyze(runs: dict[str, dict[int, list]]) -> dict[str, Any]:
    """side -> threads -> batch -> {train, augment}: samples/s spread over repetitions."""
    report: dict[str, Any] = {}
    for side, by_threads in runs.items():
        report[side] = {}
        for t, reps in by_threads.items():
            report[side][str(t)] = {}
            for i, point in enumerate(reps[0]):
                report[side][str(t)][str(point["batch"])] = {
                    "train_samples_per_s": spread([r[i]["train_samples_per_s"] for r in reps]),
                    "augment_samples_per_s": spread([r[i]["augment_samples_per_s"] for r in reps])}
    return report


def markdown(report: dict[str, Any], settings: dict[str, Any]) -> str:
    rows = []
    for side, by_t in report.items():
        for t, by_b in by_t.items():
            for b, r in by_b.items():
                rows.append([side + (f" (--dpu-speed {settings['dpu_speed']})" if side == "dpu" else ""), t, b,
                             f"{r['train_samples_per_s']['median']:.0f} ({r['train_samples_per_s']['min']:.0f}–"
                             f"{r['train_samples_per_s']['max']:.0f})",
                             f"{r['augment_samples_per_s']['median']:.0f} ({r['augment_samples_per_s']['min']:.0f}–"
                             f"{r['augment_samples_per_s']['max']:.0f})"])
    return (f"resnet20, bundled CIFAR-format data, {settings['reps']} interleaved repetitions; samples/s "
            "median (min–max).\n\n" + table(["side", "threads", "batch", "train fwd+bwd samples/s",
                                             "load+augment+collate samples/s"], rows))


def plot(report: dict[str, Any], path: Path) -> Path:
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    for ax, key, title in zip(axes, ("train_samples_per_s", "augment_samples_per_s"),
                              ("training (fwd+bwd)", "load + augment + collate")):
        for side, by_t in report.items():
            for t, by_b in by_t.items():
                bs = [int(b) for b in by_b]
                ax.plot(bs, [by_b[str(b)][key]["median"] for b in bs], marker="o", label=f"{side}, {t} thr")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("batch size")
        ax.set_ylabel("samples/s")
        ax.set_title(title)
        legend_outside(ax, "below", fontsize=7)
    return save_figure(fig, path)


def build_parser() -> argparse.ArgumentParser:
    p = bench_parser(__doc__, "sweep", "1 thread, batches 8 and 16, 1 rep, 0.25 s timings", epochs=False)
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--batches", type=int, nargs="+", default=[8, 16, 32, 64])
    p.add_argument("--min-seconds", type=float, default=1.0,
                   help="each timing spans at least this long, >= several 100 ms CFS periods (default: 1)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return p


def run(args: argparse.Namespace) -> Section:
    if args.quick:
        args.reps, args.threads, args.batches, args.min_seconds = 1, [1], [8, 16], 0.25
    make_data(["cifar10"])
    report = analyze(measure(args))
    payload = {"machine": machine(), "settings": settings(args), "report": report}
    write_json(args.out, payload)
    return Section("sweep", payload, markdown(report, settings(args)), [plot(report, args.plots / "sweep.png")])


def main() -> int:
    args = build_parser().parse_args()
    if args.worker:
        print(json.dumps(worker(args.threads[0], args.batches, args.min_seconds)))
        return 0
    section = run(args)
    print(section.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
