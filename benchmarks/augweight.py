"""Augmentation weight sweep: where each mode starts to pay, light (crop + flip) to heavy.

    python benchmarks/augweight.py [--reps 2] [--epochs 3] [--dpu-speed 0.5] [--quick]

resnet20 on the Tiny-ImageNet-format JPEGs (64x64), with the training transforms of
`benchmarks/augfactories.py` (light, medium, randaug, heavy) given as a user data set factory
(`--dataset benchmarks.augfactories:heavy`). At every weight, interleaved: `none`, `da`, `mv` and
the DataLoader peer (see `workloads.py`), on the emulated node. Reported: epoch time, each
variant's ratio to `none` measured in the same run, the host's data share in `none`, the DPU
rank's seconds to augment the epoch in `da`, and `da` against its ideal overlap bound.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import workloads as W  # noqa: E402
from benchmarks.augfactories import WEIGHTS  # noqa: E402
from benchmarks.harness import (  # noqa: E402
    QUICK_DPU_SPEED,
    RunLog,
    Section,
    bench_parser,
    fmt_spread,
    legend_outside,
    machine,
    make_data,
    median,
    pyplot,
    ratio_spread,
    save_figure,
    settings,
    spread,
    table,
    write_json,
)

VARIANTS = ("none", "da", "mv", "peer")


def workload(weight: str, train: int, val: int) -> dict[str, Any]:
    return {"flags": ["--model", "resnet20", "--dataset", f"benchmarks.augfactories:{weight}", "--data",
                      "@tinyimagenet"], "train": train, "val": val}


def analyze(by_variant: dict[str, list[RunLog]]) -> dict[str, Any]:
    """One weight's numbers; `by_variant` holds none and da, and mv and peer unless --quick."""
    epoch = {v: W.per_rep(logs, RunLog.epoch_times) for v, logs in by_variant.items()}
    _, dpu_aug, bound = W.da_bound(by_variant["none"], by_variant["da"])
    none = by_variant["none"]
    data_share = median(h["phases"].get("data", 0.0) / h["epoch_time"] for log in none for h in log.steady(log.host))
    out = {"epoch_s": {v: spread([t for log in logs for t in log.epoch_times()]) for v, logs in by_variant.items()},
           "vs_none": {v: ratio_spread(epoch[v], epoch["none"]) for v in epoch},
           "da_vs_bound": ratio_spread(epoch["da"], bound), "bound_s": spread(bound),
           "none_data_share": data_share, "dpu_augment_s": spread(dpu_aug)}
    if "peer" in epoch:
        out["da_vs_peer"] = ratio_spread(epoch["da"], epoch["peer"])
    return out


def markdown(report: dict[str, Any], settings: dict[str, Any]) -> str:
    head = (f"resnet20 on 64x64 JPEGs, {settings['train']} train / {settings['val']} val samples, batch 16, "
            f"DPU rank / peer worker on core 1 at --dpu-speed {settings['dpu_speed']}, {settings['epochs']} epochs x "
            f"{settings['reps']} interleaved repetitions.\n")
    def cell(s: Any) -> str:
        return fmt_spread(s, 3) if s else "-"

    rows = [[w, f"{r['none_data_share']:.0%}", f"{r['epoch_s']['none']['median']:.2f}",
             *(cell(r["vs_none"].get(v)) for v in ("peer", "da", "mv")), cell(r.get("da_vs_peer")),
             f"{r['dpu_augment_s']['median']:.2f}", fmt_spread(r["da_vs_bound"], 3)] for w, r in report.items()]
    return head + "\n" + table(["augmentation", "data share (none)", "none s", "peer / none", "da / none", "mv / none",
                                "da / peer", "DPU augment s/epoch (da)", "da / bound"], rows)


def plot(report: dict[str, Any], path: Path) -> Path:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    names = list(report)
    for v in report[names[0]]["vs_none"]:
        meds = [report[w]["vs_none"][v]["median"] for w in names]
        lo = [m - report[w]["vs_none"][v]["min"] for m, w in zip(meds, names)]
        hi = [report[w]["vs_none"][v]["max"] - m for m, w in zip(meds, names)]
        ax.errorbar(names, meds, yerr=[lo, hi], marker="o", capsize=3, label=v)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_ylabel("epoch time / none (lower pays)")
    ax.set_xlabel("training augmentation")
    ax.set_title("Where offloading starts to pay")
    legend_outside(ax)
    return save_figure(fig, path)


def build_parser() -> argparse.ArgumentParser:
    p = bench_parser(__doc__, "augweight", "heavy only, none and da only, 1 rep of 2 epochs, 32 samples")
    p.add_argument("--train", type=int, default=192, help="training samples (default: 192)")
    p.add_argument("--val", type=int, default=96, help="validation samples (default: 96)")
    return p


def run(args: argparse.Namespace) -> Section:
    weights, variants = WEIGHTS, VARIANTS
    if args.quick:
        args.reps, args.epochs, args.train, args.val, args.dpu_speed = 1, 2, 32, 16, QUICK_DPU_SPEED
        weights, variants = ("heavy",), ("none", "da")
    data = make_data(["tinyimagenet"])
    workloads = {w: workload(w, args.train, args.val) for w in weights}
    runs = W.measure(args, workloads, data, variants)
    report = {w: analyze(runs[w]) for w in weights}
    payload = {"machine": machine(), "settings": settings(args), "report": report}
    write_json(args.out, payload)
    return Section("augweight", payload, markdown(report, settings(args)), [plot(report, args.plots / "augweight.png")])


def main() -> int:
    section = run(build_parser().parse_args())
    print(section.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
