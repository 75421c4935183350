"""One SGD step of a replica, as the trainer runs it: forward and backward (under AMP where asked),
the gradient allreduce (with `--recovery`'s hook around it), the optimizer step; on a GPU the batch
staged a step ahead and the uint8 wire's float steps run there; and the failures `--inject-simulate`
makes inside a step (lost gradients, a replay).

`Trainer` owns the epoch and its order (`common.train.loop`); `Stepper` owns what one step touches
on the device, so the GPU-only parts (`Staging`, `Finish`, the loss scaler) are in one place.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator, Optional

import torch
from torch import nn

from dpuoffload.common.data.feeds import Batch, Feed
from dpuoffload.common.faults.simulate import FailureSimulator, StepFailure, lose_gradients
from dpuoffload.common.runtime.hostgroup import HostGroup
from dpuoffload.common.runtime.metrics import PhaseTimer
from dpuoffload.common.state.trainstate import Position
from dpuoffload.common.train.allreduce import GradientSync
from dpuoffload.common.train.device import Compute, Finish, Staging, to_host
from dpuoffload.common.train.training_state import TrainingState

if TYPE_CHECKING:
    from dpuoffload.common.config import RunConfig
    from dpuoffload.common.train.loop import RecoveryHooks, StateHooks
    from dpuoffload.common.train.records import EpochRecords


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


class Stepper:
    """The step (see the module). `comm`: the training replicas (their count weighs a simulated
    failure's lost gradients); `hooks.before_optimizer_step` runs before the weights change."""

    def __init__(self, cfg: "RunConfig", state: TrainingState, compute: Compute, sync: GradientSync, comm: HostGroup,
                 timer: PhaseTimer, hooks: "StateHooks", recovery: Optional["RecoveryHooks"], records: "EpochRecords",
                 total_steps: int) -> None:
        self.state, self.compute, self.sync, self.comm, self.timer = state, compute, sync, comm, timer
        self.hooks, self.recovery, self.records = hooks, recovery, records
        self.criterion = nn.CrossEntropyLoss()
        self.scaler = torch.amp.GradScaler(compute.device.type) if compute.scales_loss else None
        self.staging: Optional[Staging] = None  # on a GPU, the epoch's batches a step ahead
        self.finish: Optional[Finish] = None    # ...and the uint8 wire's float steps run there (`device_finish`)
        self.simulator = FailureSimulator(cfg.inject_simulate, cfg.simulate_recovery, total_steps,
                                          comm.Get_size()) if cfg.inject_simulate else None  # --inject-simulate:
        # the study's failures, no process lost

    def device_finish(self, feed: Feed) -> None:
        """On a GPU, the uint8 wire's float steps taken from the feed, to run after each batch's copy
        (`DpuLoader.defer_float_steps`: `--wire uint8`). None on the CPU; under `--recovery`, where a
        takeover joins batches built here (float) to the feed's; and for a feed without them (an
        extension's own feed may leave the method out)."""
        defer = getattr(feed, "defer_float_steps", None)
        if self.compute.device.type == "cuda" and self.recovery is None and defer is not None:
            self.finish = defer()

    def epoch(self, batches: Iterator[Batch]) -> Iterator[Batch]:
        """The epoch's batches as the steps take them: on a GPU each batch's copy a step ahead."""
        self.staging = self.compute.staging(batches, self.finish)
        return self.staging if self.staging is not None else batches

    def trained_on(self, x: torch.Tensor) -> torch.Tensor:
        """The images the model gets for the batch `x` the feed gave (`--digest-batches`): `x`, or
        where the float steps run on the GPU, the finished batch back in host memory (slow: a digest
        is a check, not a hot path), so that the digest covers the GPU's arithmetic too."""
        if self.staging is None or self.finish is None or x.dtype != torch.uint8:
            return x
        return to_host(self.staging.on_device()[0]).contiguous()

    def step(self, x: torch.Tensor, y: torch.Tensor, total: Optional[int], at: Position, replay: bool = False,
             staged: bool = True) -> StepOutcome:
        """One SGD step at `at`. `total` None: every replica has an equal batch, gradients are averaged.
        Otherwise the loss is scaled by n_i / total and gradients summed: the sample-weighted mean.
        `staged` False: the batch is not the feed's (a takeover added to it), so not the one staged
        on the GPU.
        A step `--inject-simulate` fails loses gradients before the allreduce (`common.faults.simulate`)
        and, with immediate rollback, is replayed (`replay`) on the state it left."""
        state = self.state
        failure = None if replay or self.simulator is None else self.simulator.at(at.global_step + 1)
        outcome, out, mean = StepOutcome(), None, None
        with self.timer.phase("forward_backward"):
            state.optimizer.zero_grad(set_to_none=False)
            if len(y):
                staging = self.staging if staged and not replay else None
                x, y = staging.on_device() if staging is not None else self.compute.inputs(x, y)
                with self.compute.autocast():
                    out = state.model(x)
                    mean = self.criterion(out, y)
                weighted = mean if total is None else mean * (len(y) / total)
                (weighted if self.scaler is None else self.scaler.scale(weighted)).backward()
        self.prefetch(replay)  # on a GPU the next batch's copy runs beside the queued backward pass
        if out is not None and mean is not None:  # (queued, not read: `StepOutcome`)
            outcome = StepOutcome(mean.detach(), (out.detach().argmax(1) == y).sum(), len(y))
        with self.timer.phase("allreduce"):
            grads = self.gradients()
            if failure is not None:
                self.announce(failure, lose_gradients(grads, failure, self.comm.Get_rank(), self.comm.Get_size()),
                              len(grads))
            with self.recovery.replayable(outcome, at) if self.recovery is not None else contextlib.nullcontext():
                self.sync.allreduce_gradients_(grads, average=total is None, weight=len(y) / total if total else 1.0)
        with self.timer.phase("optimizer"):
            self.hooks.before_optimizer_step()
            if self.scaler is None:
                state.optimizer.step()
            else:  # the same scaled gradients on every replica: the same skip-or-step decision
                self.scaler.step(state.optimizer)
                self.scaler.update()
            if failure is not None and failure.replays:  # the same mini-batch again, at the same LR
                return self.step(x, y, total, at, replay=True)
            state.scheduler.step()
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
        if self.comm.Get_rank() == 0:
            print(f"[dpuoffload] {self.records.label}{failure.describe(self.comm.Get_size(), lost, total)}",
                  flush=True)
        self.records.note({"event": "simulated_failure", "global_step": failure.global_step,
                           "casualties": list(failure.casualties), "progress": failure.progress,
                           "recovery": failure.recovery, "gradients_lost": lost, "gradients": total})

    def gradients(self) -> list[torch.Tensor]:
        """Every parameter's gradient; zeros where this replica had no samples (it still takes part)."""
        grads: list[torch.Tensor] = []
        for p in self.state.model.parameters():
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            grads.append(p.grad)
        return grads
