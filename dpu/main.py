"""DPU program entry: start-up checks, then this rank's offloaded work, then clean exit."""

from __future__ import annotations

import contextlib
import io
import platform
import sys
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any, Optional, Sequence, cast

from dpuoffload.common.config import RunConfig, parse_run_config
from dpuoffload.common.errors import ConfigError
from dpuoffload.common.faults import inject
from dpuoffload.common.faults.abort import run_program
from dpuoffload.common.modes import Mode
from dpuoffload.common.plan.assign import StateAssignment
from dpuoffload.common.plan.offload import DA, IDLE, MV, plan_offload
from dpuoffload.common.runtime import trace
from dpuoffload.common.runtime.metrics import JsonlLog
from dpuoffload.common.runtime.roles import Role, Topology
from dpuoffload.common.runtime.torchsetup import import_torch_ahead, import_torchvision_without_compiler, init_torch
from dpuoffload.common.startup import Run, start_program
from dpuoffload.dpu.control import ControlInbox
from dpuoffload.dpu.idle import idle_until_shutdown

if TYPE_CHECKING:
    from dpuoffload.common.faults.watch import Faults
    from dpuoffload.dpu.keeper import Keeper
    from dpuoffload.dpu.replica import Replica
    from dpuoffload.dpu.serve import LoaderService
    from dpuoffload.dpu.work import Work

REPLICA = "replica"  # --mode naive: the DPU rank trains as a data-parallel replica
WORK_COLORS = {IDLE: 0, DA: 1, MV: 2}


@dataclass
class DpuJob:
    work: str                   # what this rank does: augmentation, validation, replica or idle
    runner: Optional[Work]
    keeper: Optional[Keeper]    # checkpoint / clone keeper thread, next to the work


def prepare(cfg: RunConfig, topo: Topology, run: Run) -> DpuJob:
    """Build this rank's work (augmentation, validation, training, or none) before any host<->DPU traffic.

    Only a rank with something to compute imports torch (`dpu/work.py`, `init_torch`); an idle one
    (every DPU rank of --mode none, the ranks a plan leaves over) waits for the end without it.
    """
    if cfg.mode.dpu_trains:
        init_torch()
        from dpuoffload.dpu import work as works

        return DpuJob(REPLICA, works.replica(cfg, topo, run), None)
    plan = plan_offload(topo.ranks, cfg)
    planned = plan.work.get(topo.world_rank, IDLE)
    check_injections(cfg, topo, planned)
    # DPU-only collectives first, before anything that could fail on one rank and not the others
    work_comm = topo.side_comm.Split(color=WORK_COLORS[planned], key=topo.world_rank)
    keeper = build_keeper(cfg, topo, run)
    work = IDLE if planned == DA and not plan.fed_by(topo.world_rank) else planned  # (more DPU ranks than needed)
    if work == IDLE:
        return DpuJob(IDLE, None, keeper)
    init_torch()
    import_torchvision_without_compiler()  # (before the data sets' own import of it: imported ahead or not)
    from dpuoffload.dpu import work as works

    if work == DA:
        runner: Work = works.augmentation(cfg, topo, plan, run)
    else:
        runner = works.validation(cfg, topo, plan, work_comm, run)
    return DpuJob(work, runner, keeper)


def check_injections(cfg: RunConfig, topo: Topology, work: str) -> None:
    """`--inject dpu:R@STEP` fires when the rank builds that step's batch (augmentation), gets the
    state of that step's epoch (validation) or of the first checkpoint from that step on (a keeper):
    an idle rank that keeps nothing has nothing to fail at."""
    named = [i for i in inject.named(cfg.inject, topo) if i.who == "dpu"]
    keeps = cfg.checkpointing and bool(StateAssignment.of(topo).hosts_kept_by(topo.world_rank))
    if named and work not in (DA, MV) and not keeps:
        raise ConfigError(f"--inject {named[0]}: {topo.describe()} is idle in this run (--mode {cfg.mode}), so it "
                          "has no training steps to fail at; name an augmentation or validation DPU rank, or a "
                          "host rank")


def build_keeper(cfg: RunConfig, topo: Topology, run: Run) -> Optional[Keeper]:
    """A keeper on every DPU rank that host ranks hand state to (collective over the DPU ranks)."""
    restoring = run.memory is not None  # (restarting from DPU memory: the keepers hand the state back)
    if not (cfg.checkpointing or (cfg.clone_at is not None and topo.clone_ranks) or restoring):
        return None
    from mpi4py import MPI

    keeps = bool(StateAssignment.of(topo).hosts_kept_by(topo.world_rank))
    comm = topo.side_comm.Split(color=1 if keeps else MPI.UNDEFINED, key=topo.world_rank)
    if not keeps:
        return None
    init_torch()  # (shard files: safetensors over torch tensors)
    from dpuoffload.dpu.keeper import Keeper

    return Keeper(cfg, topo, comm, run.faults, run.memory)


def profile(cfg: RunConfig, topo: Topology, job: DpuJob) -> dict[str, Any]:
    if job.work != REPLICA:
        return {}
    from dpuoffload.dpu import work as works

    return works.profile(cfg, topo, job.runner)


class Needs(Enum):
    """What a DPU rank with given flags will import: nothing (idle), torch (a checkpoint keeper's
    shards), or torch and torchvision (augmentation, validation, training, `auto`'s profile)."""

    NOTHING = 0
    TORCH = 1
    TORCH_AND_TORCHVISION = 2


def needs(argv: Optional[Sequence[str]]) -> Needs:
    """What these flags give DPU ranks to import, read before MPI init (torch-free), so such a rank
    imports it beside the host ranks' own imports (`import_torch_ahead`).

    A rank the plan then leaves idle (more DPU ranks than the mode uses) has imported them for
    nothing, which costs DPU memory (`DPUOFFLOAD_IMPORT_AHEAD=0`: only once the plan gives the rank
    work). Flags that do not parse: nothing, their error (silenced here) is `configure`'s.
    """
    try:
        with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            cfg = parse_run_config(argv)
    except (Exception, SystemExit):  # noqa: BLE001
        return Needs.NOTHING
    if cfg.mode is not Mode.NONE:
        return Needs.TORCH_AND_TORCHVISION
    keeps = cfg.hands_state_off or cfg.resume is not None  # (`build_keeper`: a resume may restore from DPU memory)
    return Needs.TORCH if keeps else Needs.NOTHING


def main(argv: Optional[Sequence[str]] = None) -> int:
    wanted = needs(argv)
    if wanted is not Needs.NOTHING:
        import_torch_ahead(torchvision=wanted is Needs.TORCH_AND_TORCHVISION, compiler=False)
    started = start_program(Role.DPU, argv, prepare, profile)
    cfg, topo, job, profiles, faults = started.cfg, started.topo, started.state, started.profiles, started.run.faults
    if not topo.host_ranks:
        trace.finish(topo.world, cfg.trace)
        return 0
    runner = job.runner
    if job.work == REPLICA:  # (`prepare`: a replica's runner is a Replica)
        cast("Replica", runner).start(profiles)
    log = JsonlLog(cfg.log_dir, f"phases-rank{topo.world_rank}.jsonl")
    if job.keeper is not None:
        job.keeper.start()
    if runner is not None:
        for record in runner.run():
            log.write({"world_rank": topo.world_rank, "role": "dpu", "work": job.work, **record})
        if runner.inbox is not None:
            told_to_end(cfg, faults, runner.inbox)
        runner.close()
    stats: dict[str, Any] = {}
    inbox = runner.inbox if runner is not None else None
    if inbox is None:  # (the loader service and a script's validation learnt of the end in run(): not these)
        inbox = ControlInbox(topo, cfg.recovery_policy.survives_host_loss)
        stats = idle_until_shutdown(inbox)
        told_to_end(cfg, faults, inbox)
    if job.keeper is not None:
        stats["handoffs"] = len(job.keeper.join())
    if job.work == DA:  # the pairing, as the ranks found it (node: what --dpus maps it to)
        service = cast("LoaderService", runner)  # (`prepare`: augmentation's runner is the loader service)
        stats["feeds"] = {str(h): topo.ranks[h].node for h in service.hosts}
        stats["polls"] = service.polls()  # the streams whose sends move only while this rank polls
        stats["wires"] = service.wires()  # what each stream sends: uint8 (the host runs the float steps) or float32
    log.write({"event": "end", "world_rank": topo.world_rank, "role": "dpu", "work": job.work, "mode": cfg.mode,
               "node": topo.ranks[topo.world_rank].node, "machine": platform.machine(),
               "torch_imported": "torch" in sys.modules, **stats})
    inbox.released(cfg.peer_timeout)  # (every DPU rank knows the job is over: this one may leave)
    trace.finish(topo.world, cfg.trace)
    return 0


def told_to_end(cfg: RunConfig, faults: Faults, inbox: ControlInbox) -> None:
    """SHUTDOWN came: from now on a rank that leaves is leaving, not dying, for this rank's failure
    watch; then the reply the sender waits for before any host rank leaves (`host.control.end_with_dpus`)."""
    faults.ending()
    inbox.reply(cfg.peer_timeout)


def run(argv: Optional[Sequence[str]] = None) -> None:
    run_program(lambda: main(argv), "DPU program")
