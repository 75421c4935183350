"""The recovery study's table, measured here: a host rank lost at 5 %, 50 % and 90 % of training.

    python benchmarks/recovery.py [--seeds 3] [--at 0.05 0.5 0.9] [--epochs 4] [--subset 512]
                                  [--model resnet20] [--batch-size 16] [--dataset cifar10|fake]

Every run is a real dpurun job (2 host + 2 DPU ranks, `--mode da`, resnet20 on bundled CIFAR-10,
batch 16 per host rank, unless `--model`/`--batch-size` say otherwise: a longer step shows what
the fixed costs of recovery weigh against it) whose host rank 1 is SIGKILLed (`--inject host:1@K`)
after global step K:

- `failure-free`: no failure, one run per seed (the reference for time and accuracy);
- `lossy-forward`: `--recovery lossy-forward`: the survivor finishes step K+1 alone, loses host rank
  1's samples of the rest of that epoch, and takes its batches over from the next epoch;
- `lossy-forward --reassign`: the same, but the survivor takes the batches over from step K+2, so
  only step K+1's batch is lost;
- `rollback (spare)`: `--recovery rollback` with `dpurun --spare-ranks 1`: the spare takes host
  rank 1's seat with host rank 0's pre-step state and replays step K+1 (seed 0 only: the run is
  bit-exact with the failure-free one, so its accuracy is too);
- `restart (C/R)`: `dpurun --restarts 1` with a checkpoint at every epoch's end, kept in DPU memory:
  the job ends, is relaunched, resumes from the newest checkpoint and replays the steps since it
  (seed 0 only: a restarted run's accuracy is the failure-free run's, it replays what it lost);
- `DPU rank: fallback`, `DPU rank: restart (C/R)`: DPU rank 1 (which augments host rank 1's
  batches) is SIGKILLed instead (`--inject dpu:1@K`: when it starts building step K's batch, a few
  steps ahead of its host) under `--dpu-failure fallback` (host rank 1 builds its own batches from
  the one that did not come: the same batches, so the run is bit-exact) or restarted as above.

Columns (medians over seeds):
- *recovery s*: from the kill to the next completed step (lossy forward, rollback: the end of the
  failed step; rollback after a death in an epoch's end work: the spare's call-in before the next
  step; C/R: mpirun's detection, teardown, relaunch and resume from `restarts.jsonl`, plus the
  replayed steps at the failure-free run's median step time); a DPU rank under fallback: the time
  the step that found its feeder gone took beyond a normal step (the kill itself comes while the
  host still trains on batches built ahead);
- *failed step / normal*: the failed step's time over the median step before it (lossy forward,
  rollback, a DPU rank's fallback);
- *overhead*: the job's wall time over the failure-free run's of the same seed, minus one;
- *replayed*, *samples lost*: steps trained twice; samples never trained in that epoch;
- *acc Δ*: final validation accuracy minus the failure-free run's of the same seed, in points
  (mean over seeds, and the worst seed);
- *weight dist*: the final weights' L2 distance to the failure-free run's of the same seed, over the
  latter's norm (every floating tensor of the `state_dict`, `--save-weights`): 0 when recovery is
  exact; median over seeds.

`--only NAME ...` runs some strategies only. Writes `results/recovery.json` (`--out`); prints the
table that goes into RESULTS.md, and C/R's recovery time over rollback's at each failure point.
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
from typing import Any, Optional

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.harness import BIN, RESULTS, ROOT, job_env, machine, machine_line, make_data, table, write_json  # noqa: E402

LAUNCH = ["--host-ranks", "2", "--dpu-ranks", "2", "--oversubscribe", "--share-cores"]
HOSTS = 2
STRATEGIES = {"lossy-forward": ["--recovery", "lossy-forward"],
              "lossy-forward --reassign": ["--recovery", "lossy-forward", "--reassign"],
              "rollback (spare)": ["--recovery", "rollback"],
              "restart (C/R)": ["--ckpt-every-epoch"],
              "DPU rank: fallback": ["--dpu-failure", "fallback"],
              "DPU rank: restart (C/R)": ["--ckpt-every-epoch"]}
EXACT = ("rollback (spare)", "restart (C/R)", "DPU rank: fallback", "DPU rank: restart (C/R)")  # bit-exact (or
# replaying) strategies: one seed


def read(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def dataset_flags(args: argparse.Namespace, data: Path) -> list[str]:
    """Bundled CIFAR-10 (1,497 training images: at most 47 steps per epoch at batch 16 on 2 host ranks),
    or FakeData of `--subset` images for the epochs long enough that a restart's replay outweighs its
    relaunch (the study's setting; the accuracy column means nothing on random images)."""
    return ["--dataset", "fake"] if args.dataset == "fake" else ["--data", str(data / "cifar10")]


def job(args: argparse.Namespace, data: Path, seed: int, extra: list[str], restarts: int = 0) -> dict[str, Any]:
    """One dpurun job and what its logs say."""
    with tempfile.TemporaryDirectory(prefix="dpurecovery-") as tmp:
        log = Path(tmp) / "log"
        training = ["--preset", "debug", "--no-progress", "--train-subset", str(args.subset), "--epochs",
                    str(args.epochs), "--seed", str(seed), "--mode", "da", *dataset_flags(args, data),
                    "--model", args.model, "--batch-size", str(args.batch_size),
                    "--log-dir", str(log), *extra]
        if restarts:
            training += ["--ckpt-dir", str(Path(tmp) / "ckpt")]
        training += ["--save-weights", str(Path(tmp) / "weights.pt")]
        launch = [*LAUNCH, "--restarts", str(restarts)] if restarts else LAUNCH
        if "rollback" in extra:
            launch = [*launch, "--spare-ranks", "1"]
        t0 = time.perf_counter()
        res = subprocess.run([str(BIN / "dpurun"), *launch, "--", *training], capture_output=True, text=True,
                             env=job_env(), cwd=ROOT, timeout=900)
        wall = time.perf_counter() - t0
        if res.returncode != 0:
            sys.exit(f"a run failed ({' '.join(extra)}):\n{res.stdout[-1500:]}\n{res.stderr[-2500:]}")
        metrics = read(log / "metrics.jsonl")
        epochs = {r["epoch"]: r for r in metrics if r["event"] == "epoch"}
        steps = [t for r in read(log / "phases-rank0.jsonl") for t in r["step_times"]]
        return {"wall": wall, "final_acc": epochs[max(epochs)]["val_acc"], "weights": flat(Path(tmp) / "weights.pt"),
                "recovery": ([r for r in metrics if r["event"] == "recovery"] or [None])[-1],  # (rollback: the
                # last, the call-in, when a death in an epoch's end work left the seat vacant first)
                "restart": next(iter(read(log / "restarts.jsonl")), None),
                "injected": next((r["time"] for p in log.glob("failures-rank*.jsonl") for r in read(p)
                                  if r["event"] == "injected"), None),
                "fallback": fallback_step(log),
                "step_s": statistics.median(steps) if steps else None}


def fallback_step(log: Path) -> Optional[dict[str, Any]]:
    """A DPU rank's death under --dpu-failure fallback: the step of the host rank that found its
    feeder gone (it built that batch itself), its time and the median of that rank's steps before it."""
    for path in log.glob("failures-rank*.jsonl"):
        found = next((r for r in read(path) if r["event"] == "fallback"), None)
        if found is None:
            continue
        rank = path.stem.removeprefix("failures-rank")
        epoch = next(r for r in read(log / f"phases-rank{rank}.jsonl") if r["epoch"] == found["epoch"])
        times = epoch["step_times"]
        before = times[:found["step"]] or times[found["step"] + 1:]
        return {"failed_step_s": times[found["step"]], "normal_step_s": statistics.median(before),
                "replayed_steps": 0, "samples_lost": 0}
    return None


def flat(path: Path) -> torch.Tensor:
    """Every floating tensor of a saved `state_dict`, as one float64 vector."""
    state = torch.load(path, weights_only=True)
    return torch.cat([t.reshape(-1).double() for t in state.values() if t.is_floating_point()])


def weight_distance(run: dict[str, Any], ref: dict[str, Any]) -> float:
    return float((run["weights"] - ref["weights"]).norm() / ref["weights"].norm())


def recovery_s(run: dict[str, Any], step_s: float) -> Optional[float]:
    """Kill -> next completed step."""
    if run["recovery"] is not None and run["injected"] is not None:
        return run["recovery"]["reported_time"] - run["injected"]
    if run["fallback"] is not None:
        return run["fallback"]["failed_step_s"] - run["fallback"]["normal_step_s"]
    r = run["restart"]
    if r is None or None in (r["detected_s"], r["ended_s"], r["resumed_s"], r["replayed_steps"]):
        return None
    return r["detected_s"] + r["ended_s"] + r["resumed_s"] + r["replayed_steps"] * step_s


def med(xs: list[float]) -> Optional[float]:
    return statistics.median(xs) if xs else None


def row(name: str, at: float, runs: list[dict[str, Any]], refs: list[dict[str, Any]]) -> dict[str, Any]:
    step_s = statistics.median(r["step_s"] for r in refs)
    rec = [r["recovery"] or r["fallback"] for r in runs if r["recovery"] or r["fallback"]]
    acc = [100 * (r["final_acc"] - ref["final_acc"]) for r, ref in zip(runs, refs)]
    return {"strategy": name, "at": at,
            "recovery_s": med([t for r in runs if (t := recovery_s(r, step_s)) is not None]),
            "failed_step_ratio": med([x["failed_step_s"] / x["normal_step_s"] for x in rec
                                      if x["failed_step_s"] and x["normal_step_s"]]),
            "overhead": statistics.median(r["wall"] / ref["wall"] - 1 for r, ref in zip(runs, refs)),
            "replayed": med([r["restart"]["replayed_steps"] for r in runs if r["restart"]]
                            + [x["replayed_steps"] for x in rec if "replayed_steps" in x]) or 0,
            "samples_lost": med([x["samples_lost"] for x in rec]) or 0,
            "acc_delta_mean": statistics.mean(acc), "acc_delta_worst": min(acc), "seeds": len(runs),
            "weight_distance": statistics.median(weight_distance(r, ref) for r, ref in zip(runs, refs)),
            "step_s": step_s}


def fmt(v: Optional[float], spec: str) -> str:
    return "-" if v is None else format(v, spec)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", type=int, default=3, help="seeds per lossy-forward cell (default: 3)")
    p.add_argument("--at", type=float, nargs="+", default=[0.05, 0.5, 0.9], help="failure points (fractions)")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--subset", type=int, default=512, help="training samples (default: 512)")
    p.add_argument("--model", default="resnet20", help="model (default: resnet20)")
    p.add_argument("--batch-size", type=int, default=16, help="batch per host rank (default: 16)")
    p.add_argument("--dataset", choices=("cifar10", "fake"), default="cifar10",
                   help="bundled CIFAR-10 (default) or FakeData of --subset images (long epochs)")
    p.add_argument("--out", type=Path, default=RESULTS / "recovery.json")
    p.add_argument("--only", nargs="+", choices=list(STRATEGIES), default=list(STRATEGIES), metavar="NAME",
                   help=f"strategies to run (default: all of {', '.join(STRATEGIES)})")
    args = p.parse_args()
    data = make_data(("cifar10",))
    total = args.epochs * -(-args.subset // HOSTS // args.batch_size)
    seeds_needed = args.seeds if any(name not in EXACT for name in args.only) else 1
    refs = [job(args, data, s, []) for s in range(seeds_needed)]
    print(f"failure-free: {total} steps, median step {statistics.median(r['step_s'] for r in refs):.3f} s, "
          f"wall {statistics.median(r['wall'] for r in refs):.1f} s", flush=True)
    rows = []
    for at in args.at:
        step = max(1, min(total - 1, round(at * total)))
        for name in args.only:
            flags, restarts = STRATEGIES[name], "restart" in name
            seeds = range(1) if name in EXACT else range(args.seeds)
            who = "dpu:1" if name.startswith("DPU") else "host:1"
            runs = [job(args, data, s, [*flags, "--inject", f"{who}@{step}"], restarts=int(restarts)) for s in seeds]
            rows.append(row(name, at, runs, [refs[s] for s in seeds]) | {"step": step})
            r = rows[-1]
            print(f"{name} at {at:.0%} (after step {step}): recovery {fmt(r['recovery_s'], '.2f')} s, overhead "
                  f"{r['overhead']:+.0%}, acc {r['acc_delta_mean']:+.1f} pts, weight dist {r['weight_distance']:.2g}",
                  flush=True)
    m = machine()
    print(machine_line(m))
    for at in args.at:
        cells = {r["strategy"]: r["recovery_s"] for r in rows if r["at"] == at}
        if cells.get("rollback (spare)") and cells.get("restart (C/R)"):
            print(f"at {at:.0%}: C/R / rollback recovery = {cells['restart (C/R)'] / cells['rollback (spare)']:.0f}x")
    print(table(["strategy", "failure at", "recovery s", "failed step / normal", "overhead", "replayed",
                 "samples lost", "acc Δ (mean, worst) pts", "weight dist"],
                [[r["strategy"], f"{r['at']:.0%} (step {r['step']})", fmt(r["recovery_s"], ".2f"),
                  fmt(r["failed_step_ratio"], ".2f"), f"{r['overhead']:+.0%}", r["replayed"], r["samples_lost"],
                  f"{r['acc_delta_mean']:+.1f}, {r['acc_delta_worst']:+.1f} ({r['seeds']} seed(s))",
                  f"{r['weight_distance']:.2g}"] for r in rows]))
    refs_out = [{k: v for k, v in r.items() if k != "weights"} for r in refs]
    write_json(args.out, {"machine": m, "settings": vars(args) | {"out": str(args.out)}, "total_steps": total,
                          "failure_free": refs_out, "rows": rows})


if __name__ == "__main__":
    main()
