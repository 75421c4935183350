"""The data-parallel training loop of one replica: host ranks in every mode, DPU ranks too in naive.

One step = next batch (data) -> forward/backward -> gradient allreduce -> optimizer step, each
timed as a phase; each epoch ends with BatchNorm buffers synced from world rank 0 (host rank 0),
validation (on the host ranks, or handed to DPU ranks) and one log record. The replicas are the
host ranks (`group` = host_comm), or host and DPU ranks in `--mode naive` (`group` = world), where
batches differ in size and gradients are weighted by each replica's sample count.
Determinism: weights from the seed, `DistributedSampler(seed)`, per-sample augmentation seeds
(`PerSampleSeeded`), deterministic algorithms and a fixed allreduce order, so the same seed and
rank count give the same loss sequence to the bit.
"""

from __future__ import annotations

import contextlib
import hashlib
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional, Protocol, Sequence

import numpy as np
import torch
from torch import nn

from dpuoffload.common.config import RunConfig
from dpuoffload.common.data.datasets import DatasetPair
from dpuoffload.common.data.feeds import Batch, Feed
from dpuoffload.common.data.sampling import PerSampleSeeded, seed_training
from dpuoffload.common.data.shards import sharded_of
from dpuoffload.common.faults import inject
from dpuoffload.common.faults.watch import Faults
from dpuoffload.common.files import write_atomic
from dpuoffload.common.plan.offload import OffloadPlan
from dpuoffload.common.runtime import trace
from dpuoffload.common.runtime.hostgroup import FixedGroup, HostGroup
from dpuoffload.common.runtime.metrics import JsonlLog, PhaseTimer
from dpuoffload.common.runtime.roles import Topology
from dpuoffload.common.runtime.torchsetup import CLOCK
from dpuoffload.common.state.resume import ResumePoint
from dpuoffload.common.state.sharding import state_digest
from dpuoffload.common.state.trainstate import EpochProgress, EpochSpan, Position, epoch_spans
from dpuoffload.common.train.allreduce import GradientSync
from dpuoffload.common.train.device import Compute
from dpuoffload.common.train.evaluation import (
    SharePolicy,
    Validation,
    allreduce_sums,
)
from dpuoffload.common.train.records import EpochBar, EpochRecords
from dpuoffload.common.train.step import StepOutcome, Stepper
from dpuoffload.common.train.training_state import TrainingState


class StateHooks(Protocol):
    """Where checkpoints and clones plug into the loop (`host.checkpoint.StateHandoff`).

    Called by every replica of the group that was given hooks, in this order: `before_optimizer_step`
    inside each step (before the weights change); `after_step` after each step (the position after
    it); `after_epoch` after an epoch's end work (BatchNorm sync, validation hand-off), at position
    (epoch + 1, 0); `finish` once, after the last step and validation.
    """

    def after_step(self, pos: Position, progress: EpochProgress) -> None: ...

    def after_epoch(self, pos: Position) -> None: ...

    def before_optimizer_step(self) -> None: ...

    def finish(self) -> None: ...


class RecoveryHooks(Protocol):
    """What the trainer asks of `--recovery` (`host.recovery.survivors.LossyForward`,
    `host.recovery.spares.Rollback`; built with the group before the trainer, `host.recovery.HostRecovery`):
    every rank's record of an epoch resumed mid-way, the step's batch, a hook around the step's
    allreduce (at the position of the step in flight), the epoch's totals, and after each step the
    failures to report (each by the rank that `reports` says); between epochs a chance to change the
    group (rollback's spares take seats left vacant)."""

    def batch(self, epoch: int, step: int, batch: Batch, total: Optional[int]) -> tuple[Batch, Optional[int]]: ...

    def resumed(self, epoch: int, seats: Sequence[EpochProgress]) -> None: ...

    def replayable(self, outcome: "StepOutcome", at: Position) -> contextlib.AbstractContextManager[None]: ...

    def epoch_totals(self, epoch: int, sums: np.ndarray, losses: list[float]) -> tuple[np.ndarray, list[float]]: ...

    def check(self, epoch: int, step: int, global_step: int) -> Sequence[Any]: ...

    def between_epochs(self, epoch: int, global_step: int) -> bool: ...

    def reports(self, event: Any, leader: bool) -> bool: ...

    def report(self, event: Any, topo: Topology, step_times: list[float]) -> dict[str, Any]: ...


class NoHooks:
    """Hooks that do nothing: a base class for hooks that need only some of the calls."""

    def after_step(self, pos: Position, progress: EpochProgress) -> None:
        pass

    def after_epoch(self, pos: Position) -> None:
        pass

    def before_optimizer_step(self) -> None:
        pass

    def finish(self) -> None:
        pass


@dataclass
class TrainJob:
    """What set-up builds before any communication (so failures are collective and clean)."""

    data: DatasetPair
    train: PerSampleSeeded  # the training set under per-sample augmentation seeds
    model: nn.Module
    feed: Feed
    plan: OffloadPlan
    resume: Optional[ResumePoint] = None  # --resume: the checkpoint and where this run starts
    compute: Compute = field(default_factory=Compute)  # --device, --amp, --channels-last (the model is placed)


def save_state_dict(model: nn.Module, path: str) -> None:
    """Write the final `state_dict` for `torch.load(..., weights_only=True)`, durably (`common.files`)."""
    write_atomic(path, lambda f: torch.save(model.state_dict(), f), parents=True)


def timed(timer: PhaseTimer, batches: Iterator[Batch]) -> Iterator[Batch]:
    """Yield from `batches`, timing every fetch as the data phase (the last one too: the feed's epoch
    epilogue)."""
    while True:
        with timer.phase("data"):
            batch = next(batches, None)
        if batch is None:
            return
        yield batch


class Trainer:
    """The training loop of one replica. It owns the order (epochs of steps, the work between them,
    when each collaborator is called), the position (epoch, step, global step) and the epoch's
    progress (losses and sums, in step order). What a step touches on the device (AMP, GPU staging,
    the allreduce, simulated failures) is its `Stepper`; what it writes (records, logs, the bar,
    failure reports) its `EpochRecords`; what a step updates a `TrainingState`; checkpoints and
    clones plug in as `StateHooks`, `--recovery` as `RecoveryHooks`, both given at construction."""

    def __init__(self, cfg: RunConfig, topo: Topology, job: TrainJob, sync: GradientSync,
                 validation: Validation, share_policy: Optional[SharePolicy] = None,
                 group: Optional[HostGroup] = None, *, faults: Faults,
                 state: Optional[TrainingState] = None, recovery: Optional[RecoveryHooks] = None,
                 hooks: Optional[Callable[["Trainer"], Optional[StateHooks]]] = None, joining: bool = False,
                 label: str = "") -> None:
        """`faults`: the run's failure record (`--inject` notes its moments there). `hooks` builds the
        state hooks once, at the end (they need the optimizer; `host.extensions.HooksFactory`); None
        or a None built: no hand-offs, no "handoff" phase. `state`: what it steps (built from the job's
        model when None; given when another part holds the same objects: rollback packs them).
        `recovery`: what follows a host rank's death (None: it ends the job). `joining`: a spare seated
        mid-run (its logs appended, its weights from the state). `label`: before each epoch line."""
        self.cfg, self.topo, self.sync, self.faults, self.recovery = cfg, topo, sync, faults, recovery
        seed_training(cfg.seed, topo.side_rank)  # (a resume, a clone's or a spare's state restores its own later)
        # all training replicas (a SurvivorGroup under --recovery lossy-forward: fewer once a host rank died)
        self.comm: HostGroup = FixedGroup.of_side(topo) if group is None else group
        self.validation, self.share_policy, self.feed, self.joining = validation, share_policy, job.feed, joining
        self.stream = sharded_of(job.train)  # a stream of shards: its epochs' padding and drops go in the records
        self.train_set = job.train.dataset    # (--skip-corrupt: an epoch's full sample count)
        self.total_steps = cfg.epochs * self.feed.steps()
        self.state = TrainingState.build(cfg, job.model, self.total_steps) if state is None else state
        self.model, self.optimizer, self.scheduler = self.state.model, self.state.optimizer, self.state.scheduler
        self.records = EpochRecords(cfg, topo, self.state.pending, lambda: self.is_leader, joining, label)
        self.timer = PhaseTimer()
        self.start, self.at, self.global_step = Position(), Position(), 0  # `at`: the step in flight
        self.resumed_progress: Optional[EpochProgress] = None
        self.step_times: list[float] = []  # seconds of each step of the epoch in flight
        self._t_step = time.perf_counter()  # when the step in flight began
        self.injector = inject.for_rank(cfg.inject, topo, faults.note)  # --inject: this rank fails on purpose
        built = hooks(self) if hooks is not None else None
        self.hands_off = built is not None  # time the hooks as their own phase only when there are some
        self.hooks: StateHooks = built if built is not None else NoHooks()
        self.stepper = Stepper(cfg, self.state, job.compute, sync, self.comm, self.timer, self.hooks, recovery,
                               self.records, self.total_steps)

    @property
    def size(self) -> int:
        return self.comm.Get_size()

    @property
    def is_leader(self) -> bool:
        """Replica 0 of the group (host rank 0, or clone rank 0) prints and writes the metrics."""
        return self.comm.Get_rank() == 0

    @property
    def metrics_log(self) -> JsonlLog:
        return self.records.metrics_log

    def resume_at(self, start: Position, progress: Optional[EpochProgress],
                  seats: Optional[Sequence[EpochProgress]] = None) -> None:
        """Continue from `start` (state already restored); `progress`: the interrupted epoch's so far;
        `seats`: every host rank's, when the state carried them (for `--recovery`: `Loaded.seats`)."""
        self.start, self.global_step = start, start.global_step
        self.resumed_progress = progress if start.step > 0 else None
        if self.recovery is not None and seats is not None and start.step > 0:
            self.recovery.resumed(start.epoch, seats)

    def fit(self) -> list[dict[str, Any]]:
        if self.feed.steps() == 0:
            raise ValueError("an epoch has no batches: the training set is smaller than one batch per "
                             "host rank with --drop-last; lower --batch-size or drop --drop-last")
        if not self.joining:
            self.sync.broadcast_parameters_(self.model)
        self.records.open()
        self.stepper.device_finish(self.feed)
        CLOCK.mark("allreduce, trainer, parameters broadcast")  # (before the first batch: the loader opens lazily)
        records: list[dict[str, Any]] = []
        for span in epoch_spans(self.feed.steps(), self.cfg.epochs, self.start, self.cfg.stop_at_step):
            self.run_epoch(span)
            records += self.records.complete_all(self.validation.ready())
            if span.completes and self.recovery is not None and self.recovery.between_epochs(span.epoch,
                                                                                              self.global_step):
                self.recovered(span.epoch, -1)  # (the spares called in are reported)
        records += self.records.complete_all(self.validation.finish())
        self.hooks.finish()
        startup = CLOCK.parts()  # (where this process's start to its training went: what a short job pays)
        self.records.close({"event": "end", "weights_sha256": state_digest(self.model), "global_step": self.global_step,
                            "allreduce": self.sync.name, "host_ranks": len(self.topo.host_ranks), "replicas": self.size,
                            "startup_s": round(sum(startup.values()), 3), "startup_parts_s": startup})
        if self.is_leader and self.cfg.save_weights:
            save_state_dict(self.model, self.cfg.save_weights)
        return records

    def run_epoch(self, span: EpochSpan) -> None:
        """Train (part of) an epoch; at its end, hand validation off (or do it) and keep the epoch's
        record until its metrics come. A run stopped mid-epoch (--stop-at-step) logs no record."""
        epoch, t0 = span.epoch, time.perf_counter()
        self.timer.reset()
        train_sums, losses, batch_digest, samples = self.train_epoch(span)
        train_time = time.perf_counter() - t0
        if not span.completes:
            return
        share = self.share_policy(train_time) if self.share_policy is not None else 0.0  # the DPU ranks' part (mv)
        trace.set_position(epoch=epoch)
        with self.timer.phase("validation"):
            self.sync.broadcast_buffers_(self.model)
            self.validation.epoch_end(epoch, share)
        share = share if getattr(self.validation, "offloads", True) else 0.0  # (validated on the host ranks)
        # (kept before a spare is seated, between epochs: its state carries the records still waiting)
        self.state.pending[epoch] = record = self.epoch_record(epoch, train_sums, losses,
                                                               (time.perf_counter() - t0, train_time), share)
        self.recovered(epoch, -1)  # (a host rank lost in the epoch's end work)
        self.handoff(lambda: self.hooks.after_epoch(Position(epoch + 1, 0, self.global_step)))
        epoch_time = time.perf_counter() - t0
        record.update(epoch_time=epoch_time, phase_shares=self.timer.shares(epoch_time))
        self.records.phases(epoch, epoch_time, span.stop - span.start, self.timer, batch_digest=batch_digest,
                            samples=samples, skipped_corrupt=self.feed.skipped(epoch),
                            first_global_step=self.global_step - len(self.step_times) + 1, step_times=self.step_times)

    def epoch_record(self, epoch: int, sums: np.ndarray, losses: list[float], times: tuple[float, float],
                     share: float) -> dict[str, Any]:
        counts_skipped = self.cfg.skip_corrupt and self.recovery is None  # (with recovery a lost rank's would count)
        return self.records.epoch(epoch, sums, losses, times, self.train_set if counts_skipped else None,
                                  self.stream, global_step=self.global_step, lr=self.scheduler.get_last_lr()[0],
                                  val_dpu_share=share, phase_shares=self.timer.shares(times[0]), step_losses=losses,
                                  weights_sha256=state_digest(self.model), samples=int(sums[2]),
                                  replicas=self.size)  # (at the epoch's end: under --recovery it can change)

    def train_epoch(self, span: EpochSpan) -> tuple[np.ndarray, list[float], Optional[str], int]:
        """Train steps [span.start, span.stop) of an epoch; return [loss, correct, count] summed over
        replicas, this replica's step losses, the digest of its batches (`--digest-batches`) and its
        sample count. A resumed epoch starts from the interrupted epoch's sums and losses."""
        self.model.train()
        progress = self.resumed_progress if span.start > 0 and self.resumed_progress else EpochProgress()
        self.resumed_progress = None
        digest = hashlib.sha256() if self.cfg.digest_batches else None
        bar = EpochBar(span.start, span.stop, f"epoch {span.epoch + 1}/{self.cfg.epochs}",
                       self.cfg.progress and self.is_leader, self.size)
        batches = self.stepper.epoch(self.feed.epoch(span.epoch, span.start, span.stop))
        self.step_times, self._t_step = [], time.perf_counter()
        pending: Optional[StepOutcome] = None  # the last step, not read yet (`StepOutcome`)
        trace.set_position(epoch=span.epoch, step=self.global_step + 1)
        for i, (x, y) in enumerate(timed(self.timer, batches), start=span.start):
            if digest is not None:
                digest.update(self.stepper.trained_on(x).numpy().tobytes())
                digest.update(y.numpy().tobytes())
            total, own = self.feed.global_samples(i), y
            if self.recovery is not None:  # this rank's share of dead host ranks' batches
                (x, y), total = self.recovery.batch(span.epoch, i, (x, y), total)
            self.at = Position(span.epoch, i, self.global_step)
            outcome = self.stepper.step(x, y, total, self.at, staged=y is own)
            loss = self.record_step(progress, pending)  # the step before: done on a GPU by now
            pending = outcome
            if self.hands_off:  # a checkpoint or clone after this step saves its progress: read it now
                loss, pending = self.record_step(progress, pending), None
            self.global_step += 1
            self.recovered(span.epoch, i)
            if self.injector:
                self.injector.check(self.global_step, self.total_steps)
            trace.set_position(epoch=span.epoch, step=self.global_step + 1)  # the data wait of the next step
            self.handoff(lambda: self.hooks.after_step(Position(span.epoch, i + 1, self.global_step), progress))
            now = time.perf_counter()
            self.step_times.append(now - self._t_step)  # data + compute + hand-off: what a checkpoint costs a step
            self._t_step = now
            bar.update(len(y), self.feed.global_samples(i), loss)
        if pending is not None:
            trace.set_position(epoch=span.epoch, step=self.global_step)  # (the last step's read, not a next one's)
            self.record_step(progress, pending)
        bar.close()
        sums, losses = allreduce_sums(self.comm, progress.sums), progress.losses
        if self.recovery is not None:  # (rollback: from every seat's progress, a dead one's too)
            sums, losses = self.recovery.epoch_totals(span.epoch, sums, losses)
        return sums, losses, digest.hexdigest() if digest is not None else None, int(progress.sums[2])

    def record_step(self, progress: EpochProgress, outcome: Optional[StepOutcome]) -> Optional[float]:
        """Add a step's loss and correct count to the epoch's progress, in step order; its loss (None
        without a step). Timed as forward/backward: on a GPU it is where the step's kernels are waited for."""
        if outcome is None:
            return None
        with self.timer.phase("forward_backward"):
            loss, correct = outcome.read()
        progress.losses.append(loss)
        progress.sums += (loss * outcome.count, correct, outcome.count)
        return loss

    def recovered(self, epoch: int, step: int) -> None:
        """Under --recovery: report the host ranks the last collectives lost (the new host rank 0
        takes the metrics log over if host rank 0 was lost; lossy forward's report comes from it,
        rollback's from the rank that sent the state)."""
        if self.recovery is None:
            return
        for failure in self.recovery.check(epoch, step, self.global_step):
            self.records.lead()
            if self.recovery.reports(failure, self.is_leader):
                self.records.failure(self.recovery.report(failure, self.topo,
                                                          self.step_times + [time.perf_counter() - self._t_step]))

    def handoff(self, hook: Callable[[], None]) -> None:
        """Run a state hand-off hook, timed as its own phase only when checkpoints or clones are on."""
        if not self.hands_off:
            return
        with self.timer.phase("handoff"):
            hook()
