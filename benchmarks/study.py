"""The recovery study's Figs 3-4, reproduced with `--inject-simulate`: accuracy after a failed
mini-batch, and at the end, against when the failure comes, how far the backward pass got, and
how many replicas survive.

    python benchmarks/study.py [--points 0.25 0.5 0.75] [--progress 0.25 0.5 0.75]
                               [--survivors 1 2 3] [--host-ranks 4] [--batch-size 4] [--epochs 4] [--subset 512]
                               [--quick]

The study (`../shared/papers/low-overhead-resilience-rollback-lossy-forward.txt`, section IV-F)
fails a step of data-parallel training on 8 GPUs during the backward pass, after 25, 50 or 75 % of
the gradients were computed (F-25/50/75), and measures the accuracy after that mini-batch under
immediate rollback (IR: the step is replayed on the partly updated state) and lossy forward (FR: 2,
4 or 6 survivors of 8 average what is left), beside *Baseline* (the failure-free step) and the
step's slowdown. Here, scaled to this 2-core box: every run is a real dpurun job of 4 host ranks
(`--mode none`, no DPU rank: a simulated failure loses no process), resnet20 on 512 images of the
bundled CIFAR-10, 4 epochs of 32 steps (a batch of 4 per host rank: the demo's global batch of 16,
so the model learns as fast as the demo's), and the survivors are 1, 2 or 3 of 4 (the study's 2, 4,
6 of 8: the same shares). The failure points are the last step of epochs 1, 2 and 3, i.e. 25, 50 and
75 % of training, so the validation that ends that epoch is the accuracy *after the failed
mini-batch* (the only difference from the failure-free run is that one step); the last epoch's
validation is the accuracy at the end. The study's *Before* (the state before the mini-batch) is not
measured: validation runs at an epoch's end, not between two steps.

Every run is deterministic (the same flags give the same losses to the bit), so one run per cell.
Columns: validation accuracy after the failed mini-batch and its difference from the failure-free
run's at the same point (points, and relative in % as the study's bars), the final accuracy's, the
validation loss after the failed mini-batch, and the failed step's time over the median step (the
study's slowdown, Figs 3b/4b). Writes `results/study.json` and `results/study.png` (`--plots`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.harness import (  # noqa: E402
    BIN,
    RESULTS,
    ROOT,
    job_env,
    legend_outside,
    machine,
    machine_line,
    make_data,
    pyplot,
    save_figure,
    table,
    write_json,
)

IR, FR = "rollback", "lossy-forward"


def cells(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every failed run to make: (point, progress) x (IR, FR with each survivor count)."""
    out = []
    for point in args.points:
        for progress in args.progress:
            out.append({"point": point, "progress": progress, "recovery": IR, "survivors": None})
            out += [{"point": point, "progress": progress, "recovery": FR, "survivors": s} for s in args.survivors]
    return out


def failed_epoch(point: float, epochs: int) -> int:
    """The epoch (1-based) whose last step fails: `point` of training done after it."""
    epoch = round(point * epochs)
    if not 1 <= epoch < epochs:
        raise SystemExit(f"--points {point}: with --epochs {epochs} a failure point must fall on the end of an "
                         f"epoch before the last (e.g. {', '.join(f'{e / epochs:g}' for e in range(1, epochs))})")
    return epoch


def specs(cell: dict[str, Any], hosts: int, step: int) -> list[str]:
    """`--inject-simulate` specs: the casualties are the highest host ranks (IR: one; every replica
    loses the gradients after the failure under immediate rollback whoever the casualties are)."""
    n = 1 if cell["recovery"] == IR else hosts - cell["survivors"]
    p = f"{round(cell['progress'] * 100)}%"
    return [f"host:{r}@{step}:{p}" for r in range(hosts - n, hosts)]


def job(args: argparse.Namespace, data: Path, extra: list[str]) -> dict[str, Any]:
    """One dpurun job: every epoch's validation and the step times of host rank 0."""
    with tempfile.TemporaryDirectory(prefix="dpustudy-") as tmp:
        log = Path(tmp)
        training = ["--preset", "debug", "--mode", "none", "--no-progress", "--data", str(data / "cifar10"),
                    "--epochs", str(args.epochs), "--train-subset", str(args.subset), "--batch-size",
                    str(args.batch_size), "--log-dir", str(log), *extra]
        cmd = [str(BIN / "dpurun"), "--host-ranks", str(args.host_ranks), "--dpu-ranks", "0", "--oversubscribe",
               "--share-cores", "--", *training]
        res = subprocess.run(cmd, capture_output=True, text=True, env=job_env(), cwd=ROOT, timeout=900)
        if res.returncode != 0:
            sys.exit(f"a study run failed ({' '.join(extra)}):\n{res.stdout[-1500:]}\n{res.stderr[-2500:]}")
        metrics = [json.loads(x) for x in (log / "metrics.jsonl").read_text().splitlines()]
        phases = [json.loads(x) for x in (log / "phases-rank0.jsonl").read_text().splitlines()]
    epochs = sorted((m for m in metrics if m["event"] == "epoch"), key=lambda m: m["epoch"])
    steps = {r["first_global_step"] + i: t for r in phases for i, t in enumerate(r["step_times"])}
    return {"val_acc": [e["val_acc"] for e in epochs], "val_loss": [e["val_loss"] for e in epochs],
            "steps_per_epoch": len(epochs[0]["step_losses"]), "step_s": steps}


def measure(args: argparse.Namespace) -> dict[str, Any]:
    data = make_data(("cifar10",))
    t0 = time.perf_counter()
    base = job(args, data, [])
    spe = base["steps_per_epoch"]
    print(f"[study] failure-free: {spe} steps per epoch, {time.perf_counter() - t0:.0f} s", flush=True)
    runs = []
    for i, cell in enumerate(cells(args)):
        epoch = failed_epoch(cell["point"], args.epochs)
        step = epoch * spe
        extra = [f"--inject-simulate={s}" for s in specs(cell, args.host_ranks, step)]
        extra += ["--simulate-recovery", cell["recovery"]]
        t0 = time.perf_counter()
        got = job(args, data, extra)
        runs.append({**cell, "epoch": epoch, "global_step": step, **row(got, base, epoch, step)})
        print(f"[study] {i + 1}/{len(cells(args))} {label(cell)} at {cell['point']:.0%}: acc after "
              f"{runs[-1]['acc_after']:.4f} (failure-free {runs[-1]['base_after']:.4f}), "
              f"{time.perf_counter() - t0:.0f} s", flush=True)
    return {"baseline": {k: v for k, v in base.items() if k != "step_s"}, "runs": runs}


def row(got: dict[str, Any], base: dict[str, Any], epoch: int, step: int) -> dict[str, Any]:
    """The failed run against the failure-free one: after the failed mini-batch (the validation of
    the epoch it ends) and at the end; the failed step's time over the run's median step."""
    ordinary = [t for s, t in got["step_s"].items() if s not in (step, 1)]
    return {"acc_after": got["val_acc"][epoch - 1], "base_after": base["val_acc"][epoch - 1],
            "loss_after": got["val_loss"][epoch - 1], "base_loss_after": base["val_loss"][epoch - 1],
            "acc_end": got["val_acc"][-1], "base_end": base["val_acc"][-1],
            "slowdown": got["step_s"][step] / statistics.median(ordinary)}


def label(cell: dict[str, Any]) -> str:
    f = f"F-{round(cell['progress'] * 100)}%"
    return f"IR {f}" if cell["recovery"] == IR else f"FR {f}, {cell['survivors']} survivor(s)"


def delta(value: float, base: float) -> str:
    """An accuracy's difference in points, and relative to `base` in % (the study's bars)."""
    points = f"{100 * (value - base):+.1f}"
    return f"{points} ({100 * (value - base) / base:+.1f} %)" if base else points


def markdown(payload: dict[str, Any]) -> str:
    s = payload["settings"]
    rows = []
    for r in payload["runs"]:
        rows.append([f"{r['point']:.0%} (epoch {r['epoch']}, step {r['global_step']})", label(r),
                     f"{100 * r['acc_after']:.1f} ({100 * r['base_after']:.1f})",
                     delta(r["acc_after"], r["base_after"]),
                     f"{r['loss_after']:.4f} ({r['base_loss_after']:.4f})", delta(r["acc_end"], r["base_end"]),
                     f"{r['slowdown']:.2f}x"])
    return "\n".join([
        f"## The recovery study's Figs 3-4 (`benchmarks/study.py`, {time.strftime('%Y-%m-%d')})", "",
        machine_line(payload["machine"]), "",
        f"{s['host_ranks']} host ranks, `--mode none`, resnet20 on the bundled CIFAR-10 ({s['subset']} training "
        f"images, batch {s['batch_size']} per host rank, {payload['baseline']['steps_per_epoch']} steps per epoch, "
        f"{s['epochs']} epochs); failures "
        "simulated with `--inject-simulate` at the last step of an epoch. Accuracy in % (failure-free in "
        "brackets); differences in points (relative to the failure-free run, as the study's bars).", "",
        table(["failure point", "strategy", "acc after the failed mini-batch", "Δ after", "val loss after",
               "Δ final acc", "failed step / median"], rows), ""])


def plot(payload: dict[str, Any], out: Path) -> Path:
    """One panel per failure point (the study's scenarios): bars of the accuracy after the failed
    mini-batch per strategy, the failure-free run's as a line."""
    plt = pyplot()
    points = sorted({r["point"] for r in payload["runs"]})
    fig, axes = plt.subplots(1, len(points), figsize=(4.2 * len(points), 3.6), sharey=True, squeeze=False)
    for ax, point in zip(axes[0], points):
        runs = [r for r in payload["runs"] if r["point"] == point]
        names = [label(r).replace(", ", "\n").replace(" survivor(s)", " surv.") for r in runs]
        colors = ["tab:red" if r["recovery"] == IR else "tab:blue" for r in runs]
        ax.bar(range(len(runs)), [100 * r["acc_after"] for r in runs], color=colors)
        ax.axhline(100 * runs[0]["base_after"], color="black", linestyle="--", label="failure-free (Baseline)")
        ax.set_xticks(range(len(runs)), names, rotation=90, fontsize=7)
        ax.set_title(f"failure at {point:.0%} (epoch {runs[0]['epoch']})", fontsize=9)
        ax.set_ylabel("val accuracy after the failed mini-batch (%)")
    legend_outside(axes[0][-1])
    return save_figure(fig, out / "study.png")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--points", type=float, nargs="+", default=[0.25, 0.5, 0.75],
                   help="failure points, as shares of training ending an epoch (default: 0.25 0.5 0.75)")
    p.add_argument("--progress", type=float, nargs="+", default=[0.25, 0.5, 0.75],
                   help="share of the backward pass done when it fails (default: 0.25 0.5 0.75)")
    p.add_argument("--survivors", type=int, nargs="+", default=[1, 2, 3],
                   help="lossy forward's survivors of --host-ranks (default: 1 2 3 of 4)")
    p.add_argument("--host-ranks", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=4, help="batch per host rank (default: 4)")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--subset", type=int, default=512, help="training images (default: 512)")
    p.add_argument("--quick", action="store_true", help="one failure point, one progress, 2 host ranks (tests)")
    p.add_argument("--out", type=Path, default=RESULTS / "study.json")
    p.add_argument("--plots", type=Path, default=RESULTS, help="directory for the PNG plot")
    args = p.parse_args()
    if args.quick:
        args.points, args.progress, args.survivors, args.host_ranks, args.epochs, args.subset, args.batch_size = \
            [0.5], [0.5], [1], 2, 2, 128, 16
    if any(not 1 <= s < args.host_ranks for s in args.survivors):
        p.error(f"--survivors must be between 1 and {args.host_ranks - 1} (of --host-ranks {args.host_ranks})")
    payload = {"settings": {k: v for k, v in vars(args).items() if k not in ("out", "plots")}, "machine": machine(),
               **measure(args)}
    write_json(args.out, payload)
    print(markdown(payload))
    print(f"[study] plot: {plot(payload, args.plots)}")


if __name__ == "__main__":
    main()
