"""`--recovery rollback`: spare host ranks (`dpurun --spare-ranks S`) take dead host ranks' places.

The recovery study's immediate mini-batch rollback (IR), with real lost processes, under ULFM:

- The *pool* is a communicator of the host and the spare ranks (`Topology.pool`). Every member
  knows the *seats*: which pool member trains in which host rank's place (at the start, host rank
  i in seat i). The seated members' communicator (`SparePool.active`) is what the trainer's
  `SurvivorGroup` reduces over; the spares stand by in a broadcast on the pool (`stand_by`).
- A host rank dies during a step's gradient allreduce: the survivors agree it failed
  (`SurvivorGroup.run`), revoke the pool (which wakes the spares), shrink it, and broadcast a
  *call-in*: which spare takes which vacant seat, at which position. The pool splits again (the
  spare at its seat's rank, so the ranks keep their order), and the lowest surviving seated rank
  sends the called spare the pre-step state: parameters, optimizer and scheduler state (the same on
  every survivor, data parallelism's own redundancy), and what only a seat held, host rank 0's
  BatchNorm buffers and the seat's epoch progress, which ride in every step's allreduce
  (`host.recovery.carried`). The spare takes the dead rank's batch of that step (from that rank's
  DPU rank in `da`, else built itself: per-sample seeds make it the same batch;
  `host.spare`), runs forward and backward and joins the survivors, who redo the
  allreduce with their own unchanged gradients: the step's result is the failure-free run's, to the bit.
- A death outside a step (in the epoch's end work) shrinks the seated ranks for that work, and
  the vacant seat is filled once the epoch is done, with the state there (nothing to replay).
- The state comes from a survivor, not from the DPU ranks' memory: only a checkpoint every step
  would put the pre-step state there, and every survivor holds it anyway (with what rides in the
  allreduce).

The call-in's message layout is `Command` (one definition, both sides).
"""

from __future__ import annotations

import contextlib
import dataclasses
import statistics
import struct
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping, Optional, Sequence

import numpy as np
import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from dpuoffload.common.data.feeds import Batch
from dpuoffload.common.errors import ConfigError, DeathNotSurvived, PeerLost
from dpuoffload.common.faults.abort import PREFIX
from dpuoffload.common.faults.policy import Recovery
from dpuoffload.common.faults.watch import Faults, Verdict, death_line
from dpuoffload.common.runtime.waits import wait, wait_all, wait_unless_lost
from dpuoffload.common.state.load import Live, Reader, StateSource, load_state
from dpuoffload.common.state.meta import CheckpointMeta, Slicing
from dpuoffload.common.state.trainstate import (
    EpochProgress,
    Position,
    capture_local,
    catalog_of,
    meta_of,
    parse_local,
    safetensors_metadata,
    shared_tensors,
)
from dpuoffload.common.train.training_state import TrainingState
from dpuoffload.host.recovery.carried import Carried, decode_seats, encode_seats

if TYPE_CHECKING:
    from mpi4py import MPI

    from dpuoffload.common.runtime.roles import Topology
    from dpuoffload.common.train.step import StepOutcome
    from dpuoffload.host.recovery.survivors import Shrink, SurvivorGroup

END, CALL_IN, REGROUP = 1, 2, 3      # Command.kind
STATE_TAG = 41                        # the state to a called spare, on the pool
STANDBY_MAX_SLEEP = 0.01              # a standing-by spare polls its broadcast this often


class NoSpareLeft(DeathNotSurvived):
    """A seat fell vacant and no spare rank is left to fill it: the death that vacated it ends the
    job (its line names that rank)."""


@dataclass(frozen=True)
class Command:
    """What the seated ranks tell the pool after a shrink, or at the end (int64 on the wire).

    Layout: [kind, epoch, step, global_step, replay, n, (pool start rank, seat) * n], padded to
    `Command.length(pool size)`.
    """

    kind: int
    position: Position = Position()
    replay: bool = False
    calls: tuple[tuple[int, int], ...] = ()   # (pool start rank of a spare, the seat it takes)

    @staticmethod
    def length(pool_size: int) -> int:
        return 6 + 2 * pool_size

    def encode(self, pool_size: int) -> np.ndarray:
        out = np.zeros(self.length(pool_size), dtype=np.int64)
        p = self.position
        out[:6] = (self.kind, p.epoch, p.step, p.global_step, int(self.replay), len(self.calls))
        for i, (member, seat) in enumerate(self.calls):
            out[6 + 2 * i: 8 + 2 * i] = (member, seat)
        return out

    @classmethod
    def decode(cls, buf: np.ndarray) -> "Command":
        kind, epoch, step, global_step, replay, n = (int(v) for v in buf[:6])
        calls = tuple((int(buf[6 + 2 * i]), int(buf[7 + 2 * i])) for i in range(n))
        return cls(kind, Position(epoch, step, global_step), bool(replay), calls)


@dataclass(frozen=True)
class Regroup:
    """One shrink of the pool (a seated or standing-by member died) and the call-in after it."""

    lost: tuple[int, ...]            # seats whose member died
    lost_world: tuple[int, ...]      # world ranks that died (seated or standing by)
    called: tuple[tuple[int, int], ...]  # (world rank of a spare, the seat it took)
    shrink_s: float
    call_s: float                    # the command and the split
    transfer_s: float                # the state to the called spares (0: none called)
    nbytes: int                      # bytes of state sent, per called spare
    sender: Optional[int]            # world rank that sent the state (and reports)
    replay: bool                     # the failed step is replayed by the spares

    @property
    def changed(self) -> bool:
        """Whether a member died or a spare took a seat (a regroup that found everyone alive and
        no seat to fill changed nothing but the communicator)."""
        return bool(self.lost_world or self.called)


@dataclass(frozen=True)
class CallIn:
    """What a called spare receives: its seat, where to start, and the state there."""

    seat: int
    position: Position
    replay: bool
    state: bytes
    sender: int                      # world rank it came from


# ------------------------------------------------------------------------------------------- state
SAME = Slicing(1, 1)  # a called spare joins the group that packed the state: the same slicing on both sides


def pack_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any, position: Position,
               records: Optional[Mapping[int, Mapping[str, Any]]] = None,
               buffers: Optional[Mapping[str, torch.Tensor]] = None,
               seats: Optional[list[EpochProgress]] = None) -> bytes:
    """The trainer's state at `position` as one message: [8-byte size][shared safetensors][local].
    `records`: the epoch records still waiting for their DPU validation results (the spare may
    become host rank 0, which logs them when the results come). `buffers`: the model's buffers to
    send instead of its own (`SeatZeroBuffers.pre_step`); `seats`: every seat's progress in the
    epoch (`SeatProgress`), in the metadata (`seat_progress` reads it)."""
    tensors = {k: v.contiguous() for k, v in shared_tensors(model, optimizer).items()}
    pending = {str(e): r for e, r in (records or {}).items()}
    meta = meta_of(position, catalog_of(tensors), optimizer, scheduler, model, pending_records=pending)
    shared = st_save(tensors, metadata={"meta": meta.encode().decode(), "seats": encode_seats(seats)})
    return struct.pack("<Q", len(shared)) + shared + capture_local(model, EpochProgress(), buffers)


def seat_progress(blob: bytes) -> Optional[list[EpochProgress]]:
    """`pack_state`'s every-seat progress (None: unknown to the sender)."""
    (n,) = struct.unpack("<Q", blob[:8])
    return decode_seats(safetensors_metadata(blob[8: 8 + n]).get("seats"))


def packed_source(blob: bytes) -> StateSource:
    """`pack_state`'s message as a state source (one local state: the sender's)."""
    (n,) = struct.unpack("<Q", blob[:8])
    shared = blob[8: 8 + n]
    meta = CheckpointMeta.decode(safetensors_metadata(shared)["meta"].encode())
    return StateSource(meta, st_load(shared), (parse_local(blob[8 + n:]),), SAME)


def unpack_state(blob: bytes, state: TrainingState) -> Position:
    """Load `pack_state`'s message into `state` (`common.state.load.load_state`; its epoch records
    waiting for validation too); return its position."""
    loaded = load_state(packed_source(blob), Live(state.model, state.optimizer, state.scheduler), Reader(0, SAME))
    state.pending.update({int(e): r for e, r in (loaded.meta.pending_records or {}).items()})
    return loaded.start


# -------------------------------------------------------------------------------------------- pool
class SparePool:
    """The host and spare ranks, who sits in which host rank's seat, and the call-in protocol.

    Built by every host and spare rank alike (collective over the pool: it splits it).
    """

    def __init__(self, topo: "Topology", timeout: Optional[float], faults: Faults) -> None:
        """`faults`: the run's failure record, whose watch judges deaths by the seats read here."""
        from mpi4py import MPI

        if topo.pool is None:
            raise ConfigError("--recovery rollback needs spare ranks: start the job with dpurun --spare-ranks S")
        self.topo, self.timeout = topo, timeout
        self.comm: "MPI.Comm" = topo.pool.Dup()
        self.comm.Set_errhandler(MPI.ERRORS_RETURN)
        self.start = self.comm.Get_group()
        self.size0 = self.comm.Get_size()
        self.me = self.comm.Get_rank()   # pool rank at the start (pool key = world rank: host ranks first)
        self.world_of = tuple(sorted(topo.host_ranks + topo.spare_ranks))   # pool start rank -> world rank
        self.seats: dict[int, int] = {r: r for r in range(len(topo.host_ranks))}  # seated member -> seat
        self.members = tuple(range(self.size0))   # living pool start ranks, in pool rank order
        self.vacant: tuple[int, ...] = ()
        self.vacated: dict[int, int] = {}   # seat -> world rank whose death vacated it
        self.offered: Optional[Callable[[], tuple[Position, bytes]]] = None  # inside a step: its pre-step state
        self.active = self._split()
        faults.track_seats(self.seated_world)

    def seated_world(self) -> frozenset[int]:
        """World ranks of the members in seats now (read by the failure watch's thread)."""
        return frozenset(self.seated_in_order())

    def seated_in_order(self) -> list[int]:
        """World ranks of the seated members in seat order (= rank order of `active`)."""
        return [self.world_of[m] for m, _ in sorted(self.seats.items(), key=lambda kv: kv[1])]

    # -- what every member agrees on ---------------------------------------------------------
    @property
    def seated(self) -> bool:
        return self.me in self.seats

    @property
    def root(self) -> int:
        """Pool rank of the lowest seated member: it broadcasts the commands and sends the state."""
        return self.members.index(min(self.seats))

    @property
    def free(self) -> tuple[int, ...]:
        """Pool start ranks of the spares still standing by."""
        return tuple(r for r in self.members if r not in self.seats)

    def positions(self) -> tuple[int, ...]:
        """The seats of the active communicator's ranks, in rank order (ranks follow the seats)."""
        return tuple(sorted(self.seats.values()))

    def _split(self) -> "MPI.Comm":
        from mpi4py import MPI

        seat = self.seats.get(self.me)
        comm = self.comm.Split(0 if seat is not None else 1, seat if seat is not None else self.size0 + self.me)
        comm.Set_errhandler(MPI.ERRORS_RETURN)
        return comm

    def _shrink(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """MPI_Comm_shrink of the pool; the seats whose member died become vacant. Returns those
        seats and the world ranks that died (seated or standing by)."""
        from mpi4py import MPI

        new, before = self.comm.Shrink(), self.members
        new.Set_errhandler(MPI.ERRORS_RETURN)
        self.members = tuple(new.Get_group().Translate_ranks(list(range(new.Get_size())), self.start))
        self.comm = new
        lost = tuple(sorted(seat for member, seat in self.seats.items() if member not in self.members))
        self.vacated.update({seat: self.world_of[m] for m, seat in self.seats.items() if m not in self.members})
        self.seats = {m: s for m, s in self.seats.items() if m in self.members}
        self.vacant = tuple(sorted(self.vacant + lost))
        return lost, tuple(self.world_of[m] for m in sorted(set(before) - set(self.members)))

    def _apply(self, cmd: Command) -> None:
        self.seats = {**self.seats, **dict(cmd.calls)}  # (a new dict: the failure watch's thread reads it)
        self.vacant = tuple(s for s in self.vacant if s not in {seat for _, seat in cmd.calls})
        self.active = self._split()

    # -- the seated ranks' side --------------------------------------------------------------
    @contextlib.contextmanager
    def offering(self, state: Callable[[], tuple[Position, bytes]]) -> Iterator[None]:
        """Inside a step's allreduce (`Rollback.replayable`): the pre-step state a spare called in by a
        death there replays the step from (made only if one is called)."""
        self.offered = state
        try:
            yield
        finally:
            self.offered = None

    def regroup(self) -> Regroup:
        """After a seated member's death (agreed by the seated ranks): shrink the pool and, inside
        a step (a state `offering`), call spares into the vacant seats to replay it; else keep the
        seats vacant until `fill`."""
        state = self.offered
        t0 = time.perf_counter()
        self.comm.Revoke()   # the spares leave their standby broadcast and join the shrink
        lost, lost_world = self._shrink()
        shrink_s = time.perf_counter() - t0
        if state is None or not self.vacant:
            t1 = time.perf_counter()
            self._broadcast(Command(REGROUP))
            self.active = self._split()
            return Regroup(lost, lost_world, (), shrink_s, time.perf_counter() - t1, 0.0, 0, None, False)
        return dataclasses.replace(self.fill(state, replay=True), lost=lost, lost_world=lost_world, shrink_s=shrink_s)

    def fill(self, state: Callable[[], tuple[Position, bytes]], replay: bool = False, every: bool = True) -> Regroup:
        """Call standing-by spares into the vacant seats and send them `state()` (from the root).
        `every`: each vacant seat must be filled (rollback: a seat left vacant would lose its step),
        else as many as spares are left, lowest seats first (lossy forward growing back)."""
        free = self.free
        if every and len(free) < len(self.vacant):
            seat = self.vacant[-1]
            what = (f"it trained, and no spare rank is left to take host rank {seat}'s seat (all spares of dpurun "
                    "--spare-ranks are in use): start more spares, or use --recovery lossy-forward, which goes on "
                    "without the dead ranks")
            raise NoSpareLeft(death_line(self.topo, self.vacated[seat], Verdict(False, what)))
        t0 = time.perf_counter()
        sender = self.members[self.root]   # (before the call-in: a survivor, who has the state)
        position, blob = state() if self.me == sender else (Position(), b"")
        cmd = Command.decode(self._broadcast(Command(CALL_IN, position, replay, tuple(zip(free, self.vacant)))))
        self._apply(cmd)
        t1 = time.perf_counter()
        if self.me == sender:
            self._send_state(blob, [m for m, _ in cmd.calls])
        return Regroup((), (), tuple((self.world_of[m], s) for m, s in cmd.calls), 0.0, t1 - t0,
                       time.perf_counter() - t1, len(blob), self.world_of[sender], replay)

    def _broadcast(self, cmd: Command) -> np.ndarray:
        buf = cmd.encode(self.size0)
        wait(self.comm.Ibcast(buf, root=self.root), self.timeout, "the spare ranks' command broadcast")
        return buf

    def _send_state(self, blob: bytes, members: list[int]) -> None:
        size = np.array([len(blob)], dtype=np.int64)
        data = np.frombuffer(blob, dtype=np.uint8)
        reqs = []
        for m in members:
            dest = self.members.index(m)
            reqs += [self.comm.Isend(size, dest=dest, tag=STATE_TAG), self.comm.Isend(data, dest=dest, tag=STATE_TAG)]
        wait_all(reqs, self.timeout, "the state's transfer to the called spare rank(s)")

    def release(self) -> None:
        """At the end, on every seated rank: tell the spares still standing by to leave, and wait
        until each has heard it (`ended`)."""
        while True:
            try:
                self._broadcast(Command(END))
                break
            except PeerLost:   # a standing-by spare died: without it
                self.comm.Revoke()
                self._shrink()
        self.ended()

    def ended(self) -> None:
        """The pool's last barrier, on every member whose part is over: a seated rank once it broadcast
        END, a spare standing by once it heard it (with its `Faults.ending` set). No member leaves before
        then, so no spare standing by takes a host rank's exit for a death (it once waited 1 s for
        END and judged after that). A member that died meanwhile costs nothing."""
        wait_unless_lost(self.comm.Ibarrier(), self.timeout, "the spare ranks' last barrier")

    # -- the spares' side --------------------------------------------------------------------
    def stand_by(self) -> Optional[CallIn]:
        """On a spare: wait for a call-in (returned) or the end of the job (None)."""
        buf = np.zeros(Command.length(self.size0), dtype=np.int64)
        while True:
            root = self.root
            try:
                wait(self.comm.Ibcast(buf, root=root), None, "the host ranks' command", max_sleep=STANDBY_MAX_SLEEP)
            except PeerLost:   # a member died (or the seated ranks revoked the pool for it): shrink with them
                self._shrink()
                if not self.seats:  # every seated rank is gone: the job is over (the failure watch says why)
                    return None
                continue
            cmd = Command.decode(buf)
            if cmd.kind == END:
                return None
            sender = self.members[root]
            self._apply(cmd)
            if cmd.kind == CALL_IN and self.seated:
                return CallIn(self.seats[self.me], cmd.position, cmd.replay, self._receive_state(root),
                              self.world_of[sender])

    def _receive_state(self, source: int) -> bytes:
        size = np.zeros(1, dtype=np.int64)
        wait(self.comm.Irecv(size, source=source, tag=STATE_TAG), self.timeout, "the state's size")
        data = np.empty(int(size[0]), dtype=np.uint8)
        wait(self.comm.Irecv(data, source=source, tag=STATE_TAG), self.timeout, "the state")
        return data.tobytes()


# ----------------------------------------------------------------------------------------- trainer
@dataclass
class Replaced:
    """One regroup as the trainer saw it, for its report."""

    shrink: "Shrink"
    regroup: Regroup
    epoch: int
    step: int            # step of the epoch after which it was handled (-1: after the epoch's end work)
    global_step: int


class Rollback:
    """The trainer's side of `--recovery rollback` (`common.train.loop.RecoveryHooks`): hand the
    pre-step state to a replaying spare, fill seats left vacant once the epoch is done, report.

    Built before the trainer (`host.recovery.build.HostRecovery`) with what it shares with it: the
    `TrainingState` the trainer steps (packed for a spare), and `carried`, the passenger of the
    gradient sync's allreduce (host rank 0's buffers and every seat's progress:
    `host.recovery.carried`)."""

    def __init__(self, group: "SurvivorGroup", pool: "SparePool", carried: Carried, state: TrainingState,
                 topo: "Topology", epochs: int) -> None:
        self.group, self.pool, self.carried, self.state = group, pool, carried, state
        self.topo, self.epochs = topo, epochs
        self.seen = 0

    def batch(self, epoch: int, step: int, batch: Batch, total: Optional[int]) -> tuple[Batch, Optional[int]]:
        """Before the step's forward (a spare trains the dead rank's own batches: nothing to take over)."""
        self.carried.begin_step(epoch, step)
        return batch, total

    def resumed(self, epoch: int, seats: Sequence[EpochProgress]) -> None:
        """A mid-epoch resume (every rank's record of `epoch` so far, from the state it loaded, the
        same on every rank): every seat's progress is known from the resumed step on, as from an
        epoch's first step."""
        self.carried.progress.adopt(epoch, list(seats))

    def _state(self, position: Position) -> Callable[[], tuple[Position, bytes]]:
        """The pre-step state a spare starts from: this rank's parameters and optimizer state (the
        step's allreduce has not changed them), seat 0's buffers (this rank's are past its forward)
        and every seat's progress in the epoch."""
        t, c = self.state, self.carried
        return lambda: (position, pack_state(t.model, t.optimizer, t.scheduler, position, t.pending,
                                             buffers=c.buffers.pre_step(), seats=c.progress.at(position.epoch)))

    def replayable(self, outcome: "StepOutcome", at: Position) -> contextlib.AbstractContextManager[None]:
        """Around a step's gradient allreduce (`outcome`: the step's loss and counts, which ride in
        it; `at`: the step's position): a death in it calls a spare in to replay the step."""
        self.carried.progress.carry(outcome)
        return self.pool.offering(self._state(at))

    def epoch_totals(self, epoch: int, sums: np.ndarray, losses: list[float]) -> tuple[np.ndarray, list[float]]:
        """The epoch's [loss sum, correct, count] over every seat, added in seat order, and host rank
        0's step losses (the run's record), from every seat's progress (`SeatProgress`): a rank that
        died in the epoch's end work, even host rank 0, still counts, and every rank's record (one
        may wait for DPU validation in a spare's state) is the failure-free run's. The allreduce's
        `sums` and this rank's `losses` when the epoch's progress is unknown here (begun mid-way from a
        state without every rank's record)."""
        seats = self.carried.progress.at(epoch)
        if seats is None:
            return sums, losses
        total = seats[0].sums.copy()
        for seat in seats[1:]:
            total += seat.sums
        return total, list(seats[0].losses)

    def check(self, epoch: int, step: int, global_step: int) -> list[Replaced]:
        """After a step (or the epoch's end work, `step` -1): the regroups since the last check."""
        out = [Replaced(sh, rg, epoch, step, global_step) for sh, rg in self.group.regroups[self.seen:]]
        self.seen = len(self.group.regroups)
        return out

    def between_epochs(self, epoch: int, global_step: int) -> bool:
        """After epoch `epoch` is done (its end work, its state hand-off and the records that could
        be completed): fill the seats a death outside a step left vacant, from the state here, so
        the spare starts the next epoch. Not earlier: the epoch's record is completed and logged by
        the group that trained it, and its hand-off is sliced among that group (a spare in the
        seat adds nothing to either). Not after the last epoch: nothing is left to train. Returns
        whether spares were called in."""
        if not self.pool.vacant or epoch + 1 >= self.epochs:
            return False
        self.group.fill(self._state(Position(epoch + 1, 0, global_step)))
        return True

    def reports(self, event: Replaced, leader: bool) -> bool:
        """The rank that sent the state reports a call-in (it has the figures); the leader the rest."""
        sender = event.regroup.sender
        return sender == self.topo.world_rank if sender is not None else leader

    def report(self, event: Replaced, topo: "Topology", step_times: list[float]) -> dict[str, Any]:
        s, r = event.shrink, event.regroup
        normal = statistics.median(step_times[:-1]) if len(step_times) > 1 else None
        mb = r.nbytes / 1e6
        took = f"; that step took {step_times[-1]:.3f} s (normal: {normal:.3f} s)" if normal and r.replay else ""
        spares = ", ".join(f"{topo.describe(w)} took host rank {seat}'s seat" for w, seat in r.called)
        sender = topo.describe(r.sender) if r.sender is not None else ""
        if r.lost_world and r.replay:
            line = (f"{PREFIX} {self._who(r, topo)} died at global step {event.global_step} (epoch "
                    f"{event.epoch + 1}, step {event.step + 1}): rollback, {spares} with {sender}'s pre-step state "
                    f"({mb:.1f} MB in {r.transfer_s * 1e3:.0f} ms) and replayed the step (agreed failed after "
                    f"{s.failed_call_s * 1e3:.0f} ms, pool shrunk in {r.shrink_s * 1e3:.1f} ms, call-in "
                    f"{r.call_s * 1e3:.1f} ms){took}; no sample lost")
        elif r.lost_world:
            line = (f"{PREFIX} {self._who(r, topo)} died outside a step (near global step {event.global_step}): the "
                    f"{len(s.survivors)} surviving host rank(s) finished the epoch's work; a spare takes the seat "
                    f"before the next epoch, if one is left")
        else:
            line = (f"{PREFIX} {spares} before global step {event.global_step + 1}, with {sender}'s state ({mb:.1f} MB "
                    f"in {r.transfer_s * 1e3:.0f} ms); nothing to replay")
        record = {"event": "recovery", "strategy": Recovery.ROLLBACK, "lost_host_ranks": list(r.lost),
                  "lost_world_ranks": list(r.lost_world), "replaced_by": [list(c) for c in r.called],
                  "state_from": r.sender, "epoch": event.epoch, "step": event.step,
                  "global_step": event.global_step, "failed_call_s": s.failed_call_s, "shrink_s": r.shrink_s,
                  "call_in_s": r.call_s, "transfer_s": r.transfer_s, "bytes_moved": r.nbytes,
                  "replayed_steps": int(r.replay and bool(r.called)), "samples_lost": 0,
                  "learnt_time": s.learnt_time, "failed_step_s": step_times[-1] if step_times and r.replay else None,
                  "normal_step_s": normal, "reported_time": time.time()}
        return {"line": line, "record": record}

    @staticmethod
    def _who(r: Regroup, topo: "Topology") -> str:
        return ", ".join(topo.describe(w) for w in r.lost_world)
