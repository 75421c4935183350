"""DPU program entry: start-up checks, then the work of the chosen mode, then clean exit."""

from __future__ import annotations

from typing import Optional, Sequence

from dpuoffload.common.config import RunConfig
from dpuoffload.common.failure import run_program
from dpuoffload.common.metrics import JsonlLog
from dpuoffload.common.roles import Role, Topology
from dpuoffload.common.startup import start_program
from dpuoffload.dpu.idle import idle_until_shutdown


def prepare(cfg: RunConfig, topo: Topology) -> None:
    """Nothing to build in --mode none; later modes load data sets / models here."""
    return None


def main(argv: Optional[Sequence[str]] = None) -> int:
    cfg, topo, _ = start_program(Role.DPU, argv, prepare)
    if not topo.host_ranks:
        return 0
    stats = idle_until_shutdown(topo)
    JsonlLog(cfg.log_dir, f"phases-rank{topo.world_rank}.jsonl").write(
        {"event": "end", "world_rank": topo.world_rank, "role": "dpu", "mode": cfg.mode, **stats})
    return 0


def run(argv: Optional[Sequence[str]] = None) -> None:
    run_program(lambda: main(argv), "DPU program")
