"""The benchmark suite, one command: run it on the emulated node, write JSON, RESULTS.md and plots.

    python benchmarks/run.py [--quick] [--only NAME ...] [--dpu-speed 0.5] [--results DIR] [--markdown FILE]

Host ranks and DPU ranks run on disjoint cores (host on core 0, DPU on core 1), DPU ranks
throttled with `--dpu-speed`. Every comparison is measured side by side inside one benchmark
(interleaved repetitions, medians and min–max), never against a number from another run.
Each benchmark NAME writes `<results>/<NAME>.json` and its PNG plots into `<results>/`; the run
appends one section with the machine description and every table to the markdown file.

Benchmarks (default: all but `modes` (15+ min on 2 cores), `baseline` (3 min), `own_loop` (12 min), `streams`,
`multinode` and `netmodel` (root) and `gpu` (a GPU node)):
  workloads  phase shares, the DataLoader peer, the ideal bounds of da and mv, prediction error
  augweight  light -> heavy augmentation: none / da / mv / peer at each weight
  sweep      samples/s vs threads per rank and batch size, host and (throttled) DPU
  transport  host<->DPU batch bandwidth vs raw MPI Send/Recv
  interference  host compute slowed by load on the emulated DPU core (what a real DPU would not cost)
  modes      none / da / mv / hybrid / naive side by side
  baseline   idle DPU rank cost, Horovod vs torch.distributed, MPI waits yielding vs spinning
  startup    wall time of a tiny dpurun job vs a plain torchvision + DataLoader script, and where it goes
  own_loop   a user's own script: torch's DataLoader on the spare core vs job.loader with a DPU rank there
  streams    the same JPEGs as an ImageFolder and as tar shards on the DPU rank; training from shards,
             job.loader vs webdataset's own pipeline in a DataLoader worker (3 min)
  multinode  none / da / mv / hybrid across 2 emulated nodes and their DPUs (TCP between machines; root)
  netmodel   the performance model's allreduce term vs measurement across emulated machines, unshaped and
             shaped links (fitted link, training's allreduce per step, ring-model prediction; root)
  gpu        a GPU host rank fed by DPU and host cores: GPU-bound, the DataLoader peer, da, host + DPU shares,
             short epochs, the model's predictions (16 cores + a GPU; --quick: a CPU smoke run)

`--quick` shrinks every benchmark to seconds (1 repetition, tiny subsets, ours and the reference
variant only where a benchmark has several) and writes to
`benchmarks/results/quick/` so it never overwrites the real results; the test suite runs it.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.harness import RESULTS, ROOT, Section, machine, machine_line, table  # noqa: E402

BENCHMARKS = ("workloads", "augweight", "sweep", "transport", "interference", "startup", "fanin", "modes", "baseline",
              "own_loop", "streams", "multinode", "netmodel", "gpu")
DEFAULT = ("workloads", "augweight", "sweep", "transport", "interference", "startup", "fanin")
TITLES = {"workloads": "Phases, the DataLoader peer, ideal bounds and prediction error",
          "augweight": "Augmentation weight sweep", "sweep": "Thread and batch sweeps",
          "transport": "Transport: host<->DPU batches vs raw MPI",
          "interference": "Emulation fidelity: DPU-core load slowing the host core",
          "modes": "Offload modes side by side",
          "baseline": "Baseline: idle DPU rank, Horovod vs torch.distributed, MPI waits yielding vs spinning",
          "startup": "Start-up: a tiny dpurun job vs a plain torchvision script",
          "own_loop": "Own loop: a user's script, DataLoader worker vs job.loader",
          "fanin": "Fan-in: K worker processes building one host rank's batches (--dpu-workers)",
          "streams": "Streams: the same JPEGs as an ImageFolder and as tar shards",
          "multinode": "Offload modes on 2 emulated nodes (TCP between machines)",
          "netmodel": "The model's network term vs measurement on emulated machines",
          "gpu": "GPU host ranks fed by DPU cores and host cores"}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog=__doc__.split("\n\n", 2)[2],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="tiny sizes, 1 repetition (the test suite runs this)")
    p.add_argument("--only", nargs="+", choices=BENCHMARKS, metavar="NAME",
                   help=f"run only these ({', '.join(BENCHMARKS)}) (default: {' '.join(DEFAULT)})")
    p.add_argument("--dpu-speed", type=float, default=0.5,
                   help="DPU ranks' (and the peer's workers') fraction of a core (default: 0.5)")
    p.add_argument("--results", type=Path, help="directory for JSON and PNGs (default: benchmarks/results, "
                                                "with --quick benchmarks/results/quick)")
    p.add_argument("--markdown", type=Path, help="markdown file the section is appended to (default: "
                                                 "benchmarks/RESULTS.md, with --quick <results>/RESULTS.md)")
    return p


def bench_args(name: str, module: Any, args: argparse.Namespace, results: Path) -> argparse.Namespace:
    """The benchmark's own defaults, with the suite's settings on top."""
    ns = module.build_parser().parse_args([])
    ns.quick, ns.out = args.quick, results / f"{name}.json"
    if hasattr(ns, "plots"):
        ns.plots = results
    if hasattr(ns, "dpu_speed"):
        ns.dpu_speed = args.dpu_speed
    return ns


def run_one(name: str, args: argparse.Namespace, results: Path) -> Section:
    module = importlib.import_module(f"benchmarks.{name}")
    t0 = time.perf_counter()
    print(f"== {name}", file=sys.stderr, flush=True)
    section = module.run(bench_args(name, module, args, results))
    section.payload["seconds"] = time.perf_counter() - t0
    print(f"== {name} done in {section.payload['seconds']:.0f} s", file=sys.stderr, flush=True)
    return section


def targets(sections: dict[str, Section]) -> str:
    """The issue's targets, met or missed, from the sections that measure them."""
    rows = []
    if "workloads" in sections:
        report = sections["workloads"].payload["report"]
        limits = sections["workloads"].payload["targets"]
        for key, label in (("da_vs_bound", "da / ideal bound"), ("da_vs_peer", "da / DataLoader peer"),
                           ("mv_vs_train_only", "mv / train-only epoch")):
            for w, r in report.items():
                value = r["ratios"][key]["median"]
                verdict = "met" if value <= limits[key] else "missed"
                rows.append([label, w, f"≤ {limits[key]:.2f}", f"{value:.3f}", verdict])
        for w, r in report.items():
            worst = max(r["prediction"]["modes"].items(), key=lambda kv: abs(kv[1]["error"]))
            rows.append(["prediction error (worst mode)", w, "≤ 10 %", f"{worst[1]['error']:+.1%} ({worst[0]})",
                         "met" if abs(worst[1]["error"]) <= limits["prediction_error"] else "missed"])
    if "transport" in sections:
        for key, label in (("ratio", "transport / raw MPI (collate + send)"),
                           ("ratio_send_only", "transport / raw MPI (send only)")):
            for r in sections["transport"].payload["results"]:
                rows.append([label, r["size"], "≥ 0.80", f"{r[key]:.2f}", "met" if r[key] >= 0.8 else "missed"])
    if "gpu" in sections:
        for w, r in sections["gpu"].payload["report"].items():
            for t in r["targets"]:
                value = f"{t['value']:+.1%}" if "error" in t["target"] else f"{t['value']:.3f}"
                rows.append([t["target"], w, t["limit"], value, "met" if t["met"] else "missed"])
    if "own_loop" in sections:
        for w, r in sections["own_loop"].payload["report"].items():
            value = r["ratio_api_vs_peer"]["median"]
            rows.append(["job.loader / DataLoader epoch (own loop)", w, "≤ 1.00", f"{value:.3f}",
                         "met" if value <= 1.0 else "missed"])
    return table(["target", "workload", "limit", "measured (median)", ""], rows) if rows else ""


def report(sections: dict[str, Section], args: argparse.Namespace, info: dict[str, Any], markdown: Path,
           seconds: float) -> str:
    today = datetime.date.today().isoformat()
    load = info["load_avg_at_start"]
    loaded = (f" The machine was loaded by other work (load average {load[0]:.2f} at start on "
              f"{info['cpus_logical']} CPUs), so absolute times are noisy; every comparison is interleaved "
              "within one benchmark.") if load[0] >= 0.5 else ""
    cmd = "python benchmarks/run.py" + (" --quick" if args.quick else "") + (
        f" --only {' '.join(args.only)}" if args.only else "")
    out = [f"## Suite run {today} (`{cmd}`, {seconds / 60:.0f} min)", "",
           f"Machine: {machine_line(info)}.{loaded} DPU ranks and the peer's workers at --dpu-speed {args.dpu_speed}"
           + (" (--quick: unthrottled in the benchmarks that start jobs)." if args.quick else "."),
           ""]
    summary = targets(sections)
    if summary:
        out += ["**Targets**", "", summary, ""]
    for name, section in sections.items():
        out += [f"### {TITLES[name]} (`{name}`)", "", section.markdown, ""]
        for plot in section.plots:
            out.append(f"![{plot.stem}]({_relative(plot, markdown.parent)})")
        out += [f"Raw numbers: `{_relative(args.results / (name + '.json'), ROOT)}`.", ""]
    return "\n".join(out)


def _relative(path: Path, base: Path) -> str:
    try:
        return str(path.resolve().relative_to(base.resolve()))
    except ValueError:
        return str(path)


def main() -> int:
    args = build_parser().parse_args()
    args.results = args.results or (RESULTS / "quick" if args.quick else RESULTS)
    markdown = args.markdown or (args.results / "RESULTS.md" if args.quick else ROOT / "benchmarks" / "RESULTS.md")
    args.results.mkdir(parents=True, exist_ok=True)
    info = machine()
    t0 = time.perf_counter()
    sections = {name: run_one(name, args, args.results) for name in (args.only or DEFAULT)}
    text = report(sections, args, info, markdown, time.perf_counter() - t0)
    markdown.parent.mkdir(parents=True, exist_ok=True)
    with open(markdown, "a", encoding="utf-8") as f:
        f.write("\n" + text + "\n")
    print(text)
    print(f"\nappended to {markdown}; JSON and plots in {args.results}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
