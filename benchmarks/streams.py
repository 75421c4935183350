"""Streams of shards: the same JPEGs as an ImageFolder and as tar shards, on the DPU rank and in a user's script.

    python benchmarks/streams.py [--reps 3] [--epochs 3] [--dpu-speed 0.5] [--quick]

Two measurements, repetitions interleaved:

1. **The DPU rank's read path** (what `dpu/serve.py` does for one stream, outside MPI): a child
   process on core 1, throttled to `--dpu-speed` in the DPU ranks' kind of CPU cgroup, builds
   `--epochs` epochs of one host rank's batches (`RankLoader` over per-sample seeds, batch 64,
   Tiny ImageNet's augmentation) from the bundled Tiny ImageNet JPEGs as an **ImageFolder** (a file
   per sample) and as **tar shards** (`tinyimagenet/shards/`, the same JPEG bytes, read as a
   stream: `dpu.webdataset`). Reported per epoch: samples/s, bytes read (`/proc/self/io` rchar),
   files opened, and the time to an epoch's first batch.
2. **Training from shards in a user's script** (`benchmarks/own_loop_script.py --shards`): host
   rank on core 0, shufflenet_v2 at 64 px, batch 16, the first two shards (512 samples); on core 1
   at `--dpu-speed` either a DPU rank serving `job.loader(dpu.webdataset(...))` (`--mode da`) or the
   peer: webdataset's own pipeline (shard shuffle, 1000-sample buffer, decode, the same augmentation)
   in a `DataLoader` with one worker pinned there in the same kind of cgroup.

Targets (issue 56): shards >= 1.0x ImageFolder's samples/s on the DPU rank; the first batch of an
epoch no later than ImageFolder's; `da` from shards <= 1.00x the peer's epoch.
"""

from __future__ import annotations

import argparse
import builtins
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.harness import (  # noqa: E402
    DATA,
    QUICK_DPU_SPEED,
    ROOT,
    Section,
    bench_parser,
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
from benchmarks.own_loop import run_script, steady_walls  # noqa: E402
from benchmarks.workloads import throttle_cgroup  # noqa: E402

SHARDS = DATA / "tinyimagenet" / "shards"
READ_BATCH = 64
TRAIN_SHARDS = "train-{000000..000001}.tar"   # 512 samples for the training comparison
SOURCES = ("imagefolder", "shards")


# ------------------------------------------------------------------------------- 1: the read path
def child(source: str, epochs: int, cgroup: Optional[str]) -> dict[str, Any]:
    """In the child: build `epochs` epochs from `source`; per epoch samples/s, bytes, opens, first batch."""
    os.sched_setaffinity(0, {1 % os.cpu_count()})
    if cgroup:
        Path(cgroup, "cgroup.procs").write_text(str(os.getpid()))
    import torch
    from torchvision import datasets

    from dpuoffload.common.data.datasets import _transform
    from dpuoffload.common.data.loaders import RankLoader, Sampling
    from dpuoffload.common.data.sampling import PerSampleSeeded
    from dpuoffload.common.data.tarshards import webdataset

    torch.set_num_threads(1)
    augment = _transform("tinyimagenet", True)
    if source == "imagefolder":
        data: Any = datasets.ImageFolder(str(DATA / "tinyimagenet" / "train"), transform=augment)
    else:
        data = webdataset(str(SHARDS / "train-{000000..000005}.tar"), augment)
    loader = RankLoader(Sampling(READ_BATCH), PerSampleSeeded(data, 0), collate=False)
    opens = [0]
    real_open = builtins.open

    def counting_open(*a: Any, **k: Any) -> Any:
        opens[0] += 1
        return real_open(*a, **k)

    builtins.open = counting_open  # (PIL and tarshards open files through it)
    out = []
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        opens[0], rchar, t0 = 0, _rchar(), time.perf_counter()
        first, n = None, 0
        for items in loader.batches():
            first = first if first is not None else time.perf_counter() - t0
            n += len(items)
        wall = time.perf_counter() - t0
        out.append({"epoch": epoch, "samples": n, "samples_per_s": n / wall, "first_batch_s": first,
                    "bytes_read": _rchar() - rchar, "files_opened": opens[0]})
    return {"source": source, "epochs": out}


def _rchar() -> int:
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("rchar:"))


def read_path(args: argparse.Namespace, cgroup: Optional[str]) -> dict[str, list[dict[str, Any]]]:
    runs: dict[str, list[dict[str, Any]]] = {s: [] for s in SOURCES}
    for rep in range(args.reps):
        for source in SOURCES:
            cmd = [sys.executable, __file__, "--child", source, "--epochs", str(args.epochs),
                   *(["--cgroup", cgroup] if cgroup else [])]
            res = subprocess.run(cmd, capture_output=True, text=True, env=job_env(), cwd=ROOT, timeout=1800)
            if res.returncode != 0:
                sys.exit(f"streams: the {source} child failed:\n{res.stderr[-3000:]}")
            run = json.loads(res.stdout.strip().splitlines()[-1])
            runs[source].append(run)
            steady = run["epochs"][1:] or run["epochs"]
            print(f"rep {rep + 1}/{args.reps} {source}: {median(e['samples_per_s'] for e in steady):.0f} samples/s, "
                  f"first batch {1e3 * median(e['first_batch_s'] for e in steady):.0f} ms", file=sys.stderr, flush=True)
    return runs


def analyze_read(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    def steady(source: str, key: str) -> list[float]:
        return [e[key] for run in runs[source] for e in (run["epochs"][1:] or run["epochs"])]

    per_rep = {s: [median(e["samples_per_s"] for e in (run["epochs"][1:] or run["epochs"])) for run in runs[s]]
               for s in SOURCES}
    first = {s: [median(e["first_batch_s"] for e in (run["epochs"][1:] or run["epochs"])) for run in runs[s]]
             for s in SOURCES}
    return {"sources": {s: {"samples_per_s": spread(steady(s, "samples_per_s")),
                            "first_batch_s": spread(steady(s, "first_batch_s")),
                            "bytes_per_epoch": median(steady(s, "bytes_read")),
                            "files_per_epoch": median(steady(s, "files_opened")),
                            "samples_per_epoch": median(steady(s, "samples"))} for s in SOURCES},
            "ratio_samples_per_s": ratio_spread(per_rep["shards"], per_rep["imagefolder"]),
            "ratio_first_batch": ratio_spread(first["shards"], first["imagefolder"])}


# ---------------------------------------------------------------------------- 2: training from shards
def train_cmd(variant: str, args: argparse.Namespace, cgroup: Optional[str]) -> list[str]:
    from benchmarks.harness import BIN, emulated_node
    from benchmarks.own_loop import DA_BUFFERS, SCRIPT

    mode, loader = ("da", "dpu") if variant == "api" else ("none", "torch")
    flags = ["--workload", "shufflenet_v2", "--data", str(DATA / "tinyimagenet"), "--shards",
             str(SHARDS / args.train_shards), "--loader", loader, "--epochs", str(args.epochs), "--batch-size", "16",
             "--times", "{times}"]
    if variant == "peer":
        flags += ["--worker-cores", "1", *(["--worker-cgroup", cgroup] if cgroup else [])]
    return [str(BIN / "dpurun"), *emulated_node(1, args.dpu_speed), "--", "--mode", mode, "--da-buffers",
            str(DA_BUFFERS), "--no-progress", str(SCRIPT), *flags]


def training(args: argparse.Namespace, cgroup: Optional[str]) -> dict[str, list[dict[str, Any]]]:
    runs: dict[str, list[dict[str, Any]]] = {"peer": [], "api": []}
    for rep in range(args.reps):
        for variant in runs:
            run = run_script(train_cmd(variant, args, cgroup), f"streams {variant}")
            runs[variant].append(run)
            print(f"rep {rep + 1}/{args.reps} train from shards, {variant}: {median(steady_walls(run)):.2f} s/epoch",
                  file=sys.stderr, flush=True)
    return runs


def analyze_training(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    per_rep = {v: [median(steady_walls(run)) for run in r] for v, r in runs.items()}
    return {"epoch_s": {v: spread([t for run in r for t in steady_walls(run)]) for v, r in runs.items()},
            "ratio_api_vs_peer": ratio_spread(per_rep["api"], per_rep["peer"]),
            "steps_per_epoch": runs["api"][0]["steps_per_epoch"]}


# ------------------------------------------------------------------------------------------- output
def markdown(report: dict[str, Any], s: dict[str, Any]) -> str:
    r = report["read"]
    rows = []
    for src in SOURCES:
        x = r["sources"][src]
        rows.append([src, fmt_spread(x["samples_per_s"], 0), f"{1e3 * x['first_batch_s']['median']:.0f}",
                     f"{x['bytes_per_epoch'] / 1e6:.2f}", f"{x['files_per_epoch']:.0f}",
                     f"{x['samples_per_epoch']:.0f}"])
    q, f = r["ratio_samples_per_s"], r["ratio_first_batch"]
    t = report["train"]
    out = [f"**The DPU rank's read path**: one host rank's batches (batch {READ_BATCH}, Tiny ImageNet's augmentation) "
           f"built on core 1 at --dpu-speed {s['dpu_speed']}, {s['epochs']} epochs x {s['reps']} interleaved "
           "repetitions; per epoch, epochs 2.. (min–max).", "",
           table(["source", "samples/s", "first batch ms", "MB read", "files opened", "samples"], rows), "",
           f"shards / ImageFolder samples/s: {fmt_spread(q, 3)} (target ≥ 1.00: "
           f"{'met' if q['median'] >= 1 else 'missed'}); "
           f"first batch shards / ImageFolder: {fmt_spread(f, 2)} (target ≤ 1.00: "
           f"{'met' if f['median'] <= 1 else 'missed'}).", "",
           f"**Training from shards** (`own_loop_script.py --shards {s['train_shards']}`, shufflenet_v2 at 64 px, "
           f"batch 16, {t['steps_per_epoch']} steps/epoch): host rank on core 0; on core 1 at --dpu-speed "
           f"{s['dpu_speed']} a DPU rank serving `job.loader(dpu.webdataset(...))` (api, `--mode da`) or "
           "webdataset's own pipeline in a one-worker DataLoader (peer); epoch s = median over epochs 2.. (min–max).",
           "", table(["peer epoch s", "api epoch s", "api / peer (≤ 1.00)"],
                     [[fmt_spread(t["epoch_s"]["peer"]), fmt_spread(t["epoch_s"]["api"]),
                       f"{fmt_spread(t['ratio_api_vs_peer'], 3)} "
                       f"{'met' if t['ratio_api_vs_peer']['median'] <= 1 else 'missed'}"]])]
    return "\n".join(out)


def build_parser() -> argparse.ArgumentParser:
    p = bench_parser(__doc__, "streams", "1 rep of 2 epochs, one shard for training, unthrottled", reps=3,
                     plots=False)
    p.add_argument("--train-shards", default=TRAIN_SHARDS, help="the shards the training comparison reads")
    p.add_argument("--child", choices=SOURCES, help=argparse.SUPPRESS)
    p.add_argument("--cgroup", help=argparse.SUPPRESS)
    return p


def run(args: argparse.Namespace) -> Section:
    if args.quick:
        args.reps, args.epochs, args.dpu_speed, args.train_shards = 1, 2, QUICK_DPU_SPEED, "train-000000.tar"
    make_data(("tinyimagenet",))
    info = machine()
    with throttle_cgroup(args.dpu_speed, 1) as cgroup:
        report = {"read": analyze_read(read_path(args, cgroup)), "train": analyze_training(training(args, cgroup))}
    info["load_avg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    payload = {"machine": info, "settings": settings(args), "report": report}
    write_json(args.out, payload)
    return Section("streams", payload, markdown(report, settings(args)))


def main() -> int:
    args = build_parser().parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.epochs, args.cgroup)))
        return 0
    print(run(args).markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
