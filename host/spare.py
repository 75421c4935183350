"""A spare host rank (`dpurun --spare-ranks S`, `--recovery rollback`): stand by, then train in a
dead host rank's seat.

The spare builds everything a host rank has at start-up (data sets, model), then waits in the
pool's broadcast (`common.train.spares.SparePool.stand_by`). Called in, it receives the state of
the step to replay (or of the step boundary to start from), loads the dead rank's batches itself
(`--mode da` too: the dead rank's DPU rank dropped its stream; per-sample seeds make the batches
the same), and trains in that seat to the end of the run like any host rank.
"""

from __future__ import annotations

from dpuoffload.common.config import RunConfig
from dpuoffload.common.data.feeds import Feed
from dpuoffload.common.data.loaders import Sampling
from dpuoffload.common.data.sampling import PerSampleSeeded
from dpuoffload.common.runtime import faults
from dpuoffload.common.runtime.roles import Topology
from dpuoffload.common.state.trainstate import describe_position
from dpuoffload.common.train.allreduce import build_sync
from dpuoffload.common.train.evaluation import LocalValidation
from dpuoffload.common.train.loop import Trainer, TrainJob
from dpuoffload.common.train.spares import Rollback, SparePool, unpack_state
from dpuoffload.common.train.survivors import SurvivorGroup
from dpuoffload.host.extensions import LoaderFeed
from dpuoffload.host.loader import local_loader


def spare_feed(cfg: RunConfig, topo: Topology, train: PerSampleSeeded, seat: int) -> Feed:
    """Host rank `seat`'s batches, loaded in this process."""
    return LoaderFeed(local_loader(train.dataset, Sampling.of(cfg, len(topo.host_ranks), seat)))


def run_spare(cfg: RunConfig, topo: Topology, job: TrainJob) -> int:
    """Stand by; if called in, train in the seat to the end. Collective over the pool (with the
    host ranks' `SparePool`)."""
    pool = SparePool(topo, cfg.peer_timeout)
    call = pool.stand_by()
    if call is None:   # the run ended without needing this spare
        faults.ending()
        return 0
    job.feed = spare_feed(cfg, topo, job.train, call.seat)
    group = SurvivorGroup(topo, cfg.peer_timeout, spares=pool)
    sync = build_sync("mpi", group, cfg.peer_timeout, job.compute.device)
    validation = LocalValidation(job.model, job.data.val, cfg.val_batch_size, group)
    trainer = Trainer(cfg, topo, job, sync, validation, group=group, joining=True)
    position = unpack_state(call.state, trainer.model, trainer.optimizer, trainer.scheduler)
    trainer.resume_at(position, None)
    trainer.recovery = Rollback(group, trainer, job.feed.steps(), cfg.epochs)
    what = "replays the failed step from" if call.replay else "starts at"
    print(f"[dpuoffload] {topo.describe()} takes host rank {call.seat}'s seat: it {what} "
          f"{describe_position(position)}", flush=True)
    trainer.fit()
    group.Barrier()   # (as `Job.finish` on the host ranks)
    faults.ending()
    pool.release()
    sync.shutdown()
    return 0
