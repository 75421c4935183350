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
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional, Protocol, Sequence

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from dpuoffload.common.config import RunConfig
from dpuoffload.common.data.datasets import DatasetPair
from dpuoffload.common.data.feeds import Batch, Feed
from dpuoffload.common.data.loaders import Sampling
from dpuoffload.common.data.sampling import PerSampleSeeded, seed_training
from dpuoffload.common.data.shards import sharded_of
from dpuoffload.common.faults import inject
from dpuoffload.common.faults.simulate import FailureSimulator, StepFailure, lose_gradients
from dpuoffload.common.faults.watch import Faults
from dpuoffload.common.files import write_atomic
from dpuoffload.common.plan.offload import OffloadPlan
from dpuoffload.common.runtime import env, trace
from dpuoffload.common.runtime.hostgroup import FixedGroup, HostGroup
from dpuoffload.common.runtime.metrics import JsonlLog, PhaseTimer
from dpuoffload.common.runtime.report import Reports, build_reports
from dpuoffload.common.runtime.roles import Topology
from dpuoffload.common.runtime.torchsetup import CLOCK
from dpuoffload.common.state.resume import ResumePoint
from dpuoffload.common.state.sharding import state_digest
from dpuoffload.common.state.trainstate import EpochProgress, EpochSpan, Position, epoch_spans
from dpuoffload.common.train.allreduce import GradientSync
from dpuoffload.common.train.device import Compute, Finish, Staging, to_host
from dpuoffload.common.train.evaluation import (
    SharePolicy,
    Validation,
    allreduce_sums,
    metrics_from_sums,
)
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


@dataclass(frozen=True)
class StepOutcome:
    """A step's loss and correct count, still tensors (on the device the step ran on).

    Why not floats: reading a GPU tensor waits for the kernels that make it, and a read right after
    queuing the step (the trainer used to `float(loss)` every step) leaves the GPU idle while the
    CPU queues the optimizer and the next step. The trainer reads a step's outcome a step later
    (`Trainer.train_epoch`), when the GPU has long finished it; the values, and so every record,
    are the same. On a CPU the tensors are ready at once: nothing changes there.
    """

    loss: Optional[torch.Tensor] = None      # the batch's mean loss (None: an empty batch)
    correct: Optional[torch.Tensor] = None   # how many of its samples the model got right
    count: int = 0                           # its samples

    def read(self) -> tuple[float, int]:
        """(loss, correct) as numbers: waits for the step's kernels on a GPU."""
        if self.loss is None or self.correct is None:
            return 0.0, 0
        return float(self.loss), int(self.correct)


class Trainer:
    def __init__(self, cfg: RunConfig, topo: Topology, job: TrainJob, sync: GradientSync,
                 validation: Validation, share_policy: Optional[SharePolicy] = None,
                 group: Optional[HostGroup] = None, *, faults: Faults,
                 state: Optional[TrainingState] = None, recovery: Optional[RecoveryHooks] = None,
                 hooks: Optional[Callable[["Trainer"], Optional[StateHooks]]] = None, joining: bool = False) -> None:
        """`faults`: the run's failure record (`--inject` notes its moments there; the state hooks
        ask it which keepers are dead). `hooks` builds this trainer's state hooks, called once at the
        end of the constructor (they need its optimizer and schedule; `host.extensions.HooksFactory`);
        None or a build that returns None: no hand-offs, and no "handoff" phase in the timings.
        `state`: the model, optimizer and schedule it steps (built here from the job's model when
        None; given when another part must hold the same objects: rollback packs them for a spare).
        `recovery`: what `--recovery` does after a host rank's death (None: a death ends the job).
        `joining`: a spare rank taking a dead host rank's seat mid-run (`--recovery rollback`): the
        run's logs are appended to, and its weights come with the state, not from a broadcast."""
        self.cfg, self.topo, self.sync, self.faults = cfg, topo, sync, faults
        seed_training(cfg.seed, topo.side_rank)  # (a resume, a clone's or a spare's state restores its own later)
        # all training replicas (a SurvivorGroup under --recovery lossy-forward: fewer once a host rank died)
        self.comm: HostGroup = FixedGroup.of_side(topo) if group is None else group
        self.validation, self.share_policy = validation, share_policy
        self.criterion = nn.CrossEntropyLoss()
        self.compute = job.compute
        self.scaler = torch.amp.GradScaler(job.compute.device.type) if job.compute.scales_loss else None
        self.feed = job.feed
        self.stream = sharded_of(job.train)  # a stream of shards: its epochs' padding and drops go in the records
        self.train_set = job.train.dataset    # (--skip-corrupt: an epoch's full sample count)
        self.total_steps = cfg.epochs * self.feed.steps()
        self.state = TrainingState.build(cfg, job.model, self.total_steps) if state is None else state
        self.model, self.optimizer, self.scheduler = self.state.model, self.state.optimizer, self.state.scheduler
        self.partial = self.state.pending  # (the records still waiting for validation: rollback's state carries them)
        self.timer = PhaseTimer()
        self.staging: Optional[Staging] = None  # on a GPU, the epoch's batches a step ahead
        self.finish: Optional[Finish] = None    # ...and the uint8 wire's float steps run there (`device_finish`)
        self.phase_log = JsonlLog(cfg.log_dir, f"phases-rank{topo.world_rank}.jsonl")
        self.metrics_log = JsonlLog(cfg.log_dir if self.is_leader else None, "metrics.jsonl", replace=not joining)
        self.joining = joining
        self.start = Position()
        self.global_step = 0
        self.resumed_progress: Optional[EpochProgress] = None
        self.label = ""  # printed before each epoch line ("[clone] " in a clone group)
        self.reports = Reports([])  # --tensorboard / --plots, built in `fit` once the label is known
        self.step_times: list[float] = []  # seconds of each step of the epoch in flight
        self._t_step = time.perf_counter()  # when the step in flight began
        self.injector = inject.for_rank(cfg.inject, topo, faults.note)  # --inject: this rank fails on purpose
        self.simulator = FailureSimulator(cfg.inject_simulate, cfg.simulate_recovery, self.total_steps, self.size) \
            if cfg.inject_simulate else None  # --inject-simulate: the study's failures, no process lost
        self.recovery = recovery
        built = hooks(self) if hooks is not None else None
        self.hands_off = built is not None  # time the hooks as their own phase only when there are some
        self.hooks: StateHooks = built if built is not None else NoHooks()
        self.at = Position()  # the step in flight (rollback hands a spare the state before it)

    @property
    def size(self) -> int:
        return self.comm.Get_size()

    @property
    def is_leader(self) -> bool:
        """Replica 0 of the group (host rank 0, or clone rank 0) prints and writes the metrics."""
        return self.comm.Get_rank() == 0

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
        self.reports = build_reports(self.cfg, self.is_leader, "clone" if self.label else "")
        self.finish = self.device_finish()
        CLOCK.mark("allreduce, trainer, parameters broadcast")  # (before the first batch: the loader opens lazily)
        records: list[dict[str, Any]] = []
        for span in epoch_spans(self.feed.steps(), self.cfg.epochs, self.start, self.cfg.stop_at_step):
            self.run_epoch(span)
            records += self.complete_all(self.validation.ready())
            if span.completes and self.recovery is not None and self.recovery.between_epochs(span.epoch,
                                                                                              self.global_step):
                self.recovered(span.epoch, -1)  # (the spares called in are reported)
        records += self.complete_all(self.validation.finish())
        self.reports.close()
        self.hooks.finish()
        startup = CLOCK.parts()  # (where this process's start to its training went: what a short job pays)
        final = {"event": "end", "weights_sha256": state_digest(self.model), "global_step": self.global_step,
                 "allreduce": self.sync.name, "host_ranks": len(self.topo.host_ranks), "replicas": self.size,
                 "startup_s": round(sum(startup.values()), 3), "startup_parts_s": startup}
        if self.is_leader:  # (a rank that led for a while under --recovery keeps its log open)
            self.metrics_log.write(final)
        if self.is_leader and self.cfg.save_weights:
            save_state_dict(self.model, self.cfg.save_weights)
        return records

    def run_epoch(self, span: EpochSpan) -> None:
        """Train (part of) an epoch; at its end, hand validation off (or do it) and keep the epoch's
        record until its metrics come. A run stopped mid-epoch (--stop-at-step) logs no record."""
        epoch = span.epoch
        self.timer.reset()
        t0 = time.perf_counter()
        train_sums, losses, batch_digest, samples = self.train_epoch(span)
        train_time = time.perf_counter() - t0
        if not span.completes:
            return
        share = self.dpu_share(train_time)
        trace.set_position(epoch=epoch)
        with self.timer.phase("validation"):
            self.sync.broadcast_buffers_(self.model)
            self.validation.epoch_end(epoch, share)
        share = share if getattr(self.validation, "offloads", True) else 0.0  # (validated on the host ranks)
        # (kept before a spare is seated, between epochs: its state carries the records still waiting)
        self.partial[epoch] = record = self.train_record(epoch, train_sums, losses, (time.perf_counter() - t0,
                                                                                     train_time), share)
        self.recovered(epoch, -1)  # (a host rank lost in the epoch's end work)
        self.handoff(lambda: self.hooks.after_epoch(Position(epoch + 1, 0, self.global_step)))
        epoch_time = time.perf_counter() - t0
        record.update(epoch_time=epoch_time, phase_shares=self.timer.shares(epoch_time))
        self.phase_log.write({"epoch": epoch, "world_rank": self.topo.world_rank, "role": self.topo.role.name.lower(),
                              "epoch_time": epoch_time, "steps": span.stop - span.start,
                              "phases": dict(self.timer.totals), "batch_digest": batch_digest,
                              "samples": samples, "skipped_corrupt": self.feed.skipped(epoch),
                              "first_global_step": self.global_step - len(self.step_times) + 1,
                              "step_times": self.step_times})

    def dpu_share(self, train_time: float) -> float:
        """Fraction of the validation set the DPU ranks evaluate this epoch (0 without mv)."""
        return self.share_policy(train_time) if self.share_policy is not None else 0.0

    def complete_all(self, results: list[tuple[int, np.ndarray]]) -> list[dict[str, Any]]:
        """`complete` each epoch of `results` this rank keeps a record of (a spare seated under
        --recovery rollback has none of the epochs before it joined, unless they came with its state)."""
        return [self.complete(e, sums) for e, sums in results if e in self.partial]

    def complete(self, epoch: int, val_sums: np.ndarray) -> dict[str, Any]:
        """Merge validation results into the epoch's record; host rank 0 logs and prints it."""
        record = self.partial.pop(epoch)
        val_loss, val_acc = metrics_from_sums(val_sums)
        record.update(val_loss=val_loss, val_acc=val_acc, val_loss_sum=float(val_sums[0]),
                      val_correct=int(val_sums[1]), val_count=int(val_sums[2]))
        if self.is_leader:
            self.metrics_log.write(record)
            print(self.label + format_epoch_line(record, self.cfg.epochs), flush=True)
            self.reports.add_epoch(record)
        return record

    def train_epoch(self, span: EpochSpan) -> tuple[np.ndarray, list[float], Optional[str], int]:
        """Train steps [span.start, span.stop) of an epoch; return [loss, correct, count] summed over
        replicas, this replica's step losses, the digest of its batches (`--digest-batches`) and its
        sample count. A resumed epoch starts from the interrupted epoch's sums and losses."""
        self.model.train()
        progress = self.resumed_progress if span.start > 0 and self.resumed_progress else EpochProgress()
        self.resumed_progress = None
        digest = hashlib.sha256() if self.cfg.digest_batches else None
        bar = tqdm(total=span.stop, initial=span.start, desc=f"epoch {span.epoch + 1}/{self.cfg.epochs}",
                   unit="step", leave=False, file=sys.stdout, mininterval=1.0, ncols=100, nrows=100,  # mpirun
                   # hides the terminal size from ranks and tqdm would hide a bar it thinks off-screen
                   disable=not (self.cfg.progress and self.is_leader and env.progress_wanted()))
        batches = self.feed.epoch(span.epoch, span.start, span.stop)
        self.staging = self.compute.staging(batches, self.finish)  # a GPU: each batch's copy a step ahead
        batches = self.staging if self.staging is not None else batches
        self.step_times, self._t_step = [], time.perf_counter()
        rate = SampleRate(self.size) if not bar.disable else None
        pending: Optional[StepOutcome] = None  # the last step, not read yet (`StepOutcome`)
        trace.set_position(epoch=span.epoch, step=self.global_step + 1)
        for i, (x, y) in enumerate(self.timed(batches), start=span.start):
            if digest is not None:
                digest.update(self.trained_on(x).numpy().tobytes())
                digest.update(y.numpy().tobytes())
            total = self.feed.global_samples(i)
            own = y
            if self.recovery is not None:  # this rank's share of dead host ranks' batches
                (x, y), total = self.recovery.batch(span.epoch, i, (x, y), total)
            self.at = Position(span.epoch, i, self.global_step)
            outcome = self.step(x, y, total, staged=y is own)
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
            if rate is not None:  # progress bar on: the last loss read and the job's samples/s so far this epoch
                speed = rate.add(len(y), self.feed.global_samples(i))
                shown = f"loss {loss:.3f}, " if loss is not None else ""
                bar.set_postfix_str(f"{shown}{speed:.0f} samples/s", refresh=False)
            bar.update(1)
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

    def device_finish(self) -> Optional[Finish]:
        """On a GPU, the uint8 wire's float steps taken from the feed, to run after each batch's copy
        (`DpuLoader.defer_float_steps`: `--wire uint8`). None on the CPU; under `--recovery`, where a
        takeover joins batches built here (float) to the feed's; and for a feed without them (an
        extension's own feed may leave the method out)."""
        defer = getattr(self.feed, "defer_float_steps", None)
        if self.compute.device.type != "cuda" or self.recovery is not None or defer is None:
            return None
        return defer()

    def trained_on(self, x: torch.Tensor) -> torch.Tensor:
        """The images the model gets for the batch `x` the feed gave (`--digest-batches`): `x`, or
        where the float steps run on the GPU, the finished batch back in host memory (slow: a digest
        is a check, not a hot path), so that the digest covers the GPU's arithmetic too."""
        if self.staging is None or self.finish is None or x.dtype != torch.uint8:
            return x
        return to_host(self.staging.on_device()[0]).contiguous()

    def recovered(self, epoch: int, step: int) -> None:
        """Under --recovery: report the host ranks the last collectives lost (the new host rank 0
        takes the metrics log over if host rank 0 was lost; lossy forward's report comes from it,
        rollback's from the rank that sent the state)."""
        if self.recovery is None:
            return
        for failure in self.recovery.check(epoch, step, self.global_step):
            if self.is_leader and self.metrics_log.path is None:  # host rank 0 was lost: this one logs now
                self.metrics_log = JsonlLog(self.cfg.log_dir, "metrics.jsonl", replace=False)
            if not self.recovery.reports(failure, self.is_leader):
                continue
            report = self.recovery.report(failure, self.topo, self.step_times + [time.perf_counter() - self._t_step])
            print(report["line"], flush=True)
            log = self.metrics_log if self.is_leader else JsonlLog(self.cfg.log_dir, "metrics.jsonl", replace=False)
            log.write(report["record"])

    def handoff(self, hook: Any) -> None:
        """Run a state hand-off hook, timed as its own phase only when checkpoints or clones are on."""
        if not self.hands_off:
            return
        with self.timer.phase("handoff"):
            hook()

    def timed(self, batches: Iterator[Batch]) -> Iterator[Batch]:
        """Yield from `batches`, timing every fetch (the last one too: the feed's epoch epilogue)."""
        while True:
            with self.timer.phase("data"):
                batch = next(batches, None)
            if batch is None:
                return
            yield batch

    def step(self, x: torch.Tensor, y: torch.Tensor, total: Optional[int], replay: bool = False,
             staged: bool = True) -> StepOutcome:
        """One SGD step. `total` None: every replica has an equal batch, gradients are averaged.
        Otherwise the loss is scaled by n_i / total and gradients summed: the sample-weighted mean.
        `staged` False: the batch is not the feed's (a takeover added to it), so not the one staged
        on the GPU.
        A step `--inject-simulate` fails loses gradients before the allreduce (`common.faults.simulate`)
        and, with immediate rollback, is replayed (`replay`) on the state it left."""
        failure = None if replay or self.simulator is None else self.simulator.at(self.global_step + 1)
        outcome, out, mean = StepOutcome(), None, None
        with self.timer.phase("forward_backward"):
            self.optimizer.zero_grad(set_to_none=False)
            if len(y):
                staging = self.staging if staged and not replay else None
                x, y = staging.on_device() if staging is not None else self.compute.inputs(x, y)
                with self.compute.autocast():
                    out = self.model(x)
                    mean = self.criterion(out, y)
                weighted = mean if total is None else mean * (len(y) / total)
                (weighted if self.scaler is None else self.scaler.scale(weighted)).backward()
        self.prefetch(replay)  # on a GPU the next batch's copy runs beside the queued backward pass
        if out is not None and mean is not None:  # (queued, not read: `StepOutcome`)
            outcome = StepOutcome(mean.detach(), (out.detach().argmax(1) == y).sum(), len(y))
        with self.timer.phase("allreduce"):
            grads = self.gradients()
            if failure is not None:
                self.announce(failure, lose_gradients(grads, failure, self.comm.Get_rank(), self.size), len(grads))
            with self.recovery.replayable(outcome, self.at) if self.recovery is not None else contextlib.nullcontext():
                self.sync.allreduce_gradients_(grads, average=total is None, weight=len(y) / total if total else 1.0)
        with self.timer.phase("optimizer"):
            self.hooks.before_optimizer_step()
            if self.scaler is None:
                self.optimizer.step()
            else:  # the same scaled gradients on every replica: the same skip-or-step decision
                self.scaler.step(self.optimizer)
                self.scaler.update()
            if failure is not None and failure.replays:  # the same mini-batch again, at the same LR
                return self.step(x, y, total, replay=True)
            self.scheduler.step()
        return outcome

    def prefetch(self, replay: bool) -> None:
        """On a GPU: take the next batch and queue its copy now, while the queued backward pass runs
        (timed as data: it is the wait for the next batch, moved earlier)."""
        if self.staging is None or replay:
            return
        with self.timer.phase("data"):
            self.staging.prefetch()

    def announce(self, failure: StepFailure, lost: int, total: int) -> None:
        """One line and one metrics record per simulated failure (replica 0)."""
        if self.is_leader:
            print(f"[dpuoffload] {self.label}{failure.describe(self.size, lost, total)}", flush=True)
            self.metrics_log.write({"event": "simulated_failure", "global_step": failure.global_step,
                                    "casualties": list(failure.casualties), "progress": failure.progress,
                                    "recovery": failure.recovery, "gradients_lost": lost, "gradients": total})

    def gradients(self) -> list[torch.Tensor]:
        """Every parameter's gradient; zeros where this replica had no samples (it still takes part)."""
        grads: list[torch.Tensor] = []
        for p in self.model.parameters():
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            grads.append(p.grad)
        return grads

    def train_record(self, epoch: int, train_sums: np.ndarray, losses: list[float], times: tuple[float, float],
                     share: float) -> dict[str, Any]:
        """The epoch's record before validation; `times`: (epoch, training) seconds. samples_per_s is
        the whole job's: every replica's training samples of the epoch over its training time."""
        train_loss, train_acc = metrics_from_sums(train_sums)
        epoch_time, train_time = times
        return {"event": "epoch", "epoch": epoch, "train_loss": train_loss, "train_acc": train_acc,
                "epoch_time": epoch_time, "train_time": train_time, "global_step": self.global_step,
                "samples_per_s": float(train_sums[2]) / train_time if train_time > 0 else 0.0,
                "lr": self.scheduler.get_last_lr()[0], "val_dpu_share": share,
                "phase_shares": self.timer.shares(epoch_time), "step_losses": losses,
                "weights_sha256": state_digest(self.model), **self.stream_balance(epoch),
                **self.left_out(train_sums)}

    def left_out(self, train_sums: np.ndarray) -> dict[str, Any]:
        """`--skip-corrupt`: the epoch's samples no host rank trained on, over all of them (the epoch's
        full count minus the trained one); each rank's own count is in its phase log."""
        if not self.cfg.skip_corrupt or self.recovery is not None:  # (with recovery a lost rank's samples would count)
            return {}
        hosts = len(self.topo.host_ranks)
        full = sum(Sampling.of(self.cfg, hosts, 0).batch_sizes(self.train_set)) * hosts
        return {"skipped_corrupt": full - int(train_sums[2])}

    def stream_balance(self, epoch: int) -> dict[str, Any]:
        """A stream's epoch: the samples its host ranks repeated to train equal epochs (padded) and
        left for another epoch (dropped), over all host ranks (`ShardPlan.balance`); {} for a map-style set."""
        if self.stream is None:
            return {}
        plan = self.stream.plan(len(self.topo.host_ranks), self.cfg.seed)
        return {"stream": {"shards": len(self.stream.shards), "samples": len(self.stream), **plan.balance(epoch)}}


class SampleRate:
    """The job's training samples per second since the epoch (or its resumed part) began, from one
    replica's view: its batch times the replica count, or the step's global count (naive mode)."""

    def __init__(self, replicas: int) -> None:
        self.replicas, self.samples, self.t0 = replicas, 0, time.perf_counter()

    def add(self, batch: int, global_samples: Optional[int]) -> float:
        self.samples += global_samples if global_samples is not None else batch * self.replicas
        return self.samples / max(time.perf_counter() - self.t0, 1e-9)


_SHORT = {"data": "data", "forward_backward": "fwd/bwd", "allreduce": "allreduce",
          "optimizer": "opt", "validation": "val", "handoff": "ckpt"}


def format_epoch_line(rec: dict[str, Any], epochs: int) -> str:
    shares = " ".join(f"{_SHORT.get(k, k)} {v:.0%}" for k, v in rec["phase_shares"].items())
    stream = rec.get("stream") or {}
    evened = (f" | stream: {stream['padded']} repeated, {stream['dropped']} left for later (uneven shards)"
              if stream.get("padded") or stream.get("dropped") else "")
    return (f"epoch {rec['epoch'] + 1}/{epochs} | train loss {rec['train_loss']:.4f} acc "
            f"{rec['train_acc']:.1%} | val loss {rec['val_loss']:.4f} acc {rec['val_acc']:.1%} | "
            f"{rec['epoch_time']:.1f} s, {rec['samples_per_s']:.0f} samples/s | {shares}{evened}")
