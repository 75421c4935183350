"""A spare host rank (`dpurun --spare-ranks S`, `--recovery rollback` or `lossy-forward`): stand by,
then train in a dead host rank's seat.

The spare builds everything a host rank has at start-up (data sets, model), then waits in the
pool's broadcast (`host.recovery.spares.SparePool.stand_by`). Called in, it receives the state of
the step to replay (or of the step boundary to start from), and trains in that seat to the end of
the run like any host rank. Its batches are the dead rank's: in `--mode da` it opens the same
loader on the DPU rank that fed the dead rank (which dropped the dead rank's stream and serves
spares under `--recovery rollback`); where that DPU rank is dead too, or in `none`, it loads them
itself (per-sample seeds make them the same batches).
"""

from __future__ import annotations

import copy
import functools
from typing import TYPE_CHECKING, Optional

import torch
from torch.utils.data import default_collate

from dpuoffload.common.config import RunConfig
from dpuoffload.common.data.datasets import build_train_set
from dpuoffload.common.data.loaders import Sampling
from dpuoffload.common.data.sampling import PerSampleSeeded
from dpuoffload.common.faults.watch import Faults
from dpuoffload.common.modes import AllReduce
from dpuoffload.common.plan.offload import OffloadPlan
from dpuoffload.common.runtime.roles import Topology
from dpuoffload.common.state.trainstate import describe_position
from dpuoffload.common.train.allreduce import build_sync
from dpuoffload.common.train.loop import TrainJob
from dpuoffload.common.train.training_state import TrainingState
from dpuoffload.host.checkpoint import StateHandoff
from dpuoffload.host.control import end_with_dpus
from dpuoffload.host.extensions import LoaderFeed, build_hooks
from dpuoffload.host.library import Job
from dpuoffload.host.loader import local_loader
from dpuoffload.host.recovery.build import HostRecovery
from dpuoffload.host.recovery.spares import SparePool, seat_progress, unpack_state

if TYPE_CHECKING:
    from dpuoffload.host.main import Assembly


def spare_feed(cfg: RunConfig, topo: Topology, faults: Faults, train: PerSampleSeeded, seat: int,
               plan: Optional[OffloadPlan] = None) -> LoaderFeed:
    """Host rank `seat`'s batches: in `--mode da`, from the DPU rank that fed it (if alive, as
    `faults` knows; else, and in `none`, loaded in this process). Without `plan`: the placeholder
    of start-up."""
    host = topo.host_ranks[seat]
    feeder = plan.feeder.get(host) if plan is not None and cfg.mode.augments_on_dpu else None
    if feeder is None or feeder in faults.dead_ranks():
        return LoaderFeed(local_loader(train.dataset, Sampling.of(cfg, len(topo.host_ranks), seat)))
    # (the same loader the host rank would open, on its own DPU rank)
    job = Job(seat, len(topo.host_ranks), cfg.mode, None, topo, cfg, plan, faults=faults, fed_as=host)
    return LoaderFeed(job.loader(train.dataset, cfg.batch_size, seed=cfg.seed, drop_last=cfg.drop_last, copy=False,
                                 epochs=cfg.epochs, build_on_dpu=functools.partial(build_train_set, cfg)))


def warm_up(cfg: RunConfig, job: TrainJob, steps: int = 2) -> None:
    """Run the model's forward and backward `steps` times on a training batch (the first sample,
    repeated and collated as the loader would), before standing by. A called spare replays the
    failed step at once; without this, that step also pays a fresh process's first-step costs on
    the recovery's critical path: the allocator growing, kernels set up, on a GPU cuDNN choosing
    algorithms (resnet56, batch 64, one core: the first forward and backward 511 ms, the second
    398, then 357). The state that comes with the call-in overwrites what this touched
    (parameters, BatchNorm buffers, RNG states), and the step zeroes the gradients first."""
    x, y = default_collate([job.train[0]] * cfg.batch_size)
    x, y = job.compute.inputs(x, y)
    job.model.train()
    for _ in range(steps):
        with job.compute.autocast():
            loss = torch.nn.functional.cross_entropy(job.model(x), y)
        loss.backward()
    job.model.zero_grad(set_to_none=False)


def run_spare(cfg: RunConfig, topo: Topology, job: TrainJob, faults: Faults, assembly: "Assembly") -> int:
    """Warm up, stand by; if called in, train in the seat to the end. Collective over the pool
    (with the host ranks' `SparePool`). `faults`: the run's failure record; `assembly`: the host
    program's own build and end of a run (`host.main.Assembly`), which a seated spare shares."""
    warm_up(cfg, job)
    pool = SparePool(topo, cfg.peer_timeout, faults)
    call = pool.stand_by()
    if call is None:   # the run ended without needing this spare
        faults.ending()
        pool.ended()
        return 0
    feed = job.feed = spare_feed(cfg, topo, faults, job.train, call.seat, job.plan)
    state = TrainingState.build(cfg, job.model, cfg.epochs * feed.steps())
    recovery = HostRecovery.seated(cfg, topo, job, faults, state, pool, call.seat)
    sync = build_sync(AllReduce.MPI, recovery.group, cfg.peer_timeout, job.compute.device, recovery.passenger)
    trainer = assembly.trainer(job, sync, state, recovery, hooks=lambda t: build_hooks(cfg, topo, t), joining=True)
    position = unpack_state(call.state, state)   # (after the trainer, which seeds the RNGs: the state's win)
    seats = seat_progress(call.state)   # (every seat's progress in the epoch: the seat's own resumes its record,
    # and every seat's is known here from now on, as after a resume: `Rollback.resumed`)
    trainer.resume_at(position, copy.deepcopy(seats[call.seat]) if seats else None, seats)
    recovery.joined(position.epoch)
    if isinstance(trainer.hooks, StateHandoff):  # checkpoints: the seat's keeper hears from this rank now
        trainer.hooks.join(position, resend=call.replay)
    what = "replays the failed step from" if call.replay else "starts at"
    print(f"[dpuoffload] {topo.describe()} takes host rank {call.seat}'s seat: it {what} "
          f"{describe_position(position)}, its batches from {feed.loader.where}", flush=True)
    trainer.fit()
    feed.loader.close()   # (before the barrier, as `Job.finish` on the host ranks: then the DPU ranks stop)
    recovery.group.Barrier()
    faults.ending()
    pool.release()
    end_with_dpus(topo, cfg.peer_timeout, faults, recovery.group)  # (it sends once no original host rank lives)
    return assembly.close(trainer, sync)  # (in seat 0 it has the checkpoint summary)
