"""`dpurun project`: estimate every mode's epoch at a larger scale from a measured profile.

The profile is the `auto.jsonl` record a `--mode auto` run writes to its --log-dir (or a JSON
object of `perfmodel.Profile` fields). Per-sample costs stay as measured; allreduce times come
from the ring model over the network you state, or over the link you measured (`--link`: the
per-message times of raw MPI sends that `benchmarks/transport.py --tcp` measured between emulated
machines, fitted to latency + bytes / bandwidth). The output is labelled a projection: it is a
model, not a measurement.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

from dpuoffload.common.errors import ConfigError
from dpuoffload.common.plan.perfmodel import Profile, choose, format_table, predict_all, project

WANTED = "pass the auto.jsonl that a `--mode auto --log-dir DIR` run writes to DIR"
LINK_WANTED = "pass the transport.json that `python benchmarks/transport.py --tcp` writes (benchmarks/results/)"


@dataclass(frozen=True)
class Link:
    """A network link's terms: one message of n bytes takes `latency_s + n / bandwidth_Bps`."""

    bandwidth_Bps: float
    latency_s: float
    source: str   # where the terms come from, for the projection's header line


def fit_link(sizes: Sequence[float], seconds: Sequence[float], source: str) -> Link:
    """Least-squares fit of per-message time against message size (at least 2 sizes). A negative
    intercept (noise at sizes far above the latency) is taken as 0."""
    import numpy as np

    slope, intercept = np.polyfit(np.asarray(sizes, dtype=float), np.asarray(seconds, dtype=float), 1)
    if slope <= 0:
        raise ConfigError(f"{source}: per-message time does not grow with the message size; no link terms in it")
    return Link(1.0 / float(slope), max(float(intercept), 0.0), source)


def load_link(path: str) -> Link:
    """The link terms of `benchmarks/transport.py --tcp`'s raw MPI column (`results_tcp`).

    Raises:
        ConfigError: unreadable, or no TCP measurement in it (says which command writes one).
    """
    try:
        record = json.loads(Path(path).read_text())
        rows = record["results_tcp"] if isinstance(record, dict) else None
    except (OSError, ValueError, KeyError):
        rows = None
    if not rows or len(rows) < 2:
        raise ConfigError(f"{path}: no raw MPI times over TCP at 2 sizes or more in it; {LINK_WANTED}")
    sizes = [float(r["message_bytes"]) for r in rows]
    seconds = [float(r["message_bytes"]) / (float(r["raw_GBps"]) * 1e9) for r in rows]
    return fit_link(sizes, seconds, f"measured in {path} (raw MPI over TCP, {len(rows)} sizes "
                                    f"{min(sizes) / 1e6:.1f}-{max(sizes) / 1e6:.0f} MB)")


def load_profile(path: str) -> Profile:
    """The `Profile` in the last record of `path`.

    Raises:
        ConfigError: unreadable, not JSON lines, or not a profile (e.g. metrics.jsonl): says what the
            file looks like and which file to pass instead.
    """
    try:
        lines = [ln for ln in Path(path).read_text().splitlines() if ln.strip()]
        record: dict[str, Any] = json.loads(lines[-1])
    except (OSError, ValueError, IndexError) as e:
        raise ConfigError(f"{path}: cannot read a profile ({e}); {WANTED}") from None
    fields = record.get("profile", record) if isinstance(record, dict) else None
    if not isinstance(fields, dict):
        raise ConfigError(f"{path}: its last line is a JSON {type(record).__name__}, not a profile record; {WANTED}")
    names = {f.name for f in dataclasses.fields(Profile)}
    required = {f.name for f in dataclasses.fields(Profile) if f.default is dataclasses.MISSING}
    if not required <= set(fields) or not set(fields) <= names:
        raise ConfigError(f"{path} is not a dpuoffload profile: its last record has keys "
                          f"{', '.join(sorted(fields)[:8])}{', ...' if len(fields) > 8 else ''} "
                          f"({_looks_like(fields)}), a profile has {', '.join(sorted(required)[:4])}, ...; {WANTED}")
    try:
        return Profile(**fields)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{path}: not a usable profile ({e}); {WANTED}") from None


def _looks_like(fields: dict[str, Any]) -> str:
    if "event" in fields or "epoch" in fields:
        return "it looks like a training log such as metrics.jsonl"
    return "not a record dpuoffload writes"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dpurun project", description=__doc__.split("\n")[0])
    p.add_argument("profile", help="auto.jsonl from a --mode auto run (its last record is used)")
    p.add_argument("--nodes", type=int, default=16, help="nodes (default: 16, as the published evaluation)")
    p.add_argument("--host-ranks-per-node", type=int, default=8, help="default: 8")
    p.add_argument("--dpu-ranks-per-node", type=int, default=8, help="default: 8")
    p.add_argument("--bandwidth-gbps", type=float, default=100.0,
                   help="network bandwidth per rank, Gbit/s (default: 100, HDR100)")
    p.add_argument("--latency-us", type=float, default=2.0, help="per-message latency, microseconds (default: 2)")
    p.add_argument("--link", metavar="TRANSPORT_JSON",
                   help="take bandwidth and latency from a link measurement instead: the transport.json that "
                        "`python benchmarks/transport.py --tcp` writes (raw MPI between emulated machines, fitted "
                        "to latency + bytes / bandwidth)")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    for name in ("nodes", "host_ranks_per_node"):
        if getattr(args, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be >= 1")
    measured = load_profile(args.profile)
    if measured.grad_bytes <= 0:
        raise ConfigError(f"{args.profile}: the profile has no gradient size; re-run --mode auto with this version")
    link = load_link(args.link) if args.link else Link(args.bandwidth_gbps * 1e9 / 8, args.latency_us * 1e-6,
                                                       "as stated")
    big = project(measured, args.nodes, args.host_ranks_per_node, args.dpu_ranks_per_node, measured.grad_bytes,
                  link.bandwidth_Bps, link.latency_s)
    preds = predict_all(big)
    print(f"PROJECTION (model, not a measurement): {args.nodes} nodes x {args.host_ranks_per_node} host + "
          f"{args.dpu_ranks_per_node} DPU ranks, {link.bandwidth_Bps * 8 / 1e9:.3g} Gbit/s, "
          f"{link.latency_s * 1e6:.3g} us latency ({link.source}), per-sample costs as measured in {args.profile}")
    print(format_table(preds, choose(big)))
    return 0
