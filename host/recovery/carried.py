"""`--recovery rollback`: what rides in every step's gradient allreduce besides the gradients.

`Carried` is `MpiSync`'s passenger under rollback: host rank 0's BatchNorm buffers
(`SeatZeroBuffers`) and every seat's epoch progress (`SeatProgress`), so that a spare called into
any seat, host rank 0's too, starts from that seat's own state before the step.

Why the buffers: parameters and optimizer state are the same on every host rank (data parallelism's own
redundancy), so a spare that replays a dead rank's step gets them from any survivor. BatchNorm
running statistics are not: each rank updates its own from its own batches, and the epoch's end
makes every rank's equal to host rank 0's (`GradientSync.broadcast_buffers_`). Those of seat 0 were
on seat 0 alone, so its death lost them for the rest of the epoch, and with them the run's weights
and validation to the bit. Here seat 0 adds its buffers (a few KB for resnet20, 0.2 MB for
resnet50, beside its 100 MB of gradients) to the allreduce it makes anyway, every other seat adds
zeros, so after each step every seated rank holds seat 0's buffers before the next step: what a
spare called into seat 0 starts from, and what the epoch's end sets on every rank (no broadcast).

Exact because x + 0 = x in IEEE arithmetic for every finite x but -0.0 (BatchNorm's updates never
make -0.0 from its +0.0 start; every rank, seat 0 too, takes the sums, so all agree either way),
and integer buffers (`num_batches_tracked`) are exact in float32 below 2**24 steps. A model with
floating buffers of another dtype than its gradients carries nothing: the epoch's end then
broadcasts as without recovery, and only seat 0's death is inexact, as before.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Optional

import numpy as np
import torch
from torch import nn

from dpuoffload.common.runtime.hostgroup import HostGroup
from dpuoffload.common.state.trainstate import EpochProgress

if TYPE_CHECKING:
    from dpuoffload.common.train.step import StepOutcome

SLOT = 3   # a seat's part of `SeatProgress`'s message: its step's mean loss, correct count, sample count


class SeatZeroBuffers:
    """Seat 0's buffers as of the last completed step, on every seated rank (`allreduce.Passenger`)."""

    def __init__(self, model: nn.Module, group: HostGroup) -> None:
        self.group = group
        self.buffers = list(model.named_buffers())
        self.dtype = next(model.parameters()).dtype   # the gradients' (the message's) dtype
        exact = all(b.dtype == self.dtype or not b.is_floating_point() for _, b in self.buffers)
        self.size = sum(b.numel() for _, b in self.buffers) if exact else 0
        self.latest: Optional[torch.Tensor] = None   # flat, in `dtype`; None before a first step

    def begin_step(self) -> None:
        """Before a step's forward, on its first step since this process began training: this
        rank's own buffers are seat 0's then (the parameters' broadcast made them so, or a spare
        was just handed them)."""
        if self.latest is None and self.size:
            self.latest = self._flat()

    def outgoing(self, dtype: torch.dtype) -> torch.Tensor:
        """This rank's part of the step's message: seat 0 its buffers, the others zeros."""
        if dtype != self.dtype or not self.size:
            return torch.empty(0, dtype=dtype)
        return self._flat() if self.group.Get_rank() == 0 else torch.zeros(self.size, dtype=dtype)

    def arrived(self, summed: torch.Tensor) -> None:
        """The step's summed part (empty when the model carries nothing): seat 0's buffers now."""
        if summed.numel():
            self.latest = summed.clone()   # (a view would keep the step's whole summed message alive)

    def pre_step(self) -> Optional[dict[str, torch.Tensor]]:
        """Seat 0's buffers before the step in flight (what a spare in any seat starts from), by
        name; None when the model carries nothing, or before a first step."""
        if self.latest is None:
            return None
        out, offset = {}, 0
        for name, b in self.buffers:
            out[name] = self.latest[offset: offset + b.numel()].view(b.shape).to(b.dtype)
            offset += b.numel()
        return out

    def set_buffers(self, model: nn.Module) -> bool:
        """The epoch's end: every rank takes seat 0's buffers from the last step's message; False
        when there is none (the caller broadcasts instead)."""
        latest = self.pre_step()
        if latest is None:
            return False
        with torch.no_grad():
            for name, b in model.named_buffers():
                b.copy_(latest[name])
        return True

    def _flat(self) -> torch.Tensor:
        return torch.cat([b.detach().reshape(-1).cpu().to(self.dtype) for _, b in self.buffers])


class SeatProgress:
    """Every seat's progress in the epoch (its step losses and [loss sum, correct, count], as
    `Trainer.record_step` keeps them) as of the last completed step, on every seated rank.

    Why: each rank's progress was its own, so a spare replaying a dead rank's step started its epoch
    record empty: the epoch's training loss lacked the dead rank's steps before the failure, and
    after host rank 0's death (whose records are the run's) so did the logged step losses; a rank
    lost in the epoch's end work was missing from the totals (`Rollback.epoch_totals` now adds them
    up from here). Each seat adds its step's loss, correct count and sample count to the step's
    allreduce (three numbers in its own slot, zeros in the others'), and every rank adds them to each
    seat's progress with the same arithmetic as the seat itself: the same float64 sums, to the bit.
    A loss of the gradients' dtype (float32 for a float32 model) travels exactly; counts do below
    2**24.

    A mid-epoch resume from a checkpoint or DPU memory starts it from every rank's record in the
    loaded state (`Rollback.resumed`). Unknown (None) only in an epoch this process began mid-way
    from a state without them (a re-sliced resume, whose records start afresh anyway): a spare
    called then starts its epoch record empty, and the epoch's totals are the allreduce's.
    """

    def __init__(self, group: HostGroup) -> None:
        self.group = group
        self.epoch: Optional[int] = None
        self.seats: Optional[list[EpochProgress]] = None
        self.outcome: Optional["StepOutcome"] = None   # this rank's step in flight

    def begin_step(self, epoch: int, step: int) -> None:
        """Before a step's forward: a new epoch starts every seat's progress empty."""
        if epoch != self.epoch:
            self.epoch = epoch
            self.seats = [EpochProgress() for _ in range(self.group.Get_size())] if step == 0 else None

    def adopt(self, epoch: int, seats: list[EpochProgress]) -> None:
        """Every seat's progress in `epoch` so far, from a loaded state (a resume) or the state a
        spare was sent (`Rollback.resumed`); at an epoch's first step `begin_step` starts it empty."""
        self.epoch, self.seats = epoch, seats

    def at(self, epoch: int) -> Optional[list[EpochProgress]]:
        """Every seat's progress in `epoch` (None: not the epoch in flight here, or unknown): what
        a spare called in at a position of `epoch` gets (at an epoch's start the last one's is done)."""
        return self.seats if epoch == self.epoch else None

    def carry(self, outcome: "StepOutcome") -> None:
        self.outcome = outcome

    def outgoing(self, dtype: torch.dtype) -> torch.Tensor:
        out = torch.zeros(SLOT * self.group.Get_size(), dtype=dtype)
        if self.outcome is not None:
            loss, correct = self.outcome.read()
            rank = self.group.Get_rank()
            out[SLOT * rank: SLOT * (rank + 1)] = torch.tensor([loss, correct, self.outcome.count], dtype=torch.float64)
        return out

    def arrived(self, summed: torch.Tensor) -> None:
        self.outcome = None
        if self.seats is None:
            return
        for seat, (loss, correct, count) in zip(self.seats, summed.view(-1, SLOT).tolist()):
            seat.losses.append(loss)
            seat.sums += (loss * int(count), int(correct), int(count))


class Carried:
    """`MpiSync`'s passenger under rollback (`allreduce.Passenger`): the buffers, then the progress."""

    def __init__(self, model: nn.Module, group: HostGroup) -> None:
        self.buffers, self.progress = SeatZeroBuffers(model, group), SeatProgress(group)
        self._split = 0

    def begin_step(self, epoch: int, step: int) -> None:
        self.buffers.begin_step()
        self.progress.begin_step(epoch, step)

    def outgoing(self, dtype: torch.dtype) -> torch.Tensor:
        buffers = self.buffers.outgoing(dtype)
        self._split = len(buffers)
        return torch.cat([buffers, self.progress.outgoing(dtype)])

    def arrived(self, summed: torch.Tensor) -> None:
        self.buffers.arrived(summed[:self._split])
        self.progress.arrived(summed[self._split:])

    def set_buffers(self, model: nn.Module) -> bool:
        return self.buffers.set_buffers(model)


def encode_seats(seats: Optional[list[EpochProgress]]) -> str:
    """Every seat's progress as JSON (Python's floats round-trip exactly), for the state message."""
    return json.dumps(None if seats is None else [[p.sums.tolist(), p.losses] for p in seats])


def decode_seats(text: Optional[str]) -> Optional[list[EpochProgress]]:
    if not text:
        return None
    seats = json.loads(text)
    return None if seats is None else [EpochProgress(np.asarray(s, dtype=np.float64), list(losses))
                                       for s, losses in seats]
