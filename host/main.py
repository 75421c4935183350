"""Host program entry: start-up checks, build, train, tell the DPU ranks to stop, clean up."""

from __future__ import annotations

from typing import Optional, Sequence

from dpuoffload.common.config import RunConfig
from dpuoffload.common.datasets import build_datasets
from dpuoffload.common.failure import run_program
from dpuoffload.common.models import build_model
from dpuoffload.common.roles import Role, Topology
from dpuoffload.common.startup import start_program
from dpuoffload.host.allreduce import build_sync, resolve_backend
from dpuoffload.host.control import shutdown_dpus
from dpuoffload.host.trainer import HostJob, Trainer


def prepare(cfg: RunConfig, topo: Topology) -> HostJob:
    """Everything that can fail on bad input, before any host-only communication starts."""
    resolve_backend(cfg.allreduce)
    data = build_datasets(cfg)
    return HostJob(data=data, model=build_model(cfg, data.num_classes))


def main(argv: Optional[Sequence[str]] = None) -> int:
    cfg, topo, job = start_program(Role.HOST, argv, prepare)
    sync = build_sync(cfg.allreduce, topo.side_comm, cfg.peer_timeout)
    if topo.side_rank == 0:
        print(f"[dpuoffload] mode {cfg.mode}: {len(topo.host_ranks)} host rank(s), "
              f"{len(topo.dpu_ranks)} DPU rank(s), model {cfg.model}, dataset {cfg.dataset} "
              f"({len(job.data.train)} train / {len(job.data.val)} val), allreduce {sync.name}", flush=True)
    Trainer(cfg, topo, job, sync).fit()
    shutdown_dpus(topo, cfg.peer_timeout)
    sync.shutdown()
    return 0


def run(argv: Optional[Sequence[str]] = None) -> None:
    run_program(lambda: main(argv), "host program")
