"""`--mode da` on a DPU rank: serve the loaders of the host ranks it feeds (the public API's `job.loader`).

The host ranks (a user's script, or the built-in trainer, which uses the same API) open loaders
and plan them over the loader stream protocol (`common.data.streams`): for every loader a fed host
rank opens, this rank builds that host's own `RankLoader` over the host's data set (received, or
built from its recipe) and produces its batches per the host's plans, each stream through its own
ring of `--da-buffers` send buffers used in turn: a buffer is refilled only once its previous send
completed, so memory stays bounded however far the DPU rank runs ahead. Each batch is collated
straight into its send buffer (one copy, `BatchLayout.pack_items`) and sent as one raw message. Streams are
served round-robin and a stream whose ring is full (its host is busy computing) is skipped, so one
slow host never stalls another's batches. The loop sleeps with a back-off when no stream can move,
and ends when host rank 0 sends SHUTDOWN (`job.finish()`, after every host closed its loaders).

There is no deadline on a full ring: the host decides when it wants its next batch (a user's own
validation may take an hour). A dead host rank ends the job through mpirun (or, under
`--dpu-failure fallback`, through `common.faults.watch`); under `--recovery lossy-forward` its
stream is dropped and the survivors take its batches over; under `--recovery rollback` the spare
rank that takes its seat opens the same loader here (a spare's messages are served like a fed
host rank's).
"""

from __future__ import annotations

import contextlib
import pickle
import time
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Optional, Union

import numpy as np

from dpuoffload.common.config import RunConfig
from dpuoffload.common.data.batches import FLAG_POLL, BatchBuffer, BatchLayout, stamp_flags
from dpuoffload.common.data.loaders import RankLoader, probe_layout, unfit_samples
from dpuoffload.common.data.numerics import fingerprint, step_output
from dpuoffload.common.data.streams import STOP, NumericsQuery, OpenLoader, Plan, Recipe, StepSplit, decode, stream_tag
from dpuoffload.common.data.workers import WorkerPool, cores_note
from dpuoffload.common.errors import PeerError, PeerLost
from dpuoffload.common.faults import inject
from dpuoffload.common.faults.watch import Faults
from dpuoffload.common.runtime.messages import Tag
from dpuoffload.common.runtime.metrics import PhaseTimer
from dpuoffload.common.runtime.roles import Topology
from dpuoffload.common.runtime.waits import REMOTE_MAX_SLEEP, REMOTE_SPIN, is_failure, lost_peer, probe_any, wait
from dpuoffload.dpu.control import ControlInbox

if TYPE_CHECKING:
    import torch
    from mpi4py import MPI

IDLE_MAX_SLEEP = 0.002       # nothing to do: poll for the host's receives and messages at least this often
RING_POLL_MAX_SLEEP = 0.002  # a marker waits for a free buffer: poll often...
RING_POLL_SPIN = 0.0002      # ...and spin briefly first, a send of a posted receive completes in microseconds
PROBE_MIN_S = 0.005          # `SendRing.probe`: how long a ring's first full-size send is left alone...
PROBE_BPS = 1e9              # ...or longer for a large one: as long as a single copy takes at 1 GB/s


class SendRing:
    """K send buffers to one host rank on one tag, used in turn.

    A large message moves by itself only where Open MPI's single-copy shared memory carries it (the
    receiver pulls the bytes); over TCP, or over shared memory without single-copy (`--mca smsc
    ^cma`, a container that forbids cross-process reads), it moves only while both ends call into
    MPI, and a ring that slept between polls moved 0.01-0.02 of raw MPI at 3-19 MB. So the ring
    polls often (`needs_progress`) toward another machine, and on this one it finds out with its
    first full-size send (`probe`); every message then carries the answer (`FLAG_POLL`), so the
    receiver polls as often.
    """

    def __init__(self, world: "MPI.Comm", layout: BatchLayout, k: int, dest: int, tag: int,
                 timeout: Optional[float] = None, remote: bool = False) -> None:
        """`remote`: `dest` is on another machine, where sends progress only while this rank polls."""
        self.world, self.dest, self.tag, self.timeout = world, dest, tag, timeout
        self.needs_progress = remote  # toward this machine: found out by `probe`
        self.probed = remote
        self.buffers = [layout.buffer() for _ in range(k)]
        self.pending: list[Optional["MPI.Request"]] = [None] * k
        self.held: list[Any] = [None] * k   # a message sent from other memory (a worker's), kept until sent
        self.next = 0

    @property
    def max_sleep(self) -> float:
        return REMOTE_MAX_SLEEP if self.needs_progress else RING_POLL_MAX_SLEEP

    @property
    def spin(self) -> float:
        return REMOTE_SPIN if self.needs_progress else RING_POLL_SPIN

    def ready(self) -> bool:
        """Whether `acquire` returns at once (the next buffer's previous send completed)."""
        req = self.pending[self.next]
        return req is None or bool(req.Test())

    def acquire(self) -> tuple[int, BatchBuffer]:
        """The next buffer, once its previous send completed (waits, sleeping, if need be)."""
        slot = self.next
        self.next = (self.next + 1) % len(self.buffers)
        self._complete(slot)
        return slot, self.buffers[slot]

    def send(self, slot: int, nbytes: int) -> None:
        self.pending[slot] = self._isend(self.buffers[slot].raw[:nbytes])

    def send_items(self, slot: int, layout: BatchLayout, epoch: int, step: int, items: list) -> None:
        """Collate a batch's items into the slot's buffer and send it. A polled ring keeps its
        sends in flight moving while it collates (`progress` between chunks): without single-copy a
        19 MB batch's collate is milliseconds in which nothing else would move."""
        between = self.progress if self.needs_progress else None
        self.send(slot, layout.pack_items(self.buffers[slot], epoch, step, items, between=between))

    def progress(self) -> None:
        """One call into MPI for the sends in flight."""
        from mpi4py import MPI

        MPI.Request.Testall([req for req in self.pending if req is not None])

    def send_from(self, slot: int, message: np.ndarray) -> None:
        """Send `message` (a worker's packed batch) in place of the slot's buffer: no copy."""
        self.held[slot] = message
        self.pending[slot] = self._isend(message)

    def send_marker(self, layout: BatchLayout, seq: int) -> None:
        """The marker of plan `seq`; the ring's first one finds out whether its sends need polling."""
        slot, buf = self.acquire()
        nbytes = layout.pack_marker(buf, seq)
        if self.probed:
            self.send(slot, nbytes)
        else:
            self.probe(slot)

    def probe(self, slot: int) -> None:
        """Send the slot's message (a plan's marker: the receiver reads its header only) padded to
        the whole buffer, leave it alone for as long as a single copy of it takes at >= 1 GB/s (at
        least PROBE_MIN_S), and poll from then on if it has not arrived. Done once per ring, when the
        host rank is waiting for this marker with its receives posted. A second, longer look keeps a
        host rank that was slow to be scheduled (a loaded box) from passing for a missing single copy;
        two polls cannot move a large message without it (MPI pipelines it in fragments)."""
        req = self._isend(self.buffers[slot].raw)
        self.pending[slot] = req
        alone = max(PROBE_MIN_S, self.buffers[slot].raw.nbytes / PROBE_BPS)
        done = False
        for look in (alone, 4 * alone):
            time.sleep(look)
            with lost_peer(f"host world rank {self.dest} to receive a plan's marker"):
                done = bool(req.Test())
            if done:
                break
        self.needs_progress, self.probed = not done, True

    def drain(self) -> None:
        for slot in range(len(self.buffers)):
            self._complete(slot)

    def _isend(self, message: np.ndarray) -> "MPI.Request":
        stamp_flags(message, FLAG_POLL if self.needs_progress else 0)
        return self.world.Isend(message, dest=self.dest, tag=self.tag)

    def _complete(self, slot: int) -> None:
        req = self.pending[slot]
        if req is None:
            return
        if not req.Test():  # (a completed send skips building the wait's message)
            wait(req, self.timeout, f"host world rank {self.dest} to receive a batch",
                 max_sleep=self.max_sleep, spin=self.spin)
        self.pending[slot] = self.held[slot] = None


class Stream:
    """One host rank's loader on this DPU rank: its sampler, its send ring, where its plan stands."""

    def __init__(self, world: "MPI.Comm", host: int, host_label: str, opened: OpenLoader, buffers: int,
                 timer: PhaseTimer, on_epoch_end: Optional[Callable[[int], None]] = None,
                 prebuilt: Optional[dict[bytes, Any]] = None,
                 on_batch: Optional[Callable[[int, int], None]] = None, workers: int = 0,
                 remote: bool = False) -> None:
        """`on_batch(global_step, steps_per_epoch)` runs before each batch is built (`--inject`);
        `workers` > 0 builds the batches in that many worker processes (`--dpu-workers`); `remote`:
        the host rank is on another machine (`SendRing`)."""
        self.world, self.host, self.host_label, self.timer = world, host, host_label, timer
        self.on_epoch_end, self.on_batch = on_epoch_end, on_batch
        dataset = _prebuilt_or_none(opened, prebuilt or {})
        dataset = opened.wire_view(opened.materialize() if dataset is None else dataset)
        train = opened.sampling.seeded(dataset)
        self.loader = RankLoader(opened.sampling, train, collate=False)
        self.layout = probe_layout(train, opened.sampling)
        self.steps = len(self.loader)
        self.split = StepSplit(opened.host_share, self.steps)  # --da-host-share: the host builds some steps
        self.mine = self.split.owned(host=False)
        keep = self._mine if self.split.share else None
        self.pool = WorkerPool(train, self.loader, self.layout, workers, keep=keep) if workers > 0 else None
        self.ring = SendRing(world, self.layout, buffers, host, stream_tag(opened.loader), remote=remote)
        self.dataset = dataset  # (named in the error for samples that do not fit the layout)
        self.epoch, self.step, self.end = STOP, 0, STOP
        self.batches: Optional[Iterator[Union[list, torch.Tensor, ValueError]]] = None  # (`_start`)
        self.sent = 0
        self.sent_in: dict[int, int] = {}   # batches sent per epoch (for the per-epoch records)
        self.finished = -1                  # the last epoch this stream produced to its end

    @property
    def active(self) -> bool:
        return self.epoch != STOP and self.mine > 0 and (self.end == STOP or self.epoch < self.end)

    def _mine(self, step: int) -> bool:
        return not self.split.host(step)

    def replan(self, plan: Plan) -> None:
        """Start `plan`: the marker first (the host discards what came before it), then its batches."""
        if plan.epoch != STOP and not 0 <= plan.start < max(self.steps, 1):
            raise PeerError(f"{self.host_label} asked for step {plan.start} of an epoch of {self.steps} steps")
        self.epoch, self.step, self.end, self.batches = plan.epoch, plan.start, plan.end, None
        self._settle()
        self.ring.send_marker(self.layout, plan.seq)  # the host is receiving: it waits for this marker

    def produce(self) -> None:
        """Augment and send the next batch (the caller checked `ring.ready()`), then advance."""
        if self.on_batch is not None:
            self.on_batch(self.epoch * self.steps + self.step + 1, self.steps)
        if self.batches is None:
            self.batches = self._start()
        with self.timer.phase("augment"):  # built here, or waited for from the workers
            items = next(self.batches)
        with self.timer.phase("send"):  # collate straight into the send buffer (or the workers did), then Isend
            slot, _ = self.ring.acquire()
            try:
                self._send(slot, items)
            except ValueError as e:
                raise unfit_samples(self.dataset, e) from None
        self.sent += 1
        self.sent_in[self.epoch] = self.sent_in.get(self.epoch, 0) + 1
        self.step += 1
        self._settle()

    def _settle(self) -> None:
        """Move on to the next step this rank builds, into the next epoch at an epoch's end (the
        host most likely wants it next); the host builds the steps between (`--da-host-share`)."""
        while self.active:
            if self.step == self.steps:
                self.finished = self.epoch
                if self.on_epoch_end is not None:
                    self.on_epoch_end(self.epoch)
                self.epoch, self.step = self.epoch + 1, 0
                if self.pool is None:
                    self.batches = None
            elif self._mine(self.step):
                return
            else:
                self.step += 1

    def _send(self, slot: int, batch: Any) -> None:
        """Pack this process's items into the slot's buffer, or send a worker's packed message."""
        if isinstance(batch, list):
            self.ring.send_items(slot, self.layout, self.epoch, self.step, batch)
            return
        if isinstance(batch, ValueError):  # the worker found samples that do not fit the layout
            raise batch
        message = batch.numpy()
        self.layout.pack_header(message, self.epoch, self.step, int(self.layout.unpack_header(message)["count"]))
        self.ring.send_from(slot, message)

    def _start(self) -> Iterator[Union[list, torch.Tensor, ValueError]]:
        """Batches from (epoch, step) on: this epoch's in this process, or the plan's, across epoch
        edges, from the worker processes (which then run ahead into the next epoch): a list of items,
        or a worker's packed message or the ValueError it met (`_send`)."""
        if self.pool is not None:
            return self.pool.batches(self.epoch, self.step, self.end)
        self.loader.set_epoch(self.epoch)
        return self.loader.batches(self.step, keep=self._mine if self.split.share else None)

    def close(self) -> None:
        self.ring.drain()
        self.abandon()

    def abandon(self) -> None:
        """Stop producing (its host rank died: the sends in flight to it are never completed)."""
        if self.pool is not None:
            self.batches = None
            self.pool.close()
            self.pool = None


def _prebuilt_or_none(opened: OpenLoader, prebuilt: dict[bytes, Any]) -> Any:
    """The data set of a recipe this rank already built at start-up, or None."""
    if not isinstance(opened.dataset, Recipe):
        return None
    return prebuilt.get(pickle.dumps(opened.dataset.build))


class EpochRecords:
    """This DPU rank's record per epoch: its phases since the previous record and the batches it
    sent of that epoch (what the benchmarks read per epoch, as for the host ranks)."""

    def __init__(self, timer: PhaseTimer) -> None:
        self.timer = timer
        self.records: list[dict[str, Any]] = []
        self.mark = time.perf_counter()  # when the last record was taken
        self.recorded = -1               # the last epoch recorded

    def done(self, epoch: int, streams: Iterable[Stream]) -> None:
        """A stream finished producing `epoch`: record it once every open stream has. A stream opened
        late (its host started after the others, as on a loaded machine) adds its batches to the
        epoch already recorded instead of losing them."""
        streams = list(streams)
        if epoch <= self.recorded:
            record = next((r for r in self.records if r["epoch"] == epoch), None)
            late = sum(s.sent_in.pop(epoch, 0) for s in streams)
            if record is not None:
                record["batches"] += late
            return
        if any(s.finished < epoch for s in streams):
            return
        now = time.perf_counter()
        batches = sum(s.sent_in.pop(epoch, 0) for s in streams)
        self.records.append({"epoch": epoch, "epoch_time": now - self.mark, "batches": batches,
                             "phases": dict(self.timer.totals)})
        self.timer.reset()
        self.mark, self.recorded = now, epoch


class LoaderService:
    """This DPU rank's work in `--mode da`: the loaders of the host ranks it feeds."""

    def __init__(self, cfg: RunConfig, topo: Topology, hosts: tuple[int, ...], faults: Faults) -> None:
        """`hosts`: the world ranks of the host ranks it feeds; `faults`: the run's failure record."""
        self.cfg, self.topo, self.hosts = cfg, topo, hosts
        self.inbox = ControlInbox(topo, cfg.recovery_policy.survives_host_loss)  # (SHUTDOWN ends `run`)
        self.max_idle = IDLE_MAX_SLEEP  # (`_follow_rings`)
        self.streams: dict[tuple[int, int], Stream] = {}
        self.timer = PhaseTimer()
        self.turn = 0
        self.prebuilt: dict[bytes, Any] = {}
        self.epochs = EpochRecords(self.timer)
        self.injector = inject.for_rank(cfg.inject, topo, faults.note)  # --inject: fail at a step's batch
        note = cores_note(cfg.dpu_workers) if cfg.dpu_workers else None
        if note and topo.host_ranks[0] in hosts:  # once per job: the rank that feeds host rank 0
            print(f"[dpuoffload] note: {note}", flush=True)

    def prebuild(self, recipe: Callable[[], Any]) -> None:
        """Build a data set the hosts will name by this recipe now, during start-up: its cost (and
        its errors) belong to start-up, not to the host's wait for its first batch."""
        self.prebuilt[pickle.dumps(recipe)] = recipe()

    def run(self) -> list[dict[str, Any]]:
        """Serve until SHUTDOWN; a record per epoch all streams produced (phases, batches sent)."""
        sleep, moved_at = 0.0, time.perf_counter()
        while True:
            moved = self.poll_messages()
            if self.inbox.shut_down():
                break
            moved = self.produce_round() or moved
            if moved:
                sleep, moved_at = 0.0, time.perf_counter()
                continue
            # (a polled stream's sends in flight move only while this rank polls: no sleep at first)
            spinning = self.max_idle == REMOTE_MAX_SLEEP and time.perf_counter() - moved_at < REMOTE_SPIN
            with self.timer.phase("buffer_wait"):
                time.sleep(0.0 if spinning else sleep)
            sleep = sleep if spinning else min(max(sleep * 2, 1e-4), self.max_idle)
        return self.epochs.records

    def polls(self) -> dict[str, bool]:
        """Per host rank fed: whether its stream polls (`SendRing.probe`; for the end record)."""
        polled: dict[str, bool] = {}
        for (host, _), stream in self.streams.items():
            polled[str(host)] = polled.get(str(host), False) or stream.ring.needs_progress
        return polled

    def wires(self) -> dict[str, str]:
        """Per host rank fed: the dtype its batches travel in (uint8: `common.data.wire`; for the end record)."""
        return {str(host): str(stream.layout.dtype) for (host, _), stream in self.streams.items()}

    def _follow_rings(self) -> None:
        """Idle as briefly as the rings poll: with full rings, each poll (`ready()`) also moves the
        sends in flight, which over TCP or without single-copy shared memory move no other way."""
        polled = any(s.ring.needs_progress for s in self.streams.values())
        self.max_idle = REMOTE_MAX_SLEEP if polled else IDLE_MAX_SLEEP

    def epoch_done(self, epoch: int) -> None:
        self.epochs.done(epoch, self.streams.values())

    def inject_at(self, global_step: int, steps_per_epoch: int) -> None:
        self.injector.check(global_step, steps_per_epoch * self.cfg.epochs)

    def poll_messages(self) -> bool:
        """Handle every loader message that has arrived; whether there was one."""
        from mpi4py import MPI

        status, got = MPI.Status(), False
        while probe_any(self.topo.world, Tag.LOADER, status):
            host = status.Get_source()
            data = self.topo.world.recv(source=host, tag=Tag.LOADER)
            self.handle(host, decode(data, self.cfg.script))
            got = True
        return got

    def handle(self, host: int, message: Any) -> None:
        spares = self.topo.spare_ranks
        if host not in self.hosts and not (self.cfg.recovery_policy.fills_seats(len(spares)) and host in spares):
            raise PeerError(f"{self.topo.describe(host)} sent a loader message to {self.topo.describe()}, "
                            "which does not feed it: host and DPU programs disagree on the offload plan")
        if isinstance(message, OpenLoader):
            opened = Stream(self.topo.world, host, self.topo.describe(host), message, self.cfg.da_buffers, self.timer,
                            self.epoch_done, self.prebuilt, self.inject_at if self.injector else None,
                            self.cfg.dpu_workers, remote=self.topo.on_other_machine(host))
            self.streams[(host, message.loader)] = opened
            if message.check:  # (the host rank waits for it before planning: `host.numerics`)
                self.answer(host, fingerprint(opened.dataset, message.sampling.seed, message.check))
        elif isinstance(message, NumericsQuery):
            stream = self.streams.get((host, message.loader))
            if stream is None:
                raise PeerError(f"{self.topo.describe(host)} asked about loader {message.loader}, never opened")
            self.answer(host, step_output(stream.dataset, stream.loader.sampling.seed, message.index, message.step))
        elif isinstance(message, Plan):
            stream = self.streams.get((host, message.loader))
            if stream is None:
                raise PeerError(f"{self.topo.describe(host)} planned loader {message.loader}, which it never opened")
            stream.replan(message)
            self._follow_rings()
        else:
            raise PeerError(f"unknown loader message {type(message).__name__} from {self.topo.describe(host)}")

    def answer(self, host: int, reply: Any) -> None:
        """A numerics check's answer (`common.data.numerics`), pickled: start-up size, not per batch."""
        req = self.topo.world.isend(reply, dest=host, tag=Tag.NUMERICS)
        wait(req, self.cfg.peer_timeout, f"{self.topo.describe(host)} to take the numerics check's answer")

    def produce_round(self) -> bool:
        """One batch for each active stream whose ring has a free buffer, starting where the last
        round stopped (fairness between the hosts of a fan-out); whether any batch was made."""
        streams = [s for s in self.streams.values() if s.active]
        moved = False
        for i in range(len(streams)):
            stream = streams[(self.turn + i) % len(streams)]
            with self.host_may_die(stream):
                if stream.ring.ready():
                    stream.produce()
                    moved = True
        self.turn += 1
        return moved

    @contextlib.contextmanager
    def host_may_die(self, stream: Stream) -> Iterator[None]:
        """Under --recovery, a send to a dead host rank fails: its stream is dropped (its batches are
        the survivors' to take over) and the other streams go on."""
        from mpi4py import MPI

        try:
            yield
        except (PeerLost, MPI.Exception) as e:
            if not self.cfg.recovery_policy.survives_host_loss or not (isinstance(e, PeerLost) or is_failure(e)):
                raise
            self.streams = {k: s for k, s in self.streams.items() if s is not stream}
            stream.abandon()

    def close(self) -> None:
        for stream in list(self.streams.values()):
            with self.host_may_die(stream):
                stream.close()
