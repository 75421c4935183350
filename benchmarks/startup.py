"""Start-up cost: a tiny dpurun job against the same training as a plain torchvision + DataLoader script.

    python benchmarks/startup.py [--reps 4] [--quick]

Each repetition runs, back to back on this machine, `dpurun -- --preset debug --epochs 1
--train-subset 64 --val-subset 64` (1 host rank on core 0, 1 DPU rank on core 1) and
`benchmarks/plain_train.py` (one process pinned to core 0, one thread: the same model, data,
transforms, steps and validation), and takes each one's wall time from start to exit. Medians,
min–max, their difference and ratio are reported. One more dpurun run goes through
`benchmarks/startup_probe.py` (dpurun `--python` pointed at it) to show where the job's time goes,
from marks every rank takes at each start-up step and at exit.
"""

from __future__ import annotations

import argparse
import json
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.harness import (  # noqa: E402
    BIN,
    ROOT,
    Section,
    bench_parser,
    fmt_spread,
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

# (label, mark that ends the part): consecutive marks of host rank 0; "end" is dpurun's exit.
PARTS = [("dpurun + mpirun start", "exec"), ("interpreter + torch import", "import_torch"),
         ("program imports", "import_program"), ("torchvision imported ahead", "import_ahead"),
         ("MPI init + topology", "mpi_init_topology"),
         ("flags + threads + determinism", "configure"), ("handshake", "handshake"),
         ("datasets + model", "prepare_data_model"), ("waiting for every rank, profiles", "profile_started"),
         ("allreduce init", "allreduce_init"), ("training + validation", "trained"),
         ("DPU shutdown + allreduce shutdown + trace", "trace_finish"), ("exit hooks", "exit"),
         ("MPI finalize, process exit, mpirun exit", "end")]


TARGET_S = 2.0  # issue 16: a tiny job may cost at most this much more than the plain script
UNCUT_BTL = "self,sm,tcp,ofi,uct"  # Open MPI's default: every transport pip's build has (ofi: ~1 s MPI_Init)
LATE_ENV = {"DPUOFFLOAD_IMPORT_AHEAD": "0"}  # common/runtime/torchsetup.py's import_torch_ahead, off
GC_ON_ENV = {"DPUOFFLOAD_GC_FREEZE": "0"}  # common/runtime/malloc.py's pause_collector (and freeze), off
UNCUT_ENV = {"DPUOFFLOAD_FAST_EXIT": "0", **LATE_ENV, **GC_ON_ENV}  # and common/runtime/fastexit.py's opt-out
DA, DA_LATE = "dpurun da", "dpurun da, imports late"  # the --mode da pair: imports ahead, at first use
DA_GC_ON = "dpurun da, collector on"  # ...and the collector left on through start-up


def job_flags(data: Path, subset: int) -> list[str]:
    return ["--preset", "debug", "--data", str(data), "--epochs", "1", "--train-subset", str(subset),
            "--val-subset", str(subset)]


def launcher_flags() -> list[str]:
    """1 host + 1 DPU rank; `--skip-checks` where dpurun has it (its pre-launch checks are measured apart)."""
    from dpuoffload.launch import cli

    flags = {s for a in cli.build_launcher_parser()._actions for s in a.option_strings}
    return ["--host-ranks", "1", "--dpu-ranks", "1"] + (["--skip-checks"] if "--skip-checks" in flags else [])


def timed(cmd: list[str], extra_env: dict[str, str] | None = None) -> float:
    """Wall seconds of `cmd`, start to exit; a failure ends the benchmark with its output."""
    t0 = time.perf_counter()
    res = subprocess.run(cmd, capture_output=True, text=True, env={**job_env(), **(extra_env or {})}, cwd=ROOT)
    wall = time.perf_counter() - t0
    if res.returncode != 0:
        sys.exit(f"startup benchmark run failed: {' '.join(cmd)}\n{res.stdout[-1500:]}\n{res.stderr[-3000:]}")
    return wall


def dpurun_cmd(data: Path, subset: int, python: str | None = None, uncut: bool = False,
               mode: str = "none") -> list[str]:
    """The tiny job; `uncut`: without this benchmark's start-up cuts (Open MPI's default transports,
    libfabric included; the interpreter's full teardown at exit, see `UNCUT_ENV`). `mode`: in `none`
    the DPU rank idles (never imports torch); in `da` it builds the batches (imports torch, torchvision)."""
    py = ["--python", python] if python else []
    mpi = [f"--mpirun-arg=--mca btl {UNCUT_BTL}"] if uncut else []
    return [str(BIN / "dpurun"), *launcher_flags(), *mpi, *py, "--", *job_flags(data, subset), "--mode", mode,
            "--no-progress"]


def plain_cmd(data: Path, subset: int) -> list[str]:
    return ["taskset", "-c", "0", sys.executable, str(ROOT / "benchmarks" / "plain_train.py"), "--data", str(data),
            "--train-subset", str(subset), "--val-subset", str(subset)]


def breakdown(data: Path, subset: int, uncut: bool = False, mode: str = "none",
              extra_env: dict[str, str] | None = None) -> dict[str, Any]:
    """One probed dpurun run: seconds per part on host rank 0, and each rank's marks."""
    with tempfile.TemporaryDirectory(prefix="dpustartup-") as tmp:
        wrapper = Path(tmp) / "python"
        wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} {ROOT / "benchmarks" / "startup_probe.py"} "$@"\n')
        wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
        probe_env = {"STARTUP_T0": repr(time.time()), "STARTUP_PROBE_DIR": tmp, **(UNCUT_ENV if uncut else {}),
                     **(extra_env or {})}
        wall = timed(dpurun_cmd(data, subset, str(wrapper), uncut, mode), probe_env)
        ranks = {p.stem: json.loads(p.read_text()) for p in sorted(Path(tmp).glob("rank*.json"))}
    host = dict(next(r for r in ranks.values() if r["module"].endswith("host"))["marks"])
    host["end"] = wall
    parts, last = {}, 0.0
    for label, mark in PARTS:
        if mark in host:
            parts[label], last = host[mark] - last, host[mark]
    return {"wall_s": wall, "parts_s": parts, "ranks": ranks}


def run(args: argparse.Namespace) -> Section:
    reps, subset = (1, 64) if args.quick else (args.reps, args.subset)
    data = make_data(["cifar10"]) / "cifar10"
    variants = {"dpurun": lambda: timed(dpurun_cmd(data, subset)), "plain": lambda: timed(plain_cmd(data, subset))}
    if not args.quick:
        variants[DA] = lambda: timed(dpurun_cmd(data, subset, mode="da"))
        variants[DA_LATE] = lambda: timed(dpurun_cmd(data, subset, mode="da"), LATE_ENV)
        variants[DA_GC_ON] = lambda: timed(dpurun_cmd(data, subset, mode="da"), GC_ON_ENV)
        variants["dpurun, uncut"] = lambda: timed(dpurun_cmd(data, subset, uncut=True), UNCUT_ENV)
    walls: dict[str, list[float]] = {v: [] for v in variants}
    for rep in range(reps):  # interleaved: machine noise hits every variant alike
        for name, measure in variants.items():
            walls[name].append(measure())
        print(f"rep {rep + 1}/{reps}: " + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in walls.items()),
              file=sys.stderr, flush=True)
    parts = {"dpurun": breakdown(data, subset)}
    if not args.quick:
        parts["dpurun, uncut"] = breakdown(data, subset, uncut=True)
        parts[DA] = breakdown(data, subset, mode="da")
        parts[DA_LATE] = breakdown(data, subset, mode="da", extra_env=LATE_ENV)
        parts[DA_GC_ON] = breakdown(data, subset, mode="da", extra_env=GC_ON_ENV)
    stats, summary = summarize(walls)
    payload = {"machine": machine(), "settings": settings(args), "reps": reps, "subset": subset,
               "launcher": launcher_flags(), "walls_s": walls, "stats": stats, "summary": summary,
               "target_difference_s": TARGET_S, "breakdown": parts}
    write_json(args.out, payload)
    plots = [plot(parts, args.plots / "startup.png")] if args.plots else []
    return Section("startup", payload, markdown(stats, summary, parts), plots)


def summarize(walls: dict[str, list[float]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Each variant's spread, and each one against the plain script, pair by pair; with the `--mode da`
    pair, the imports before MPI init against imports at first use ("imports ahead")."""
    stats = {k: spread(v) for k, v in walls.items()}
    summary = {k: {"difference_s": spread([a - b for a, b in zip(walls[k], walls["plain"])]),
                   "ratio": stats[k]["median"] / stats["plain"]["median"]} for k in walls if k != "plain"}
    if DA in walls and DA_LATE in walls:  # (the imports before MPI init, on and off, where the DPU computes)
        summary["imports ahead"] = {"difference_s": spread([a - b for a, b in zip(walls[DA], walls[DA_LATE])]),
                                    "ratio": stats[DA]["median"] / stats[DA_LATE]["median"]}
    if DA in walls and DA_GC_ON in walls:  # (the collector paused through start-up, against left on)
        summary["collector paused"] = {"difference_s": spread([a - b for a, b in zip(walls[DA], walls[DA_GC_ON])]),
                                       "ratio": stats[DA]["median"] / stats[DA_GC_ON]["median"]}
    return stats, summary


def markdown(stats: dict[str, Any], summary: dict[str, Any], parts: dict[str, Any]) -> str:
    names = {"dpurun": "dpurun, 1 host + 1 DPU rank (--mode none)", DA: "dpurun --mode da",
             DA_LATE: "dpurun --mode da, imports at first use (DPUOFFLOAD_IMPORT_AHEAD=0)",
             DA_GC_ON: "dpurun --mode da, the collector on through start-up (DPUOFFLOAD_GC_FREEZE=0)",
             "dpurun, uncut": "dpurun --mode none without the start-up cuts",
             "plain": "plain torchvision + DataLoader script"}
    rows = []
    for k, s in stats.items():
        d = summary.get(k)
        rows.append([names[k], fmt_spread(s), fmt_spread(d["difference_s"]) if d else "",
                     f"{d['ratio']:.2f}" if d else "", s["n"]])
    md = table(["job (same model, data, steps)", "wall s, median (min–max)", "− plain, s per pair", "ratio", "runs"],
               rows)
    d = summary["dpurun"]["difference_s"]["median"]
    md += f"\n\nTarget dpurun − plain ≤ {TARGET_S:.0f} s: {'met' if d <= TARGET_S else 'missed'} ({d:.2f} s)."
    if "imports ahead" in summary:
        a = summary["imports ahead"]
        md += (f" `--mode da` with torch and torchvision imported before MPI init − at first use: "
               f"{fmt_spread(a['difference_s'])} s per pair (ratio {a['ratio']:.2f}).")
    if "collector paused" in summary:
        c = summary["collector paused"]
        md += (f" `--mode da` with the collector paused through start-up − left on: "
               f"{fmt_spread(c['difference_s'])} s per pair (ratio {c['ratio']:.2f}).")
    md += "\n\nWhere one job's time goes (host rank 0, marks from `startup_probe.py`; one run each):\n\n"
    labels = list(parts["dpurun"]["parts_s"])
    cols = list(parts)
    md += table(["part", *(f"{c}, s" for c in cols)],
                [[label, *(f"{parts[c]['parts_s'].get(label, 0.0):.2f}" for c in cols)] for label in labels]
                + [["wall", *(f"{parts[c]['wall_s']:.2f}" for c in cols)]])
    return md


def plot(parts: dict[str, Any], path: Path) -> Path:
    """One stacked bar per probed job: the parts of its wall time, in order."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 1.2 + 0.6 * len(parts)))
    labels = list(parts["dpurun"]["parts_s"])
    left = [0.0] * len(parts)
    for label in labels:
        seconds = [p["parts_s"].get(label, 0.0) for p in parts.values()]
        ax.barh(list(parts), seconds, left=left, label=label)
        left = [a + b for a, b in zip(left, seconds)]
    ax.set_xlabel("seconds since dpurun started")
    ax.set_title("Where a tiny job's wall time goes")
    legend_outside(ax, fontsize=7)
    return save_figure(fig, path)


def build_parser() -> argparse.ArgumentParser:
    p = bench_parser(__doc__, "startup", "1 pair and the breakdown run (keeps the command working)", reps=4,
                     epochs=False, dpu_speed=False)
    p.add_argument("--subset", type=int, default=64, help="train and val samples of the job (default: 64)")
    return p


def main() -> int:
    print(run(build_parser().parse_args()).markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
