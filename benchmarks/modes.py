"""Offload modes side by side on the emulated node: none / da / mv / hybrid / naive.

One host rank on core 0; DPU ranks on core 1 throttled with --dpu-speed (a BlueField-2 A72 core
is several times slower than a server x86 core). Every mode of every workload runs once per
repetition, repetitions interleaved, so machine noise hits all modes alike; the table reports
medians and the ratio to `none` measured in this run.

    python benchmarks/modes.py [--reps 2] [--epochs 3] [--dpu-speed 0.5] [--quick]

Columns: epoch time (median over epochs 2..E of all repetitions), its ratio to none, the host's
wait for data per step (in none: loading + augmenting itself; in da/hybrid: the stall on the DPU),
the DPU busy fraction (seconds the DPU ranks worked per host epoch, averaged over DPU ranks).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.harness import (  # noqa: E402
    QUICK_DPU_SPEED,
    RunLog,
    Section,
    bench_parser,
    data_flags,
    dpurun_cmd,
    emulated_node,
    machine,
    make_data,
    run_logged,
    settings,
    write_json,
)

MODES = ("none", "da", "mv", "hybrid", "naive")
QUICK_MODES = ("none", "hybrid", "naive")  # --quick: every kind of DPU work (da + mv in hybrid, a replica)
WORKLOADS = {
    "resnet20/cifar10": ["--model", "resnet20", "--dataset", "cifar10", "--data", "@cifar10"],
    "resnet20/tinyimagenet (JPEG, RandomResizedCrop 64)": ["--model", "resnet20", "--dataset", "tinyimagenet",
                                                           "--data", "@tinyimagenet"],
}


def run_mode(mode: str, workload: list[str], data: Path, args: argparse.Namespace) -> dict:
    training = ["--mode", mode, *data_flags(workload, data), "--epochs", str(args.epochs), "--batch-size", "16",
                "--train-subset", str(args.train), "--val-subset", str(args.val)]
    log = run_logged(dpurun_cmd(emulated_node(2 if mode == "hybrid" else 1, args.dpu_speed), training), mode)
    return summarize(log)


def summarize(log: RunLog) -> dict:
    stall = [h["phases"].get("data", 0.0) / max(h["steps"], 1) for h in log.steady(log.host)]
    epoch_time = {e["epoch"]: e["epoch_time"] for e in log.epochs}
    busy = [dpu_busy(recs, epoch_time) for recs in log.dpus.values()]
    return {"epoch_times": log.epoch_times(), "stall_per_step": statistics.median(stall),
            "dpu_busy": statistics.mean([b for b in busy if b is not None] or [0.0]),
            "final_val_acc": log.epochs[-1]["val_acc"], "job_seconds": log.wall}


def dpu_busy(records: list[dict], host_epoch_time: dict[int, float]) -> float | None:
    """Seconds this DPU rank worked per host epoch (epochs 2..), as a fraction."""
    fractions = []
    for rec in records:
        epoch = rec.get("epoch")
        if epoch is None or epoch == 0 or epoch not in host_epoch_time:
            continue
        phases = rec.get("phases", {})
        if rec.get("work") == "da":
            work = phases.get("augment", 0.0) + phases.get("send", 0.0)
        elif rec.get("work") == "mv":
            work = rec.get("busy_time", 0.0)
        else:  # naive replica: everything but waiting in the allreduce
            work = sum(v for k, v in phases.items() if k != "allreduce")
        fractions.append(work / host_epoch_time[epoch])
    return statistics.mean(fractions) if fractions else None


def build_parser() -> argparse.ArgumentParser:
    p = bench_parser(__doc__, "modes", "1 rep, 2 epochs, cifar10, 64 train / 32 val samples, none / hybrid / naive",
                     plots=False)
    p.add_argument("--train", type=int, default=512, help="training samples (default: 512)")
    p.add_argument("--val", type=int, default=256, help="validation samples (default: 256)")
    return p


def run(args: argparse.Namespace) -> Section:
    workloads = dict(WORKLOADS)
    if args.quick:
        args.reps, args.epochs, args.train, args.val, args.dpu_speed = 1, 2, 64, 32, QUICK_DPU_SPEED
        workloads = {k: v for k, v in workloads.items() if "cifar10" in k}
    modes = QUICK_MODES if args.quick else MODES
    data = make_data()
    runs: dict[str, dict[str, list[dict]]] = {w: {m: [] for m in modes} for w in workloads}
    for rep in range(args.reps):
        for w, flags in workloads.items():
            for mode in modes:
                r = run_mode(mode, flags, data, args)
                runs[w][mode].append(r)
                print(f"rep {rep + 1}/{args.reps} {w} {mode}: {statistics.median(r['epoch_times']):.2f} s/epoch",
                      file=sys.stderr, flush=True)
    report = {w: table_rows(runs[w]) for w in workloads}
    payload = {"machine": machine(), "settings": settings(args), "report": report}
    write_json(args.out, payload)
    return Section("modes", payload, markdown(report, args))


def main() -> int:
    print(run(build_parser().parse_args()).markdown)
    return 0


def table_rows(by_mode: dict[str, list[dict]]) -> dict[str, dict]:
    rows = {}
    base = statistics.median(t for r in by_mode["none"] for t in r["epoch_times"])
    for mode, rs in by_mode.items():
        times = [t for r in rs for t in r["epoch_times"]]
        rows[mode] = {"epoch_s": statistics.median(times), "min": min(times), "max": max(times),
                      "ratio_to_none": statistics.median(times) / base,
                      "stall_ms_per_step": 1e3 * statistics.median(r["stall_per_step"] for r in rs),
                      "dpu_busy": statistics.median(r["dpu_busy"] for r in rs),
                      "final_val_acc": rs[-1]["final_val_acc"]}
    return rows


def markdown(report: dict, args: argparse.Namespace) -> str:
    out = [f"1 host rank (core 0) + DPU rank(s) on core 1 at --dpu-speed {args.dpu_speed}; {args.train} train / "
           f"{args.val} val samples, batch 16, {args.epochs} epochs x {args.reps} interleaved reps"]
    for w, rows in report.items():
        out += [f"\n**{w}**\n", "| mode | epoch s (median) | min–max | vs none | host data wait ms/step | DPU busy |",
                "|---|---|---|---|---|---|"]
        for mode, r in rows.items():
            out.append(f"| {mode} | {r['epoch_s']:.2f} | {r['min']:.2f}–{r['max']:.2f} | {r['ratio_to_none']:.3f} | "
                       f"{r['stall_ms_per_step']:.2f} | {r['dpu_busy']:.0%} |")
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
