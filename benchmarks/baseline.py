"""Baseline benchmark (--mode none): what an idle DPU rank costs, Horovod vs torch.distributed, and
what MPI waits that spin (Open MPI's default where ranks do not outnumber cores) cost against the
waits that yield their core (dpurun's default for the host program's ranks,
`OMPI_MCA_mpi_yield_when_idle=1` in their app contexts: `launch/command.py::_yield_env`).

Runs the variants below interleaved (rep 1 of every variant, then rep 2, ...) on this machine so
that machine noise hits all of them alike, and prints medians and ratios measured in this run.

    python benchmarks/baseline.py [--reps 3] [--epochs 3] [--quick] [--out benchmarks/results/baseline.json]

Epoch time is the median over epochs 2.. of every rep (epoch 1 pays one-off warm-up).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.harness import RESULTS, Section, dpurun_cmd, machine, make_data, run_logged, table, write_json  # noqa: E402

VARIANTS = {
    "1 host, no DPU rank": ["--host-ranks", "1", "--dpu-ranks", "0", "--host-threads", "1"],
    "1 host + 1 idle DPU rank": ["--host-ranks", "1", "--dpu-ranks", "1", "--host-threads", "1"],
    "2 hosts, horovod": ["--host-ranks", "2", "--dpu-ranks", "0", "--host-threads", "1", "@horovod"],
    "2 hosts, torch (gloo)": ["--host-ranks", "2", "--dpu-ranks", "0", "--host-threads", "1", "@torch"],
    "2 hosts, horovod, MPI waits spinning": ["--host-ranks", "2", "--dpu-ranks", "0", "--host-threads", "1",
                                             "--mpirun-arg=--mca mpi_yield_when_idle 0", "@horovod"],
}
RATIOS = [("1 host + 1 idle DPU rank", "1 host, no DPU rank"), ("2 hosts, torch (gloo)", "2 hosts, horovod"),
          ("2 hosts, horovod", "2 hosts, horovod, MPI waits spinning")]


def run_variant(launcher: list[str], data: Path, epochs: int) -> list[dict]:
    allreduce = next((a[1:] for a in launcher if a.startswith("@")), "auto")
    launcher = [a for a in launcher if not a.startswith("@")]
    training = ["--preset", "debug", "--data", str(data / "cifar10"), "--epochs", str(epochs), "--allreduce", allreduce]
    return run_logged(dpurun_cmd(launcher, training), " ".join(launcher)).epochs


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="1 rep of 2 epochs (keeps the command working)")
    p.add_argument("--out", type=Path, default=RESULTS / "baseline.json")
    return p


def run(args: argparse.Namespace) -> Section:
    reps, epochs = (1, 2) if args.quick else (args.reps, args.epochs)
    data = make_data(["cifar10"])
    times: dict[str, list[float]] = {v: [] for v in VARIANTS}
    allreduce: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for rep in range(reps):
        for name, launcher in VARIANTS.items():
            epochs_rec = run_variant(launcher, data, epochs)[1:]
            times[name] += [e["epoch_time"] for e in epochs_rec]
            allreduce[name] += [e["phase_shares"].get("allreduce", 0.0) * e["epoch_time"] for e in epochs_rec]
            print(f"rep {rep + 1}/{reps} {name}: {statistics.median(times[name][-len(epochs_rec):]):.2f} s/epoch",
                  file=sys.stderr, flush=True)
    report = {v: {"epoch_s_median": statistics.median(t), "epoch_s_min": min(t), "epoch_s_max": max(t),
                  "allreduce_s_median": statistics.median(allreduce[v]), "samples": len(t)}
              for v, t in times.items()}
    ratios = {f"{a} / {b}": report[a]["epoch_s_median"] / report[b]["epoch_s_median"] for a, b in RATIOS}
    payload = {"machine": machine(), "reps": reps, "epochs": epochs, "variants": report, "ratios": ratios}
    write_json(args.out, payload)
    md = table(["variant", "epoch s (median)", "min–max", "allreduce s/epoch"],
               [[v, f"{r['epoch_s_median']:.2f}", f"{r['epoch_s_min']:.2f}–{r['epoch_s_max']:.2f}",
                 f"{r['allreduce_s_median']:.3f}"] for v, r in report.items()])
    md += "".join(f"\n\nratio {k}: {v:.3f}" for k, v in ratios.items())
    return Section("baseline", payload, md)


def main() -> int:
    print(run(build_parser().parse_args()).markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
