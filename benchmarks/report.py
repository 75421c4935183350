"""The figures the docs quote, written from the results files so that they cannot go stale.

    python benchmarks/report.py           # rewrite every marked figure and table in README.md, docs/*.md, RESULTS.md
    python benchmarks/report.py --check   # list the marked texts that differ from their results file; exit 1 if any;
                                          # then the results files measured on older code (benchmarks/freshness.py)

A figure in a page is marked inline, `<!-- fig:NAME -->TEXT<!-- /fig -->`, and a table on lines of
its own, `<!-- table:NAME -->` ... `<!-- /table -->` (HTML comments: invisible once rendered, on
GitHub and in MkDocs). NAME is a key of `FIGURES` or `TABLES` below: a function of
`benchmarks/results/*.json` that returns the text. After a benchmark run writes a new results file,
this script rewrites the text; `tests/unit/test_docs.py` fails while a page still quotes the old one.

Results files carry no date, so where one benchmark wrote several files (`faults.py --out`), the
order they were run in is written here (`FAULT_RUNS`) and the test checks it names every such file.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import sys
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import freshness  # noqa: E402
from benchmarks.workloads import fmt_interval, geomean_interval  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
FIGURE = re.compile(r"<!-- fig:([a-z0-9_.]+) -->(.*?)<!-- /fig -->", re.S)
TABLE = re.compile(r"(<!-- table:([a-z0-9_.]+) -->\n)(.*?)(\n<!-- /table -->)", re.S)
MARKER = re.compile(r"<!-- (fig|table):([a-z0-9_.]+) -->")


def pages() -> list[Path]:
    """Every page whose marked figures this script keeps: the README, the docs, RESULTS.md."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "benchmarks" / "RESULTS.md"]


@lru_cache(maxsize=None)
def load(name: str) -> Any:
    """`benchmarks/results/<name>` parsed (cached: figures read the same files many times)."""
    return json.loads((RESULTS / name).read_text())


def baseline_ratio(numerator: str, denominator: str) -> float:
    """A ratio `benchmarks/baseline.py` wrote, found by its variants' names (a unique part of the
    denominator's is enough)."""
    ratios = load("baseline.json")["ratios"]
    (key,) = [k for k in ratios if k.startswith(f"{numerator} / ") and denominator in k.split(" / ", 1)[1]]
    return ratios[key]


# ------------------------------------------------------------------------------------ formatting
def table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(out + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows])


def times(values: Sequence[float], digits: int = 2) -> str:
    """1.23× and 4.56× (the values in the order given)."""
    parts = [f"{v:.{digits}f}×" for v in values]
    return " and ".join(parts) if len(parts) == 2 else " / ".join(parts)


def span(values: Iterable[float], digits: int = 2) -> str:
    """min-max, or one value where they agree at that precision."""
    values = list(values)
    lo, hi = f"{min(values):.{digits}f}", f"{max(values):.{digits}f}"
    return lo if lo == hi else f"{lo}-{hi}"


def met(flags: Sequence[bool]) -> str:
    return "met" if all(flags) else "missed" if not any(flags) else f"met {sum(flags)} of {len(flags)}"


# ------------------------------------------------------------------------------------ readers
def unique_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """transport.json's rows once per batch size (a run may list the first size again at the end)."""
    seen: dict[str, dict[str, Any]] = {}
    for r in rows:
        seen.setdefault(r["size"], r)
    return list(seen.values())


def large(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The 3-19 MB batch messages."""
    return [r for r in unique_rows(rows) if r["message_bytes"] >= 1_000_000]


def netmodel_row(setting: str) -> dict[str, Any]:
    return next(r for r in load("netmodel.json")["report"] if r["setting"] == setting)


def clone_median(model: str, method: str, key: str) -> float:
    return statistics.median(r[key] for r in load("clone.json")["results"][model][method])


def checkpoint_median(model: str, method: str, key: str) -> float:
    return statistics.median(v for r in load("checkpoint.json")["results"][model][method] for v in r[key])


LONG_STEP_RECOVERY = "recovery-long-step-2026-11-29.json"  # rollback at 0.7 s steps, on today's code


def recovery_rows(name: str, strategy: str) -> list[dict[str, Any]]:
    """One strategy's rows of a recovery.py results file, in order of the failure's position."""
    return sorted((r for r in load(name)["rows"] if r["strategy"] == strategy), key=lambda r: r["at"])


def over_rollback(name: str) -> list[float]:
    """Restart's recovery time over rollback's, at each failure position both rows have."""
    restart = {r["at"]: r["recovery_s"] for r in recovery_rows(name, "restart (C/R)")}
    return [restart[r["at"]] / r["recovery_s"] for r in recovery_rows(name, "rollback (spare)") if r["at"] in restart]


def exact_distances() -> list[float]:
    """The final weights' distance to the failure-free run's, for rollback and restart (0: bit-exact)."""
    strategies = ("rollback (spare)", "restart (C/R)")
    return [r["weight_distance"] for s in strategies for r in recovery_rows("recovery.json", s)]


def models(report: dict[str, Any]) -> str:
    """The workloads of a report by model name: `resnet20/cifar10` is `resnet20`."""
    return " / ".join(w.split("/")[0] for w in report)


def workloads() -> dict[str, dict[str, Any]]:
    return load("workloads.json")["report"]


def machine_ms() -> list[dict[str, float]]:
    """The 1 s probes of the machine's speed before each job (`harness.machine_speed`), every mode of every workload."""
    return [m for r in workloads().values() for m in r["machine_ms"].values()]


def prediction_errors() -> list[float]:
    """The model's error against the measured epoch, every mode of every workload (0.05: 5 % slow)."""
    return [p["error"] for r in workloads().values() for p in r["prediction"]["modes"].values()]


def crossarch_identical(pipeline: dict[str, Any], side: str = "aarch64 N1", wire: str = "float") -> str:
    v = pipeline["vs"][side][wire]
    return f"{v['identical']}/{v['compared']}"


def v2_resize_shares() -> list[float]:
    """The share of differing elements (first differing sample) of the v2 uint8 resizes, every side."""
    shares = []
    for p in load("crossarch.json")["pipelines"]:
        if p["pipeline"].startswith("v2:"):
            for side in p["vs"].values():
                first = side["float"].get("first")
                if first:
                    shares.append(100 * first["differing"] / first["elements"])
    return shares


def link_fit() -> str:
    """What `dpurun project --link benchmarks/results/transport.json` fits (its own code)."""
    sys.path.insert(0, str(ROOT))
    from dpuoffload.launch.project import load_link

    link = load_link(str(RESULTS / "transport.json"))
    return f"{link.bandwidth_Bps * 8 / 1e9:.1f} Gbit/s and {link.latency_s * 1e6:.0f} µs"


# ------------------------------------------------------------------------------------ figures
FIGURES: dict[str, Callable[[], str]] = {
    "fanin.workers2": lambda: times([load("fanin.json")["report"]["workers 2"]["vs_in_process"]["median"]]),
    "fanin.dataloader2": lambda: times(
        [load("fanin.json")["report"]["DataLoader 2 per epoch"]["vs_in_process"]["median"]]),
    "multinode.da": lambda: times([load("multinode.json")["report"]["da"]["ratio_to_none"]], 3),
    "multinode.mv": lambda: times([load("multinode.json")["report"]["mv"]["ratio_to_none"]], 3),
    "multinode.hybrid": lambda: times([load("multinode.json")["report"]["hybrid"]["ratio_to_none"]], 3),
    "netmodel.ratio_1gbit": lambda: f"{netmodel_row('1gbit')['stream']['ratio']:.2f}",
    "netmodel.ratio_200mbit": lambda: f"{netmodel_row('200mbit')['stream']['ratio']:.2f}",
    "netmodel.unshaped_measured": lambda: (
        f"{netmodel_row('unshaped')['last_arriving_s']['median'] * 1e3:.1f}-"
        f"{netmodel_row('unshaped')['logged_s']['median'] * 1e3:.1f} ms"),
    "netmodel.unshaped_predicted": lambda: f"{netmodel_row('unshaped')['stream']['predicted_s'] * 1e3:.1f} ms",
    "transport.nosc_collate_large": lambda: span(r["ratio"] for r in large(load("transport.json")[
        "results_no_single_copy"])),
    "transport.nosc_send_large": lambda: span(r["ratio_send_only"] for r in large(load("transport.json")[
        "results_no_single_copy"])),
    "transport.nosc_sleeping_large": lambda: span(r["ratio_sleeping"] for r in large(load("transport.json")[
        "results_no_single_copy"])),
    "transport.link_fit": link_fit,
    "wire.host_sample_ms": lambda: f"{load('wire.json')['in_process']['uint8']['host_sample_us'] / 1e3:.2f} ms",
    "crossarch.v2_resize_share": lambda: (
        f"{math.floor(min(v2_resize_shares()))}-{math.ceil(max(v2_resize_shares()))} %"),
    "baseline.yield_vs_spin": lambda: f"{baseline_ratio('2 hosts, horovod', 'spinning'):.3f}",
    "baseline.spin_vs_yield": lambda: f"{1 / baseline_ratio('2 hosts, horovod', 'spinning'):.2f}×",
    "baseline.gloo_vs_horovod": lambda: f"{baseline_ratio('2 hosts, torch (gloo)', '2 hosts, horovod'):.2f}",
    "startup.difference": lambda: f"{load('startup.json')['summary']['dpurun']['difference_s']['median']:+.2f} s",
    "startup.difference_uncut": lambda: (
        f"{load('startup.json')['summary']['dpurun, uncut']['difference_s']['median']:+.2f} s"),
    "startup.imports_ahead": lambda: (
        f"{load('startup.json')['summary']['imports ahead']['difference_s']['median']:+.2f} s"),
    "clone.resnet50.ready_ms": lambda: f"{clone_median('resnet50', 'ours-staged', 'readiness_s') * 1e3:.0f} ms",
    "clone.resnet50.ready_vs_file": lambda: times([clone_median("resnet50", "file", "readiness_s")
                                                   / clone_median("resnet50", "ours-staged", "readiness_s")], 1),
    "clone.resnet50.ready_vs_p2p": lambda: times([clone_median("resnet50", "ours-staged", "readiness_s")
                                                  / clone_median("resnet50", "p2p", "readiness_s")], 2),
    "clone.resnet50.overhead_vs_file": lambda: times([clone_median("resnet50", "file", "overhead_s")
                                                      / clone_median("resnet50", "ours-staged", "overhead_s")], 1),
    "interference.slowdown": lambda: " and ".join(
        f"{(load('interference.json')['slowdown'][k] - 1) * 100:+.1f} %" for k in ("load at 0.5", "load at 1.0")),
    "interference.augment_slowdown": lambda: "{:+.1f} %".format(
        (next(v for k, v in load("interference.json")["slowdown"].items() if k.startswith("augmentation")) - 1) * 100),
    "recovery_long.step_s": lambda: f"{load('recovery-long-step.json')['failure_free'][0]['step_s']:.2f} s",
    "recovery_long.rollback_ratios": lambda: times(
        [r["failed_step_ratio"] for r in recovery_rows("recovery-long-step.json", "rollback (spare)")]),
    "recovery_long_lf.ratios": lambda: times(
        [r["failed_step_ratio"] for r in recovery_rows("recovery-long-step-lf.json", "lossy-forward")]),
    "recovery_today.step_s": lambda: f"{load(LONG_STEP_RECOVERY)['failure_free'][0]['step_s']:.2f} s",
    "recovery_today.rollback_ratios": lambda: times(
        [r["failed_step_ratio"] for r in recovery_rows(LONG_STEP_RECOVERY, "rollback (spare)")]),
    "recovery_epochs.steps": lambda: str(load("recovery-long-epoch.json")["total_steps"]
                                         // load("recovery-long-epoch.json")["settings"]["epochs"]),
    "recovery_epochs.cr_over_rollback": lambda: times(over_rollback("recovery-long-epoch.json"), 0),
    "recovery_long.restart_over_rollback": lambda: times(over_rollback("recovery-long-step.json"), 1),
    "workloads.speed_moved": lambda: times([load("workloads.json")["machine_speed"]["slow_over_fast"]]),
    "workloads.probes_ms": lambda: (f"{min(m['min'] for m in machine_ms()):.1f}-"
                                    f"{max(m['max'] for m in machine_ms()):.1f} ms"),
    "workloads.predictions_met": lambda: "{} of {}".format(
        sum(abs(e) <= load("workloads.json")["targets"]["prediction_error"] for e in prediction_errors()),
        len(prediction_errors())),
    "workloads.prediction_errors": lambda: (f"{min(prediction_errors()) * 100:+.1f} % to "
                                            f"{max(prediction_errors()) * 100:+.1f} %"),
    "workloads.auto_vs_best": lambda: " / ".join(f"{r['auto']['ratio']['median']:.3f}" for r in workloads().values()),
    "workloads.epoch_s": lambda: span((p["measured_s"] for r in workloads().values()
                                       for p in r["prediction"]["modes"].values()), 1) + " s",
    "workloads.auto_vs_choice": lambda: auto_vs_choice(),
    "workloads.auto_vs_best_resolution": lambda: auto_vs_best_resolution(),
    "recovery.rollback_distance": lambda: f"{max(exact_distances()):g}",
    "recovery.lossy_distance": lambda: " / ".join(
        f"{r['weight_distance']:.2g}" for r in recovery_rows("recovery.json", "lossy-forward")),
}


def auto_vs_choice() -> str:
    """auto / its choice by hand, every repetition of every workload: the geometric mean and its ±2 SE span
    (`workloads.leftover_cost`)."""
    left = load("workloads.json")["auto_vs_choice"]
    return f"{left['geomean']:.3f} ({left['low']:.3f}-{left['high']:.3f}, {left['n']} repetitions)"


def auto_vs_best_resolution() -> str:
    """auto / the best mode per repetition, each workload's geometric mean and its ±2 SE span
    (`workloads.geomean_interval`), in the benchmark's order of workloads."""
    spans = [geomean_interval(r["auto"]["ratio_each"]) for r in load("workloads.json")["report"].values()]
    return ", ".join(fmt_interval(g) for g in spans)


# ------------------------------------------------------------------------------------ tables
def targets_rows() -> list[list[str]]:
    """Every target of the issues, its latest measurement and verdict, and the file it comes from."""
    return [*workload_targets(), transport_target(), netmodel_target(), *checkpoint_targets(), *clone_targets(),
            *recovery_targets(), goodput_target(), own_loop_target(), *streams_targets(), wire_target(),
            crossarch_target(), startup_target()]


def goodput_target() -> list[str]:
    """Issue 59: at one host-rank death per 60 s, rollback and restart from DPU memory keep ≥ 0.95 of
    the failure-free throughput (the median over the repetitions), every death survived."""
    name = "goodput-60s-reps.json"
    cells = {c["strategy"]: c for c in load(name)["cells"]}
    picked = [cells["rollback"], cells["restart (DPU memory)"]]
    latest = "; ".join(f"{c['strategy']} {c['goodput']:.2f} ({c['goodput_range'][0]:.2f}-{c['goodput_range'][1]:.2f}"
                       f" over {c['reps']}), {c['survived']} of {c['killed']} deaths survived" for c in picked)
    verdicts = [c["goodput"] >= 0.95 and c["survived"] == c["killed"] for c in picked]
    return ["goodput ≥ 0.95 × failure-free at a host-rank death every 60 s, every death survived (rollback; "
            "restart from DPU memory)", latest, met(verdicts), name]


def workload_targets() -> list[list[str]]:
    w, limits = workloads(), load("workloads.json")["targets"]
    rows = []
    for key, label in (("da_vs_bound", "da ≤ {:.2f} × ideal overlap bound"), ("da_vs_peer", "da ≤ {:.2f} × "
                       "DataLoader peer"), ("mv_vs_train_only", "mv ≤ {:.2f} × train-only epoch")):
        values = [r["ratios"][key]["median"] for r in w.values()]
        rows.append([label.format(limits[key]), " / ".join(f"{v:.3f}" for v in values) + f" ({models(w)})",
                     met([v <= limits[key] for v in values]), "workloads.json"])
    worst = [max(r["prediction"]["modes"].items(), key=lambda kv: abs(kv[1]["error"])) for r in w.values()]
    rows.append([f"model prediction error ≤ {limits['prediction_error'] * 100:.0f} %",
                 "worst mode " + " / ".join(f"{e['error']:+.1%} ({m})" for m, e in worst),
                 met([abs(e["error"]) <= limits["prediction_error"] for _, e in worst]), "workloads.json"])
    if all("auto" in r for r in w.values()):  # (runs before 2026-11-26 ran auto for its warm-up epoch only)
        values = [r["auto"]["ratio"]["median"] for r in w.values()]
        rows.append([f"`--mode auto` ≤ {limits['auto_vs_best']:.2f} × the best mode run by hand",
                     " / ".join(f"{v:.3f}" for v in values) + f" ({models(w)}); chose "
                     + " / ".join(", ".join(r["auto"]["chosen"]) for r in w.values()),
                     met([v <= limits["auto_vs_best"] for v in values]), "workloads.json"])
    return rows


def transport_target() -> list[str]:
    t = load("transport.json")
    paths = (("shared memory", "results"), ("without single-copy", "results_no_single_copy"), ("TCP", "results_tcp"))
    cells, latest = [], []
    for label, key in paths:
        rows = unique_rows(t[key])
        send, both = [r["ratio_send_only"] for r in rows], [r["ratio"] for r in rows]
        cells += send + both
        latest.append(f"{label}: {span(send)}; {span(both)}")
    return ["transport ≥ 0.8 × raw MPI (send only; collate + send), 0.2-19 MB", ". ".join(latest),
            f"met in {sum(c >= 0.8 for c in cells)} of {len(cells)} cells", "transport.json"]


def netmodel_target() -> list[str]:
    shaped = [netmodel_row(s)["stream"]["ratio"] for s in ("1gbit", "200mbit")]
    unshaped = netmodel_row("unshaped")["stream"]["ratio"]
    # No limit was set (issue 14); "matches" where every shaped link is within 0.8-1.25 of the ring term.
    verdict = "matches where the network dominates" if all(0.8 <= r <= 1.25 for r in shaped) else "differs"
    return ["the model's network term vs measurement (allreduce measured / predicted)",
            f"{shaped[0]:.2f} (1 Gbit/s), {shaped[1]:.2f} (200 Mbit/s); {unshaped:.1f} on the unshaped veth",
            verdict, "netmodel.json"]


def checkpoint_targets() -> list[list[str]]:
    """Issue 57's: ≥ 50× less blocking than rank-0 `torch.save`, and no more blocking or runtime overhead
    than DCP `async_save` (≤ 1.0×), for each model measured (2 host ranks since 2026-11-29), for each of
    our copies measured (staged, overlapped since 2026-12-01, zero-copy)."""
    results = load("checkpoint.json")["results"]
    rows = []
    for model in results:
        ours = [m for m in ("ours-staged", "ours-overlap", "ours-zero") if m in results[model]]
        ref = checkpoint_median(model, "rank0-torch.save", "blocked_s")
        got = {m: ref / checkpoint_median(model, m, "blocked_s") for m in ours}
        rows.append([f"checkpoint: ≥ 50× less host blocking than rank-0 `torch.save` ({model})",
                     ", ".join(f"{COPY_NAMES[m]} {v:.1f}×" for m, v in got.items()),
                     met([v >= 50 for v in got.values()]), "checkpoint.json"])
        if "dcp-async_save" not in results[model]:
            continue
        for key, label in (("blocked_s", "host blocking"), ("overhead_s", "runtime overhead")):
            dcp = checkpoint_median(model, "dcp-async_save", key)
            vs = {m: checkpoint_median(model, m, key) / dcp for m in ours}
            rows.append([f"checkpoint: {label} ≤ 1.0× DCP `async_save`'s ({model})",
                         ", ".join(f"{COPY_NAMES[m]} {v:.2f}×" for m, v in vs.items()),
                         met([v <= 1.0 for v in vs.values()]), "checkpoint.json"])
    return rows


COPY_NAMES = {"ours-staged": "staged", "ours-overlap": "overlapped", "ours-zero": "zero-copy"}


def clone_targets() -> list[list[str]]:
    rows = []
    for key, label, limit in (("readiness_s", "sooner ready", 10), ("overhead_s", "less runtime overhead", 20)):
        value = clone_median("resnet50", "file", key) / clone_median("resnet50", "ours-staged", key)
        rows.append([f"clone: ≥ {limit}× {label} than the file path (resnet50)", f"{value:.1f}×",
                     met([value >= limit]), "clone.json"])
    vs_p2p = clone_median("resnet50", "ours-staged", "readiness_s") / clone_median("resnet50", "p2p", "readiness_s")
    rows.append(["clone: ready no later than point-to-point sends of the whole state (≤ 1.0×, resnet50)",
                 f"{vs_p2p:.2f}×", met([vs_p2p <= 1.0]), "clone.json"])
    return rows


def recovery_targets() -> list[list[str]]:
    long_run, short_run, epochs_run = LONG_STEP_RECOVERY, "recovery-2026-11-29.json", "recovery-long-epoch.json"
    long_step = load(long_run)["failure_free"][0]["step_s"]
    short = load(short_run)["failure_free"][0]["step_s"]
    rollback = [r["failed_step_ratio"] for r in recovery_rows(long_run, "rollback (spare)")]
    rollback_short = [r["failed_step_ratio"] for r in recovery_rows(short_run, "rollback (spare)")
                      if r["failed_step_ratio"]]
    lossy = [r["failed_step_ratio"] for r in recovery_rows("recovery-long-step-lf.json", "lossy-forward")]
    lossy_step = load("recovery-long-step-lf.json")["failure_free"][0]["step_s"]
    lossy_short = [r["failed_step_ratio"] for s in ("lossy-forward", "lossy-forward --reassign")
                   for r in recovery_rows("recovery.json", s) if r["failed_step_ratio"]]
    per_epoch, long_epochs = over_rollback(short_run), over_rollback(epochs_run)
    epoch_steps = load(epochs_run)["total_steps"] // load(epochs_run)["settings"]["epochs"]
    accuracy = [r["acc_delta_mean"] for r in recovery_rows("recovery.json", "lossy-forward")]
    return [
        ["recovery: rollback's failed step ≤ 2× a normal step", f"{times(rollback)} ({long_step:.2f} s steps); "
         f"{times(rollback_short)} ({short:.3f} s steps)",
         f"{met([r <= 2 for r in rollback])} at the long step, {met([r <= 2 for r in rollback_short])} at the short",
         f"{long_run}, {short_run}"],
        ["recovery: rollback ≥ 5× faster than a restart", times(over_rollback("recovery-long-step.json"), 1)
         + " (restart from DPU memory)", met([r >= 5 for r in over_rollback("recovery-long-step.json")]),
         "recovery-long-step.json"],
        ["recovery: C/R with per-epoch checkpoints / rollback ≥ 100× (at epochs long enough to matter)",
         f"{times(long_epochs, 0)} ({epoch_steps}-step epochs); {times(per_epoch, 0)} (16-step epochs)",
         f"{met([r >= 100 for r in long_epochs])} at the long epoch, {met([r >= 100 for r in per_epoch])} at the short",
         f"{epochs_run}, {short_run}"],
        ["recovery: lossy-forward failed step ≤ 1.05× a normal step", f"{times(lossy)} ({lossy_step:.2f} s steps); "
         f"{span(lossy_short)}× (short steps)",
         f"{met([r <= 1.05 for r in lossy])} at the long step, {met([r <= 1.05 for r in lossy_short])} at the short",
         "recovery-long-step-lf.json, recovery.json"],
        ["recovery: lossy-forward final accuracy within 1 point (loss at 5 / 50 / 90 %)",
         " / ".join(f"{a:+.1f}" for a in accuracy) + " points", met([abs(a) <= 1 for a in accuracy]), "recovery.json"],
    ]


def own_loop_target() -> list[str]:
    o = load("own_loop.json")
    ratios = [r["ratio_api_vs_peer"]["median"] for r in o["report"].values()]
    per_step = [r["next_us"]["api"]["median"] for r in o["report"].values()]
    return [f"own loop: `job.loader` ≤ {o['target']:.2f} × `DataLoader(num_workers=1)` epoch, same script",
            " / ".join(f"{v:.3f}" for v in ratios) + f" ({models(o['report'])}); time in next() "
            + " / ".join(f"{v:.0f}" for v in per_step) + " µs", met([v <= o["target"] for v in ratios]),
            "own_loop.json"]


def streams_targets() -> list[list[str]]:
    r = load("streams.json")["report"]
    read, train = r["read"], r["train"]["ratio_api_vs_peer"]["median"]
    samples, first = read["ratio_samples_per_s"]["median"], read["ratio_first_batch"]["median"]
    return [["streams: tar shards ≥ 1.00 × ImageFolder samples/s on the DPU rank; first batch ≤ 1.00 ×",
             f"{samples:.3f}; first batch {first:.2f}", met([samples >= 1.0, first <= 1.0]), "streams.json"],
            ["streams: `da` from shards ≤ 1.00 × webdataset's pipeline in a DataLoader worker, same script",
             f"{train:.3f}", met([train <= 1.0]), "streams.json"]]


def wire_target() -> list[str]:
    w = load("wire.json")
    s, batch = w["end_to_end"]["summary"], w["batch"]
    size = w["in_process"]["uint8"]["bytes_per_batch"] / w["in_process"]["float"]["bytes_per_batch"]
    cpu = (s["uint8"]["next_cpu_ms"]["median"] - s["float"]["next_cpu_ms"]["median"]) / batch
    dpu, host = (s["uint8"][k]["median"] / s["float"][k]["median"] for k in ("dpu_ms", "next_ms"))
    return [f"uint8 wire: a {batch} × 224 px batch, uint8 / float32",
            f"bytes {size:.3f}; DPU time per batch {dpu:.2f}×; host time in next() {host:.2f}× "
            f"({cpu:+.2f} ms CPU per sample)", "measured (no target set)", "wire.json"]


def crossarch_target() -> list[str]:
    pipelines = load("crossarch.json")["pipelines"]
    pil = [crossarch_identical(p) for p in pipelines if "PIL" in p["pipeline"]]
    other = [f"{p['pipeline'].split(' (')[0]} {crossarch_identical(p)}" for p in pipelines
             if "PIL" not in p["pipeline"]]
    holds = all(v.split("/")[0] == v.split("/")[1] for v in pil)
    return ["bit-identical samples across architectures: x86 AVX2 vs aarch64 (qemu Neoverse-N1), float wire",
            f"PIL pipelines {', '.join(pil)}; " + "; ".join(other),
            "holds for the PIL pipelines; the numerics check catches the rest" if holds else "differs on PIL",
            "crossarch.json"]


def startup_target() -> list[str]:
    s = load("startup.json")
    diff = s["summary"]["dpurun"]["difference_s"]["median"]
    paused = s["summary"].get("collector paused")
    return [f"start-up: a tiny job ≤ {s['target_difference_s']:.0f} s over a plain torchvision script",
            f"{diff:+.2f} s ({s['summary']['dpurun, uncut']['difference_s']['median']:+.2f} s without the cuts); "
            f"`--mode da`, imports before MPI init: {s['summary']['imports ahead']['difference_s']['median']:+.2f} s"
            + (f"; the collector paused through start-up: {paused['difference_s']['median']:+.2f} s" if paused else ""),
            met([diff <= s["target_difference_s"]]), "startup.json"]


# Every run of benchmarks/faults.py kept in results/, oldest first: a kind's latest result is in the
# last file that holds it. A new run gets its own `--out` name, appended here (tests/unit/test_docs.py fails
# until it is); one that overwrites a file listed here must be moved to the end of the list.
FAULT_RUNS = ("faults.json", "faults-host-lossy.json", "faults-host-rollback.json", "faults-dpu-validation.json",
              "faults-dpu-keeper.json", "faults-host-mv.json", "faults-host-lossy-ckpt.json",
              "faults-host-rollback-ckpt.json", "faults-host-rollback-mv2.json", "faults-all.json",
              "faults-rollback-totals.json", "faults-rollback-resumed.json")
FAULT_TIMES = (("detected_s", "detected after"), ("ended_s", "job ended after"), ("recovered_s", "{} step done after"))


def latest_faults() -> dict[str, tuple[str, list[dict[str, Any]]]]:
    """Each kind of failure: the newest results file that tried it, and its tries there."""
    latest: dict[str, tuple[str, list[dict[str, Any]]]] = {}
    for name in FAULT_RUNS:
        kinds: dict[str, list[dict[str, Any]]] = {}
        for record in load(name)["records"]:
            kinds.setdefault(record["kind"], []).append(record)
        latest.update({kind: (name, tries) for kind, tries in kinds.items()})
    return latest


def faults_rows() -> list[list[str]]:
    rows = []
    for kind, (name, tries) in latest_faults().items():
        key, what = next((k, w) for k, w in FAULT_TIMES if k in tries[0])
        took = [r[key] for r in tries if r.get(key) is not None]
        rows.append([kind, f"{sum(r['passed'] for r in tries)} / {len(tries)}",
                     f"{what.format('replayed' if 'rollback' in kind else 'failed')} "
                     f"{statistics.median(took):.2f} s, {max(took):.2f} s", name])
    return rows


def prediction_rows() -> list[list[str]]:
    limit = load("workloads.json")["targets"]["prediction_error"]
    return [[w, mode, f"{p['predicted_s']:.2f}", f"{p['measured_s']:.2f}", f"{p['error']:+.1%}",
             "met" if abs(p["error"]) <= limit else "missed"]
            for w, r in workloads().items() for mode, p in r["prediction"]["modes"].items()]


def netmodel_rows() -> list[list[str]]:
    return [[r["setting"], f"{r['link']['stream']['bandwidth_Bps'] * 8 / 1e9:.3g}",
             f"{r['logged_s']['median'] * 1e3:.1f}", f"{r['stream']['predicted_s'] * 1e3:.1f}",
             f"{r['stream']['ratio']:.2f}"] for r in load("netmodel.json")["report"]]


def crossarch_rows() -> list[list[str]]:
    return [[p["pipeline"], crossarch_identical(p), crossarch_identical(p, "aarch64 A72"),
             crossarch_identical(p, "x86 default")] for p in load("crossarch.json")["pipelines"]]


TABLES: dict[str, Callable[[], str]] = {
    "targets": lambda: table(["target", "latest", "verdict", "results file"], targets_rows()),
    "faults": lambda: table(["kind", "passed", "time (median, max)", "results file"], faults_rows()),
    "prediction": lambda: table(["workload", "mode", "predicted s", "measured s", "error", "≤ 10 %"],
                                prediction_rows()),
    "netmodel": lambda: table(["link setting", "fitted Gbit/s", "measured allreduce ms/step (median)",
                               "predicted ms/step", "measured / predicted"], netmodel_rows()),
    "crossarch": lambda: table(["pipeline", "identical, x86 AVX2 vs aarch64 Neoverse-N1",
                                "vs aarch64 Cortex-A72", "x86 scalar kernels vs AVX2"], crossarch_rows()),
}


# ------------------------------------------------------------------------------------ pages
def render(text: str) -> str:
    """The page with every marked figure and table computed afresh.

    Raises:
        KeyError: a marker names no figure or table (the message names it).
    """
    def figure(m: re.Match) -> str:
        return f"<!-- fig:{m[1]} -->{FIGURES[m[1]]()}<!-- /fig -->"

    def block(m: re.Match) -> str:
        return f"{m[1]}\n{TABLES[m[2]]()}\n{m[4]}"

    return TABLE.sub(block, FIGURE.sub(figure, text))


def unknown_markers(text: str) -> list[str]:
    return [f"{kind}:{name}" for kind, name in MARKER.findall(text)
            if name not in (FIGURES if kind == "fig" else TABLES)]


def stale(path: Path) -> list[str]:
    """The marked texts of one page that differ from their results file, as `page: marker: text -> new`."""
    text = path.read_text()
    fresh = {m[1]: m[2] for m in FIGURE.finditer(render(text))}
    out = [f"{path.relative_to(ROOT)}: fig:{m[1]}: {m[2]!r} -> {fresh[m[1]]!r}" for m in FIGURE.finditer(text)
           if m[2] != fresh[m[1]]]
    tables = {m[2]: m[3] for m in TABLE.finditer(render(text))}
    out += [f"{path.relative_to(ROOT)}: table:{m[2]} differs" for m in TABLE.finditer(text) if m[3] != tables[m[2]]]
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--check", action="store_true", help="list stale figures and exit 1 if any, writing nothing")
    args = p.parse_args(argv)
    problems = [f"{page.relative_to(ROOT)}: unknown marker {m}" for page in pages() for m in
                unknown_markers(page.read_text())]
    if problems:
        print("\n".join(problems), file=sys.stderr)
        return 1
    if args.check:
        found = [line for page in pages() for line in stale(page)]
        print("\n".join(found) or "every marked figure matches its results file")
        older = freshness.report()
        if older:  # (said, not failed: a re-run may change these numbers; they are still what was measured)
            print(f"\n{len(older)} results file(s) measured older code than what they exercise now "
                  "(benchmarks/freshness.py):\n" + "\n".join(older))
        return 1 if found else 0
    for page in pages():
        text = page.read_text()
        if render(text) != text:
            page.write_text(render(text))
            print(f"rewrote {page.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
