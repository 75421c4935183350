"""`dpurun project`: estimate every mode's epoch at a larger scale from a measured profile.

The profile is the `auto.jsonl` record a `--mode auto` run writes to its --log-dir (or a JSON
object of `perfmodel.Profile` fields). Per-sample costs stay as measured; allreduce times come
from the ring model over the network you state. The output is labelled a projection: it is a
model, not a measurement.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any, Optional, Sequence

from dpuoffload.common.errors import ConfigError
from dpuoffload.common.plan.perfmodel import Profile, choose, format_table, predict_all, project

WANTED = "pass the auto.jsonl that a `--mode auto --log-dir DIR` run writes to DIR"


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
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    for name in ("nodes", "host_ranks_per_node"):
        if getattr(args, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be >= 1")
    measured = load_profile(args.profile)
    if measured.grad_bytes <= 0:
        raise ConfigError(f"{args.profile}: the profile has no gradient size; re-run --mode auto with this version")
    big = project(measured, args.nodes, args.host_ranks_per_node, args.dpu_ranks_per_node, measured.grad_bytes,
                  args.bandwidth_gbps * 1e9 / 8, args.latency_us * 1e-6)
    preds = predict_all(big)
    print(f"PROJECTION (model, not a measurement): {args.nodes} nodes x {args.host_ranks_per_node} host + "
          f"{args.dpu_ranks_per_node} DPU ranks, {args.bandwidth_gbps:g} Gbit/s, {args.latency_us:g} us latency, "
          f"per-sample costs as measured in {args.profile}")
    print(format_table(preds, choose(big)))
    return 0
