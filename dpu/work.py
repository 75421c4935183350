"""Build the DPU rank's computing work: augmentation, validation, or a training replica.

Everything here needs torch, so `dpu/main.py` imports this module only once the offload plan has
given the rank something to compute (`--mode none`'s DPU ranks, and ranks the plan leaves idle,
never import torch: see `common/runtime/torchsetup.init_torch`).
"""

from __future__ import annotations

import functools
import itertools
from typing import Any, Optional, Protocol

from mpi4py import MPI

from dpuoffload.common.config import RunConfig
from dpuoffload.common.data.datasets import build_datasets, build_train_set
from dpuoffload.common.data.loaders import Sampling, steps_for
from dpuoffload.common.data.sampling import PerSampleSeeded
from dpuoffload.common.models.zoo import build_model
from dpuoffload.common.plan.offload import OffloadPlan
from dpuoffload.common.runtime.roles import Topology
from dpuoffload.common.startup import Run
from dpuoffload.common.state.resume import find_resume, start_position
from dpuoffload.common.state.trainstate import epoch_spans
from dpuoffload.common.train.naive import measure_profile
from dpuoffload.dpu.control import ControlInbox
from dpuoffload.dpu.replica import Replica
from dpuoffload.dpu.serve import LoaderService
from dpuoffload.dpu.validate import ScriptValidation, Validator


class Work(Protocol):
    @property
    def inbox(self) -> Optional[ControlInbox]:
        """Where run() learns of the job's end and returns (None: it returns by itself, and the rank idles
        until the end; `dpu.main`). Read-only here, so a work whose inbox is always set (or always None) matches."""

    def run(self) -> list[dict[str, Any]]: ...

    def close(self) -> None: ...


def replica(cfg: RunConfig, topo: Topology, run: Run) -> Replica:
    """--mode naive: this DPU rank trains as a data-parallel replica."""
    data = build_datasets(cfg)
    return Replica(cfg, topo, data, PerSampleSeeded(data.train, cfg.seed), build_model(cfg, data.num_classes),
                   run.faults)


def augmentation(cfg: RunConfig, topo: Topology, plan: OffloadPlan, run: Run) -> LoaderService:
    """The service of the loaders this rank's host ranks open (their plans say which batches)."""
    service = LoaderService(cfg, topo, plan.fed_by(topo.world_rank), run.faults)
    if cfg.script is None:  # the built-in trainer's hosts name the training set by this recipe
        service.prebuild(functools.partial(build_train_set, cfg))
    return service


def validation(cfg: RunConfig, topo: Topology, plan: OffloadPlan, work_comm: MPI.Comm, run: Run) -> Work:
    """This rank's share of validation: a script's when it calls job.validate, else the built-in
    trainer's epochs this run completes."""
    hosts = plan.states_to(topo.world_rank)
    if cfg.script is not None:
        return ScriptValidation(cfg, topo, run.faults, work_comm, hosts)
    data = build_datasets(cfg)
    steps = steps_for(data.train, Sampling.of(cfg, len(topo.host_ranks), 0))
    start = start_position(find_resume(cfg, len(topo.host_ranks), steps, run.memory))
    spans = epoch_spans(steps, cfg.epochs, start, cfg.stop_at_step)
    done = list(itertools.accumulate((s.stop - s.start for s in spans), initial=start.global_step))
    span_steps = {s.epoch: range(first + 1, last + 1) for s, first, last in zip(spans, done, done[1:])}
    return Validator(cfg, topo, run.faults, work_comm, build_model(cfg, data.num_classes), data.val, hosts,
                     [s.epoch for s in spans if s.completes], span_steps, steps * cfg.epochs, plan.mv_ranks)


def profile(cfg: RunConfig, topo: Topology, runner: Optional[Work]) -> dict[str, Any]:
    """A replica's measured compute speeds (--mode naive sizes its batch from them)."""
    if isinstance(runner, Replica):
        return measure_profile(cfg, topo, runner.model, runner.train)
    return {}
