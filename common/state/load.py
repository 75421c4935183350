"""One way to load training state into live objects, wherever the state came from.

Four origins hand a rank of the host program the training state:

- a checkpoint on disk (`--resume`; `StateSource.of_checkpoint`),
- the keepers' DPU memory (`--resume latest --ckpt-mem-keep K`; `host.checkpoint.state_from_memory`),
- the clone hand-off, forwarded by the keepers (`--clone-at`; `host.clone.assemble`),
- a survivor's packed state (`--recovery rollback`; `host.recovery.spares.packed_source`).

Each arrives as a `StateSource`: the typed meta, every shared tensor whole, and the local states
it carries. `load_state` is the one code path that puts a source into the model, optimizer and
scheduler, restores the RNG states last, and says where the loop continues:

- **One re-slicing rule** (`common.state.meta.reslice_position`): the position moves so that the
  same number of the epoch's samples is done when the samples per step (host ranks x batch size)
  differ between the run that wrote the state and this one.
- **Exact** when both runs slice alike (same host rank count, the position unchanged): each rank
  adopts its own counterpart's local state (BatchNorm buffers, RNG, the epoch's record so far) and
  the run continues to the bit. Otherwise every rank takes the first local state the source carries
  (host rank 0's) and the interrupted epoch's record starts afresh. A source that carries a single
  local state (a clone rank's assigned one, `StateAssignment.local_state_of`; a spare's sender's)
  gives that one either way.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Mapping, Optional

import torch

from dpuoffload.common.state.ckptfiles import Checkpoint
from dpuoffload.common.state.meta import CheckpointMeta, Position, Slicing, reslice_position
from dpuoffload.common.state.trainstate import EpochProgress, LocalState, restore, set_rng


@dataclass(frozen=True)
class StateSource:
    """Training state as it arrived from one origin, not yet in any live object.

    Attributes:
        meta: the run-level facts (position, catalog, optimizer groups, scheduler, ...).
        shared: every parameter and optimizer state tensor, whole, by catalog name.
        locals: the local states it carries, in host rank order (all of the writers', or the one
            this rank adopts).
        slicing: how the run that wrote it dealt samples.
    """

    meta: CheckpointMeta
    shared: Mapping[str, torch.Tensor]
    locals: tuple[LocalState, ...]
    slicing: Slicing

    @classmethod
    def of_checkpoint(cls, ckpt: Checkpoint) -> "StateSource":
        meta = CheckpointMeta.from_json(ckpt.meta)
        return cls(meta, ckpt.shared, tuple(ckpt.locals), meta.slicing)

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.shared.values())

    def local_for(self, rank: int, exact: bool) -> LocalState:
        """Rank `rank`'s local state: its counterpart's under the same slicing, else the first."""
        return self.locals[rank] if exact and len(self.locals) > 1 else self.locals[0]


@dataclass(frozen=True)
class Reader:
    """The rank that loads: its rank in its group, how its run deals samples, its epoch length
    (None: a script's loop, whose epochs the library does not know; the step is then not capped)."""

    rank: int
    slicing: Slicing
    steps_per_epoch: Optional[int] = None


@dataclass(frozen=True)
class Live:
    """The objects the state goes into; `scheduler` may be None (a script without one)."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any = None

    @classmethod
    def of(cls, trainer: Any) -> "Live":
        """The built-in `Trainer`'s model, optimizer and schedule."""
        return cls(trainer.model, trainer.optimizer, trainer.scheduler)


@dataclass(frozen=True)
class Loaded:
    """What `load_state` did: where to continue and with which epoch record.

    Attributes:
        start: the position this rank continues from (re-sliced to its run).
        progress: the interrupted epoch's record so far, when exact (else None: it starts afresh).
        exact: both runs slice alike, so the continuation is bit-exact.
        meta: the source's meta (a script's `extra=`, a spare's pending records ...).
        seats: every host rank's record of the interrupted epoch, in host rank order, when exact and
            the source carries them all (a checkpoint, DPU memory); else None. `--recovery rollback`
            needs them: a spare it calls into any seat in that epoch resumes the seat's record.
    """

    start: Position
    progress: Optional[EpochProgress]
    exact: bool
    meta: CheckpointMeta
    seats: Optional[tuple[EpochProgress, ...]] = None


def load_state(source: StateSource, into: Live, reader: Reader) -> Loaded:
    """Load `source` into `into`: parameters, BatchNorm buffers, optimizer and scheduler state,
    then the RNG states (last: nothing after them may draw a number before training does).

    Raises:
        ValueError: the state was written for another model (a parameter missing or of another shape).
    """
    written = source.meta.position
    start = reslice_position(written, source.slicing.per_step, reader.slicing.per_step, reader.steps_per_epoch)
    exact = start == written and source.slicing.host_ranks == reader.slicing.host_ranks
    local = source.local_for(reader.rank, exact)
    restore(into.model, into.optimizer, into.scheduler, source.meta, source.shared, local)
    set_rng(local.rng)
    every = exact and len(source.locals) == reader.slicing.host_ranks
    return Loaded(start, local.progress if exact else None, exact, source.meta,
                  tuple(copy.deepcopy(s.progress) for s in source.locals) if every else None)
