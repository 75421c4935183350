"""Clone cost: ours (slices handed to the DPU, staged or zero-copy, forwarded to the clones) vs the
file path (host rank 0 `torch.save`s, the clones load) vs point-to-point (each host rank sends its
whole state to its clone).

    python benchmarks/clone.py [--quick] [--reps 3] [--models resnet20 resnet50]

DeepClone's metrics, measured side by side in one run (methods interleaved, repetition by
repetition) on the emulated node: host rank on core 0, DPU rank on core 1 at `--dpu-speed`, one
clone rank on core 1 too (`dpurun --clone-cores 1`: a stand-in for the other node a clone runs
on, so its loading does not land on the host rank's core). Every method runs the same job, a
clone at step S, through `dpurun` (the baselines through `benchmarks/clone_host.py`, which swaps
only the hand-off and the clone's adoption):

- runtime overhead on the original group: mean time of the clone step and the next step minus the
  mean of ordinary steps (`benchmarks/checkpoint.py`'s definition), plus the host's blocking time;
- standby: how long the clone rank waited, from start-up until the state arrived;
- readiness: end of the clone step (the original's hand-off starts) -> the clone ready to train
  (state restored), across processes by wall clock on this one box.

The clones stop right after adopting the state (`--clone-override stop_at_step=S`): training
afterwards would only add their compute to the shared core and blur the originals' step times.
The clone's state sha256 must be the same for every method (they all fork the same step).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.checkpoint import MODELS  # noqa: E402
from benchmarks.harness import (  # noqa: E402
    BIN,
    QUICK_DPU_SPEED,
    ROOT,
    bench_parser,
    emulated_node,
    job_env,
    machine,
    machine_line,
    make_data,
    settings,
    table,
    write_json,
)

METHODS = ("ours-staged", "ours-zero", "file", "p2p")
QUICK_METHODS = ("ours-zero", "p2p", "file")  # --quick: ours (relayed piece by piece) and both baselines
WARMUP = 2


def command(method: str, training: list[str], log: Path, speed: float) -> tuple[list[str], dict[str, str]]:
    """The job's argv and environment: dpurun for ours, dpurun via clone_host for the baselines."""
    launcher = [*emulated_node(1, speed), "--clone-ranks", "1", "--clone-cores", "1", "--", *training,
                "--log-dir", str(log)]
    if method.startswith("ours"):
        return [str(BIN / "dpurun"), *launcher, "--ckpt-copy", method.split("-")[1]], job_env()
    how = f"file:{log / 'files'}" if method == "file" else "p2p"
    (log / "files").mkdir()
    return ([sys.executable, str(Path(__file__).with_name("clone_host.py")), "launch", *launcher],
            {**job_env(), "DPUBENCH_CLONE": how})


def jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


def measure(method: str, training: list[str], speed: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="dpubench-clone-") as tmp:
        log = Path(tmp)
        cmd, env = command(method, training, log, speed)
        res = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=1800)
        if res.returncode != 0:
            sys.exit(f"clone benchmark run failed ({method}):\n{res.stdout[-1500:]}\n{res.stderr[-3000:]}")
        phases, handoffs = jsonl(log / "phases-rank0.jsonl"), jsonl(log / "handoff-rank0.jsonl")
        starts = [r for r in jsonl(log / "clone" / "metrics.jsonl") if r.get("event") == "clone_start"]
        forwards = [r for r in jsonl(log / "keeper-rank1.jsonl") if "forwarded_step" in r]
    if not starts or not [h for h in handoffs if h["kind"] == "clone"]:
        sys.exit(f"clone benchmark ({method}): no clone hand-off or clone start logged")
    return summarize(phases, handoffs, starts[0], forwards[0] if forwards else None)


def summarize(phases: list[dict[str, Any]], handoffs: list[dict[str, Any]], start: dict[str, Any],
              forward: Optional[dict[str, Any]] = None, warmup: int = WARMUP) -> dict[str, Any]:
    """Overhead, blocking, standby and readiness of one run's clone (pure), and where the readiness
    goes: packing (the host's blocking), the bytes' last part reaching the clone after packing ended
    (`after_pack_s`; for ours, `at_keeper_s` of it until the keeper had them all), the clone's rebuild."""
    times = {r["first_global_step"] + i: t for r in phases for i, t in enumerate(r["step_times"])}
    h = next(x for x in handoffs if x["kind"] == "clone")
    step = h["global_step"]
    ordinary = [t for s, t in times.items() if s not in (step, step + 1) and s > warmup]
    base = statistics.mean(ordinary)
    arrived = start["ready_time"] - start["rebuild_s"]   # wall clock: the clone had every byte
    return {"clone_step": step, "blocked_s": h["blocked_s"], "overhead_s": (times[step] + times[step + 1]) / 2 - base,
            "ordinary_step_s": base, "standby_s": start["standby_s"],
            "readiness_s": start["ready_time"] - (h["wall_time"] - h["blocked_s"]),
            "after_pack_s": arrived - h["wall_time"], "rebuild_s": start["rebuild_s"],
            "at_keeper_s": forward["received_time"] - h["wall_time"] if forward else None,
            "state_sha256": start["state_sha256"]}


def run(args: Any) -> dict[str, Any]:
    data = make_data(("cifar10", "tinyimagenet"))
    steps, at = (8, 6) if args.quick else (16, 8)  # quick: ordinary steps 3-5 and 8
    if args.quick:
        args.dpu_speed = QUICK_DPU_SPEED
    methods = QUICK_METHODS if args.quick else tuple(dict.fromkeys([*args.methods, "file"]))
    results: dict[str, dict[str, list[dict[str, Any]]]] = {m: {k: [] for k in methods} for m in args.models}
    for rep in range(args.reps):
        for model in args.models:
            batch = int(MODELS[model][MODELS[model].index("--batch-size") + 1])
            training = [str(data / a[1:]) if a.startswith("@") else a for a in MODELS[model]]
            training += ["--epochs", "1", "--train-subset", str(steps * batch), "--val-subset", "16", "--no-progress",
                         "--clone-at", str(at), "--clone-override", f"stop_at_step={at}"]
            for method in methods:
                t0 = time.perf_counter()
                results[model][method].append(measure(method, training, args.dpu_speed))
                print(f"[clone] rep {rep + 1}/{args.reps} {model} {method}: {time.perf_counter() - t0:.0f} s",
                      flush=True)
    return {"settings": settings(args), "machine": machine(), "results": results,
            "same_state": {m: len({r["state_sha256"] for runs in by.values() for r in runs}) == 1
                           for m, by in results.items()}}


def med(runs: list[dict[str, Any]], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def ratio(ref: float, value: float) -> str:
    return f"{ref / value:.1f}x" if value > 0 else "(none measurable)"


def ms(runs: list[dict[str, Any]], key: str) -> str:
    """The median of `key` in ms, or '-' where the method has no such phase (no keeper on its path)."""
    values = [r[key] for r in runs if r.get(key) is not None]
    return f"{statistics.median(values) * 1e3:.0f}" if values else "-"


def markdown(payload: dict[str, Any]) -> str:
    out = [f"## Clone cost (`benchmarks/clone.py`, {time.strftime('%Y-%m-%d')})", "",
           machine_line(payload["machine"]), ""]
    for model, by in payload["results"].items():
        ref_o, ref_r = med(by["file"], "overhead_s"), med(by["file"], "readiness_s")
        p2p = med(by["p2p"], "readiness_s") if "p2p" in by else None
        rows = [[method, f"{med(runs, 'blocked_s') * 1e3:.1f}", f"{med(runs, 'overhead_s') * 1e3:.1f}",
                 f"{med(runs, 'standby_s'):.2f}", f"{med(runs, 'readiness_s') * 1e3:.0f}", ms(runs, "after_pack_s"),
                 ms(runs, "at_keeper_s"), ms(runs, "rebuild_s"),
                 ratio(ref_o, med(runs, "overhead_s")), ratio(ref_r, med(runs, "readiness_s")),
                 f"{med(runs, 'readiness_s') / p2p:.2f}x" if p2p else "-", f"{med(runs, 'ordinary_step_s') * 1e3:.0f}"]
                for method, runs in by.items()]
        same = "identical" if payload["same_state"][model] else "DIFFERENT"
        out += [f"**{model}** (medians of {len(by['file'])} repetition(s); clone state sha256 {same} across "
                "methods and repetitions)", "",
                table(["method", "host blocking ms", "overhead ms", "standby s", "readiness ms",
                       "of it: packed -> clone has all", "(packed -> keeper has all)", "clone rebuild ms",
                       "less overhead than file", "faster ready than file", "readiness / p2p's",
                       "ordinary step ms"], rows), ""]
    return "\n".join(out)


def main() -> None:
    p = bench_parser(__doc__, "clone", "tiny runs (8 steps), ours-zero, p2p and file only, for the test suite", reps=3,
                     epochs=False, plots=False)
    p.add_argument("--models", nargs="+", choices=sorted(MODELS), default=list(MODELS))
    p.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS),
                   help="which hand-offs to compare (default: all; file is always run, the ratios' reference)")
    args = p.parse_args()
    payload = run(args)
    write_json(args.out, payload)
    print(markdown(payload))


if __name__ == "__main__":
    main()
