"""Host program entry: start-up checks, build, train, tell the DPU ranks to stop, clean up.

Variants of the program (the benchmarks' baselines) pass `HostExtensions` (`host.extensions`)
to `main`/`run` instead of replacing this module's attributes.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence, Sized, cast

from dpuoffload.common.config import RunConfig
from dpuoffload.common.data.datasets import build_datasets
from dpuoffload.common.data.feeds import Feed
from dpuoffload.common.data.sampling import PerSampleSeeded
from dpuoffload.common.errors import ConfigError
from dpuoffload.common.faults.abort import run_program
from dpuoffload.common.faults.watch import Faults
from dpuoffload.common.models.zoo import build_model
from dpuoffload.common.modes import Device, Mode
from dpuoffload.common.plan.assign import StateAssignment
from dpuoffload.common.plan.offload import plan_offload
from dpuoffload.common.runtime import trace
from dpuoffload.common.runtime.hostgroup import FixedGroup, HostGroup
from dpuoffload.common.runtime.metrics import JsonlLog
from dpuoffload.common.runtime.roles import Role, Topology
from dpuoffload.common.runtime.torchsetup import CLOCK, import_torch_ahead
from dpuoffload.common.startup import Run, start_program
from dpuoffload.common.state.resume import find_resume, start_position, starting_line
from dpuoffload.common.state.trainstate import describe_position, epoch_spans
from dpuoffload.common.train.allreduce import GradientSync, build_sync, resolve_backend
from dpuoffload.common.train.autoselect import report_measured
from dpuoffload.common.train.device import Compute, resolve_device
from dpuoffload.common.train.evaluation import LocalValidation
from dpuoffload.common.train.loop import StateHooks, Trainer, TrainJob
from dpuoffload.common.train.naive import build_naive_feed, measure_profile, naive_backend
from dpuoffload.common.train.training_state import TrainingState
from dpuoffload.host.checkpoint import report_end, resume_trainer
from dpuoffload.host.clone import check_clone_flags, clone_config, describe_overrides
from dpuoffload.host.extensions import CloneAdopter, HostExtensions
from dpuoffload.host.library import attach, current
from dpuoffload.host.recovery.build import HostRecovery
from dpuoffload.host.spare import run_spare, spare_feed
from dpuoffload.host.validation import build_validation


def prepare(cfg: RunConfig, topo: Topology, run: Run, extensions: HostExtensions) -> TrainJob:
    """Everything that can fail on bad input, before any host-only communication starts."""
    if topo.role is Role.CLONE:
        cfg = clone_config(cfg)
    resolve_backend(cfg.allreduce)
    data = build_datasets(cfg)
    CLOCK.mark("data sets")
    plan = plan_offload(topo.ranks, cfg)
    if topo.role is Role.HOST:  # the public API's job: the da feed's loader and the end of the run
        attach(cfg, topo, plan, run.faults)
    train = PerSampleSeeded(data.train, cfg.seed)
    compute = Compute.of(resolve_device(Device.CPU if cfg.mode.dpu_trains or cfg.mode is Mode.AUTO else cfg.device,
                                        topo.local_rank), cfg.amp, cfg.channels_last)  # naive, auto: CPU replicas
    if compute.device.type == "cuda" and cfg.ckpt_copy.from_tensor_memory:
        raise ConfigError("--ckpt-copy zero sends the state from the tensors' own memory, which is GPU memory with "
                          "--device cuda; use --ckpt-copy staged (the default: staged through host memory)")
    if topo.role is Role.SPARE:
        feed: Feed = spare_feed(cfg, topo, run.faults, train, 0)
    else:
        feed = extensions.feed_factory(cfg, topo, train, plan)
    CLOCK.mark("feed")
    job = TrainJob(data=data, train=train, model=compute.place(build_model(cfg, data.num_classes)),
                   feed=feed, plan=plan, compute=compute)
    CLOCK.mark("model on its device")  # (a GPU's context is made here: its first tensor)
    if topo.role is Role.HOST:
        check_state_flags(cfg, topo, job, run)
    return job


def check_state_flags(cfg: RunConfig, topo: Topology, job: TrainJob, run: Run) -> None:
    """Checkpoint, resume and clone flags that need the topology or the data to check."""
    steps = job.feed.steps()
    job.resume = find_resume(cfg, len(topo.host_ranks), steps, run.memory)
    if job.resume is None and cfg.resumes_if_any and topo.side_rank == 0:
        print(starting_line(cfg), flush=True)
    start = start_position(job.resume)
    spans = epoch_spans(steps, cfg.epochs, start, cfg.stop_at_step)
    check_clone_flags(cfg, topo, start.global_step + sum(s.stop - s.start for s in spans))
    if cfg.hands_state_off:
        StateAssignment.of(topo).keeper_of(topo.world_rank)


@dataclass(frozen=True)
class Assembly:
    """How the host program builds a trainer and ends a run: one sequence for the host ranks and a
    spare called into a seat (`host.spare`), so both train and finish alike."""

    cfg: RunConfig
    topo: Topology
    faults: Faults
    ext: HostExtensions

    def trainer(self, job: TrainJob, sync: GradientSync, state: TrainingState, recovery: Optional[HostRecovery],
                group: Optional[HostGroup] = None, hooks: Optional[Callable[[Trainer], Optional[StateHooks]]] = None,
                joining: bool = False) -> Trainer:
        """The trainer over `group` (under --recovery: the recovery's group; default: the host ranks),
        with its validation; `hooks` default to the extensions' (checkpoints and clones)."""
        cfg, topo = self.cfg, self.topo
        survivors = recovery.group if recovery is not None else None
        validation, share = build_validation(cfg, topo, job, self.faults, survivors)
        return Trainer(cfg, topo, job, sync, validation, share, group=survivors if survivors is not None else group,
                       faults=self.faults, state=state, recovery=recovery.hooks if recovery is not None else None,
                       hooks=hooks or (lambda t: self.ext.hooks_factory(cfg, topo, t)), joining=joining)

    def close(self, trainer: Trainer, sync: GradientSync) -> int:
        """After the DPU ranks were told to stop: the sync ended, the trace written, the run's exit code."""
        sync.shutdown()
        trace.finish(self.topo.world, self.cfg.trace)
        return report_end(self.cfg, self.topo, trainer)


def report_auto(auto: dict[str, Any], records: list[dict[str, Any]], cfg: RunConfig) -> None:
    """--mode auto: print predicted vs measured for the chosen mode and log the whole record."""
    line = report_measured(auto, [r["epoch_time"] for r in records])
    if line:
        print(line, flush=True)
    JsonlLog(cfg.log_dir, "auto.jsonl").write(auto)


def main(argv: Optional[Sequence[str]] = None, extensions: Optional[HostExtensions] = None) -> int:
    """The host program (and the clone group's); `extensions`: the parts a variant replaces."""
    ext = HostExtensions() if extensions is None else extensions
    import_torch_ahead()  # (torchvision's import, before MPI init: beside the DPU ranks' own)
    started = start_program(Role.HOST, argv, functools.partial(prepare, extensions=ext),
                            lambda cfg, topo, job: measure_profile(cfg, topo, job.model, job.train))
    cfg, topo, job, profiles, faults = started.cfg, started.topo, started.state, started.profiles, started.run.faults
    if topo.role is Role.CLONE:
        return run_clone(cfg, topo, job, ext.adopt, faults)
    assembly = Assembly(cfg, topo, faults, ext)
    if topo.role is Role.SPARE:
        return run_spare(cfg, topo, job, faults, assembly)
    group: HostGroup = FixedGroup.of_side(topo)
    if cfg.mode.dpu_trains:  # DPU ranks are replicas too: one gradient group over the whole job
        source = "balanced by --mode auto's profile" if started.auto is not None else "from --dpu-batch-size"
        job.feed = build_naive_feed(cfg, topo, job.train, profiles, source)
        group = FixedGroup.of_world(topo)
    state = TrainingState.build(cfg, job.model, cfg.epochs * job.feed.steps())
    recovery = HostRecovery.build(cfg, topo, job, faults, state)  # (None without --recovery)
    group = recovery.group if recovery is not None else group
    sync = build_sync(naive_backend(cfg, profiles) if cfg.mode.dpu_trains else cfg.allreduce, group,
                      cfg.peer_timeout, job.compute.device, recovery.passenger if recovery is not None else None)
    if topo.side_rank == 0:
        print(f"[dpuoffload] mode {cfg.mode}: {len(topo.host_ranks)} host rank(s), "
              f"{len(topo.dpu_ranks)} DPU rank(s), model {cfg.model}, dataset {cfg.dataset} "
              f"({len(cast(Sized, job.data.train))} train / {len(cast(Sized, job.data.val))} val), "
              f"allreduce {sync.name}"
              f"{'' if job.compute == Compute() else ', on ' + job.compute.describe()}", flush=True)
    trainer = assembly.trainer(job, sync, state, recovery, group=group)
    if job.resume is not None:
        resume_trainer(trainer, job.resume, topo)
    records = trainer.fit()
    if started.auto is not None and topo.side_rank == 0:
        report_auto(started.auto, records, cfg)
    current().finish_over(recovery.group if recovery is not None else None,  # the loaders closed, then the
                          recovery.spares if recovery is not None else None)  # DPU ranks told to stop
    return assembly.close(trainer, sync)


def run_clone(original: RunConfig, topo: Topology, job: TrainJob, adopt: CloneAdopter, faults: Faults) -> int:
    """Clone ranks: stand by for the forwarded state, then train as their own group."""
    cfg = clone_config(original)
    group = FixedGroup.of_side(topo)
    sync = build_sync(cfg.allreduce, group, cfg.peer_timeout, job.compute.device)
    trainer = Trainer(cfg, topo, job, sync, LocalValidation(job.model, job.data.val, cfg.val_batch_size, group),
                      group=group, faults=faults, label="[clone] ")
    if topo.side_rank == 0:
        print(f"[clone] {len(topo.clone_ranks)} clone rank(s) standing by for the state of step "
              f"{original.clone_at} ({describe_overrides(original, cfg)})", flush=True)
    record = adopt(trainer, topo, original, cfg)
    if topo.side_rank == 0:
        print(f"[clone] state of step {record['global_step']} received after {record['standby_s']:.1f} s standing "
              f"by, rebuilt in {record['rebuild_s'] * 1e3:.0f} ms; continuing from "
              f"{describe_position(trainer.start)}", flush=True)
    trainer.metrics_log.write(record)
    trainer.fit()
    sync.shutdown()
    trace.finish(topo.world, original.trace)
    return 0


def run(argv: Optional[Sequence[str]] = None, extensions: Optional[HostExtensions] = None) -> None:
    run_program(lambda: main(argv, extensions), "host program")
