"""Host side of checkpoints and clones: hand this rank's slice of the training state to its keeper.

Right after the optimizer step that a checkpoint (`--ckpt-every`, `--ckpt-every-epoch`,
`--stop-at-step`) or the clone (`--clone-at`) falls on, every host rank sends its keeper DPU rank
(its first paired DPU rank, `common.plan.assign`) three messages (layouts in `common.messages`):
the header, a small part (run-level JSON meta + this rank's local state, always staged) and its
1/N slice of the shared tensors. The slice goes either

- staged (`--ckpt-copy staged`, default): copied into a reusable send buffer; the host blocks only
  for that copy and goes on while the keeper receives and writes (DeepFreeze's fine-grained async
  snapshot, with the DPU as the snapshot thread); or
- zero-copy (`--ckpt-copy zero`): sent straight from the parameter and momentum memory with one
  MPI hindexed datatype; nothing is copied, but the next optimizer step must wait until the send
  completed (it would overwrite the bytes in flight).
- overlapped (`--ckpt-copy overlap`): staged, but the copy runs in the background beside the next
  step's forward and backward (a thread; a GPU's on a side stream into pinned memory,
  `host.capture`), each chunk sent once copied; the next optimizer step waits for what is left.

A step that ends an epoch hands its state over after the epoch-end work (BatchNorm sync), at
position (epoch + 1, 0), so a resumed run never has to redo half of an epoch's end.
"""

from __future__ import annotations

import collections
import contextlib
import sys
import time
from typing import TYPE_CHECKING, Any, Iterator, Optional

import numpy as np
from torch import nn

from dpuoffload.common.config import RunConfig
from dpuoffload.common.errors import InternalError, PeerError, PeerLost
from dpuoffload.common.faults.abort import EXIT_CHECKPOINT_FAILED, PREFIX
from dpuoffload.common.faults.watch import Faults
from dpuoffload.common.modes import StateCopy
from dpuoffload.common.plan.assign import StateAssignment
from dpuoffload.common.runtime.hostgroup import FixedGroup, HostGroup, seat_hosts
from dpuoffload.common.runtime.messages import CKPT_HEADER, STAGED_CHUNK_BYTES, StateKind, Tag
from dpuoffload.common.runtime.metrics import JsonlLog
from dpuoffload.common.runtime.roles import Topology
from dpuoffload.common.runtime.waits import wait, wait_all, wait_object
from dpuoffload.common.state import ckptfiles
from dpuoffload.common.state.ckptfiles import Received, chunk_sizes, part_bounds
from dpuoffload.common.state.load import Live, Loaded, Reader, StateSource, load_state
from dpuoffload.common.state.memstore import MemoryPoint
from dpuoffload.common.state.meta import Slicing
from dpuoffload.common.state.resume import ResumePoint, config_dict
from dpuoffload.common.state.sharding import DEFAULT_THRESHOLD, byte_buffer, pack_pieces, packed_nbytes, plan_shards
from dpuoffload.common.state.trainstate import (
    EpochProgress,
    Position,
    capture_local,
    catalog_of,
    describe_position,
    meta_of,
    shared_tensors,
)
from dpuoffload.host import capture

ZERO_POLL_MAX_SLEEP = 0.0005  # the next optimizer step waits on these: poll often

if TYPE_CHECKING:
    from mpi4py import MPI


def resume_trainer(trainer: Any, point: ResumePoint, topo: Topology) -> None:
    """Load the checkpoint into the trainer (`common.state.load.load_state`: the same slicing restores
    this rank's own local state, bit-exact; another takes host rank 0's). Restarting from DPU
    memory, the state comes from the keepers instead of the disk (same slicing)."""
    t0 = time.perf_counter()
    if point.memory is not None:
        source = state_from_memory(topo, point.memory, trainer.cfg.peer_timeout)
    else:
        source = StateSource.of_checkpoint(ckptfiles.load(point.path, point.verified))
        point.verified.clear()  # (the bytes are in tensors now)
    reader = Reader(topo.side_rank, Slicing(topo.side_comm.Get_size(), trainer.cfg.batch_size), trainer.feed.steps())
    loaded = load_state(source, Live.of(trainer), reader)
    trainer.resume_at(loaded.start, loaded.progress, loaded.seats)
    if topo.side_rank == 0:
        report_resume(point, loaded, time.perf_counter() - t0, source.nbytes, topo)
    if point.memory is not None:
        trainer.metrics_log.write({"event": "restart", "source": "dpu-memory", "global_step": point.memory.step,
                                   "transfer_s": time.perf_counter() - t0, "bytes": source.nbytes})


def report_end(cfg: RunConfig, topo: Topology, trainer: Any) -> int:
    """Host rank 0's last words: where a --stop-at-step run continues from, and lost checkpoints
    (non-zero exit: a run that ends without its checkpoints must not look like a success)."""
    if not trainer.is_leader:  # (host rank 0, or the lowest survivor after its death under --recovery)
        return 0
    handoff = trainer.hooks if isinstance(trainer.hooks, StateHandoff) else None
    summary = handoff.summary if handoff is not None else None
    if cfg.stop_at_step is not None and trainer.global_step == cfg.stop_at_step:
        newest = summary["newest"] if summary else None
        if newest and newest.endswith(f"step-{cfg.stop_at_step:09d}"):
            print(f"[dpuoffload] stopped at step {cfg.stop_at_step}; checkpoint {newest}; continue with "
                  f"`--resume latest`", flush=True)
        elif cfg.ckpt_dir:
            print(f"[dpuoffload] stopped at step {cfg.stop_at_step}; its checkpoint was NOT saved (see below)",
                  flush=True)
        else:
            print(f"[dpuoffload] stopped at step {cfg.stop_at_step}; no checkpoint was taken (add --ckpt-dir DIR "
                  f"to continue later with `--resume latest`)", flush=True)
    return handoff.exit_code() if handoff is not None else 0


def report_resume(point: ResumePoint, loaded: Loaded, seconds: float, nbytes: int, topo: Topology) -> None:
    for note in point.skipped:
        print(f"[dpuoffload] warning: --resume latest {note}", flush=True)
    was = loaded.meta.slicing
    how = "exactly" if loaded.exact else f"re-sliced from {was.host_ranks} host rank(s) x batch {was.batch_size}"
    if point.memory is not None:
        copies = "".join(f"; {topo.describe(k)}'s part from its partner copy on {topo.describe(h)}"
                         for k, h in point.memory.from_copies)
        print(f"[dpuoffload] restarting from DPU memory: the state of step {point.memory.step} "
              f"({nbytes / 1e6:.1f} MB) came back from {len(point.memory.keepers)} keeper(s) in "
              f"{seconds * 1e3:.0f} ms{copies}; the checkpoint disk was not read", flush=True)
    where = f"DPU memory (step {point.memory.step})" if point.memory is not None else point.path
    print(f"[dpuoffload] resuming from {where} ({how}): {describe_position(loaded.start)}", flush=True)
    if point.changed:
        print(f"[dpuoffload] note: the checkpoint's run had other values for: {', '.join(point.changed)}",
              flush=True)


def state_from_memory(topo: Topology, point: MemoryPoint, timeout: float) -> StateSource:
    """Every host rank's hand-off of the agreed step, from DPU memory: this rank receives its own
    from its keeper (or, that keeper's memory lost, from the holder of its partner copy), the host
    ranks all-gather them (as clone ranks do) and rebuild the state."""
    from dpuoffload.host.clone import handoff_source  # (clone imports the trainer)

    server = point.server_of(StateAssignment.of(topo).keeper_of(topo.world_rank))
    mine = receive_restore(topo, server, point.step, topo.side_comm, timeout)
    return handoff_source(topo.side_comm, [mine])


def receive_restore(topo: Topology, keeper: int, step: int, comm: "MPI.Comm", timeout: float) -> Received:
    """This host rank's hand-off of `step`, sent back by its keeper (Tag.RESTORE)."""
    what = f"its state of step {step} from DPU memory ({topo.describe(keeper)})"
    header = CKPT_HEADER.empty()
    wait(topo.world.Irecv(header, source=keeper, tag=Tag.RESTORE), timeout, what)
    head = dict(CKPT_HEADER.unpack(header))
    if head["kind"] != StateKind.RESTORE or head["sender"] != comm.Get_rank() or head["global_step"] != step:
        raise PeerError(f"expected host rank {comm.Get_rank()}'s state of step {step} from {topo.describe(keeper)}, "
                        f"got {head}")
    small, shared = byte_buffer(head["small_nbytes"]), byte_buffer(head["shared_nbytes"])
    wait_all([topo.world.Irecv(buf, source=keeper, tag=Tag.RESTORE) for buf in (small, shared)], timeout, what)
    return Received(head, small, shared)


class StateHandoff:
    """Decides when state is due and sends it; the trainer calls the hooks below."""

    def __init__(self, cfg: RunConfig, topo: Topology, faults: Faults, model: Optional[nn.Module], optimizer: Any,
                 scheduler: Any, steps_per_epoch: Optional[int], group: Optional[HostGroup] = None,
                 joining: bool = False) -> None:
        """`faults`: the run's failure record (the keepers known dead). `model`/`optimizer` None: a
        script's job binds them at its first `job.checkpoint` (`bind`); `steps_per_epoch` None: the
        script counts its own steps. `group`: the host ranks' `SurvivorGroup` under --recovery: each
        hand-off is sliced among the host ranks alive then (lossy forward), and keepers whose host
        ranks all died get a notice instead; a spare in a seat (rollback) hands off to that seat's
        keeper. `joining`: this is such a spare, seated mid-run (`join`)."""
        self.cfg, self.topo, self.model, self.optimizer, self.scheduler = cfg, topo, model, optimizer, scheduler
        self.faults = faults
        self.steps_per_epoch = steps_per_epoch
        self.assign = StateAssignment.of(topo)
        self.comm: HostGroup = FixedGroup.of_side(topo) if group is None else group
        self.surviving = group is not None  # (--recovery: host ranks may die, keepers may be left without one)
        self.seat_host = seat_hosts(self.comm, topo.host_ranks)[self.rank]  # whose place this rank trains in
        self.keeper = self.assign.keeper_of(self.seat_host)
        self.fallback = cfg.recovery_policy.survives_keeper_loss  # a dead keeper: the next hand-offs go to a living one
        self.lost: frozenset[int] = frozenset()        # the keepers the host ranks agreed are dead
        self.inflight: list[tuple["MPI.Request", Any]] = []   # requests and the buffers they read
        self.zero_pending: list["MPI.Request"] = []   # zero-copy sends straight from tensor memory
        self.zero_views: list[np.ndarray] = []
        self.staging: Optional[np.ndarray] = None
        self.background = capture.PinnedStaging()  # (--ckpt-copy overlap's staging buffer)
        self.capture: Optional[capture.Capture] = None  # the overlapped copy in flight
        self.unsent: collections.deque[tuple[int, int]] = collections.deque()  # its chunks not yet sent
        self.record: Optional[dict[str, Any]] = None  # the hand-off's log record, until the next step settled it
        self.prepared = joining  # (a spare's keeper was warmed by the dead rank's PREPARE)
        self.deferred: set[StateKind] = set()
        self.log = JsonlLog(cfg.log_dir, f"handoff-rank{topo.world_rank}.jsonl")
        self.blocked: list[float] = []
        self.summary: Optional[dict[str, Any]] = None   # host rank 0, after `finish`: keeper 0's report

    @classmethod
    def for_trainer(cls, cfg: RunConfig, topo: Topology, trainer: Any) -> "StateHandoff":
        """The hand-off of `trainer`'s model, optimizer and schedule (a `host.extensions.HooksFactory`)."""
        group = trainer.comm if cfg.recovery_policy.survives_host_loss else None  # (its SurvivorGroup)
        return cls(cfg, topo, trainer.faults, trainer.model, trainer.optimizer, trainer.scheduler, trainer.feed.steps(),
                   group, trainer.joining)

    @property
    def rank(self) -> int:
        return self.comm.Get_rank()

    @property
    def size(self) -> int:
        return self.comm.Get_size()

    def header(self, kind: StateKind, global_step: int, **sizes: int) -> np.ndarray:
        """This rank's hand-off header: who sends (rank, seat, the group's size and rank 0) and to
        whom the others send (`to_me`). Under --recovery, rank 0 also sends a header-only notice to
        every keeper that no living host rank hands off to, so each keeper hears of every hand-off."""
        hosts = seat_hosts(self.comm, self.topo.host_ranks)
        keepers = [self.assign.keeper_of(h, self.lost) for h in hosts]
        common = dict(kind=kind, global_step=global_step, senders=self.size,
                      leader=self.comm.members()[0],
                      lost_keepers=self.assign.lost_mask(self.lost))
        if self.surviving and self.rank == 0 and kind is not StateKind.JOIN:
            for k in self.assign.keeper_ranks:
                if k not in keepers and k not in self.lost:
                    notice = CKPT_HEADER.pack(**common, sender=-1, seat=-1, to_me=0)
                    self.inflight.append((self.topo.world.Isend(notice, dest=k, tag=Tag.CKPT), notice))
        return CKPT_HEADER.pack(**common, **sizes, sender=self.rank, seat=self.topo.host_ranks.index(hosts[self.rank]),
                                to_me=keepers.count(self.keeper))

    def bind(self, model: nn.Module, optimizer: Any, scheduler: Any) -> None:
        """The objects the next hand-offs read (a script passes them to every `job.checkpoint`)."""
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler

    # ------------------------------------------------------------------- trainer hooks
    def due(self, global_step: int) -> set[StateKind]:
        kinds = set()
        c = self.cfg
        if c.checkpointing and ((c.ckpt_every and global_step % c.ckpt_every == 0) or global_step == c.stop_at_step):
            kinds.add(StateKind.CHECKPOINT)
        if c.clone_at == global_step and self.topo.clone_ranks:
            kinds.add(StateKind.CLONE)
        return kinds

    def after_step(self, pos: Position, progress: EpochProgress) -> None:
        self._send_copied()  # (a GPU's copy: the chunks the device finished since)
        if not self.prepared:
            self._prepare()
        kinds = self.due(pos.global_step)
        if pos.step == self.steps_per_epoch:  # the epoch-end work comes first
            self.deferred |= kinds
            return
        for kind in sorted(kinds):
            self.send(kind, pos, progress)

    def after_epoch(self, pos: Position) -> None:
        kinds, self.deferred = set(self.deferred), set()
        if self.cfg.checkpointing and self.cfg.ckpt_every_epoch:
            kinds.add(StateKind.CHECKPOINT)
        for kind in sorted(kinds):
            self.send(kind, pos, EpochProgress())

    def join(self, pos: Position, resend: bool) -> None:
        """--recovery rollback, on a spare that took a seat with the state at `pos`: tell the seat's
        keeper (JOIN). `resend` (it replays the step after `pos`): the group handed `pos` over
        before it knew of the death, so hand over again what was due there. The dead rank may have
        died before its own part reached the keeper, which then waits for this one (and drops it if
        the dead rank's came whole): a death next to a checkpoint does not tear it. (A spare seated
        between epochs joins after the group handed the epoch's state over without that seat.)"""
        self._post(self.header(StateKind.JOIN, pos.global_step))
        kinds = self.due(pos.global_step) if resend and pos.global_step > 0 else set()
        if resend and pos.step == 0 and pos.epoch > 0 and self.cfg.checkpointing and self.cfg.ckpt_every_epoch:
            kinds.add(StateKind.CHECKPOINT)  # (the epoch's end hand-off, `after_epoch`)
        for kind in sorted(kinds):
            self.send(kind, pos, EpochProgress())

    def before_optimizer_step(self) -> None:
        """The optimizer step is about to overwrite the state: zero-copy's sends and an overlapped
        copy must be done with it (a GPU's copy: the device orders the step after it, the host
        does not wait). The time this blocks is logged with the hand-off (`next_step_wait_s`)."""
        if not self.zero_pending and self.capture is None:
            return
        t0 = time.perf_counter()
        if self.zero_pending:
            with self.keeper_may_die():
                wait_all(self.zero_pending, self.cfg.peer_timeout,
                         f"{self.topo.describe(self.keeper)} to receive the state slice", max_sleep=ZERO_POLL_MAX_SLEEP)
            self.zero_pending, self.zero_views = [], []
        if self.capture is not None:
            self.capture.settle()
            self._send_copied()
        self._log_handoff(time.perf_counter() - t0)

    def sent_out(self) -> None:
        """A script's `job.checkpoint`: the library cannot see the script's next optimizer step (or
        whatever else writes its weights), so the hand-off leaves the weights' memory before it returns."""
        self.before_optimizer_step()
        self._send_copied(wait=True)

    def _send_copied(self, wait: bool = False) -> None:
        """Send the chunks of the overlapped copy that are copied (`wait`: all of them, once copied)."""
        if self.capture is None:
            return
        if wait:
            self.capture.wait()
        upto = self.capture.packed()
        while self.unsent and self.unsent[0][1] <= upto:
            a, b = self.unsent.popleft()
            self._post(self.background.array[a:b])  # type: ignore[index]
        if not self.unsent:
            self.capture = None

    def _log_handoff(self, waited: float = 0.0) -> None:
        if self.record is not None:
            self.log.write({**self.record, "next_step_wait_s": waited})
            self.record = None

    def finish(self) -> None:
        """Tell the keeper no more state comes, and wait until everything sent was received."""
        self.before_optimizer_step()
        self._complete()
        self._route()
        self._post(self.header(StateKind.END, -1))
        self._complete()
        if self.cfg.checkpointing and self.rank == 0:
            self.summary = self._receive_summary()

    def _receive_summary(self) -> dict[str, Any]:
        """The committing keeper's account of the run's checkpoints (keeper 0, or the lowest living
        keeper after deaths; it sends it after the END hand-off). No deadline: the last checkpoint
        may still be being written."""
        keeper0 = min(k for k in self.assign.keeper_ranks if k not in self.lost)  # (the one that commits)
        req = self.topo.world.irecv(source=keeper0, tag=Tag.CKPT_SUMMARY)
        return wait_object(req, None, "keeper 0's summary of the checkpoints")

    def exit_code(self) -> int:
        """Host rank 0, after `finish`: print the checkpoint outcome as the job's last word if any
        checkpoint was lost, and return the job's exit code (non-zero then: nothing lost silently)."""
        if self.summary is None or not self.summary["failed"]:
            return 0
        print(f"{PREFIX} {self.summary['line']}", file=sys.stderr, flush=True)
        return EXIT_CHECKPOINT_FAILED

    # ------------------------------------------------------------------------- sending
    def send(self, kind: StateKind, pos: Position, progress: EpochProgress,
             user: Optional[dict[str, Any]] = None) -> None:
        """Hand this rank's slice over. `user`: a script's own JSON data (`job.checkpoint(extra=)`)."""
        t0 = time.perf_counter()
        if self.model is None:
            raise InternalError("a state hand-off without a model (a script's job binds one before each send)")
        self.before_optimizer_step()
        self._complete()  # the previous hand-off's buffers are reused below
        self._route()
        tensors = shared_tensors(self.model, self.optimizer)
        catalog = catalog_of(tensors)
        plan = plan_shards([t.numel() for t in tensors.values()], self.size, DEFAULT_THRESHOLD)
        pieces = plan.rank_pieces(self.rank)
        meta = meta_of(pos, catalog, self.optimizer, self.scheduler, self.model, host_ranks=self.size,
                       threshold=DEFAULT_THRESHOLD, steps_per_epoch=self.steps_per_epoch,
                       config=config_dict(self.cfg), config_hash=self.cfg.config_hash(), user=user).encode()
        small = np.frombuffer(meta + capture_local(self.model, progress), dtype=np.uint8)
        shared_nbytes = packed_nbytes(list(tensors.values()), pieces)
        zero = self.cfg.ckpt_copy.from_tensor_memory
        chunks = chunk_sizes(shared_nbytes, STAGED_CHUNK_BYTES)
        self._post(self.header(kind, pos.global_step, meta_nbytes=len(meta), small_nbytes=small.nbytes,
                               shared_nbytes=shared_nbytes, shared_parts=len(pieces) if zero else len(chunks),
                               chunk_bytes=0 if zero else STAGED_CHUNK_BYTES))
        self._post(small)
        if zero:
            self._send_zero_copy(list(tensors.values()), pieces)
        elif self.cfg.ckpt_copy.in_background:
            self._start_copy(list(tensors.values()), pieces, chunks)
        else:
            self._send_staged(list(tensors.values()), pieces, chunks)
        blocked = time.perf_counter() - t0
        self.blocked.append(blocked)
        self.record = {"kind": kind.name.lower(), "global_step": pos.global_step, "epoch": pos.epoch,
                       "step": pos.step, "blocked_s": blocked, "shared_bytes": shared_nbytes,
                       "small_bytes": small.nbytes, "copy": str(self.cfg.ckpt_copy),
                       "wall_time": time.time()}  # wall clock: clone readiness = clone's ready_time - this
        if self.cfg.ckpt_copy is StateCopy.STAGED:
            self._log_handoff()

    def _prepare(self) -> None:
        """After the first step (the optimizer state exists by then): fault in the staging buffer and
        tell the keeper the hand-off size (PREPARE), so neither the first hand-off's copy here nor
        its receive there pays ~50k page faults (0.5 s for 188 MB on this VM)."""
        self.prepared = True
        self._route()
        if self.model is None:
            raise InternalError("the trainer's hand-off without a model")
        tensors = list(shared_tensors(self.model, self.optimizer).values())
        plan = plan_shards([t.numel() for t in tensors], self.size, DEFAULT_THRESHOLD)
        nbytes = packed_nbytes(tensors, plan.rank_pieces(self.rank))
        if self.cfg.ckpt_copy is StateCopy.STAGED:
            self.staging = byte_buffer(nbytes, touch=True)
        elif self.cfg.ckpt_copy.in_background:
            self.background.at_least(nbytes, pinned=any(t.is_cuda for t in tensors))
        self._post(self.header(StateKind.PREPARE, -1, shared_nbytes=nbytes))

    def _send_staged(self, tensors: list, pieces: tuple, chunks: list[int]) -> None:
        """Pack the slice into the staging buffer and send each chunk as soon as it is packed: the
        keeper pulls chunk i while this rank packs chunk i+1 (and a clone's keeper passes it on)."""
        nbytes = sum(chunks)
        if self.staging is None or self.staging.nbytes < nbytes:
            self.staging = byte_buffer(nbytes)
        staging = self.staging
        unsent = collections.deque(part_bounds(chunks))

        def send_packed(upto: int) -> None:
            while unsent and unsent[0][1] <= upto:
                a, b = unsent.popleft()
                self._post(staging[a:b])

        pack_pieces(tensors, pieces, staging, send_packed)

    def _start_copy(self, tensors: list, pieces: tuple, chunks: list[int]) -> None:
        """Start the slice's copy in the background (`host.capture`); its chunks go as they are copied."""
        self.capture = capture.start(tensors, pieces, self.background, sum(chunks))
        self.unsent = collections.deque(part_bounds(chunks))
        self._send_copied()

    def _send_zero_copy(self, tensors: list, pieces: tuple) -> None:
        """One message per piece, straight from tensor memory (contiguous, so large pieces take
        Open MPI's single-copy path: the keeper pulls them while this rank computes the next step)."""
        for p in pieces:
            view = tensors[p.tensor].reshape(-1)[p.start: p.stop].numpy().view(np.uint8)
            self.zero_views.append(view)
            self.zero_pending.append(self.topo.world.Isend(view, dest=self.keeper, tag=Tag.CKPT))

    def _post(self, buf: np.ndarray) -> None:
        self.inflight.append((self.topo.world.Isend(buf, dest=self.keeper, tag=Tag.CKPT), buf))

    def _complete(self) -> None:
        self._send_copied(wait=True)
        self._log_handoff()
        with self.keeper_may_die():
            for req, _ in self.inflight:
                wait(req, self.cfg.peer_timeout, f"{self.topo.describe(self.keeper)} to receive the state slices")
        self.inflight.clear()

    @contextlib.contextmanager
    def keeper_may_die(self) -> Iterator[None]:
        """`--dpu-failure fallback`: a keeper that died with a hand-off in flight takes that
        checkpoint with it (it is never committed); the next hand-off goes to a living keeper."""
        try:
            yield
        except PeerLost:
            if not self.fallback:
                raise

    def _route(self) -> None:
        """`--dpu-failure fallback`, before each hand-off: the host ranks (which all hand off at the
        same steps) agree on the keepers known dead, and this rank sends to its keeper among the
        living (`StateAssignment.keeper_of`). Collective over the host ranks."""
        if not self.fallback:
            return
        from mpi4py import MPI

        known = self.lost | (self.faults.dead_ranks() & set(self.assign.keeper_ranks))
        mine, agreed = np.array([self.assign.lost_mask(known)], dtype=np.int64), np.zeros(1, dtype=np.int64)
        self.comm.Allreduce(mine, agreed, op=MPI.BOR)
        lost = self.assign.lost_of(int(agreed[0]))
        if lost == self.lost:
            return
        if len(lost) == len(self.assign.keeper_ranks):
            raise PeerError("every checkpoint keeper DPU rank died: no rank is left to take the state")
        self.lost, keeper = lost, self.assign.keeper_of(self.seat_host, lost)
        if keeper != self.keeper:
            print(f"{PREFIX} {self.topo.describe()}: its checkpoint keeper {self.topo.describe(self.keeper)} died; "
                  f"its state goes to {self.topo.describe(keeper)} from here on (--dpu-failure fallback)", flush=True)
            self.faults.note({"event": "keeper_moved", "dead": self.keeper, "keeper": keeper, "time": time.time()})
        self.keeper = keeper
