"""Checkpoint cost on the host: ours (slices handed to the DPU, staged or zero-copy) vs host ranks
saving with `torch.save` themselves (rank 0 saves everything, or every rank its slice).

    python benchmarks/checkpoint.py [--quick] [--reps 2] [--models resnet20 resnet50]

DeepFreeze's metrics, measured side by side in one run (methods interleaved, repetition by
repetition), on the emulated node (host rank on core 0; for ours a DPU rank on core 1 at
`--dpu-speed`): the host's *blocking time* per checkpoint, and the *runtime overhead* = mean
time of the checkpoint step and the next step minus the mean time of ordinary steps (which is
where zero-copy pays: the next optimizer step waits for the send). resnet50 (~100 MB of weights,
~200 MB with SGD momentum) on 64x64 Tiny-ImageNet-format images is the large case.
"""

from __future__ import annotations

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

METHODS = ("ours-staged", "ours-zero", "rank0-torch.save", "slices-torch.save")
QUICK_METHODS = ("ours-zero", "rank0-torch.save")  # --quick: our hand-off and the reference it is compared with
MODELS = {
    "resnet20": ["--preset", "debug", "--dataset", "cifar10", "--data", "@cifar10", "--batch-size", "16"],
    "resnet50": ["--preset", "debug", "--model", "resnet50", "--dataset", "tinyimagenet", "--data", "@tinyimagenet",
                 "--batch-size", "8"],
}


def command(method: str, training: list[str], log: Path, every: int, speed: float) -> list[str]:
    ck = str(log / "ck")
    if method.startswith("ours"):
        copy = method.split("-")[1]
        return [str(BIN / "dpurun"), *emulated_node(1, speed), "--", *training, "--log-dir", str(log),
                "--ckpt-dir", ck, "--ckpt-every", str(every), "--ckpt-keep", "1", "--ckpt-copy", copy]
    how = "rank0" if method.startswith("rank0") else "slices"
    return [str(BIN / "mpirun"), "--oversubscribe", "--bind-to", "none", "-np", "1", "env", "OMP_NUM_THREADS=1",
            "DPUOFFLOAD_THREADS=1", "taskset", "-c", "0", sys.executable, str(Path(__file__).with_name("ckpt_host.py")),
            "--how", how, "--every", str(every), "--dir", ck, "--", *training, "--log-dir", str(log)]


def measure(method: str, training: list[str], every: int, speed: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="dpubench-ckpt-") as tmp:
        log = Path(tmp)
        cmd = command(method, training, log, every, speed)
        res = subprocess.run(cmd, capture_output=True, text=True, env=job_env(), cwd=ROOT, timeout=1800)
        if res.returncode != 0:
            sys.exit(f"checkpoint benchmark run failed ({method}):\n{res.stdout[-1500:]}\n{res.stderr[-3000:]}")
        phases = [json.loads(x) for x in (log / "phases-rank0.jsonl").read_text().splitlines() if x.strip()]
        handoffs = [json.loads(x) for x in (log / "handoff-rank0.jsonl").read_text().splitlines() if x.strip()]
    return summarize(phases, handoffs)


def summarize(phases: list[dict[str, Any]], handoffs: list[dict[str, Any]], warmup: int = 2) -> dict[str, Any]:
    """Blocking and overhead per checkpoint from the step times and the hand-off log (pure)."""
    times = {r["first_global_step"] + i: t for r in phases for i, t in enumerate(r["step_times"])}
    ckpts = [h["global_step"] for h in handoffs if h["global_step"] + 1 in times and h["global_step"] in times]
    special = {s for h in handoffs for s in (h["global_step"], h["global_step"] + 1)}
    ordinary = [t for s, t in times.items() if s not in special and s > warmup]
    base = statistics.mean(ordinary)
    overheads = [(times[c] + times[c + 1]) / 2 - base for c in ckpts]
    return {"blocked_s": [h["blocked_s"] for h in handoffs], "overhead_s": overheads, "ordinary_step_s": base,
            "checkpoints": len(handoffs)}


def run(args: Any) -> dict[str, Any]:
    data = make_data(("cifar10", "tinyimagenet"))
    steps, every = (12, 4) if args.quick else (30, 5)
    if args.quick:
        args.dpu_speed = QUICK_DPU_SPEED
    methods = QUICK_METHODS if args.quick else METHODS
    results: dict[str, dict[str, list[dict[str, Any]]]] = {m: {k: [] for k in methods} for m in args.models}
    for rep in range(args.reps):
        for model in args.models:
            batch = int(MODELS[model][MODELS[model].index("--batch-size") + 1])
            training = [str(data / a[1:]) if a.startswith("@") else a for a in MODELS[model]]
            training += ["--epochs", "1", "--train-subset", str(steps * batch), "--val-subset", "16", "--no-progress"]
            for method in methods:
                t0 = time.perf_counter()
                results[model][method].append(measure(method, training, every, args.dpu_speed))
                print(f"[checkpoint] rep {rep + 1}/{args.reps} {model} {method}: {time.perf_counter() - t0:.0f} s",
                      flush=True)
    return {"settings": settings(args), "machine": machine(), "results": results}


def med(runs: list[dict[str, Any]], key: str) -> float:
    return statistics.median(v for r in runs for v in r[key])


def markdown(payload: dict[str, Any]) -> str:
    out = [f"## Checkpoint cost on the host (`benchmarks/checkpoint.py`, {time.strftime('%Y-%m-%d')})", "",
           machine_line(payload["machine"]), ""]
    for model, by in payload["results"].items():
        ref_b, ref_o = med(by["rank0-torch.save"], "blocked_s"), med(by["rank0-torch.save"], "overhead_s")
        rows = []
        for method, runs in by.items():
            b, o = med(runs, "blocked_s"), med(runs, "overhead_s")
            rows.append([method, f"{b * 1e3:.1f}", f"{o * 1e3:.1f}", f"{ref_b / b:.1f}x" if b > 0 else "-",
                         f"{ref_o / o:.1f}x" if o > 0 else "(no overhead)",
                         f"{statistics.median(r['ordinary_step_s'] for r in runs) * 1e3:.0f}"])
        out += [f"**{model}** (medians over every checkpoint of every repetition)", "",
                table(["method", "blocking ms/ckpt", "overhead ms/ckpt", "less blocking than rank0",
                       "less overhead than rank0", "ordinary step ms"], rows), ""]
    return "\n".join(out)


def main() -> None:
    p = bench_parser(__doc__, "checkpoint", "tiny runs (12 steps), ours-zero and rank0-torch.save only (tests)",
                     epochs=False, plots=False)
    p.add_argument("--models", nargs="+", choices=sorted(MODELS), default=list(MODELS))
    args = p.parse_args()
    payload = run(args)
    write_json(args.out, payload)
    print(markdown(payload))


if __name__ == "__main__":
    main()
