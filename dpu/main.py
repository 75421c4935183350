"""DPU program entry: start-up checks, then this rank's offloaded work, then clean exit."""

from __future__ import annotations

from typing import Any, Optional, Protocol, Sequence

from dpuoffload.common import trace
from dpuoffload.common.config import RunConfig
from dpuoffload.common.datasets import build_datasets
from dpuoffload.common.failure import run_program
from dpuoffload.common.loaders import probe_layout
from dpuoffload.common.metrics import JsonlLog
from dpuoffload.common.models import build_model
from dpuoffload.common.naive import measure_profile
from dpuoffload.common.offload import DA, IDLE, MV, plan_offload
from dpuoffload.common.roles import Role, Topology
from dpuoffload.common.sampling import PerSampleSeeded
from dpuoffload.common.startup import start_program
from dpuoffload.dpu.augment import Augmenter
from dpuoffload.dpu.idle import idle_until_shutdown
from dpuoffload.dpu.replica import Replica
from dpuoffload.dpu.validate import Validator

REPLICA = "replica"  # --mode naive: the DPU rank trains as a data-parallel replica
WORK_COLORS = {IDLE: 0, DA: 1, MV: 2}


class Work(Protocol):
    def run(self) -> list[dict[str, Any]]: ...

    def close(self) -> None: ...


def prepare(cfg: RunConfig, topo: Topology) -> tuple[str, Optional[Work]]:
    """Build this rank's work (augmentation, validation, training, or none) before any host<->DPU traffic."""
    me = topo.world_rank
    if cfg.mode == "naive":
        data = build_datasets(cfg)
        return REPLICA, Replica(cfg, topo, data, PerSampleSeeded(data.train, cfg.seed), build_model(cfg, data.num_classes))
    plan = plan_offload(topo.ranks, cfg)
    work = plan.work.get(me, IDLE)
    # DPU-only collective first, before anything that could fail on one rank and not the others
    work_comm = topo.side_comm.Split(color=WORK_COLORS[work], key=me)
    if work == DA and plan.fed_by(me):
        train = PerSampleSeeded(build_datasets(cfg).train, cfg.seed)
        return work, Augmenter(cfg, topo, train, probe_layout(train, cfg), plan.fed_by(me))
    if work == MV:
        data = build_datasets(cfg)
        return work, Validator(cfg, topo, work_comm, build_model(cfg, data.num_classes), data.val, plan.states_to(me))
    return IDLE, None


def profile(cfg: RunConfig, topo: Topology, state: tuple[str, Optional[Work]]) -> dict[str, Any]:
    runner = state[1]
    if isinstance(runner, Replica):
        return measure_profile(cfg, topo, runner.model, runner.train)
    return {}


def main(argv: Optional[Sequence[str]] = None) -> int:
    started = start_program(Role.DPU, argv, prepare, profile)
    cfg, topo, (work, runner), profiles = started.cfg, started.topo, started.state, started.profiles
    if not topo.host_ranks:
        trace.finish(topo.world, cfg.trace)
        return 0
    if isinstance(runner, Replica):
        runner.start(profiles)
    log = JsonlLog(cfg.log_dir, f"phases-rank{topo.world_rank}.jsonl")
    if runner is not None:
        for record in runner.run():
            log.write({"world_rank": topo.world_rank, "role": "dpu", "work": work, **record})
        runner.close()
    stats: dict[str, Any] = idle_until_shutdown(topo)
    log.write({"event": "end", "world_rank": topo.world_rank, "role": "dpu", "work": work, "mode": cfg.mode, **stats})
    trace.finish(topo.world, cfg.trace)
    return 0


def run(argv: Optional[Sequence[str]] = None) -> None:
    run_program(lambda: main(argv), "DPU program")
