"""Checkpoint cost on the host: ours (slices handed to the DPU, staged or zero-copy) vs host ranks
saving with `torch.save` themselves (rank 0 saves everything, or every rank its slice) and vs
PyTorch's own asynchronous checkpoint, `torch.distributed.checkpoint.async_save` (DCP).

    python benchmarks/checkpoint.py [--quick] [--reps 3] [--host-ranks 2] [--models resnet50 vgg11]
                                    [--methods ...] [--device cpu|cuda]

With 2 host ranks (the default) the state is really split: ours hands each host rank's half to its
keeper, slices and DCP write from both ranks. Every method runs with `--allreduce torch` (DCP needs
a torch.distributed process group), so the ordinary steps are alike.

DeepFreeze's metrics, measured side by side in one run (methods interleaved, repetition by
repetition), on the emulated node (host rank on core 0; for ours a DPU rank on core 1 at
`--dpu-speed`): the host's *blocking time* per checkpoint, and the *runtime overhead* = mean
time of the checkpoint step and the next step minus the mean time of ordinary steps (which is
where zero-copy pays: the next optimizer step waits for the send, and `--ckpt-copy overlap`: it
waits for what is left of the background copy, logged per hand-off as the *next-step wait*).
resnet50 (~100 MB of weights, ~200 MB with SGD momentum) on 64x64 Tiny-ImageNet-format images is
the large case.
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

METHODS = ("ours-staged", "ours-overlap", "ours-zero", "rank0-torch.save", "slices-torch.save", "dcp-async_save")
QUICK_METHODS = ("ours-zero", "rank0-torch.save", "dcp-async_save")  # --quick: ours and the two references
MODELS = {
    "resnet20": ["--preset", "debug", "--dataset", "cifar10", "--data", "@cifar10", "--batch-size", "16"],
    "resnet50": ["--preset", "debug", "--model", "resnet50", "--dataset", "tinyimagenet", "--data", "@tinyimagenet",
                 "--batch-size", "8"],
    "vgg11": ["--preset", "debug", "--model", "benchmarks.augfactories:vgg11", "--dataset", "tinyimagenet",
              "--data", "@tinyimagenet", "--batch-size", "8"],  # (~130M parameters)
}


def command(method: str, training: list[str], log: Path, every: int, speed: float, hosts: int) -> list[str]:
    ck = str(log / "ck")
    training = [*training, "--allreduce", "torch"]
    if method.startswith("ours"):
        copy = method.split("-")[1]
        return [str(BIN / "dpurun"), *emulated_node(hosts, speed, hosts), "--", *training, "--log-dir", str(log),
                "--ckpt-dir", ck, "--ckpt-every", str(every), "--ckpt-keep", "1", "--ckpt-copy", copy]
    how = method.split("-")[0]
    return [str(BIN / "mpirun"), "--oversubscribe", "--bind-to", "none", "-np", str(hosts), "env", "OMP_NUM_THREADS=1",
            "DPUOFFLOAD_THREADS=1", "taskset", "-c", "0", sys.executable, str(Path(__file__).with_name("ckpt_host.py")),
            "--how", how, "--every", str(every), "--dir", ck, "--", *training, "--log-dir", str(log)]


def measure(method: str, training: list[str], every: int, speed: float, hosts: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="dpubench-ckpt-") as tmp:
        log = Path(tmp)
        cmd = command(method, training, log, every, speed, hosts)
        res = subprocess.run(cmd, capture_output=True, text=True, env=job_env(), cwd=ROOT, timeout=1800)
        if res.returncode != 0:
            sys.exit(f"checkpoint benchmark run failed ({method}):\n{res.stdout[-1500:]}\n{res.stderr[-3000:]}")
        phases = [json.loads(x) for x in (log / "phases-rank0.jsonl").read_text().splitlines() if x.strip()]
        handoffs = [json.loads(x) for x in (log / "handoff-rank0.jsonl").read_text().splitlines() if x.strip()]
        nbytes = sum(f.stat().st_size for f in (log / "ck").rglob("*") if f.is_file())
    return {**summarize(phases, handoffs), "bytes_on_disk": nbytes}


def summarize(phases: list[dict[str, Any]], handoffs: list[dict[str, Any]], warmup: int = 2) -> dict[str, Any]:
    """Blocking and overhead per checkpoint from the step times and the hand-off log (pure)."""
    times = {r["first_global_step"] + i: t for r in phases for i, t in enumerate(r["step_times"])}
    ckpts = [h["global_step"] for h in handoffs if h["global_step"] + 1 in times and h["global_step"] in times]
    special = {s for h in handoffs for s in (h["global_step"], h["global_step"] + 1)}
    ordinary = [t for s, t in times.items() if s not in special and s > warmup]
    base = statistics.mean(ordinary)
    overheads = [(times[c] + times[c + 1]) / 2 - base for c in ckpts]
    return {"blocked_s": [h["blocked_s"] for h in handoffs], "overhead_s": overheads, "ordinary_step_s": base,
            "next_step_wait_s": [h.get("next_step_wait_s", 0.0) for h in handoffs], "checkpoints": len(handoffs)}


def run(args: Any) -> dict[str, Any]:
    data = make_data(("cifar10", "tinyimagenet"))
    steps, every = (12, 4) if args.quick else (30, 5)
    if args.quick:
        args.dpu_speed = QUICK_DPU_SPEED
    methods = QUICK_METHODS if args.quick else args.methods
    results: dict[str, dict[str, list[dict[str, Any]]]] = {m: {k: [] for k in methods} for m in args.models}
    for rep in range(args.reps):
        for model in args.models:
            batch = int(MODELS[model][MODELS[model].index("--batch-size") + 1])
            training = [str(data / a[1:]) if a.startswith("@") else a for a in MODELS[model]]
            training += ["--epochs", "1", "--train-subset", str(steps * batch * args.host_ranks), "--val-subset", "16",
                         "--no-progress", "--device", args.device]
            for method in methods:
                t0 = time.perf_counter()
                results[model][method].append(measure(method, training, every, args.dpu_speed, args.host_ranks))
                print(f"[checkpoint] rep {rep + 1}/{args.reps} {model} {method}: {time.perf_counter() - t0:.0f} s",
                      flush=True)
    return {"settings": settings(args), "machine": machine(), "results": results}


def med(runs: list[dict[str, Any]], key: str) -> float:
    return statistics.median(v for r in runs for v in r[key])


def markdown(payload: dict[str, Any]) -> str:
    hosts = payload["settings"].get("host_ranks", 1)
    out = [f"## Checkpoint cost on the host (`benchmarks/checkpoint.py`, {time.strftime('%Y-%m-%d')})", "",
           machine_line(payload["machine"]), "",
           f"{hosts} host rank(s) on core 0, for ours {hosts} DPU rank(s) on core 1; every method with "
           f"`--allreduce torch`, `--device {payload['settings'].get('device', 'cpu')}`. Ratios are against rank-0 "
           "`torch.save` and against DCP `async_save`; the next-step wait is part of the overhead.", ""]
    for model, by in payload["results"].items():
        ref, dcp = by.get("rank0-torch.save"), by.get("dcp-async_save")
        ref_b, ref_o = (med(ref, "blocked_s"), med(ref, "overhead_s")) if ref else (None, None)
        dcp_b, dcp_o = (med(dcp, "blocked_s"), med(dcp, "overhead_s")) if dcp else (None, None)
        rows = [row(method, runs, ref_b, ref_o, dcp_b, dcp_o) for method, runs in by.items()]
        out += [f"**{model}** (medians over every checkpoint of every repetition)", "",
                table(["method", "blocking ms/ckpt", "next-step wait ms", "overhead ms/ckpt",
                       "less blocking than rank0", "less overhead than rank0", "blocking / DCP's",
                       "overhead / DCP's", "ordinary step ms", "MB on disk (kept)"], rows), ""]
    return "\n".join(out)


def row(method: str, runs: list[dict[str, Any]], ref_b: Optional[float], ref_o: Optional[float],
        dcp_b: Optional[float], dcp_o: Optional[float]) -> list[str]:
    """One method's table row; a ratio whose reference was not run (`--methods`) is "-"."""
    b, o = med(runs, "blocked_s"), med(runs, "overhead_s")
    mb = statistics.median(r.get("bytes_on_disk", 0) for r in runs) / 1e6
    waited = statistics.median(v for r in runs for v in r.get("next_step_wait_s", [0.0]))
    return [method, f"{b * 1e3:.1f}", f"{waited * 1e3:.1f}", f"{o * 1e3:.1f}",
            f"{ref_b / b:.1f}x" if ref_b and b > 0 else "-",
            "(no overhead)" if o <= 0 else f"{ref_o / o:.1f}x" if ref_o else "-",
            f"{b / dcp_b:.2f}x" if dcp_b else "-", f"{o / dcp_o:.2f}x" if dcp_o and dcp_o > 0 else "-",
            f"{statistics.median(r['ordinary_step_s'] for r in runs) * 1e3:.0f}", f"{mb:.0f}"]


def main() -> None:
    p = bench_parser(__doc__, "checkpoint", "tiny runs (12 steps), ours-zero and rank0-torch.save only (tests)",
                     epochs=False, plots=False)
    p.add_argument("--models", nargs="+", choices=sorted(MODELS), default=["resnet50", "vgg11"])
    p.add_argument("--host-ranks", type=int, default=2, help="host ranks (2: the state is really split)")
    p.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS),
                   help="methods to compare (default: all; rank0-torch.save is every ratio's reference)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="the host ranks' device (cuda: the overlapped copy runs on a side stream)")
    args = p.parse_args()
    payload = run(args)
    write_json(args.out, payload)
    print(markdown(payload))


if __name__ == "__main__":
    main()
