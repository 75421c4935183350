"""DPU side of checkpoints and clones: receive state slices, write them, commit, forward to clones.

A keeper is a DPU rank paired with host ranks (`common.plan.assign`). It runs in a thread
next to the rank's offloaded work (augmentation, validation or none), so checkpoint I/O never
stops batches or validation for long: receiving and file writes release the GIL. Per hand-off:

- CHECKPOINT: write every paired host rank's shard and local file (`common.ckptfiles`, temp +
  fsync + rename), then report the files to keeper 0 over the keepers' own communicator. Keeper 0
  waits for every report and writes the manifest and the COMMITTED marker last, then prunes to
  `--ckpt-keep`. A failed write (disk full, permissions, a name in the way) is reported by keeper
  0, that checkpoint is dropped, the previous one stays intact, and training continues.
- CLONE: forward the messages as received to the clone ranks (host rank k's slice goes to clone
  rank k mod M), never touching disk (DeepClone's forwarding).

Under `--dpu-failure fallback` a keeper may die (checkpoints without clones or DPU memory): the
checkpoint it was part of is never committed, and from the next hand-off on its host ranks send to
the surviving keepers (`StateAssignment.survivors`), and the lowest living keeper commits. Every
hand-off's header names the keepers the host ranks agreed are dead, so each keeper knows whom to
expect: it keeps a header receive posted for every host rank and learns the routes from the
headers that land.

Under `--recovery lossy-forward` host ranks may die: each hand-off is sliced among the living ones,
a keeper none of whose host ranks is left gets a header-only notice instead (so every keeper hears
of every checkpoint), and a keeper drops a host rank whose header receive reports it dead. A host
rank that dies between a checkpoint's step and its hand-off tears that checkpoint; keeper 0 settles
it by name (`settle_missed`) and commits the next ones. Under `--recovery rollback` a spare takes
the dead rank's seat and sends its part instead (`receive_seats`): it tells the seat's keeper where
it starts (JOIN) and re-sends the hand-off due there, so a death next to a checkpoint does not tear
it; a copy of a part that had come whole is dropped.

The latest state received stays in memory (`latest`); with `--ckpt-mem-keep K` the K newest
checkpoints are also kept in DPU memory that outlives the job (`common.state.memstore`), and a
relaunched job that restarts from them gets each host rank's hand-off back from its keeper
(RESTORE) before anything else. A run that ends normally clears that memory. Waits for the next hand-off have no
deadline (checkpoints may be hours apart); a dead host rank makes Open MPI end the job. Until the
clone is served, the keeper sends its clone ranks a heartbeat every peer_timeout/4 s while it
waits (`common.runtime.heartbeat`), so their stand-by can have a deadline without one of its own.
"""

from __future__ import annotations

import shutil
import sys
import threading
import time
from typing import TYPE_CHECKING, Any, Mapping, Optional

import numpy as np

from dpuoffload.common.config import RunConfig
from dpuoffload.common.errors import PeerError, PeerLost
from dpuoffload.common.faults import inject, watch
from dpuoffload.common.faults.abort import EXIT_CHECKPOINT_FAILED, PREFIX, abort_job, ending_line
from dpuoffload.common.plan.assign import StateAssignment
from dpuoffload.common.runtime.heartbeat import Heartbeat, interval_for
from dpuoffload.common.runtime.messages import CKPT_HEADER, StateKind, Tag
from dpuoffload.common.runtime.metrics import JsonlLog
from dpuoffload.common.runtime.roles import Topology
from dpuoffload.common.runtime.waits import is_failure, lost_peer, wait, wait_all, wait_object
from dpuoffload.common.state import ckptfiles
from dpuoffload.common.state.ckptfiles import Received
from dpuoffload.common.state.memstore import MemoryStore, memory_point, memory_root
from dpuoffload.common.state.sharding import byte_buffer

if TYPE_CHECKING:
    from mpi4py import MPI

HANDOFF_POLL_MAX_SLEEP = 0.01   # between hand-offs (may be hours apart): ~100 cheap polls/s, 10 ms latency
SLICE_POLL_MAX_SLEEP = 0.002    # a hand-off in flight: each poll lets Open MPI pull the next pieces


class StandbyBeat:
    """Heartbeats from one keeper to the clone ranks it will serve, while they stand by.

    `poll` is called between the keeper's polls for the next hand-off; it sends a header-only
    HEARTBEAT to each clone rank when one is due (`common.runtime.heartbeat`). Small eager sends:
    they complete without the clone rank receiving them, which it does when it next looks."""

    def __init__(self, world: "MPI.Comm", clones: tuple[int, ...], interval: float) -> None:
        self.world, self.clones, self.schedule = world, clones, Heartbeat(interval)
        self.header = CKPT_HEADER.pack(kind=StateKind.HEARTBEAT, global_step=-1, sender=-1)
        self.inflight: list["MPI.Request"] = []

    def poll(self) -> None:
        if not self.schedule.take(time.monotonic()):
            return
        self.inflight = [r for r in self.inflight if not r.Test()]
        self.inflight += [self.world.Isend(self.header, dest=c, tag=Tag.CLONE) for c in self.clones]

    def close(self, timeout: float) -> None:
        """No more beats; the ones sent must have left before the keeper goes on (or ends)."""
        wait_all(self.inflight, timeout, "a clone rank to take a heartbeat")
        self.inflight = []


class Keeper:
    def __init__(self, cfg: RunConfig, topo: Topology, comm: "MPI.Comm") -> None:
        self.cfg, self.topo, self.comm = cfg, topo, comm  # comm: the keepers only (keeper 0 commits)
        self.assign = StateAssignment.of(topo)
        self.hosts = self.assign.hosts_kept_by(topo.world_rank)
        clones = self.assign.clone_targets_of(topo.world_rank) if cfg.clone_at is not None else ()
        self.standby = StandbyBeat(topo.world, clones, interval_for(cfg.peer_timeout)) if clones else None
        self.latest: Optional[list[Received]] = None
        self.spare: dict[int, np.ndarray] = {}   # host rank -> warm receive buffer for its next hand-off
        self.log = JsonlLog(cfg.log_dir, f"keeper-rank{topo.world_rank}.jsonl")
        self.thread = threading.Thread(target=self._main, name="dpuoffload-keeper", daemon=True)
        self.records: list[dict[str, Any]] = []
        self.outcomes: dict[int, bool] = {}   # keeper 0: checkpoint step -> committed
        self.memory = MemoryStore(memory_root(cfg.ckpt_dir), comm.Get_rank(), cfg.ckpt_mem_keep) \
            if cfg.ckpt_mem_keep and cfg.ckpt_dir else None
        self.hands_off = cfg.checkpointing or (cfg.clone_at is not None and bool(topo.clone_ranks))
        self.rerouted = cfg.recovery_policy.survives_keeper_loss  # (routes follow each header's lost keepers)
        self.surviving = cfg.recovery_policy.survives_host_loss  # host ranks may die: hand-offs from the living
        self.rollback = cfg.recovery_policy.uses_spares  # ... or from the spares in their seats
        self.seats = tuple(topo.host_ranks.index(h) for h in self.hosts)   # the seats this keeper keeps
        self.sources = {s: topo.host_ranks[s] for s in self.seats}   # (rollback) seat -> who trains in it now
        self.joined: dict[int, int] = {}   # (rollback) seat -> global step its newest spare started from
        self.last_order = float("-inf")    # (rollback) the last hand-off received (a later copy is dropped)
        self.steps_per_epoch: Optional[int] = None   # (rollback) from the first hand-off's meta: the run's last step
        self.gone: set[int] = set()     # (--recovery) host ranks known dead here: no header receive for them
        self.missed: list[int] = []     # (--recovery) host ranks whose part of this hand-off did not come
        self.early: dict[int, list[dict[str, Any]]] = {}   # (--recovery, committer) reports of a later step
        self.reported: Optional[tuple[int, int]] = None   # the last checkpoint reported: (step, to which committer)
        self.committer = self.assign.keeper_ranks[0]  # (the lowest living keeper; sends the summary at the end)
        self.headers: dict[int, tuple[np.ndarray, "MPI.Request"]] = {}  # host rank -> its posted header receive
        self.torn: list[int] = []   # checkpoint steps lost with a keeper that died
        self.injector = inject.for_rank(cfg.inject, topo)  # --inject: fail on getting a checkpoint's state
        self.last_handoff = 0

    def start(self) -> None:
        self.thread.start()

    def join(self) -> list[dict[str, Any]]:
        self.thread.join()
        return self.records

    def _main(self) -> None:
        try:
            self.restore_or_forget()
            if self.hands_off:
                self.loop()
        except BaseException as e:  # noqa: BLE001 - a dead keeper thread must not leave the job hanging
            abort_job(ending_line(e, " (in its checkpoint keeper thread)"))

    def loop(self) -> None:
        while True:
            rerouted = self.rerouted or self.surviving
            batch = self.receive_rerouted() if rerouted else [self.receive(h) for h in self.hosts]
            kinds = {r.head["kind"] for r in batch}
            steps = {r.head["global_step"] for r in batch}
            if len(kinds) != 1 or len(steps) != 1:
                raise PeerError(f"host ranks {self.hosts} handed off different things at once: kinds {kinds}, "
                                f"steps {steps}")
            kind = StateKind(kinds.pop())
            if kind is StateKind.END:
                self.stop_beating()
                self.cancel_headers()
                self.committer = self.living(batch)[0]
                if self.surviving and self.cfg.checkpointing:
                    self.end_reports()
                self.send_summary(batch[0].head["leader"] if self.surviving else self.topo.host_ranks[0])
                if self.memory is not None:  # the run is over: nothing to restart from
                    self.memory.clear()
                return
            real = [r for r in batch if r.head["sender"] >= 0]   # (none: a notice under --recovery)
            if kind is StateKind.PREPARE:
                self.prepare(real)
                continue
            self.recycle(self.latest)
            self.latest = real
            if kind is StateKind.CHECKPOINT:
                self.check_injection(batch[0].head["global_step"], real)
                self.persist(batch, real)
            elif kind is StateKind.CLONE:
                self.forward(real, received=time.time())

    def check_injection(self, step: int, real: list[Received]) -> None:
        """`--inject dpu:R@STEP` on a keeper: fail on getting the first checkpoint at or after STEP,
        before writing it (a checkpoint torn by a dead keeper). An augmentation or validation rank
        may fail earlier, at its own work."""
        per_epoch = real[0].meta.get("steps_per_epoch") if self.injector and real else None  # (None: a script's)
        if per_epoch:
            self.injector.check_through(range(self.last_handoff + 1, step + 1), per_epoch * self.cfg.epochs)
        self.last_handoff = step

    def stop_beating(self) -> None:
        if self.standby is not None:
            self.standby.close(self.cfg.peer_timeout)
            self.standby = None

    def receive(self, host: int) -> Received:
        header = CKPT_HEADER.empty()
        wait(self.topo.world.Irecv(header, source=host, tag=Tag.CKPT), None, f"state from {self.topo.describe(host)}",
             max_sleep=HANDOFF_POLL_MAX_SLEEP, on_poll=self.standby.poll if self.standby else None)
        return self.receive_parts(host, header)

    def receive_rerouted(self) -> list[Received]:
        """The next hand-off, from whichever host ranks this keeper keeps now: a header receive is
        posted for every host rank (a host rank sends only to its keeper of the moment, and its
        next message here is always a header), and the earliest hand-off among the headers that
        landed says which keepers are dead, hence which host ranks send here this time."""
        sleep = 0.0
        while not (landed := self.landed_headers()):
            time.sleep(sleep)  # (no deadline: checkpoints may be hours apart)
            sleep = min(max(2 * sleep, 1e-4), HANDOFF_POLL_MAX_SLEEP)
        # (the earliest hand-off that landed: a host rank may already be a hand-off ahead of another)
        heads = {h: CKPT_HEADER.unpack(self.headers[h][0]) for h in landed}
        first = min(heads.values(), key=_handoff_order)
        if self.rollback:
            batch = self.receive_seats(first) if first["sender"] >= 0 else self.receive_surviving(first, heads)
            self.last_order = _handoff_order(first)
            return batch
        if self.surviving:
            return self.receive_surviving(first, heads)
        lost = self.assign.lost_of(first["lost_keepers"])
        hosts = self.assign.hosts_kept_by(self.topo.world_rank, lost)
        stray = [h for h, head in heads.items() if h not in hosts and _handoff_order(head) == _handoff_order(first)]
        if stray:
            raise PeerError(f"{self.topo.describe(stray[0])} handed its state here, but with the keepers "
                            f"{sorted(lost)} dead this keeper keeps {hosts}")
        for h in hosts:
            wait(self.headers[h][1], self.cfg.peer_timeout, f"the hand-off header of {self.topo.describe(h)}",
                 max_sleep=SLICE_POLL_MAX_SLEEP)
        return [self.receive_parts(h, self.headers.pop(h)[0]) for h in hosts]

    def post_headers(self) -> None:
        """A header receive for every rank that may send one here and has none posted: every host
        rank (its keeper may change), and under --recovery rollback every spare rank."""
        for h in [*self.assign.keepers, *(self.topo.spare_ranks if self.rollback else ())]:
            if h not in self.headers and h not in self.gone:
                header = CKPT_HEADER.empty()
                self.headers[h] = (header, self.topo.world.Irecv(header, source=h, tag=Tag.CKPT))

    def landed_headers(self) -> list[int]:
        """The ranks whose posted header receive completed (receives posted first). Under
        --recovery rollback a JOIN or a copy of a finished hand-off is taken here (`screen`)."""
        self.post_headers()
        landed = [h for h in list(self.headers) if self._landed(h)]
        return [h for h in landed if not self.screen(h)] if self.rollback else landed

    def cancel_headers(self) -> None:
        """At the end: the header receives still posted (spares never called in) are cancelled."""
        for _, req in self.headers.values():
            try:
                req.Cancel()
            except Exception:  # noqa: BLE001 - (a dead rank's receive may refuse; nothing waits on it)
                pass
        self.headers.clear()

    def _landed(self, host: int) -> bool:
        """Whether `host`'s posted header receive completed. Under --recovery, one that reports its
        host rank dead is dropped: no receive is posted for that rank again."""
        from mpi4py import MPI

        try:
            return bool(self.headers[host][1].Test())
        except MPI.Exception as e:
            if not (self.surviving and is_failure(e)):
                raise
            self.headers.pop(host)
            self.gone.add(host)
            return False

    def receive_surviving(self, first: Mapping[str, int], heads: Mapping[int, Mapping[str, int]]) -> list[Received]:
        """--recovery: the hand-off `first` belongs to, from this keeper's host ranks still alive (or
        the notice that none of them hands it off). A host rank that dies before its part came is
        noted in `missed`: that checkpoint cannot be committed."""
        self.missed = []
        if first["sender"] < 0:
            source = next(h for h, head in heads.items() if head == first)
            self.headers.pop(source)
            return [header_only(first)]
        batch = []
        for h in [h for h in self.hosts if h not in self.gone]:
            try:
                wait(self.headers[h][1], self.cfg.peer_timeout, f"the hand-off header of {self.topo.describe(h)}",
                     max_sleep=SLICE_POLL_MAX_SLEEP)
                batch.append(self.receive_parts(h, self.headers.pop(h)[0]))
            except PeerLost:
                self.headers.pop(h, None)
                self.gone.add(h)
                self.missed.append(h)
        if len(batch) < first["to_me"] and not self.missed:  # (a death this keeper had learnt of before)
            self.missed = [h for h in self.hosts if h in self.gone]
        return batch or [header_only({**first, "sender": -1})]

    def screen(self, source: int) -> bool:
        """--recovery rollback: take `source`'s landed header if it is not part of a hand-off still
        to come: a spare's JOIN (it trains in that seat from that step on) or a copy of a hand-off
        this keeper has finished (a spare re-sent a part that had come whole: drained, dropped)."""
        header = self.headers[source][0]
        head = CKPT_HEADER.unpack(header)
        if head["kind"] == StateKind.JOIN:
            if head["seat"] in self.sources:
                self.sources[head["seat"]] = source
                self.joined[head["seat"]] = head["global_step"]
        elif _handoff_order(head) <= self.last_order:
            try:
                self.receive_parts(source, header)
            except PeerLost:
                self.gone.add(source)
        else:
            return False
        self.headers.pop(source)
        return True

    def receive_seats(self, first: Mapping[str, int]) -> list[Received]:
        """--recovery rollback: the hand-off `first` belongs to, one part per seat of this keeper
        that the senders fill (`to_me`), from whoever trains in it. A seat whose rank died before
        its part came whole gets it from the spare that takes the seat (`StateHandoff.join`); the
        part is missed (the checkpoint torn) only when no spare brings it (`no_spare_brings`)."""
        order, want = _handoff_order(first), first["to_me"]
        got: dict[int, Received] = {}
        deadline, sleep = time.monotonic() + self.cfg.peer_timeout, 0.0
        while True:
            for source in self.landed_headers():
                head = CKPT_HEADER.unpack(self.headers[source][0])
                if _handoff_order(head) != order or head["senders"] != first["senders"]:
                    continue   # (a later hand-off: its turn comes; another group's copy: dropped then)
                header = self.headers.pop(source)[0]
                try:
                    part = self.receive_parts(source, header)
                except PeerLost:
                    self.gone.add(source)   # (its spare sends the part again)
                    continue
                self.sources[head["seat"]] = source
                got.setdefault(head["seat"], part)
                if self.steps_per_epoch is None and part.head["small_nbytes"]:
                    self.steps_per_epoch = part.meta.get("steps_per_epoch")
            waiting = [s for s in self.seats if s not in got]
            lost = [s for s in waiting if self.seat_dead(s) and self.no_spare_brings(s, first)]
            if len(got) + len(lost) >= want:
                break
            if time.monotonic() > deadline and not all(self.seat_dead(s) for s in waiting):
                raise PeerError(f"timed out after {self.cfg.peer_timeout:.0f} s waiting for the hand-off of step "
                                f"{first['global_step']} from " + ", ".join(
                                    self.topo.describe(self.sources[s]) for s in waiting))
            time.sleep(sleep)
            sleep = min(max(2 * sleep, 1e-4), SLICE_POLL_MAX_SLEEP)
        self.missed = [self.topo.host_ranks[s] for s in lost] if len(got) < want else []
        batch = [got[s] for s in sorted(got)]
        return batch or [header_only({**first, "sender": -1})]

    def seat_dead(self, seat: int) -> bool:
        source = self.sources[seat]
        return source in self.gone or source in watch.dead_ranks()

    def no_spare_brings(self, seat: int, first: Mapping[str, int]) -> bool:
        """Whether no spare will send `seat`'s part of the hand-off `first` (its rank is dead): a
        spare joined after that step, or the hand-off comes after the last point where a spare is
        called in (PREPARE, which spares skip; the run's last step; the end)."""
        step = first["global_step"]
        if first["kind"] in (StateKind.PREPARE, StateKind.END) or self.joined.get(seat, -1) > step:
            return True
        last = [s for s in (self.cfg.stop_at_step, self.steps_per_epoch and self.steps_per_epoch * self.cfg.epochs)
                if s]
        return bool(last) and step >= min(last)

    def receive_parts(self, host: int, header: np.ndarray) -> Received:
        """The rest of `host`'s hand-off, after its header."""
        world = self.topo.world
        head = dict(CKPT_HEADER.unpack(header))
        if head["kind"] in (StateKind.END, StateKind.PREPARE):  # a header only
            return header_only(head)
        small = byte_buffer(head["small_nbytes"])
        shared = self.buffer(host, head["shared_nbytes"])
        what = f"the state slices of {self.topo.describe(host)}"
        wait(world.Irecv(small, source=host, tag=Tag.CKPT), self.cfg.peer_timeout, what)
        sizes = ckptfiles.part_sizes(Received(head, small, shared).meta, head["sender"], head["shared_parts"],
                                     shared.nbytes)
        offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(int).tolist()
        reqs = [world.Irecv(shared[a:b], source=host, tag=Tag.CKPT) for a, b in zip(offsets[:-1], offsets[1:])]
        wait_all(reqs, self.cfg.peer_timeout, what, max_sleep=SLICE_POLL_MAX_SLEEP)
        return Received(head, small, shared)

    # ------------------------------------------------------------------------- DPU memory
    def restore_or_forget(self) -> None:
        """Restarting from DPU memory: send each kept host rank its hand-off of the agreed step, as
        received (RESTORE). Otherwise what this DPU's memory holds is stale: a new run forgets it."""
        point = memory_point()
        if point is None:
            if self.memory is not None:
                self.memory.clear()
            return
        store = MemoryStore(point.root, self.comm.Get_rank(), max(self.cfg.ckpt_mem_keep, 1))
        t0 = time.perf_counter()
        reqs, sent = [], 0
        for host in self.hosts:
            head, small, shared = store.get(point.step, self.topo.host_ranks.index(host))
            restore = CKPT_HEADER.pack(**{**CKPT_HEADER.unpack(head), "kind": StateKind.RESTORE, "shared_parts": 1})
            reqs += [self.topo.world.Isend(buf, dest=host, tag=Tag.RESTORE) for buf in (restore, small, shared)]
            sent += small.nbytes + shared.nbytes
        wait_all(reqs, self.cfg.peer_timeout, "a host rank to take its state back from DPU memory",
                 max_sleep=SLICE_POLL_MAX_SLEEP)
        self.records.append({"restored_step": point.step, "restore_bytes": sent,
                             "restore_send_s": time.perf_counter() - t0})
        self.log.write(self.records[-1])

    def remember(self, batch: list[Received]) -> None:
        """Keep this checkpoint's hand-offs in DPU memory too (the disk copy follows). A memory that
        cannot take it (RAM file system full) costs the fast restart, not the checkpoint: warn.
        Under --recovery only a whole one: a checkpoint a dead host rank tore (`missed`), or a
        notice, leaves nothing here, so a relaunch never restarts from it (`memstore.restart_step`
        takes only a step every keeper holds)."""
        if self.memory is None or not batch or self.missed:
            return
        try:
            self.memory.put(batch[0].head["global_step"],
                            [(CKPT_HEADER.pack(**r.head), r.small, r.shared) for r in batch])
        except OSError as e:
            print(f"{PREFIX} warning: {self.topo.describe()}: could not keep step {batch[0].head['global_step']} "
                  f"in DPU memory ({self.memory.dir}: {e}); a restart will read the disk", file=sys.stderr,
                  flush=True)

    # ------------------------------------------------------------------------- buffers
    def prepare(self, batch: list[Received]) -> None:
        """PREPARE: fault in a receive buffer per host rank now, and pass the size on to the clone
        ranks, so the first hand-off lands in warm memory (DPU cores fault pages slowly)."""
        for r in batch:
            self.spare[self.host_of(r)] = byte_buffer(r.head["shared_nbytes"], touch=True)
        if self.topo.clone_ranks and self.cfg.clone_at is not None:
            reqs = [self.topo.world.Isend(CKPT_HEADER.pack(**r.head), dest=self.assign.clone_target(host),
                                          tag=Tag.CLONE) for host, r in zip(self.hosts, batch)]
            wait_all(reqs, self.cfg.peer_timeout, "a clone rank to receive the hand-off size")

    def buffer(self, host: int, nbytes: int) -> np.ndarray:
        """A receive buffer for `host`'s shared bytes: the warm spare when its size fits."""
        spare = self.spare.pop(host, None)
        return spare if spare is not None and spare.nbytes == nbytes else byte_buffer(nbytes)

    def recycle(self, batch: Optional[list[Received]]) -> None:
        """The previous hand-off's buffers become the spares of the next one (double buffering:
        `latest` stays intact while the next hand-off arrives)."""
        for r in batch or []:
            self.spare.setdefault(self.host_of(r), r.shared)

    def host_of(self, r: Received) -> int:
        """The world rank of the host rank that handed `r` over (the one in whose seat it trains)."""
        return self.topo.host_ranks[r.head["seat"]]

    # ------------------------------------------------------------------------- checkpoint
    def persist(self, batch: list[Received], real: list[Received]) -> None:
        """Write `real` (the hand-offs of `batch` without a notice) and report or commit the checkpoint."""
        t0 = time.perf_counter()
        self.remember(real)
        step = batch[0].head["global_step"]
        report: dict[str, Any] = {"keeper": self.comm.Get_rank(), "step": step, "files": {}, "error": None,
                                  "meta": real[0].meta if real and self.surviving else None}
        try:
            report["files"] = self.write(real) if real else {}
        except OSError as e:
            report["error"] = f"{self.topo.describe()}: {type(e).__name__}: {e}"
        if self.missed and not report["error"]:
            report.update(error=", ".join(self.topo.describe(h) for h in self.missed) + " died before handing its "
                          "state over", host_died=True)
        report["write_s"] = time.perf_counter() - t0
        living = self.living(batch)
        if self.topo.world_rank == living[0]:
            self.settle_orphan()
            others = self.settle_missed(step, living[1:]) if self.surviving else self.gather_reports(step, living[1:])
            reports = [report] + others
            meta = real[0].meta if real else next(r["meta"] for r in reports if r.get("meta"))
            self.commit(meta, reports)
            return
        self.reported = (step, living[0])
        req = self.topo.world.isend(report, dest=living[0], tag=Tag.CKPT_REPORT)
        try:
            with lost_peer("the committing keeper to take the checkpoint report"):
                wait_object(req, self.cfg.peer_timeout, "the committing keeper to take the checkpoint report")
        except PeerLost:  # (it died: this checkpoint is never committed; the next one has another committer)
            if not self.rerouted:
                raise

    def settle_orphan(self) -> None:
        """`--dpu-failure fallback`, on becoming the committer: the checkpoint this keeper last
        reported to a committer that died before committing it is torn. Say so by name (nobody
        else saw it whole) and remove it, instead of leaving it to `--ckpt-keep`'s pruning."""
        if self.reported is None or self.reported[1] == self.topo.world_rank:
            return
        step, dead = self.reported
        self.reported = None
        directory = ckptfiles.step_dir(self.cfg.ckpt_dir, step)
        if directory in ckptfiles.committed(self.cfg.ckpt_dir):
            return
        shutil.rmtree(directory, ignore_errors=True)
        self.torn.append(step)
        previous = ckptfiles.committed(self.cfg.ckpt_dir)
        kept = f"the last complete checkpoint is {previous[-1]}" if previous else "there is no complete checkpoint yet"
        print(f"{PREFIX} checkpoint at step {step} NOT saved ({self.topo.describe(dead)} died before committing it); "
              f"this keeper commits from here on (--dpu-failure fallback), {kept}", file=sys.stderr, flush=True)
        record = {"global_step": step, "committed": False, "torn": True,
                  "errors": [f"{self.topo.describe(dead)} died before committing it"]}
        self.records.append(record)
        self.log.write(record)

    def living(self, batch: list[Received]) -> list[int]:
        """The keepers alive as this hand-off's header says, lowest (the committer) first (all of
        them where a keeper's loss is not survived: its death ends the job)."""
        lost = self.assign.lost_of(batch[0].head["lost_keepers"]) if self.rerouted else frozenset()
        return [k for k in self.assign.keeper_ranks if k not in lost]

    def write(self, batch: list[Received]) -> dict[str, Any]:
        meta = batch[0].meta
        directory = ckptfiles.step_dir(self.cfg.ckpt_dir, batch[0].head["global_step"])
        directory.mkdir(parents=True, exist_ok=True)
        plan = ckptfiles.plan_for(meta)
        files = {}
        for r in batch:
            k = r.head["sender"]
            blob = ckptfiles.shard_blob(meta["catalog"], plan, k, r.shared, {"sender": str(k)})
            files[ckptfiles.shard_name(k)] = ckptfiles.write_atomic(directory / ckptfiles.shard_name(k), blob)
            files[ckptfiles.local_name(k)] = ckptfiles.write_atomic(directory / ckptfiles.local_name(k), r.local)
        return files

    def gather_reports(self, step: int, keepers: list[int]) -> list[dict[str, Any]]:
        """The other keepers' reports of checkpoint `step`; a keeper that died before reporting (under
        `--dpu-failure fallback`) is an error report, so the checkpoint is not committed."""
        reports = []
        for source in keepers:
            what = f"{self.topo.describe(source)}'s report of checkpoint step {step}"
            if self.surviving:
                reports.append(self.surviving_report(source, step, what))
                continue
            req = self.topo.world.irecv(source=source, tag=Tag.CKPT_REPORT)
            try:
                with lost_peer(what):
                    report = wait_object(req, self.cfg.peer_timeout, what)
            except PeerLost:
                if not self.rerouted:
                    raise
                report = {"step": step, "files": {}, "write_s": 0.0, "died": True,
                          "error": f"{self.topo.describe(source)} died before writing its part"}
            if report["step"] != step:
                raise PeerError(f"keeper {source} reported checkpoint step {report['step']}, expected {step}")
            reports.append(report)
        return reports

    def settle_missed(self, step: int, keepers: list[int]) -> list[dict[str, Any]]:
        """--recovery, the committer at its hand-off `step` (or at the end, `step` None): the other
        keepers' reports of it. A report of an earlier step is of one this keeper never heard of
        (its host ranks died before handing it over): that checkpoint is torn, and is settled
        first (never committed, its directory removed)."""
        missed: dict[int, list[dict[str, Any]]] = {}
        reports = []
        for source in keepers:
            what = f"{self.topo.describe(source)}'s report of checkpoint step {step}"
            while (report := self.surviving_report(source, step, what))["step"] not in (step, -1):
                missed.setdefault(report["step"], []).append(report)
            reports.append(report)
        mine = ", ".join(self.topo.describe(h) for h in self.hosts if h in self.gone | watch.dead_ranks())
        for early, theirs in sorted(missed.items()):
            meta = next(r["meta"] for r in theirs if r.get("meta"))
            self.commit(meta, theirs + [{"step": early, "files": {}, "write_s": 0.0, "host_died": True,
                                         "error": f"{mine} died before handing the state of step {early} over"}])
        return reports

    def surviving_report(self, source: int, step: Optional[int], what: str) -> dict[str, Any]:
        """--recovery: keeper `source`'s next report up to `step` (None: to the end). If its host
        ranks died before handing `step` over, it never heard of it and reports a later step (or
        the end) first: that one is kept for its turn and this step is missing their part. So
        while they are all dead the wait has no deadline: some later report comes."""
        early = self.early.setdefault(source, [])
        report = early.pop(0) if early else self.receive_report(source, what)
        if step is not None and (report.get("end") or report["step"] > step):
            early.insert(0, report)
            hosts = ", ".join(self.topo.describe(h) for h in self.assign.hosts_kept_by(source))
            return {"step": step, "files": {}, "write_s": 0.0, "host_died": True,
                    "error": f"{hosts} died before handing the state of step {step} over"}
        return report

    def receive_report(self, source: int, what: str) -> dict[str, Any]:
        req = self.topo.world.irecv(source=source, tag=Tag.CKPT_REPORT)
        deadline = time.monotonic() + self.cfg.peer_timeout
        while True:
            done, report = req.test()
            if done:
                return report
            dead = [h in watch.dead_ranks() for h in self.assign.hosts_kept_by(source)]
            if any(dead) if self.rollback else all(dead):  # (rollback: it may be waiting for a spare)
                deadline = float("inf")
            if time.monotonic() > deadline:
                raise PeerError(f"timed out after {self.cfg.peer_timeout:.0f} s waiting for {what}")
            time.sleep(HANDOFF_POLL_MAX_SLEEP)

    def end_reports(self) -> None:
        """--recovery, at the end: every keeper tells the committer it is done, which settles the
        checkpoints a keeper never heard of (`surviving_report`)."""
        if self.topo.world_rank != self.committer:
            req = self.topo.world.isend({"end": True, "step": -1}, dest=self.committer, tag=Tag.CKPT_REPORT)
            wait_object(req, self.cfg.peer_timeout, "the committing keeper to take the end report")
            return
        self.settle_missed(None, [k for k in self.assign.keeper_ranks if k != self.committer])

    def commit(self, meta: dict[str, Any], reports: list[dict[str, Any]]) -> None:
        step = meta["position"]["global_step"]
        directory = ckptfiles.step_dir(self.cfg.ckpt_dir, step)
        errors = [r["error"] for r in reports if r["error"]]
        files = {name: info for r in reports for name, info in r["files"].items()}
        missing = ckptfiles.missing_senders(files, meta["host_ranks"])
        if missing and not errors:  # (never a manifest without every host rank's files, whatever the routes)
            errors.append(f"no files of host rank(s) {missing} were written")
        t0 = time.perf_counter()
        if not errors:
            try:
                ckptfiles.write_manifest(directory, meta, files, ckptfiles.plan_for(meta))
            except OSError as e:
                errors.append(f"{self.topo.describe()}: writing the manifest: {type(e).__name__}: {e}")
        record = {"global_step": step, "epoch": meta["position"]["epoch"], "step": meta["position"]["step"],
                  "committed": not errors, "errors": errors,
                  "write_s": max(r["write_s"] for r in reports), "commit_s": time.perf_counter() - t0,
                  "bytes": sum(i["bytes"] for r in reports for i in r["files"].values())}
        if errors:
            if directory.is_dir():
                shutil.rmtree(directory, ignore_errors=True)
            previous = ckptfiles.committed(self.cfg.ckpt_dir)
            kept = (f"the last complete checkpoint is {previous[-1]}" if previous
                    else "there is no complete checkpoint yet")
            if all(r.get("died") or r.get("host_died") for r in reports if r["error"]):  # (a death survived)
                self.torn.append(step)
                record["torn"] = True
                after = ("the next ones come from the surviving host ranks (--recovery)" if any(
                    r.get("host_died") for r in reports) else "the next ones go to the living keepers (--dpu-failure "
                         "fallback)")
                print(f"{PREFIX} checkpoint at step {step} NOT saved ({'; '.join(errors)}); {after}, {kept}",
                      file=sys.stderr, flush=True)
                self.records.append(record)
                self.log.write(record)
                return
            self.outcomes[step] = False
            if self.cfg.ckpt_errors == "fail":
                self.stop_job(step, errors)
            print(f"{PREFIX} checkpoint at step {step} NOT saved ({'; '.join(errors)}); training continues, "
                  f"{kept}", file=sys.stderr, flush=True)
        else:
            self.outcomes[step] = True
            record["pruned"] = [p.name for p in ckptfiles.prune(self.cfg.ckpt_dir, self.cfg.ckpt_keep)]
            print(f"{PREFIX} checkpoint step {step} committed: {directory} ({record['bytes'] / 1e6:.1f} MB, "
                  f"written in {record['write_s']:.2f} s)", flush=True)
        self.records.append(record)
        self.log.write(record)

    # --------------------------------------------------------------------- outcome report
    def newest_intact(self) -> str:
        done = ckptfiles.committed(self.cfg.ckpt_dir)
        return f"the newest intact one is {done[-1]}" if done else "there is no intact checkpoint"

    def stop_job(self, step: int, errors: list[str]) -> None:
        """--ckpt-errors fail: one line, then end the whole job (host ranks may be mid-step)."""
        abort_job(f"checkpoints: step {step} NOT saved ({'; '.join(errors)}); stopping the job "
                  f"(--ckpt-errors fail); {self.newest_intact()}", EXIT_CHECKPOINT_FAILED)

    def summary(self) -> dict[str, Any]:
        """How many checkpoints were taken and failed, and the newest intact one, in one line."""
        failed = sorted(s for s, ok in self.outcomes.items() if not ok)
        line = None
        if failed:
            which = ", ".join(map(str, failed[:5])) + (", ..." if len(failed) > 5 else "")
            line = (f"checkpoints: {len(failed)} of {len(self.outcomes)} NOT saved (step {which}); "
                    f"{self.newest_intact()}")
        done = ckptfiles.committed(self.cfg.ckpt_dir)
        return {"taken": len(self.outcomes), "failed": failed, "newest": str(done[-1]) if done else None,
                "line": line, "torn": self.torn}

    def send_summary(self, leader: int) -> None:
        """Keeper 0 -> host rank 0 (world rank `leader`: another one once host rank 0 died under
        --recovery), after the last hand-off: the run's checkpoint outcome, which host rank 0
        reports last and turns into the exit code (`host.checkpoint.StateHandoff.finish`)."""
        if not self.cfg.checkpointing or self.topo.world_rank != self.committer:
            return
        req = self.topo.world.isend(self.summary(), dest=leader, tag=Tag.CKPT_SUMMARY)
        wait_object(req, self.cfg.peer_timeout, "host rank 0 to take the checkpoint summary")

    # ----------------------------------------------------------------------------- clone
    def forward(self, batch: list[Received], received: float) -> None:
        """Send each host rank's hand-off, unchanged, to its clone rank. `received`: wall-clock time
        the hand-off was complete here (with `forwarded_time`, it splits the clone's readiness)."""
        t0 = time.perf_counter()
        self.stop_beating()  # the state itself goes out next and ends the clone ranks' stand-by
        reqs = []
        for host, r in zip(self.hosts, batch):
            dest = self.assign.clone_target(host)
            header = CKPT_HEADER.pack(**{**r.head, "shared_parts": 1})  # forwarded as one buffer
            reqs += [self.topo.world.Isend(buf, dest=dest, tag=Tag.CLONE) for buf in (header, r.small, r.shared)]
        for req in reqs:
            wait(req, self.cfg.peer_timeout, "a clone rank to receive the forwarded state")
        self.records.append({"forwarded_step": batch[0].head["global_step"], "forward_s": time.perf_counter() - t0,
                             "received_time": received, "forwarded_time": time.time()})
        self.log.write(self.records[-1])


def header_only(head: Mapping[str, int]) -> Received:
    """A hand-off that is its header alone (END, PREPARE, a notice under --recovery)."""
    return Received(dict(head), byte_buffer(0), byte_buffer(0))


def _handoff_order(head: Mapping[str, int]) -> float:
    """Where a hand-off falls in the sequence every host rank goes through: PREPARE, the state
    hand-offs by global step, END."""
    return float("inf") if head["kind"] == StateKind.END else head["global_step"]
