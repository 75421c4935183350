"""DPU program entry: start-up checks, then the work of the chosen mode, then clean exit."""

from __future__ import annotations

from typing import Any, Optional, Sequence

from dpuoffload.common.config import RunConfig
from dpuoffload.common.datasets import build_datasets
from dpuoffload.common.failure import run_program
from dpuoffload.common.loaders import probe_layout
from dpuoffload.common.metrics import JsonlLog
from dpuoffload.common.roles import Role, Topology, fed_hosts
from dpuoffload.common.sampling import PerSampleSeeded
from dpuoffload.common.startup import start_program
from dpuoffload.dpu.augment import Augmenter
from dpuoffload.dpu.idle import idle_until_shutdown


def prepare(cfg: RunConfig, topo: Topology) -> Optional[Augmenter]:
    """Build what this rank's role needs before any host<->DPU traffic (failures stay collective)."""
    hosts = fed_hosts(topo.pairing, topo.world_rank) if cfg.mode == "da" else ()
    if not hosts:
        return None  # --mode none, or a DPU rank no host needs: it idles until shutdown
    train = PerSampleSeeded(build_datasets(cfg).train, cfg.seed)
    return Augmenter(cfg, topo, train, probe_layout(train, cfg), hosts)


def main(argv: Optional[Sequence[str]] = None) -> int:
    cfg, topo, augmenter = start_program(Role.DPU, argv, prepare)
    if not topo.host_ranks:
        return 0
    log = JsonlLog(cfg.log_dir, f"phases-rank{topo.world_rank}.jsonl")
    if augmenter is not None:
        for record in augmenter.run():
            log.write({"world_rank": topo.world_rank, "role": "dpu", "work": "da", **record})
        augmenter.close()
    stats: dict[str, Any] = idle_until_shutdown(topo)
    log.write({"event": "end", "world_rank": topo.world_rank, "role": "dpu", "mode": cfg.mode, **stats})
    return 0


def run(argv: Optional[Sequence[str]] = None) -> None:
    run_program(lambda: main(argv), "DPU program")
