"""Goodput: the same training with host ranks killed from outside at a rate, under each recovery.

    python benchmarks/goodput.py [--every 60 30 10] [--only NAME ...] [--victims host|dpu] [--reps 1]
                                 [--epochs 24] [--subset 1497] [--host-ranks 4] [--spares 3] [--quick]

Every run is a real dpurun job (`--host-ranks` host + 2 DPU ranks, `--mode da`, resnet20 on the bundled
CIFAR-10, batch 16 per host rank). A killer thread in this process finds the job's ranks by their
command line (the run's own log directory) and their world rank (`OMPI_COMM_WORLD_RANK` in their
environment) and `kill -9`s a random one every T seconds: T counted from when the job (or a relaunch)
trains (host rank 0's "mode" line, after start-up; a death inside MPI's own start-up is another
matter, see RESULTS.md), so T is training time and a relaunch's start-up is its cost.
`--victims host` (default) kills a rank in a host rank's seat: one of the launch's original host ranks,
or a spare once its line says it took a seat (never the last seated rank: a death with no rank left
to go on is not a recovery's to survive); `--victims dpu` kills a DPU rank (the strategies then add
`--dpu-failure fallback` where they can).

Strategies (each against the failure-free run of the same settings):
- `rollback`: `--recovery rollback`, `dpurun --spare-ranks S`: a spare replays the failed step from a
  survivor's state, to the bit. The pool is the S dormant spares: once they are all seated, the next
  death ends the job and `dpurun --restarts N` relaunches it from DPU memory (checkpoints every
  `CKPT_EVERY` steps) with its pool full again, so every death is survived;
- `lossy forward`: `--recovery lossy-forward --reassign`: the survivors finish the step with their own
  gradients and take the dead rank's batches over from the next step (one batch lost per death); each
  death leaves fewer replicas;
- `lossy forward + spares`: the same with `dpurun --spare-ranks S`: a spare takes each vacant seat at the
  next epoch's start, and the group is whole again (while spares are left);
- `restart (DPU memory)`: `dpurun --restarts N` with `--ckpt-every K`: the job is relaunched and resumes
  from the keepers' DPU memory (`--ckpt-mem-keep 2`, which `--restarts` sets), replaying the steps since;
- `restart (disk)`: the same with `--ckpt-mem-keep 0`: it resumes from the checkpoint files.

Columns: *failures* killed / survived (a strategy that runs out of spares or replicas ends the job, a
non-zero exit, and is counted so); *wall s*; *goodput*: useful samples per second (the epochs' samples
less those lost) over the failure-free run's; *acc Δ*: final validation accuracy minus the
failure-free run's, in points (a job that did not finish: none); *lost*, *replayed*: samples never
trained, steps trained twice; *seats refilled*: spares called into seats; *relaunches*; *whole again
after*: the median seconds from a death's notice to the group at full size again (rollback: the spare
seated; lossy forward + spares: the next epoch's start; a restart: the job's end and relaunch until
training resumed, the detection not counted). With `--reps N` each repetition starts with its own
failure-free run (this box drifts by tens of percent over an hour), a strategy's goodput is against its
repetition's, and a table cell gives the median (and range) over the repetitions, the counts added up.
Writes `results/goodput.json` (`--out`) and prints the table.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.harness import BIN, RESULTS, ROOT, job_env, machine, machine_line, make_data, table, write_json  # noqa: E402

DPUS = 2
CKPT_EVERY = 8          # steps between checkpoints under the restart strategies (the most a restart replays)
RESTARTS = 30           # --restarts: more than any rate here kills in one run
BANNER = "[dpuoffload] mode "   # host rank 0's line once start-up is done and training begins (host/main.py)
STRATEGIES = ("rollback", "lossy forward", "lossy forward + spares", "restart (DPU memory)", "restart (disk)")
SEATED = re.compile(r"\(world rank (\d+), node [^)]*\) takes host rank \d+'s seat")  # (host/spare.py's line)


@dataclass(frozen=True)
class Rank:
    pid: int
    world_rank: int
    dpu: bool
    standby: bool   # a spare (app context 2), which the killer leaves alone


def job_ranks(marker: str) -> list[Rank]:
    """The live ranks of the job whose command line holds `marker` (its log directory)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().split(b"\0")
            if marker.encode() not in cmd or b"-m" not in cmd:
                continue
            env = dict(kv.split(b"=", 1) for kv in (entry / "environ").read_bytes().split(b"\0") if b"=" in kv)
            status = (entry / "stat").read_text().split()[2]
        except (OSError, ValueError):
            continue
        if status == "Z" or b"OMPI_COMM_WORLD_RANK" not in env:
            continue
        out.append(Rank(int(entry.name), int(env[b"OMPI_COMM_WORLD_RANK"]), b"dpuoffload.dpu" in cmd,
                        env.get(b"DPUOFFLOAD_STANDBY") == b"spare"))
    return out


class Killer(threading.Thread):
    """Every `every` seconds (counted from when a launch's ranks are all up), SIGKILL one victim."""

    def __init__(self, marker: str, every: float, victims: str, expected: int, seed: int, stdout: Path) -> None:
        """`victims`: "host" or "dpu"; `expected`: the ranks of one launch (host and DPU, not spares);
        `stdout`: the job's output, where each launch's host rank 0 says it trains (`BANNER`)."""
        super().__init__(daemon=True)
        self.marker, self.every, self.victims, self.expected, self.stdout = marker, every, victims, expected, stdout
        self.rng = random.Random(seed)
        self.kills: list[dict[str, Any]] = []
        self.done = threading.Event()

    def run(self) -> None:
        previous: set[int] = set()
        launches = 0
        while (launch := self._launch_up(previous, launches)) is not None:
            previous, launches = launch, launches + 1
            while self._wait(launch) == "due":
                pool = self._victims(launch, launches)
                if len(pool) < (1 if self.victims == "dpu" else 2):
                    continue   # (never the last seated rank; a spare may take a seat later)
                victim = self.rng.choice(pool)
                os.kill(victim.pid, signal.SIGKILL)
                self.kills.append({"time": time.time(), "world_rank": victim.world_rank, "dpu": victim.dpu})

    def _victims(self, launch: set[int], launches: int) -> list[Rank]:
        """The launch's living DPU ranks, or the ranks in host rank seats: its original host ranks and the
        spares its output says took a seat (since its own start: a relaunch's world ranks repeat)."""
        ranks = [r for r in job_ranks(self.marker) if r.dpu == (self.victims == "dpu")]
        if self.victims == "dpu":
            return [r for r in ranks if r.pid in launch]
        text = self.stdout.read_text(errors="replace").split(BANNER)
        seated = {int(w) for w in SEATED.findall(BANNER.join(text[launches:]))}
        return [r for r in ranks if (r.pid in launch and not r.standby) or (r.standby and r.world_rank in seated)]

    def _wait(self, launch: set[int]) -> str:
        """"due" after `every` seconds, "ended" once the launch's ranks are gone (a relaunch comes), "done"."""
        deadline = time.monotonic() + self.every
        while not self.done.wait(0.2):
            if not launch & {r.pid for r in job_ranks(self.marker)}:
                return "ended"
            if time.monotonic() >= deadline:
                return "due"
        return "done"

    def _launch_up(self, previous: set[int], launches: int) -> Optional[set[int]]:
        """Wait for a launch (the first or a relaunch) to train: its ranks' pids, or None at the end."""
        while not self.done.wait(0.2):
            ranks = [r for r in job_ranks(self.marker) if not r.standby and r.pid not in previous]
            started = self.stdout.read_text(errors="replace").count(BANNER) if self.stdout.exists() else 0
            if len(ranks) >= self.expected and started > launches:
                return {r.pid for r in ranks}
        return None


def run(args: argparse.Namespace, data: Path, strategy: Optional[str], every: Optional[float]) -> dict[str, Any]:
    """One dpurun job (`strategy` None: failure-free) with a kill every `every` seconds."""
    with tempfile.TemporaryDirectory(prefix="dpugoodput-") as tmp:
        log = Path(tmp) / "log"
        training = ["--preset", "debug", "--no-progress", "--mode", "da", "--data", str(data / "cifar10"),
                    "--train-subset", str(args.subset), "--epochs", str(args.epochs), "--batch-size", "16",
                    "--seed", "0", "--log-dir", str(log)]
        launch = ["--host-ranks", str(args.host_ranks), "--dpu-ranks", str(DPUS), "--oversubscribe", "--share-cores"]
        dpu_fallback = ["--dpu-failure", "fallback"] if args.victims == "dpu" else []
        checkpoints = ["--ckpt-dir", str(Path(tmp) / "ckpt"), "--ckpt-every", str(CKPT_EVERY)]
        if strategy == "rollback":
            training += ["--recovery", "rollback", *dpu_fallback, *checkpoints]
            launch += ["--spare-ranks", str(args.spares), "--restarts", str(RESTARTS)]
        elif strategy in ("lossy forward", "lossy forward + spares"):
            training += ["--recovery", "lossy-forward", "--reassign", *dpu_fallback]
            launch += ["--spare-ranks", str(args.spares)] if strategy.endswith("spares") else []
        elif strategy is not None:
            training += [*checkpoints, *(["--ckpt-mem-keep", "0"] if strategy == "restart (disk)" else [])]
            launch += ["--restarts", str(RESTARTS)]
        out = Path(tmp) / "stdout.txt"
        killer = Killer(str(log), every, args.victims, args.host_ranks + DPUS, len(strategy or ""), out) \
            if every is not None else None
        if killer is not None:
            killer.start()
        t0 = time.perf_counter()
        with out.open("w") as stdout:
            res = subprocess.run([str(BIN / "dpurun"), *launch, "--", *training], stdout=stdout,
                                 stderr=subprocess.PIPE, text=True, env=job_env(), cwd=ROOT, timeout=args.timeout)
        res.stdout = out.read_text(errors="replace")
        wall = time.perf_counter() - t0
        if killer is not None:
            killer.done.set()
            killer.join()
        return outcome(log, res, wall, killer.kills if killer else [], args)


def read(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def outcome(log: Path, res: subprocess.CompletedProcess[str], wall: float, kills: list[dict[str, Any]],
            args: argparse.Namespace) -> dict[str, Any]:
    metrics = read(log / "metrics.jsonl")
    epochs = {r["epoch"]: r for r in metrics if r["event"] == "epoch" and "val_acc" in r}
    recoveries = [r for r in metrics if r["event"] == "recovery" and r.get("lost_host_ranks")]
    grown = [r for r in metrics if r["event"] == "grown_back"]
    restarts = read(log / "restarts.jsonl")
    finished = res.returncode == 0 and len(epochs) == args.epochs
    return {"exit": res.returncode, "finished": finished, "wall": wall, "kills": kills,
            "survived": len(kills) if finished else max(len(kills) - 1, 0),
            "recoveries": len(recoveries), "restarts": len(restarts),
            "refilled": sum(len(r.get("replaced_by") or []) for r in recoveries + grown),
            "whole_again_s": whole_again(recoveries, grown, restarts),
            "samples_lost": sum(r.get("samples_lost", 0) for r in recoveries),
            "replayed_steps": sum(r.get("replayed_steps", 0) or 0 for r in recoveries + restarts),
            "final_acc": epochs[max(epochs)]["val_acc"] if finished else None,
            "tail": "" if finished else (res.stdout[-800:] + res.stderr[-800:])}


def whole_again(recoveries: list[dict[str, Any]], grown: list[dict[str, Any]],
                restarts: list[dict[str, Any]]) -> list[float]:
    """Seconds from each death's notice until the group was at full size again: a rollback's spare
    seated (its record), a growth back (the latest notice of a death of each seat it filled, to its
    record), a relaunch (the job's end and the relaunch until training resumed: the detection of an
    outside kill is not known)."""
    out = [r["reported_time"] - r["learnt_time"] for r in recoveries if r.get("replaced_by")]
    for g in grown:
        for seat in g["seats"]:
            notices = [r["learnt_time"] for r in recoveries
                       if seat in r["lost_host_ranks"] and r["learnt_time"] <= g["reported_time"]]
            out += [g["reported_time"] - max(notices)] if notices else []
    out += [(r.get("ended_s") or 0.0) + r["resumed_s"] for r in restarts if r.get("resumed_s") is not None]
    return out


def row(name: str, every: Optional[float], r: dict[str, Any], ref: dict[str, Any], samples: int) -> dict[str, Any]:
    useful = samples - r["samples_lost"] if r["finished"] else 0
    return {"strategy": name, "every_s": every, "killed": len(r["kills"]), "survived": r["survived"],
            "finished": r["finished"], "exit": r["exit"], "wall_s": r["wall"],
            "goodput": (useful / r["wall"]) / (samples / ref["wall"]),
            "acc_delta_pts": 100 * (r["final_acc"] - ref["final_acc"]) if r["finished"] else None,
            "samples_lost": r["samples_lost"], "replayed_steps": r["replayed_steps"],
            "restarts": r["restarts"], "recoveries": r["recoveries"], "refilled": r["refilled"],
            "whole_again_s": r["whole_again_s"], "tail": r["tail"]}


def cells(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One cell per (strategy, rate) over its repetitions: medians of wall, goodput and accuracy, the
    kills, survivals, losses, replays, refills and relaunches added up, every whole-again time pooled."""
    out = []
    for key in dict.fromkeys((r["strategy"], r["every_s"]) for r in rows):
        reps = [r for r in rows if (r["strategy"], r["every_s"]) == key]
        deltas = [r["acc_delta_pts"] for r in reps if r["acc_delta_pts"] is not None]
        out.append({"strategy": key[0], "every_s": key[1], "reps": len(reps),
                    "finished": sum(r["finished"] for r in reps),
                    **{k: sum(r[k] for r in reps) for k in ("killed", "survived", "samples_lost", "replayed_steps",
                                                             "refilled", "restarts")},
                    "wall_s": statistics.median(r["wall_s"] for r in reps),
                    "goodput": statistics.median(r["goodput"] for r in reps),
                    "goodput_range": [min(r["goodput"] for r in reps), max(r["goodput"] for r in reps)],
                    "acc_delta_pts": statistics.median(deltas) if deltas else None,
                    "whole_again_s": [t for r in reps for t in r["whole_again_s"]]})
    return out


def cell_line(c: dict[str, Any]) -> list[Any]:
    lo, hi = c["goodput_range"]
    return [c["strategy"], f"{c['every_s']:g} s", f"{c['killed']} / {c['survived']}", f"{c['finished']} of {c['reps']}",
            f"{c['wall_s']:.1f}", f"{c['goodput']:.2f}" + (f" ({lo:.2f}-{hi:.2f})" if c["reps"] > 1 else ""),
            "-" if c["acc_delta_pts"] is None else f"{c['acc_delta_pts']:+.1f}", c["samples_lost"],
            c["replayed_steps"], c["refilled"], c["restarts"],
            f"{statistics.median(c['whole_again_s']):.2f}" if c["whole_again_s"] else "-"]


HEADER = ["strategy", "a kill every", "failures killed / survived", "finished", "wall s", "goodput", "acc Δ pts",
          "samples lost", "steps replayed", "seats refilled", "relaunches", "whole again after s"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--every", type=float, nargs="+", default=[60.0, 30.0, 10.0], help="seconds between kills")
    p.add_argument("--only", nargs="+", choices=STRATEGIES, default=list(STRATEGIES), metavar="NAME",
                   help=f"strategies (default: all of {', '.join(STRATEGIES)})")
    p.add_argument("--victims", choices=("host", "dpu"), default="host", help="what the killer kills")
    p.add_argument("--reps", type=int, default=1, help="repetitions, each with its own failure-free run first "
                                                       "(a strategy's goodput is against its repetition's)")
    p.add_argument("--epochs", type=int, default=24)
    p.add_argument("--subset", type=int, default=1497, help="training samples (default: the bundled 1,497)")
    p.add_argument("--host-ranks", type=int, default=4)
    p.add_argument("--spares", type=int, default=3, help="the spare ranks of rollback and lossy forward + spares "
                                                         "(default: 3)")
    p.add_argument("--timeout", type=float, default=1200.0, help="seconds one job may take")
    p.add_argument("--quick", action="store_true", help="a smoke run: 1 epoch of 512 samples, 2 host ranks, "
                                                        "1 spare, one rate (a kill every 4 s), rollback and disk")
    p.add_argument("--out", type=Path, default=RESULTS / "goodput.json")
    args = p.parse_args()
    if args.quick:
        args.epochs, args.subset, args.host_ranks, args.spares, args.every = 1, 512, 2, 1, [4.0]
        args.only = [s for s in args.only if s in ("rollback", "restart (disk)")]
    data = make_data(("cifar10",))
    samples = args.epochs * args.subset
    refs, rows = [], []
    for rep in range(args.reps):
        ref = run(args, data, None, None)
        if not ref["finished"]:
            sys.exit(f"the failure-free run failed:\n{ref['tail']}")
        refs.append(ref)
        print(f"repetition {rep + 1}, failure-free: {samples} samples in {ref['wall']:.1f} s "
              f"({samples / ref['wall']:.1f} samples/s), final acc {ref['final_acc']:.3f}", flush=True)
        for every in args.every:
            for name in args.only:
                rows.append({**row(name, every, run(args, data, name, every), ref, samples), "rep": rep})
                r = rows[-1]
                print(f"{name}, a {args.victims} rank every {every:g} s: killed {r['killed']}, survived "
                      f"{r['survived']}, goodput {r['goodput']:.2f}, wall {r['wall_s']:.1f} s, exit {r['exit']}",
                      flush=True)
    m = machine()
    print(machine_line(m))
    summary = cells(rows)
    print(table(HEADER, [cell_line(c) for c in summary]))
    write_json(args.out, {"machine": m, "settings": {k: v for k, v in vars(args).items() if k != "out"},
                          "samples": samples, "failure_free": refs, "rows": rows, "cells": summary,
                          "median_goodput": {n: statistics.median(r["goodput"] for r in rows if r["strategy"] == n)
                                             for n in args.only}})


if __name__ == "__main__":
    main()
