"""DPU program entry: start-up checks, then this rank's offloaded work, then clean exit."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Optional, Protocol, Sequence

from dpuoffload.common.config import RunConfig
from dpuoffload.common.data.datasets import build_datasets, build_train_set
from dpuoffload.common.data.loaders import steps_per_epoch
from dpuoffload.common.data.sampling import PerSampleSeeded
from dpuoffload.common.errors import ConfigError
from dpuoffload.common.models.zoo import build_model
from dpuoffload.common.plan.assign import StateAssignment
from dpuoffload.common.plan.offload import DA, IDLE, MV, plan_offload
from dpuoffload.common.runtime import inject, trace
from dpuoffload.common.runtime.failure import run_program
from dpuoffload.common.runtime.metrics import JsonlLog
from dpuoffload.common.runtime.roles import Role, Topology
from dpuoffload.common.runtime.startup import start_program
from dpuoffload.common.state.resume import find_resume, start_position
from dpuoffload.common.state.trainstate import epoch_spans
from dpuoffload.common.train.naive import measure_profile
from dpuoffload.dpu.idle import idle_until_shutdown
from dpuoffload.dpu.keeper import Keeper
from dpuoffload.dpu.replica import Replica
from dpuoffload.dpu.serve import LoaderService
from dpuoffload.dpu.validate import ScriptValidation, Validator

REPLICA = "replica"  # --mode naive: the DPU rank trains as a data-parallel replica
WORK_COLORS = {IDLE: 0, DA: 1, MV: 2}


class Work(Protocol):
    ends_on_shutdown: bool  # run() returns on host rank 0's SHUTDOWN itself (else: idle until it comes)

    def run(self) -> list[dict[str, Any]]: ...

    def close(self) -> None: ...


@dataclass
class DpuJob:
    work: str                   # what this rank does: augmentation, validation, replica or idle
    runner: Optional[Work]
    keeper: Optional[Keeper]    # checkpoint / clone keeper thread, next to the work


def prepare(cfg: RunConfig, topo: Topology) -> DpuJob:
    """Build this rank's work (augmentation, validation, training, or none) before any host<->DPU traffic."""
    me = topo.world_rank
    if cfg.mode.dpu_trains:
        data = build_datasets(cfg)
        return DpuJob(REPLICA, Replica(cfg, topo, data, PerSampleSeeded(data.train, cfg.seed),
                                       build_model(cfg, data.num_classes)), None)
    plan = plan_offload(topo.ranks, cfg)
    work = plan.work.get(me, IDLE)
    check_injections(cfg, topo, work)
    # DPU-only collectives first, before anything that could fail on one rank and not the others
    work_comm = topo.side_comm.Split(color=WORK_COLORS[work], key=me)
    keeper = build_keeper(cfg, topo)
    if work == DA and plan.fed_by(me):  # the loaders its host ranks open (their plans say which batches)
        service = LoaderService(cfg, topo, plan.fed_by(me))
        if cfg.script is None:  # the built-in trainer's hosts name the training set by this recipe
            service.prebuild(functools.partial(build_train_set, cfg))
        return DpuJob(work, service, keeper)
    if cfg.script is not None:  # a user's script: validation when it calls job.validate, else idle
        return DpuJob(MV, ScriptValidation(cfg, topo, work_comm, plan.states_to(me)), keeper) if work == MV \
            else DpuJob(IDLE, None, keeper)
    if work == MV:
        data = build_datasets(cfg)
        steps = host_steps(cfg, topo, len(data.train))
        start = start_position(find_resume(cfg, len(topo.host_ranks), steps))
        epochs = [s.epoch for s in epoch_spans(steps, cfg.epochs, start, cfg.stop_at_step) if s.completes]
        return DpuJob(work, Validator(cfg, topo, work_comm, build_model(cfg, data.num_classes), data.val,
                                      plan.states_to(me), epochs), keeper)
    return DpuJob(IDLE, None, keeper)


def check_injections(cfg: RunConfig, topo: Topology, work: str) -> None:
    """`--inject dpu:R@STEP` fires when the rank builds that step's batch: only augmentation ranks do."""
    named = [i for i in inject.for_rank(cfg.inject, topo).mine if i.who == "dpu"]
    if named and work != DA:
        raise ConfigError(f"--inject {named[0]}: {topo.describe()} {'validates' if work == MV else 'is idle'} in "
                          f"this run (--mode {cfg.mode}), so it has no training steps to fail at; name an "
                          "augmentation DPU rank or a host rank")


def host_steps(cfg: RunConfig, topo: Topology, n_train: int) -> int:
    return steps_per_epoch(n_train, len(topo.host_ranks), cfg.batch_size, cfg.drop_last)


def build_keeper(cfg: RunConfig, topo: Topology) -> Optional[Keeper]:
    """A keeper on every DPU rank that host ranks hand state to (collective over the DPU ranks)."""
    if not (cfg.checkpointing or (cfg.clone_at is not None and topo.clone_ranks)):
        return None
    from mpi4py import MPI

    keeps = bool(StateAssignment.of(topo).hosts_kept_by(topo.world_rank))
    comm = topo.side_comm.Split(color=1 if keeps else MPI.UNDEFINED, key=topo.world_rank)
    return Keeper(cfg, topo, comm) if keeps else None


def profile(cfg: RunConfig, topo: Topology, job: DpuJob) -> dict[str, Any]:
    if isinstance(job.runner, Replica):
        return measure_profile(cfg, topo, job.runner.model, job.runner.train)
    return {}


def main(argv: Optional[Sequence[str]] = None) -> int:
    started = start_program(Role.DPU, argv, prepare, profile)
    cfg, topo, job, profiles = started.cfg, started.topo, started.state, started.profiles
    if not topo.host_ranks:
        trace.finish(topo.world, cfg.trace)
        return 0
    runner = job.runner
    if isinstance(runner, Replica):
        runner.start(profiles)
    log = JsonlLog(cfg.log_dir, f"phases-rank{topo.world_rank}.jsonl")
    if job.keeper is not None:
        job.keeper.start()
    if runner is not None:
        for record in runner.run():
            log.write({"world_rank": topo.world_rank, "role": "dpu", "work": job.work, **record})
        runner.close()
    # (the loader service and a script's validation end on the shutdown message itself)
    stats: dict[str, Any] = {} if runner is not None and runner.ends_on_shutdown else idle_until_shutdown(topo)
    if job.keeper is not None:
        stats["handoffs"] = len(job.keeper.join())
    if isinstance(runner, LoaderService):  # the pairing, as the ranks found it (node: what --dpus maps it to)
        stats["feeds"] = {str(h): topo.ranks[h].node for h in runner.hosts}
    log.write({"event": "end", "world_rank": topo.world_rank, "role": "dpu", "work": job.work, "mode": cfg.mode,
               "node": topo.ranks[topo.world_rank].node, **stats})
    trace.finish(topo.world, cfg.trace)
    return 0


def run(argv: Optional[Sequence[str]] = None) -> None:
    run_program(lambda: main(argv), "DPU program")
