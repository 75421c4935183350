"""`--recovery lossy-forward` with spare ranks (`dpurun --spare-ranks S`): the host group grows back to
full size at the next epoch's start.

Lossy forward goes on without a dead host rank: its step's samples are lost and the survivors take its
batches over (`host.recovery.survivors`). A run that meets failures at a rate would otherwise shrink
with every one until no replica is left, so spares stand by as under rollback (`SparePool`), and the
seats lossy forward's deaths left vacant are filled once the epoch is done, from the state there:
parameters, optimizer and scheduler state (the same on every survivor) and the epoch records still
waiting for validation. At an epoch's start nothing else is per seat: the epoch's end made every rank's
BatchNorm buffers host rank 0's, and a new epoch's progress starts empty. The spare then trains the
seat's own batches (from the DPU rank that fed the seat in `--mode da`, else built itself), and the
survivors stop taking them over: from that epoch on the run trains as a full group would from the same
state (to the bit: `tests/jobs/test_lossy_forward.py`).

Why at the epoch's start and not at the next step: the epoch's records (the training loss over every
seat, the samples lost) are the shrunk group's to complete, the takeover's slices of a step are fixed
for the whole epoch, and the state a spare needs then is what every survivor already holds (no
passenger in the allreduce, unlike rollback's `Carried`). The cost: the rest of the epoch at the smaller
size. With fewer spares than vacant seats the lowest seats are filled and the rest stay taken over.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dpuoffload.common.faults.abort import PREFIX
from dpuoffload.common.state.trainstate import Position
from dpuoffload.common.train.training_state import TrainingState
from dpuoffload.host.recovery.spares import Regroup, SparePool, pack_state

if TYPE_CHECKING:
    from dpuoffload.common.runtime.roles import Topology
    from dpuoffload.host.recovery.survivors import SurvivorGroup


@dataclass(frozen=True)
class GrewBack:
    """One growth of the group: the spares called into vacant seats before `epoch` (its first epoch
    at the new size)."""

    regroup: Regroup
    epoch: int
    global_step: int
    size: int            # seated ranks after it
    start_size: int      # host ranks at the job's start


class GrowBack:
    """Fill the seats lossy forward's deaths left vacant from the spare pool, between epochs."""

    def __init__(self, group: "SurvivorGroup", pool: SparePool, state: TrainingState, epochs: int) -> None:
        self.group, self.pool, self.state, self.epochs = group, pool, state, epochs
        self.seen = 0   # the group's regroups already turned into events

    def fill(self, epoch: int, global_step: int) -> bool:
        """After epoch `epoch` is done: spares into the vacant seats, from the state here (collective
        over the seated ranks and the spares). Not after the last epoch; whether any was called in.
        Every seated rank knows the seats and the spares alike, so all decide the same."""
        if not self.pool.vacant or not self.pool.free or epoch + 1 >= self.epochs:
            return False
        position, t = Position(epoch + 1, 0, global_step), self.state
        self.group.fill(lambda: (position, pack_state(t.model, t.optimizer, t.scheduler, position, t.pending)),
                        every=False)
        return True

    def events(self, epoch: int, global_step: int) -> list[GrewBack]:
        """The growths since the last call (a regroup that called spares in), for their reports."""
        new = self.group.regroups[self.seen:]
        self.seen = len(self.group.regroups)
        size = self.group.Get_size()
        return [GrewBack(r, epoch, global_step, size, self.group.start_size) for _, r in new if r.called]

    def reports(self, event: GrewBack) -> bool:
        """The rank that sent the state reports (it has the transfer's figures)."""
        return event.regroup.sender == self.pool.topo.world_rank

    @staticmethod
    def report(event: GrewBack, topo: "Topology") -> dict[str, Any]:
        r = event.regroup
        seats = ", ".join(f"{topo.describe(w)} took host rank {seat}'s seat" for w, seat in r.called)
        sender = topo.describe(r.sender) if r.sender is not None else "a survivor"
        left = event.start_size - event.size
        rest = (f"; {left} seat(s) stay vacant, their batches taken over (no spare left)" if left else
                "; no batch is taken over from here on")
        line = (f"{PREFIX} the host group grows back: {seats} before epoch {event.epoch + 1} (global step "
                f"{event.global_step + 1}), with {sender}'s state ({r.nbytes / 1e6:.1f} MB in "
                f"{r.transfer_s * 1e3:.0f} ms, call-in {r.call_s * 1e3:.1f} ms): {event.size} of "
                f"{event.start_size} host ranks train{rest}")
        record = {"event": "grown_back", "strategy": "lossy-forward", "seats": [seat for _, seat in r.called],
                  "replaced_by": [list(c) for c in r.called], "state_from": r.sender, "epoch": event.epoch,
                  "global_step": event.global_step, "host_ranks_now": event.size, "host_ranks_start": event.start_size,
                  "call_in_s": r.call_s, "transfer_s": r.transfer_s, "bytes_moved": r.nbytes,
                  "reported_time": time.time()}  # (the group whole again, at the next epoch's start)
        return {"line": line, "record": record}
