"""Host program entry: start-up checks, build, train, tell the DPU ranks to stop, clean up."""

from __future__ import annotations

from typing import Optional, Sequence

from dpuoffload.common.config import RunConfig
from dpuoffload.common.datasets import DatasetPair, build_datasets
from dpuoffload.common.errors import ConfigError
from dpuoffload.common.loaders import RankLoader, probe_layout
from dpuoffload.common.failure import run_program
from dpuoffload.common.models import build_model
from dpuoffload.common.roles import Role, Topology, feeders
from dpuoffload.common.sampling import PerSampleSeeded
from dpuoffload.common.startup import start_program
from dpuoffload.host.allreduce import build_sync, resolve_backend
from dpuoffload.host.control import shutdown_dpus
from dpuoffload.host.feed import Feed, LocalFeed, RemoteFeed
from dpuoffload.host.trainer import HostJob, Trainer


def prepare(cfg: RunConfig, topo: Topology) -> HostJob:
    """Everything that can fail on bad input, before any host-only communication starts."""
    resolve_backend(cfg.allreduce)
    data = build_datasets(cfg)
    return HostJob(data=data, model=build_model(cfg, data.num_classes), feed=build_feed(cfg, topo, data))


def build_feed(cfg: RunConfig, topo: Topology, data: DatasetPair) -> Feed:
    """This host rank's own loader (`none`), or a receiver of the batches its DPU rank sends (`da`)."""
    train = PerSampleSeeded(data.train, cfg.seed)
    loader = RankLoader(cfg, train, len(topo.host_ranks), topo.side_rank)
    if cfg.mode == "none":
        return LocalFeed(loader)
    feeder = feeders(topo.pairing).get(topo.world_rank)
    if feeder is None:
        raise ConfigError(f"--mode {cfg.mode}: {topo.describe()} has no DPU rank on its node to feed it; "
                          "start at least one DPU rank per node that has host ranks")
    return RemoteFeed(topo.world, feeder, topo.describe(feeder), probe_layout(train, cfg), len(loader),
                      cfg.peer_timeout)


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
