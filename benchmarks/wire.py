"""uint8 vs float32 on the wire (`--wire`), side by side, for 224 px ImageNet-like batches (64x3x224x224).

    python benchmarks/wire.py [--reps 3] [--batches 60] [--step 0.15] [--dpu-speed F] [--quick]

End to end, through the real `--mode da` path: the user script `benchmarks/wire_script.py` (an
in-memory data set of 256x256 RGB PIL images, `RandomCrop(224)`, `RandomHorizontalFlip`, `ToTensor`,
`Normalize`) under `dpurun --host-ranks 1 --dpu-ranks 1` (host rank on core 0, DPU rank on core 1,
one torch thread each), once with `--wire uint8` (the DPU rank crops and flips and sends uint8
images; the host rank runs ToTensor + Normalize on each whole batch, `common.data.wire.HostSteps`)
and once with `--wire float` (the DPU rank runs the whole transform and sends float32), repetitions
interleaved (the order alternates rep by rep). The script sleeps `--step` seconds after each batch,
the emulated training step, so the DPU rank's ring is full when the script asks for the next batch:
the time inside `next()` is what the wire costs the host rank (receive + the float steps for uint8;
receive + the copy out of the receive buffer for float). Measured per wire:

- bytes per batch message (the `BatchLayout` that `common.data.wire.choose` picks);
- host rank: wall and process CPU milliseconds inside `next()` per batch (median over the batches
  after the first `--warmup`, then median and min–max over repetitions);
- DPU rank: milliseconds per batch of its phases `augment` (the transform's DPU part per sample)
  + `send` (collate into the send buffer, Isend), from its per-epoch record (`phases-rank1.jsonl`),
  and its `buffer_wait` per batch (> 0: it was ahead, its ring full);
- that both wires deliver the same batches, bit for bit (a sha256 over every batch's samples and
  labels, which the script prints: the benchmark fails if they differ).

In-process, no MPI, one torch thread (the host rank's): the host's float part alone on one real
uint8 batch (`HostSteps` = ToTensor + Normalize over 64x3x224x224) against what the float wire
costs there instead (a copy of the float32 batch), the DPU side's per-sample cost of each wire's
DPU part (the full transform vs the split's DPU view, `plan_split` / `dpu_view`) and of its collate
into the send buffer (`BatchLayout.pack_items`), medians of `--inner` timings.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from benchmarks.harness import (  # noqa: E402
    BIN,
    ROOT,
    Section,
    bench_parser,
    fmt_spread,
    job_env,
    machine,
    ratio_spread,
    settings,
    spread,
    table,
    write_json,
)
from benchmarks.wire_script import InMemoryImages, make_images  # noqa: E402
from dpuoffload.common.data.loaders import Sampling  # noqa: E402
from dpuoffload.common.data.sampling import PerSampleSeeded  # noqa: E402
from dpuoffload.common.data.wire import choose, dpu_view, plan_split  # noqa: E402
from dpuoffload.common.modes import Wire  # noqa: E402
from dpuoffload.common.train.autoselect import timed_calls as timed  # noqa: E402

SCRIPT = Path(__file__).with_name("wire_script.py")
WIRES = ("uint8", "float")
DTYPES = {"uint8": "uint8", "float": "float32"}  # what the DPU rank's end record must say it sent
BATCH = 64


# ------------------------------------------------------------------------------ end to end
def job_cmd(wire: str, args: argparse.Namespace, log: Path, out: Path) -> list[str]:
    launcher = ["--host-ranks", "1", "--dpu-ranks", "1", "--dpu-cores", "1", "--host-threads", "1",
                "--dpu-threads", "1"]
    if args.dpu_speed is not None:
        launcher += ["--dpu-speed", str(args.dpu_speed)]
    return [str(BIN / "dpurun"), *launcher, "--", "--mode", "da", "--wire", wire, "--log-dir", str(log),
            "--no-progress", str(SCRIPT), "--out", str(out), "--batches", str(args.batches), "--batch-size",
            str(BATCH), "--images", str(args.images), "--step", str(args.step)]


def run_job(wire: str, args: argparse.Namespace) -> dict[str, Any]:
    """One job: the script's timings and digest, the DPU rank's epoch and end records, the job's wall."""
    with tempfile.TemporaryDirectory(prefix="dpubench-wire-") as tmp:
        log, out = Path(tmp) / "log", Path(tmp) / "times.json"
        cmd = job_cmd(wire, args, log, out)
        t0 = time.perf_counter()
        res = subprocess.run(cmd, capture_output=True, text=True, env=job_env(), cwd=ROOT, timeout=900)
        wall = time.perf_counter() - t0
        if res.returncode != 0 or not out.exists():
            sys.exit(f"wire benchmark run failed (--wire {wire}): {' '.join(cmd)}\n{res.stdout[-1500:]}\n"
                     f"{res.stderr[-3000:]}")
        script = json.loads(out.read_text())
        recs = [json.loads(x) for x in (log / "phases-rank1.jsonl").read_text().splitlines() if x.strip()]
    epochs = [r for r in recs if "epoch" in r and "phases" in r]
    end = next(r for r in recs if r.get("event") == "end")
    sent = list(end.get("wires", {}).values())
    if sent != [DTYPES[wire]]:
        sys.exit(f"--wire {wire}: the DPU rank sent {sent}, expected [{DTYPES[wire]!r}]")
    batches = sum(r["batches"] for r in epochs)
    phase = lambda name: 1e3 * sum(r["phases"].get(name, 0.0) for r in epochs) / batches  # noqa: E731
    steady = slice(args.warmup, None)
    wall_ms = [1e3 * t for t in script["next_wall_s"][steady]]
    cpu_ms = [1e3 * t for t in script["next_cpu_s"][steady]]
    return {"wire": wire, "sha256": script["sha256"], "batches": script["batches"], "dpu_batches": batches,
            "batch_shape": script["batch_shape"], "dtype_out": script["dtype"], "dpu_sent": sent[0],
            "polls": end.get("polls"), "next_ms": statistics.median(wall_ms), "next_mean_ms": statistics.fmean(wall_ms),
            "next_cpu_ms": statistics.median(cpu_ms), "next_cpu_mean_ms": statistics.fmean(cpu_ms),
            "dpu_augment_ms": phase("augment"), "dpu_send_ms": phase("send"),
            "dpu_ms": phase("augment") + phase("send"), "dpu_buffer_wait_ms": phase("buffer_wait"),
            "epoch_s": script["epoch_s"], "job_wall_s": wall,
            "next_wall_ms_per_batch": [round(t, 3) for t in wall_ms],
            "next_cpu_ms_per_batch": [round(t, 3) for t in cpu_ms]}


def measure(args: argparse.Namespace) -> dict[str, list[dict[str, Any]]]:
    """Both wires once per repetition; the order alternates (uint8 first in odd reps, float in even)."""
    runs: dict[str, list[dict[str, Any]]] = {w: [] for w in WIRES}
    for rep in range(args.reps):
        for wire in (WIRES if rep % 2 == 0 else WIRES[::-1]):
            r = run_job(wire, args)
            runs[wire].append(r)
            print(f"rep {rep + 1}/{args.reps} --wire {wire}: next() {r['next_ms']:.1f} ms "
                  f"(CPU {r['next_cpu_ms']:.1f}), "
                  f"DPU {r['dpu_ms']:.1f} ms/batch (buffer_wait {r['dpu_buffer_wait_ms']:.1f}), "
                  f"sha256 {r['sha256'][:16]} (job {r['job_wall_s']:.0f} s)", file=sys.stderr, flush=True)
    return runs


# ------------------------------------------------------------------------------- in-process
@contextmanager
def as_host_rank() -> Iterator[None]:
    """This process on core 0 with one torch thread, as the jobs' host rank; restored afterwards."""
    cores, threads = os.sched_getaffinity(0), torch.get_num_threads()
    os.sched_setaffinity(0, {min(cores)})
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        os.sched_setaffinity(0, cores)


def in_process(args: argparse.Namespace) -> dict[str, Any]:
    ds = InMemoryImages(make_images(args.images), BATCH)
    sampling = Sampling(BATCH)
    chosen = {"uint8": choose(ds, Wire.UINT8, None, sampling), "float": choose(ds, Wire.FLOAT, None, sampling)}
    split = plan_split(ds, Wire.UINT8)
    assert split is not None and chosen["uint8"].split is not None
    views = {"uint8": PerSampleSeeded(dpu_view(ds, split), 0), "float": PerSampleSeeded(ds, 0)}
    indices = list(range(BATCH))
    items = {w: v.__getitems__(indices) for w, v in views.items()}
    u8 = torch.stack([x for x, _ in items["uint8"]])
    f32 = torch.stack([x for x, _ in items["float"]])
    host = split.host
    identical = torch.equal(host(u8), f32)  # the split's batch is the float wire's, bit for bit
    out: dict[str, Any] = {"host_steps": repr(host), "dpu_steps": [type(s).__name__ for s in split.dpu],
                           "identical": identical, "inner": args.inner}
    with as_host_rank():
        for w in WIRES:
            layout = chosen[w].layout
            buf = layout.buffer()
            out[w] = {"dtype": str(layout.dtype), "sample_shape": list(layout.sample_shape),
                      "bytes_per_batch": layout.nbytes(BATCH),
                      "dpu_sample_ms": 1e3 * timed(lambda v=views[w]: v.__getitems__(indices), args.inner) / BATCH,
                      "dpu_collate_ms": 1e3 * timed(lambda lay=layout, b=buf, it=items[w]: lay.pack_items(b, 0, 0, it),
                                                    args.inner)}
        out["uint8"]["host_batch_ms"] = 1e3 * timed(lambda: host(u8), args.inner)  # ToTensor + Normalize
        out["float"]["host_batch_ms"] = 1e3 * timed(lambda: f32.clone(), args.inner)  # copy=True's copy
    out["uint8"]["host_sample_us"] = 1e3 * out["uint8"]["host_batch_ms"] / BATCH
    return out


# ---------------------------------------------------------------------------------- analysis
METRICS = ("next_ms", "next_cpu_ms", "dpu_ms", "dpu_augment_ms", "dpu_send_ms", "dpu_buffer_wait_ms", "job_wall_s")


def analyze(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    per_rep = {w: {m: [r[m] for r in rs] for m in METRICS} for w, rs in runs.items()}
    digests = {w: sorted({r["sha256"] for r in rs}) for w, rs in runs.items()}
    identical = len(digests["uint8"]) == 1 and digests["uint8"] == digests["float"]
    return {"per_rep": per_rep,
            "summary": {w: {m: spread(v) for m, v in ms.items()} for w, ms in per_rep.items()},
            "ratios_uint8_vs_float": {m: ratio_spread(per_rep["uint8"][m], per_rep["float"][m])
                                      for m in ("next_ms", "next_cpu_ms", "dpu_ms")},
            "sha256": digests, "identical": identical}


# ------------------------------------------------------------------------------------ output
def markdown(report: dict[str, Any], inproc: dict[str, Any], s: dict[str, Any]) -> str:
    summ, ratios = report["summary"], report["ratios_uint8_vs_float"]
    nbytes = {w: inproc[w]["bytes_per_batch"] for w in WIRES}
    speed = "full speed" if s["dpu_speed"] is None else f"--dpu-speed {s['dpu_speed']}"
    out = [f"`dpurun --host-ranks 1 --dpu-ranks 1 -- --mode da --wire uint8|float benchmarks/wire_script.py`: "
           f"batch {BATCH}x3x224x224 (RandomCrop, flip, ToTensor, Normalize), {s['batches']} batches per run, "
           f"a {1e3 * s['step']:.0f} ms sleep per step, host rank core 0, DPU rank core 1 "
           f"({speed}), "
           f"{s['reps']} interleaved repetitions; ms per batch = median over batches {s['warmup'] + 1}.. of a run, "
           "then median (min–max) over repetitions. Batches bit-identical between the wires: "
           f"**{'yes' if report['identical'] else 'NO'}** (sha256 {report['sha256']['uint8'][0][:16]}).", ""]
    rows = [[w, f"{nbytes[w]:,}", fmt_spread(summ[w]["next_ms"], 1), fmt_spread(summ[w]["next_cpu_ms"], 1),
             fmt_spread(summ[w]["dpu_ms"], 1), f"{summ[w]['dpu_augment_ms']['median']:.1f} + "
             f"{summ[w]['dpu_send_ms']['median']:.1f}", fmt_spread(summ[w]["dpu_buffer_wait_ms"], 1)]
            for w in WIRES]
    rows.append(["uint8 / float", f"{nbytes['uint8'] / nbytes['float']:.3f}", fmt_spread(ratios["next_ms"], 2),
                 fmt_spread(ratios["next_cpu_ms"], 2), fmt_spread(ratios["dpu_ms"], 2), "", ""])
    out.append(table(["wire", "bytes / batch", "host ms in next()", "host CPU ms in next()",
                      "DPU ms / batch (augment + send)", "DPU augment + send (medians)", "DPU buffer_wait ms"],
                     rows))
    u, f = inproc["uint8"], inproc["float"]
    out += ["", f"In-process, one thread on core 0 (median of {inproc['inner']}); host float part = "
            f"`{inproc['host_steps']}` on one uint8 batch, identical to the float transform's batch: "
            f"{'yes' if inproc['identical'] else 'NO'}.", ""]
    out.append(table(["per batch of 64", "uint8 wire", "float wire", "uint8 / float"], [
        ["bytes", f"{u['bytes_per_batch']:,}", f"{f['bytes_per_batch']:,}",
         f"{u['bytes_per_batch'] / f['bytes_per_batch']:.3f}"],
        ["host: float steps (uint8) / copy out (float), ms", f"{u['host_batch_ms']:.1f}", f"{f['host_batch_ms']:.1f}",
         f"{u['host_batch_ms'] / f['host_batch_ms']:.2f}"],
        ["host float steps per sample, µs", f"{u['host_sample_us']:.0f}", "", ""],
        ["DPU transform part per sample, ms", f"{u['dpu_sample_ms']:.3f}", f"{f['dpu_sample_ms']:.3f}",
         f"{u['dpu_sample_ms'] / f['dpu_sample_ms']:.2f}"],
        ["DPU collate into the send buffer, ms", f"{u['dpu_collate_ms']:.1f}", f"{f['dpu_collate_ms']:.1f}",
         f"{u['dpu_collate_ms'] / f['dpu_collate_ms']:.2f}"]]))
    return "\n".join(out)


# -------------------------------------------------------------------------------------- main
def build_parser() -> argparse.ArgumentParser:
    p = bench_parser(__doc__, "wire", "1 rep of 20 batches, 3 warm-up, 5 in-process timings", reps=3,
                     epochs=False, dpu_speed=False, plots=False)
    p.add_argument("--batches", type=int, default=60, help="batches per run (default: 60)")
    p.add_argument("--warmup", type=int, default=5, help="first batches of a run left out (default: 5)")
    p.add_argument("--step", type=float, default=0.15, help="emulated training step, seconds (default: 0.15)")
    p.add_argument("--images", type=int, default=32, help="distinct images in the data set (default: 32)")
    p.add_argument("--dpu-speed", type=float, help="throttle the DPU rank to this fraction of core 1 (default: no)")
    p.add_argument("--inner", type=int, default=15, help="in-process timings per measurement (default: 15)")
    return p


def run(args: argparse.Namespace) -> Section:
    if args.quick:
        args.reps, args.batches, args.warmup, args.inner = 1, 20, 3, 5
    if args.batches <= args.warmup:
        sys.exit(f"--batches {args.batches} leaves nothing after --warmup {args.warmup}")
    t0 = time.perf_counter()
    info = machine()
    inproc = in_process(args)
    report = analyze(measure(args))
    info["load_avg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    payload = {"machine": info, "settings": settings(args), "batch": BATCH, "end_to_end": report,
               "in_process": inproc, "wall_s": time.perf_counter() - t0}
    write_json(args.out, payload)
    if not report["identical"]:
        sys.exit(f"the wires' batches differ: sha256 {report['sha256']} (results in {args.out})")
    if not inproc["identical"]:
        sys.exit(f"in-process: HostSteps on the uint8 batch differs from the float transform's (results in {args.out})")
    return Section("wire", payload, markdown(report, inproc, settings(args)))


def main() -> int:
    args = build_parser().parse_args()
    section = run(args)
    print(section.markdown)
    print(f"\n(benchmark wall time {section.payload['wall_s']:.0f} s; results in {args.out})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
