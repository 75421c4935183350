"""A user's own training script: torch's DataLoader on the spare core vs `job.loader` with a DPU rank there.

    python benchmarks/own_loop.py [--reps 3] [--epochs 3] [--dpu-speed 0.5] [--quick] [--no-micro]

The same script (`benchmarks/own_loop_script.py`: its own model, data set, SGD, cross-entropy and
loop) runs on the emulated node (host rank on core 0, one DPU rank on core 1 throttled with
`--dpu-speed`), for the resnet20 / CIFAR-10-format and shufflenet_v2 / Tiny-ImageNet-format
workloads of the suite (bundled data, batch 16, the first 384 samples), in two variants,
repetitions interleaved:

- **peer**: `dpurun -- --mode none`, the script's `DataLoader(num_workers=1, persistent_workers=True,
  prefetch_factor=4)` with its worker pinned to core 1 and put in a CPU cgroup of the same speed as
  the DPU rank's (the DPU rank itself only sleeps until the end);
- **api**: `dpurun -- --mode da --da-buffers 4`, the script's `job.loader(...)`: the DPU rank on
  core 1 loads and augments, the host rank receives.

Reported: epoch time (median over epochs 2.. of every repetition, min–max), the ratio api / peer
(ratio of the per-repetition medians; target ≤ 1.00) and the time per step the script spends in
the loader's `next()`. The API's per-step overhead is that time in `--mode da`, where the DPU rank
is ahead of the training step: receiving, checking and copying out a batch that is ready. The
micro-measurement isolates it: the same script with its step replaced by a 20 ms sleep (no
compute on core 0, the producer always ahead), for both loaders, so `next()` costs only the host
side of handing over a ready batch.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.harness import (  # noqa: E402
    BIN,
    QUICK_DPU_SPEED,
    ROOT,
    Section,
    bench_parser,
    emulated_node,
    fmt_spread,
    job_env,
    machine,
    make_data,
    median,
    ratio_spread,
    settings,
    spread,
    table,
    write_json,
)
from benchmarks.workloads import throttle_cgroup  # noqa: E402

SCRIPT = Path(__file__).with_name("own_loop_script.py")
WORKLOADS = {"resnet20/cifar10": {"workload": "resnet20", "data": "cifar10", "train": 384},
             "shufflenet_v2/tinyimagenet": {"workload": "shufflenet_v2", "data": "tinyimagenet", "train": 384}}
MICRO = {"workload": "resnet20", "data": "cifar10", "train": 384, "sleep": 0.02}
VARIANTS = ("peer", "api")
BATCH = 16
DA_BUFFERS = 4  # the DataLoader worker prefetches as many batches (own_loop_script.PREFETCH)
TARGET = 1.00


# ------------------------------------------------------------------------------------ measuring
def script_cmd(variant: str, spec: dict[str, Any], args: argparse.Namespace, times: Path,
               cgroup: Optional[str]) -> list[str]:
    """The dpurun command that runs the user's script with one loader or the other."""
    mode, loader = ("da", "dpu") if variant == "api" else ("none", "torch")
    flags = ["--workload", spec["workload"], "--data", str(ROOT / ".cache" / "data" / spec["data"]),
             "--loader", loader, "--epochs", str(args.epochs), "--batch-size", str(BATCH),
             "--train-subset", str(spec["train"]), "--times", str(times)]
    if variant == "peer":
        flags += ["--worker-cores", "1", *(["--worker-cgroup", cgroup] if cgroup else [])]
    if spec.get("sleep"):
        flags += ["--step-sleep", str(spec["sleep"])]
    return [str(BIN / "dpurun"), *emulated_node(1, args.dpu_speed), "--", "--mode", mode, "--da-buffers",
            str(DA_BUFFERS), "--no-progress", str(SCRIPT), *flags]


def run_script(cmd: list[str], what: str) -> dict[str, Any]:
    """Run one job; the script's JSON (per-epoch wall and per-step `next()` seconds) plus the job's wall."""
    with tempfile.TemporaryDirectory(prefix="dpubench-own-") as tmp:
        times = Path(tmp) / "times.json"
        argv = [str(times) if a == "{times}" else a for a in cmd]
        t0 = time.perf_counter()
        res = subprocess.run(argv, capture_output=True, text=True, env=job_env(), cwd=ROOT, timeout=1800)
        wall = time.perf_counter() - t0
        if res.returncode != 0 or not times.exists():
            sys.exit(f"benchmark run failed ({what}): {' '.join(argv)}\n{res.stdout[-1500:]}\n{res.stderr[-3000:]}")
        return {**json.loads(times.read_text()), "job_wall_s": wall}


def measure(args: argparse.Namespace, specs: dict[str, dict[str, Any]]) -> dict[str, dict[str, list[dict]]]:
    """Every variant of every workload once per repetition, repetitions interleaved (peer, api, ...)."""
    runs: dict[str, dict[str, list[dict]]] = {w: {v: [] for v in VARIANTS} for w in specs}
    with throttle_cgroup(args.dpu_speed, 1) as cgroup:
        for rep in range(args.reps):
            for w, spec in specs.items():
                for v in VARIANTS:
                    run = run_script(script_cmd(v, spec, args, Path("{times}"), cgroup), f"{w} {v}")
                    runs[w][v].append(run)
                    print(f"rep {rep + 1}/{args.reps} {w} {v}: {median(steady_walls(run)):.2f} s/epoch, "
                          f"next() {1e6 * median(steady_waits(run)):.0f} us/step (job {run['job_wall_s']:.0f} s)",
                          file=sys.stderr, flush=True)
    return runs


# ------------------------------------------------------------------------------------- analysis
def steady(run: dict[str, Any]) -> list[dict[str, Any]]:
    """Epochs 2.. (epoch 1 pays the warm-up: worker start, data set hand-over, first allocations)."""
    return run["epochs"][1:] or run["epochs"]


def steady_walls(run: dict[str, Any]) -> list[float]:
    return [e["wall_s"] for e in steady(run)]


def steady_waits(run: dict[str, Any]) -> list[float]:
    return [t for e in steady(run) for t in e["next_s"]]


def next_us(runs: list[dict[str, Any]]) -> dict[str, float]:
    """Microseconds per step in `next()` over every steady step of every repetition: the median
    (the typical hand-over) and the mean (which also carries the stalls on a producer behind)."""
    waits = [t for run in runs for t in steady_waits(run)]
    return {"median": 1e6 * median(waits), "mean": 1e6 * math.fsum(waits) / len(waits),
            "p90": 1e6 * sorted(waits)[int(0.9 * (len(waits) - 1))], "steps": len(waits)}


def analyze(by_variant: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Epoch times, the api / peer ratio and the time in `next()` of one workload."""
    per_rep = {v: [median(steady_walls(run)) for run in runs] for v, runs in by_variant.items()}
    return {"epoch_s": {v: spread([t for run in runs for t in steady_walls(run)]) for v, runs in by_variant.items()},
            "epoch_s_per_rep": per_rep,
            "ratio_api_vs_peer": ratio_spread(per_rep["api"], per_rep["peer"]),
            "next_us": {v: next_us(runs) for v, runs in by_variant.items()},
            "steps_per_epoch": by_variant["api"][0]["steps_per_epoch"]}


# --------------------------------------------------------------------------------------- output
def markdown(report: dict[str, Any], micro: Optional[dict[str, Any]], s: dict[str, Any]) -> str:
    out = [f"The same user script (`benchmarks/own_loop_script.py`), host rank on core 0; on core 1 at "
           f"--dpu-speed {s['dpu_speed']} either the DataLoader's one worker (peer, `--mode none`) or one "
           f"DPU rank serving `job.loader` (api, `--mode da`); batch {BATCH}, {s['epochs']} epochs x "
           f"{s['reps']} interleaved repetitions; epoch s = median over epochs 2.. (min–max).", ""]
    rows = []
    for w, r in report.items():
        q, n = r["ratio_api_vs_peer"], r["next_us"]
        rows.append([w, r["steps_per_epoch"], fmt_spread(r["epoch_s"]["peer"]), fmt_spread(r["epoch_s"]["api"]),
                     f"{fmt_spread(q, 3)} {'met' if q['median'] <= TARGET else 'missed'}",
                     f"{n['peer']['median']:.0f} / {n['peer']['mean']:.0f}",
                     f"{n['api']['median']:.0f} / {n['api']['mean']:.0f}"])
    out.append(table(["workload", "steps/epoch", "peer epoch s", "api epoch s", f"api / peer (≤{TARGET:.2f})",
                      "peer next() µs/step (median / mean)", "api next() µs/step (median / mean)"], rows))
    overhead = {w: r["next_us"]["api"]["median"] for w, r in report.items()}
    out += ["", "**API per-step overhead** (median time in `job.loader`'s `next()` per step in `--mode da`): " +
            ", ".join(f"{w} {us:.0f} µs" for w, us in overhead.items()) + "."]
    if micro is not None:
        out += ["", f"**Host side alone** ({MICRO['workload']} data, the step replaced by a "
                f"{1e3 * MICRO['sleep']:.0f} ms sleep so the producer is always ahead; µs per step in `next()`, "
                "over every steady step)", ""]
        out.append(table(["loader", "median µs", "p90 µs", "mean µs", "steps"],
                         [[v, *(f"{micro[v][k]:.0f}" for k in ("median", "p90", "mean")), micro[v]["steps"]]
                          for v in VARIANTS]))
    return "\n".join(out)


# ------------------------------------------------------------------------------------------ main
def build_parser() -> argparse.ArgumentParser:
    p = bench_parser(__doc__, "own_loop", "1 rep of 2 epochs of 32 samples, resnet20/cifar10 only, no micro",
                     reps=3, plots=False)
    p.add_argument("--no-micro", action="store_true", help="skip the host-side micro-measurement")
    return p


def run(args: argparse.Namespace) -> Section:
    specs = {w: dict(spec) for w, spec in WORKLOADS.items()}
    if args.quick:
        args.reps, args.epochs, args.no_micro, args.dpu_speed = 1, 2, True, QUICK_DPU_SPEED
        specs = {w: {**spec, "train": 32} for w, spec in specs.items() if w == "resnet20/cifar10"}
    make_data(("cifar10", "tinyimagenet"))
    info = machine()
    report = {w: analyze(by) for w, by in measure(args, specs).items()}
    micro = None
    if not getattr(args, "no_micro", False):
        micro = {v: next_us(runs) for v, runs in measure(args, {"micro": MICRO})["micro"].items()}
    info["load_avg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    payload = {"machine": info, "settings": settings(args), "target": TARGET, "report": report, "micro": micro}
    write_json(args.out, payload)
    return Section("own_loop", payload, markdown(report, micro, settings(args)))


def main() -> int:
    section = run(build_parser().parse_args())
    print(section.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
