"""The offload modes on 2 emulated nodes: host rank <-> DPU rank traffic over TCP between machines.

    sudo python benchmarks/multinode.py [--reps 2] [--epochs 3] [--train 512] [--quick]
        [--rate 25gbit]

Four machines on this one box (scripts/nodes.sh: a network namespace each, own hostname and
address, one bridge): host nodes h0 and h1 with one host rank each, and their DPUs d0 and d1 with
two DPU ranks each (hybrid gives one to augmentation and one to validation on every node; da and
mv use what they need). Every mode runs the same training (`--preset debug`, bundled CIFAR-10),
repetitions interleaved mode by mode; the table gives the steady epoch time (epochs 2..) against
`none` and whether the training was the same as `none`'s to the bit (step losses, final weights).
`--rate` shapes every machine's link with tbf (e.g. 25gbit; default: unshaped veths).

All machines share this box's cores: the ratios say what crossing the network costs each mode and
that the modes run across machines, not what real DPU cores add (see `modes` for that, on one box).
Needs root (network namespaces).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.harness import (  # noqa: E402
    NODES,
    ROOT,
    RunLog,
    Section,
    bench_parser,
    emulated_machines,
    machine,
    machine_line,
    machines_env,
    make_data,
    read_log,
    settings,
    table,
    write_json,
)

MODES = ("none", "da", "mv", "hybrid")
MACHINES = ("h0", "h1", "d0", "d1")
LAUNCHER = ["--hosts", "h0:1,h1:1", "--dpus", "d0:2,d1:2", "--host-ranks", "2", "--dpu-ranks", "4"]


def run_mode(mode: str, args: argparse.Namespace, data: Path, env: dict[str, str]) -> RunLog:
    """One job across the emulated machines; its parsed logs (exits with the job's output if it fails)."""
    with tempfile.TemporaryDirectory(prefix="dpubench-mn-") as log:
        cmd = ["bash", str(NODES), "dpurun", *LAUNCHER, "--", "--preset", "debug", "--data", str(data / "cifar10"),
               "--mode", mode, "--epochs", str(args.epochs), "--train-subset", str(args.train), "--val-subset",
               str(args.val), "--no-progress", "--log-dir", log]
        t0 = time.perf_counter()
        res = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=1800)
        if res.returncode != 0:
            sys.exit(f"multinode benchmark: --mode {mode} failed:\n{res.stdout[-1500:]}\n{res.stderr[-3000:]}")
        return read_log(Path(log), time.perf_counter() - t0, res.stdout)


def summarize(runs: dict[str, list[RunLog]]) -> dict[str, dict[str, Any]]:
    """Per mode: median steady epoch time, its ratio to none's, and the same training as none (pure)."""
    def epoch_s(logs: list[RunLog]) -> float:
        return statistics.median(t for log in logs for t in log.epoch_times())

    def training(log: RunLog) -> tuple:
        return tuple(tuple(e["step_losses"]) for e in log.epochs), log.epochs[-1].get("weights_sha256")

    base, reference = epoch_s(runs["none"]), training(runs["none"][0])
    return {mode: {"epoch_s": epoch_s(logs), "ratio_to_none": epoch_s(logs) / base,
                   "min_s": min(t for log in logs for t in log.epoch_times()),
                   "max_s": max(t for log in logs for t in log.epoch_times()),
                   "job_s": statistics.median(log.wall for log in logs),
                   "same_training_as_none": all(training(log) == reference for log in logs)}
            for mode, logs in runs.items()}


def markdown(report: dict[str, dict[str, Any]], s: dict[str, Any], info: dict[str, Any]) -> str:
    link = f"links shaped to {s['rate']} (tbf)" if s.get("rate") else "unshaped veth links"
    head = (f"2 emulated host nodes (1 host rank each) and their 2 DPUs (2 DPU ranks each), one network namespace "
            f"per machine, TCP between machines, {link}; resnet20, {s['train']} train / {s['val']} val samples, "
            f"batch 16, {s['epochs']} epochs x {s['reps']} interleaved repetition(s); every rank on this box's "
            f"shared cores.\n\n{machine_line(info)}\n")
    rows = [[mode, f"{r['epoch_s']:.2f}", f"{r['min_s']:.2f}–{r['max_s']:.2f}", f"{r['ratio_to_none']:.3f}",
             "yes" if r["same_training_as_none"] else "NO", f"{r['job_s']:.0f}"] for mode, r in report.items()]
    return head + "\n" + table(["mode", "epoch s (median)", "min–max", "vs none", "same training as none (bit)",
                                "job s"], rows)


def build_parser() -> argparse.ArgumentParser:
    p = bench_parser(__doc__, "multinode", "1 rep of 2 epochs, 128 train / 64 val samples", dpu_speed=False,
                     plots=False)
    p.add_argument("--train", type=int, default=512, help="training samples (default: 512)")
    p.add_argument("--val", type=int, default=256, help="validation samples (default: 256)")
    p.add_argument("--rate", default=None, help="every machine's link speed, e.g. 25gbit (default: unshaped)")
    return p


def run(args: argparse.Namespace) -> Section:
    if os.geteuid() != 0:
        sys.exit("multinode benchmark: emulated machines need root (network namespaces); run it as root")
    if args.quick:
        args.reps, args.epochs, args.train, args.val = 1, 2, 128, 64
    data, env = make_data(["cifar10"]), machines_env(f"dpbm{os.getpid() % 10000}", "10.80.3", args.rate)
    runs: dict[str, list[RunLog]] = {m: [] for m in MODES}
    with emulated_machines(MACHINES, env, "multinode benchmark"):
        for rep in range(args.reps):
            for mode in MODES:
                runs[mode].append(run_mode(mode, args, data, env))
                print(f"[multinode] rep {rep + 1}/{args.reps} {mode}: "
                      f"{statistics.median(runs[mode][-1].epoch_times()):.2f} s/epoch", file=sys.stderr, flush=True)
    report, info = summarize(runs), machine()
    payload = {"machine": info, "settings": settings(args), "report": report}
    write_json(args.out, payload)
    return Section("multinode", payload, markdown(report, settings(args), info))


def main() -> int:
    print(run(build_parser().parse_args()).markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
