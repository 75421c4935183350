"""Fault stress: each kind of failure N times at random steps, and what the job did about it.

    python benchmarks/faults.py [--tries 20] [--kinds dpu-fallback dpu-validation host-fallback ...] [--seed 0]

Every try is a real dpurun job (2 host + 2 DPU ranks, `--mode da`, resnet20 on 256 bundled CIFAR-10
samples, 2 epochs = 16 steps) with one `--inject` SIGKILL at a random global step in [2, 15]:

- `dpu-fallback`: DPU rank 1 (host rank 1's feeder) killed under `--dpu-failure fallback`. Passes if
  the job ends 0 with the weights of the failure-free run (sha256, measured once first, the same for
  `--mode none`), after host rank 1 fell back. Also: the failure watch's detection time (the kill to
  world rank 0 learning it; one box, one clock).
- `dpu-validation`: DPU rank 1 killed under `--dpu-failure fallback` in `--mode mv`, where it is a
  validation rank: it dies on getting the state of the epoch of that step. Passes if the job ends 0
  with the failure-free run's final weights and every epoch's validation sums (to the bit), the
  host ranks having validated again what it had not reported. Also: detection time, as above.
- `dpu-keeper`: in `--mode none` with a checkpoint every 2 steps, DPU rank 0 or 1 (alternately; 0
  also commits) killed under `--dpu-failure fallback` on getting the state of the first checkpoint
  at or after the step. Passes if the job ends 0 with the failure-free run's final weights, that
  checkpoint is not committed, every later one is, and every committed one loads whole.
- `host-fallback`: host rank 1 killed under `--dpu-failure fallback`. Passes if the job ends 1 with
  dpurun naming host rank 1 as dead. Also: the kill to the end of the job.
- `dpu-stop`, `host-stop`: the same ranks killed without it (Open MPI ends the job). Passes if dpurun
  names the killed rank. Also: the kill to the end of the job.
- `host-lossy`: host rank 1 killed under `--recovery lossy-forward`. Passes if the job ends 0 with one
  recovery record that lost host rank 1 and exactly the samples it had left in its epoch (none when
  it died between an epoch's last step and the epoch's end work). Also: the kill to the end of the
  failed step (the study's recovery time).
- `host-rollback`: host rank 1 killed under `--recovery rollback` with `dpurun --spare-ranks 1`.
  Passes if the job ends 0 with the failure-free run's final weights (to the bit) and a recovery
  record naming world rank 1. Also: the kill to the end of the replayed step (or to the spare's
  call-in, when the death fell in an epoch's end work).
- `host-rollback-twice`: both original host ranks killed under `--recovery rollback` with `dpurun
  --spare-ranks 2`: host rank 1 after global step K (K at most 13), host rank 0 one or two steps
  later, when spare 0 holds host rank 1's seat (the case whose CI run once recorded a recovery with
  nothing lost). Passes if the job ends 0 with exactly two deaths recorded, world ranks 1 then 0, and
  the failure-free run's final weights, every epoch's validation sums and step losses, to the bit
  (host rank 0's BatchNorm buffers and epoch progress ride in each step's allreduce). Also: the kill
  of host rank 1 to the end of its replay.
- `host-lossy-mv`, `host-rollback-mv`: the same two in `--mode mv` (each host rank's DPU rank
  validates), host rank 0 or 1 killed (alternately; 0 holds the metrics log and may die while an
  epoch's DPU results are due). Pass if the job ends 0 with one death recorded and each epoch's
  record logged once, validated whole (every sample counted); for rollback also the failure-free
  run's final weights and every epoch's validation sums, to the bit (until 2026-11-28 only with host
  rank 1 killed: host rank 0's death lost its BatchNorm statistics of that epoch).
- `host-lossy-ckpt`: `--recovery lossy-forward` in `--mode da` with a checkpoint every 2 steps, host
  rank 0 or 1 killed (alternately by step pair) right after the step's optimizer step. Passes if
  the job ends 0 and exactly the checkpoints due are committed and load whole: all of 2..16 but the
  killed step's own when it falls on a checkpoint (the rank died before handing it over), unless it
  ends an epoch (that hand-off waits for the epoch's end work, where the survivors shrink first).
- `host-rollback-ckpt`: the same kills under `--recovery rollback` (`--spare-ranks 1`). Passes if the
  job ends 0 and every checkpoint due (2..16) is committed, each holding the failure-free run's
  parameters and momentum to the bit: the spare re-sends the dead rank's part of the step it
  starts from, and an epoch's last step is handed over by the survivor alone.

Every try also counts the host group's calls redone after a shrink that found every host rank alive
(`SurvivorGroup.redone`'s line: MPI's agreement said a call failed with no death known yet); a try
with one keeps the ranks' `[dpuoffload]` lines in its record (`said`: what MPI told each rank).

Prints one table (passed out of tries; median and max times; redone calls) and writes
`results/faults.json`. The test suite runs one try of each (tests/jobs/test_dpu_failure.py,
tests/jobs/test_faults.py, tests/jobs/test_rollback.py).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.harness import BIN, RESULTS, ROOT, job_env, machine, machine_line, make_data, table, write_json  # noqa: E402
from dpuoffload.common.faults.abort import PREFIX  # noqa: E402
from dpuoffload.common.state import ckptfiles  # noqa: E402

KINDS = ("dpu-fallback", "dpu-validation", "dpu-keeper", "host-fallback", "dpu-stop", "host-stop", "host-lossy",
         "host-rollback", "host-rollback-twice", "host-lossy-mv", "host-rollback-mv", "host-lossy-ckpt",
         "host-rollback-ckpt")
REDONE = "yet the shrink found all"   # (`SurvivorGroup._redone`'s line)
LAUNCH = ["--host-ranks", "2", "--dpu-ranks", "2", "--oversubscribe", "--share-cores"]
STEPS = 16   # 2 epochs of 256 samples, 2 host ranks, batch 16
EPOCH_STEPS, BATCH = 8, 16


def training(data: Path, log: str, mode: str = "da") -> list[str]:
    return ["--preset", "debug", "--no-progress", "--train-subset", "256", "--epochs", "2", "--mode", mode,
            "--data", str(data / "cifar10"), "--log-dir", log]


def run(args: list[str], launch: tuple[str, ...] = ()) -> tuple[subprocess.CompletedProcess, float]:
    """One dpurun job (`launch`: more launcher flags); (result, wall time.time() at its end)."""
    res = subprocess.run([str(BIN / "dpurun"), *LAUNCH, *launch, "--", *args], capture_output=True, text=True,
                         env=job_env(), cwd=ROOT, timeout=600)
    return res, time.time()


def read(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def final_sha(log: Path) -> str:
    return next(r for r in read(log / "metrics.jsonl") if r["event"] == "end")["weights_sha256"]


def step_losses(log: Path) -> list[list[float]]:
    """Every epoch's step losses as its record holds them (after a death of host rank 0: the steps
    the rank in its seat trained), in epoch order."""
    return [r["step_losses"] for r in read(log / "metrics.jsonl") if r["event"] == "epoch"]


def val_sums(log: Path) -> list[tuple[float, int, int]]:
    """Every epoch's validation sums (loss sum, correct, count), in epoch order."""
    return [(r["val_loss_sum"], r["val_correct"], r["val_count"]) for r in read(log / "metrics.jsonl")
            if r["event"] == "epoch"]


def named(stderr: str, rank_words: str) -> bool:
    """Whether dpurun's verdict line names `rank_words` ('host rank 1') as dead."""
    return any(x.startswith("dpurun: world rank") and f"= {rank_words} (" in x and "died" in x
               for x in stderr.splitlines())


def same_checkpoints(ck: Path, ref: Path) -> bool:
    """Whether every checkpoint committed in `ck` holds the state of `ref`'s of the same step, to the bit."""
    import torch

    for d in ckptfiles.committed(ck):
        got, want = ckptfiles.load(d), ckptfiles.load(ref / d.name)
        if got.shared.keys() != want.shared.keys() or not all(torch.equal(got.shared[k], want.shared[k])
                                                               for k in want.shared):
            return False
    return True


def one_try(kind: str, step: int, data: Path, reference: str, ref_val: list[tuple[float, int, int]],
            ref_ck: Path, ref_losses: list[list[float]]) -> dict[str, Any]:
    who = "dpu:1" if kind.startswith("dpu") else "host:1"
    who = f"dpu:{step % 2}" if kind == "dpu-keeper" else f"host:{step % 2}" if kind.endswith("-mv") else who
    who = f"host:{step // 2 % 2}" if kind.endswith("-ckpt") else who
    mode = {"dpu-validation": "mv", "dpu-keeper": "none"}.get(kind, "mv" if kind.endswith("-mv") else "da")
    inject = f"{who}@{step}"
    if kind == "host-rollback-twice":
        step = min(step, STEPS - 3)
        inject = f"host:1@{step},host:0@{step + 1 + step % 2}"
    spares = {"host-rollback-twice": 2}.get(kind, 1 if kind.startswith("host-rollback") else 0)
    with tempfile.TemporaryDirectory(prefix="dpufaults-") as tmp:
        log, ck = Path(tmp) / "log", Path(tmp) / "ck"
        flags = [*training(data, str(log), mode), "--inject", inject]
        if kind == "dpu-keeper" or kind.endswith("-ckpt"):
            flags += ["--ckpt-dir", str(ck), "--ckpt-every", "2", "--ckpt-keep", "20"]
        if kind.endswith("fallback") or kind in ("dpu-validation", "dpu-keeper"):
            flags += ["--dpu-failure", "fallback"]
        if kind.startswith("host-lossy"):
            flags += ["--recovery", "lossy-forward"]
        if kind.startswith("host-rollback"):  # (the reference's Horovod allreduce and rollback's MPI one agree)
            flags += ["--recovery", "rollback"]
        res, ended = run(flags, ("--spare-ranks", str(spares)) if spares else ())
        record: dict[str, Any] = {"kind": kind, "step": step, "inject": inject, "code": res.returncode,
                                  "redone": res.stdout.count(REDONE)}
        injected = min((r["time"] for p in log.glob("failures-rank*.jsonl") for r in read(p)
                        if r["event"] == "injected"), default=None)  # (the first kill, of two in -twice)
        if kind == "dpu-keeper":
            torn = step + step % 2  # (the first checkpoint at or after the step)
            done = [ckptfiles.load(d).meta["position"]["global_step"] for d in ckptfiles.committed(ck)]
            record["passed"] = done == [s for s in range(2, STEPS + 1, 2) if s != torn]
            record["committed"] = done
        if kind in ("dpu-fallback", "dpu-validation", "dpu-keeper"):
            deaths = read(log / "failures.jsonl")
            record["passed"] = record.get("passed", True) and res.returncode == 0 and final_sha(log) == reference \
                and bool(deaths)
            if kind == "dpu-validation":
                record["passed"] = record["passed"] and val_sums(log) == ref_val
            if injected and deaths:
                record["detected_s"] = deaths[0]["learnt_time"] - injected
        elif kind == "host-lossy-ckpt":
            done = [ckptfiles.load(d).meta["position"]["global_step"] for d in ckptfiles.committed(ck)]
            record["committed"] = done
            torn = step if step % EPOCH_STEPS else None  # (an epoch's last step hands off after the end work,
            # by which the survivors have shrunk the group: that one is committed)
            record["passed"] = res.returncode == 0 and done == [s for s in range(2, STEPS + 1, 2) if s != torn]
            recs = [r for r in read(log / "metrics.jsonl") if r["event"] == "recovery"]
            if injected and recs:
                record["recovered_s"] = recs[0]["reported_time"] - injected
        elif kind == "host-rollback-ckpt":
            done = [ckptfiles.load(d).meta["position"]["global_step"] for d in ckptfiles.committed(ck)]
            record["committed"] = done
            record["passed"] = res.returncode == 0 and done == list(range(2, STEPS + 1, 2)) and \
                same_checkpoints(ck, ref_ck)
            recs = [r for r in read(log / "metrics.jsonl") if r["event"] == "recovery"]
            if injected and recs:
                record["recovered_s"] = recs[-1]["reported_time"] - injected
        elif kind.endswith("-mv"):
            recs = [r for r in read(log / "metrics.jsonl") if r["event"] == "recovery"]
            counts = [r["val_count"] for r in read(log / "metrics.jsonl") if r["event"] == "epoch"]
            deaths = [r for r in recs if r.get("lost_world_ranks", r.get("lost_host_ranks"))]  # (rollback: a
            # death in an epoch's end work has a second record, the spare's call-in before the next epoch)
            record["passed"] = res.returncode == 0 and len(deaths) == 1 and counts == [256, 256]
            if kind == "host-rollback-mv":
                record["passed"] = record["passed"] and final_sha(log) == reference and val_sums(log) == ref_val
            if injected and recs:
                record["recovered_s"] = recs[-1]["reported_time"] - injected
        elif kind == "host-lossy":
            recs = [r for r in read(log / "metrics.jsonl") if r["event"] == "recovery"]
            left = (EPOCH_STEPS - step % EPOCH_STEPS) % EPOCH_STEPS * BATCH  # (killed after an epoch's last step: 0)
            record["passed"] = res.returncode == 0 and len(recs) == 1 and recs[0]["lost_host_ranks"] == [1] \
                and recs[0]["samples_lost"] == left
            if injected and recs:
                record["recovered_s"] = recs[0]["reported_time"] - injected
        elif kind == "host-rollback-twice":
            recs = [r for r in read(log / "metrics.jsonl") if r["event"] == "recovery"]
            deaths = [r["lost_world_ranks"] for r in recs if r["lost_world_ranks"]]  # (not the call-ins)
            record["passed"] = res.returncode == 0 and deaths == [[1], [0]] and final_sha(log) == reference and \
                val_sums(log) == ref_val and step_losses(log) == ref_losses
            if injected and recs:
                record["recovered_s"] = recs[0]["reported_time"] - injected
        elif kind == "host-rollback":
            recs = [r for r in read(log / "metrics.jsonl") if r["event"] == "recovery"]
            record["passed"] = res.returncode == 0 and bool(recs) and recs[0]["lost_world_ranks"] == [1] \
                and final_sha(log) == reference
            if injected and recs:
                record["recovered_s"] = recs[-1]["reported_time"] - injected
        else:
            record["passed"] = res.returncode != 0 and named(res.stderr, "DPU rank 1" if who == "dpu:1"
                                                                 else "host rank 1")
            if injected:
                record["ended_s"] = ended - injected
        if not record["passed"]:
            record["tail"] = (res.stdout[-800:] + res.stderr[-1500:])
        if record["redone"]:  # (rare: keep what the ranks said about it, and about the death, for a diagnosis)
            record["said"] = [line for line in (res.stdout + res.stderr).splitlines() if line.startswith(PREFIX)]
        return record


def summarize(records: list[dict[str, Any]], kinds: tuple[str, ...]) -> list[list[Any]]:
    rows = []
    for kind in kinds:
        mine = [r for r in records if r["kind"] == kind]
        passed = sum(r["passed"] for r in mine)
        times = [t for r in mine if (t := r.get("detected_s", r.get("ended_s", r.get("recovered_s"))))]
        what = {"dpu-fallback": "detected after", "dpu-validation": "detected after", "dpu-keeper": "detected after",
                "host-lossy": "failed step done after", "host-lossy-mv": "failed step done after",
                "host-lossy-ckpt": "failed step done after",
                "host-rollback": "replayed step done after", "host-rollback-twice": "replayed step done after",
                "host-rollback-mv": "replayed step done after",
                "host-rollback-ckpt": "replayed step done after"}.get(kind, "job ended after")
        timing = f"{what}: median {statistics.median(times):.2f} s, max {max(times):.2f} s" if times else "-"
        rows.append([kind, f"{passed} / {len(mine)}", sorted(r["step"] for r in mine), timing,
                     sum(r["redone"] for r in mine)])
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tries", type=int, default=20, help="tries of each kind (default: 20)")
    p.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS))
    p.add_argument("--seed", type=int, default=0, help="seed of the random steps (default: 0)")
    p.add_argument("--out", type=Path, default=RESULTS / "faults.json")
    args = p.parse_args()
    data = make_data(("cifar10",))
    rng = random.Random(args.seed)
    records = []
    with tempfile.TemporaryDirectory(prefix="dpufaults-ref-") as ref:
        ref_ck = Path(ref) / "ck"  # (checkpoints change no number: the -ckpt kinds compare theirs with these)
        res, _ = run([*training(data, ref), "--ckpt-dir", str(ref_ck), "--ckpt-every", "2", "--ckpt-keep", "20"])
        if res.returncode != 0:
            sys.exit(f"the failure-free run failed:\n{res.stderr[-2000:]}")
        reference, ref_val, ref_losses = final_sha(Path(ref)), val_sums(Path(ref)), step_losses(Path(ref))
        for i in range(args.tries):
            for kind in args.kinds:
                records.append(one_try(kind, rng.randint(2, STEPS - 1), data, reference, ref_val, ref_ck,
                                       ref_losses))
                r = records[-1]
                print(f"try {i + 1}/{args.tries} {kind} at step {r['step']}: "
                      f"{'passed' if r['passed'] else 'FAILED'}", flush=True)
    rows = summarize(records, tuple(args.kinds))
    m = machine()
    print(machine_line(m))
    print(table(["kind", "passed", "steps killed at", "time", "calls redone"], rows))
    write_json(args.out, {"machine": m, "settings": vars(args) | {"out": str(args.out)}, "records": records})
    if any(not r["passed"] for r in records):
        sys.exit("some tries did not pass: see the records' 'tail' in " + str(args.out))


if __name__ == "__main__":
    main()
