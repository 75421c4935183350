"""`job.loader(...)`: the public API's data loader, fed by a DPU rank (`--mode da`) or built here.

`DpuLoader` is what a user's loop iterates. Its batches are those of torch's `DataLoader` over
`seeded(dataset, seed)` with a `DistributedSampler(num_replicas=host ranks, rank=this host rank,
shuffle, seed)` and the default collate, bit for bit, wherever they are built: the DPU rank builds
the very same `RankLoader` (`common.data.loaders`) from the same `Sampling`.

`RemoteSource` is the host end of the loader stream protocol (`common.data.streams`): two
receive buffers, both kept posted, take the stream's messages in order; a batch is copied out of
its buffer (so the user owns it, as with a DataLoader, and the buffer takes the next message at
once) or, with `copy=False`, handed out as a view that stays valid until the next batch is asked
for (one copy less; what the built-in trainer does).
"""

from __future__ import annotations

import contextlib
import itertools
import time
from typing import TYPE_CHECKING, Iterator, Optional, Protocol, cast

import torch

from dpuoffload.common.data.batches import FLAG_POLL, BatchBuffer, BatchKind, BatchLayout
from dpuoffload.common.data.loaders import RankLoader, Sampling, probe_layout, unfit_samples
from dpuoffload.common.data.shards import as_stream
from dpuoffload.common.data.streams import STOP, OpenLoader, Plan, StepSplit, encode, stream_tag
from dpuoffload.common.data.wire import Chosen, HostSteps
from dpuoffload.common.data.workers import WorkerPool
from dpuoffload.common.errors import ConfigError, PeerError, PeerLost
from dpuoffload.common.runtime.messages import Tag
from dpuoffload.common.runtime.waits import REMOTE_MAX_SLEEP, REMOTE_SPIN, lost_peer, wait
from dpuoffload.host.numerics import NumericsCheck

if TYPE_CHECKING:
    from mpi4py import MPI

    from dpuoffload.common.faults.watch import Faults

Batch = tuple[torch.Tensor, torch.Tensor]
BATCH_POLL_MAX_SLEEP = 0.001  # a batch is on the critical path: poll at least every millisecond
BATCH_POLL_SPIN = 0.0005      # and spin briefly first: a batch in flight lands within microseconds


class Source(Protocol):
    """Where a `DpuLoader`'s batches come from."""

    def batches(self, epoch: int, start: int, stop: int) -> Iterator[Batch]: ...

    def defer_float_steps(self) -> Optional[HostSteps]:
        """The float steps of the uint8 wire, handed to the caller, who runs them (on its GPU): the
        source's uint8 batches then come as they arrived. None where nothing arrives as uint8."""

    def close(self) -> None: ...


class LocalSource:
    """This process loads and augments (`--mode none`, or no DPU ranks at all)."""

    def __init__(self, loader: RankLoader) -> None:
        self.loader = loader

    def batches(self, epoch: int, start: int, stop: int) -> Iterator[Batch]:
        self.loader.set_epoch(epoch)
        yield from self.loader.batches(start, stop)

    def defer_float_steps(self) -> Optional[HostSteps]:
        return None

    def close(self) -> None:
        pass


class RemoteSource:
    """The host end of one loader stream from DPU rank `feeder`."""

    def __init__(self, world: "MPI.Comm", feeder: int, feeder_label: str, loader_id: int, layout: BatchLayout,
                 steps: int, timeout: float, copy: bool, epochs: Optional[int] = None,
                 split: Optional[StepSplit] = None, pinned: bool = False, remote: bool = False) -> None:
        """`split` (`--da-host-share`): the feeder sends only the steps the host does not build.
        `pinned` (a host rank on a GPU): the receive buffers, and the batches copied out of them,
        are page-locked, so their copies to the GPU run asynchronously (`common.train.device`).
        `remote`: the feeder is on another machine (`REMOTE_MAX_SLEEP`)."""
        self.world, self.feeder, self.feeder_label = world, feeder, feeder_label
        self.split = split or StepSplit(0.0, steps)
        self.end = STOP if epochs is None else epochs  # the DPU rank produces no batch of epoch `end` or later
        self.loader_id, self.layout, self.steps = loader_id, layout, steps
        self.timeout, self.copy = timeout, copy
        self.tag = stream_tag(loader_id)
        self.pinned = pinned
        self.flags = FLAG_POLL if remote else 0      # the feeder's, as its last message said (how to poll)
        self.buffers: list[BatchBuffer] = [layout.buffer(pinned), layout.buffer(pinned)]
        self.reqs: list[Optional["MPI.Request"]] = [None, None]
        self.head = 0                                # the buffer the next message lands in
        self.held: Optional[int] = None              # copy=False: the buffer the user's batch views
        self.seq = 0
        self.next: Optional[tuple[int, int]] = None  # (epoch, step) of the stream's next batch; None: no plan
        self.opening: Optional[bytes] = None         # the pickled OpenLoader, until it is sent
        self.check: Optional[NumericsCheck] = None   # --numerics: compare the feeder's samples at opening
        self.checked: tuple[object, int] = (None, 0)  # ...with this data set's, under this seed
        self.tail: Optional[HostSteps] = None        # --wire uint8: the float steps this rank runs on each batch
        self.tail_deferred = False                   # ...or its caller, on its GPU (`defer_float_steps`)
        self.closed = False

    def prepare(self, dataset: object, sampling: Sampling, wire: Optional[Chosen] = None,
                check: Optional[NumericsCheck] = None) -> None:
        """Pickle the loader's opening message now (a data set that cannot be sent fails at
        `job.loader`, not at the first batch); it goes to the feeder with the first batch request,
        so building a loader involves no communication (the built-in trainer builds its loader
        during start-up, while the DPU ranks are in their own start-up collectives).
        `wire`: what the feeder sends (uint8: this rank runs the float steps on each batch; None: the
        data set's own samples, as `layout` says)
        `check` (--numerics): compare the feeder's first samples with this rank's own, built as the
        feeder builds them, when the loader opens (`host.numerics`)."""
        self.check = check if self.split.owned(host=False) else None  # (the feeder builds nothing: no check)
        split = None if wire is None else wire.split
        self.checked = (dataset if wire is None else wire.view, sampling.seed)
        self.tail = None if split is None else split.host
        samples = 0 if self.check is None else self.check.samples
        self.opening = encode(OpenLoader(self.loader_id, dataset, sampling, self.split.share, samples,
                                         0 if split is None else split.host_steps))

    def _open(self) -> None:
        if self.opening is None:
            return
        self._send_bytes(self.opening, "OpenLoader")
        self.opening = None
        if self.check is not None:
            where = "on the GPU, after the copy" if self.tail_deferred else "here"
            wire = "" if self.tail is None else f"uint8 (then {', '.join(self.tail.names)} {where})"
            self.check.run(self.world, self.feeder, self.feeder_label, self.loader_id, *self.checked, self.timeout,
                           wire)
        for slot in (0, 1):
            self._post(slot)

    def batches(self, epoch: int, start: int, stop: int) -> Iterator[Batch]:
        """The feeder's batches of [start, stop) of `epoch`; a new plan first unless the stream is there."""
        self.begin(epoch, start)
        for step in range(start, stop):
            if self.split.host(step):
                continue
            buf = self._receive(epoch, step)
            kind, got_epoch, got_step, count, flags = self.layout.read_header(buf)
            self.flags = flags  # (the feeder's ring found out how its sends move: `dpu.serve.SendRing.probe`)
            if kind != BatchKind.BATCH or got_epoch != epoch or got_step != step:
                raise PeerError(f"expected batch {step} of epoch {epoch} from {self.feeder_label}, got "
                                f"{BatchKind(kind).name} epoch {got_epoch} step {got_step}: "
                                "host and DPU programs disagree on the loader's batches")
            x, y = self.layout.unpack(buf, count)
            self.next = self.split.next_of(False, epoch, step + 1)
            if self.tail is not None and not self.tail_deferred:  # (the float batch is other memory: free at once)
                x, y = self.tail(x, reuse=not self.copy, pinned=self.pinned), y.clone()
                y = y.pin_memory() if self.pinned else y
                self._post(self._advance())
            elif self.copy:  # (pin_memory() copies into torch's cached page-locked blocks)
                x, y = (x.pin_memory(), y.pin_memory()) if self.pinned else (x.clone(), y.clone())
                self._post(self._advance())
            else:
                self.held = self._advance()
            yield x, y

    def defer_float_steps(self) -> Optional[HostSteps]:
        if self.tail is not None:
            self.tail_deferred = True
        return self.tail

    def begin(self, epoch: int, start: int) -> None:
        """Make the stream's next batch the feeder's first step at or after (epoch, start): a new
        plan unless it is already there (the feeder ran on from the previous one)."""
        if self.closed:
            raise ConfigError("this loader is closed (job.finish() or loader.close() was called)")
        self._open()
        if not self.split.owned(host=False):
            return  # --da-host-share 1: the host builds every step
        want = self.split.next_of(False, epoch, start)
        if self.next != want:
            self._replan(*want)

    def close(self) -> None:
        """Stop the stream: a STOP plan, the stream drained to its marker, leftover receives cancelled."""
        if self.closed:
            return
        self.closed = True
        if self.opening is not None:  # never used: the feeder never heard of it
            return
        self._replan(STOP, 0)
        for slot, req in enumerate(self.reqs):
            if req is not None:
                req.Cancel()
                req.Wait()
                self.reqs[slot] = None

    def abandon(self) -> None:
        """The feeder is dead: drop this stream without a word to it (its posted receives are
        cancelled; MPI may also have failed them already)."""
        self.closed = True
        for slot, req in enumerate(self.reqs):
            if req is not None:
                with contextlib.suppress(Exception):  # (a receive ULFM already failed)
                    req.Cancel()
                    req.Wait()
                self.reqs[slot] = None

    def _replan(self, epoch: int, start: int) -> None:
        """Send the plan, then discard messages until its marker (batches of the old plan)."""
        self.seq += 1
        self._send(Plan(self.loader_id, self.seq, epoch, start, self.end))
        while True:
            buf = self._receive(epoch, start, marker=True)
            kind, seq, _, _, flags = self.layout.read_header(buf)
            self.flags = flags
            self._post(self._advance())
            if kind == BatchKind.MARKER and seq == self.seq:
                break
        self.next = None if epoch == STOP else (epoch, start)

    def _send(self, message: OpenLoader | Plan) -> None:
        self._send_bytes(encode(message), type(message).__name__)

    def _send_bytes(self, data: bytes, what: str) -> None:
        req = self.world.isend(data, dest=self.feeder, tag=Tag.LOADER)
        wait(req, self.timeout, f"{self.feeder_label} to take loader message {what}")

    def _receive(self, epoch: int, step: int, marker: bool = False) -> BatchBuffer:
        """The next message of the stream: batch `step` of `epoch`, or the marker of a plan that
        starts there (the held view's buffer is released first)."""
        if self.held is not None:
            self._post(self.held)
            self.held = None
        req = self.reqs[self.head]
        if req is None:
            raise PeerError(f"loader {self.loader_id}: no receive posted for {self._what(epoch, step, marker)} "
                            "(a bug: please report it)")
        try:  # (a batch already there: no wait, and no message built for it; this runs once per batch)
            done = req.Test()
        except Exception:
            with lost_peer(self._what(epoch, step, marker)):
                raise
        if not done:
            wait(req, self.timeout, self._what(epoch, step, marker), max_sleep=self.max_sleep, spin=self.spin)
        self.reqs[self.head] = None
        return self.buffers[self.head]

    @property
    def max_sleep(self) -> float:
        """Poll as the feeder's ring does: often where its large sends move only while both ends
        call into MPI (FLAG_POLL: another machine, or shared memory without single-copy)."""
        return REMOTE_MAX_SLEEP if self.flags & FLAG_POLL else BATCH_POLL_MAX_SLEEP

    @property
    def spin(self) -> float:
        return REMOTE_SPIN if self.flags & FLAG_POLL else BATCH_POLL_SPIN

    def _what(self, epoch: int, step: int, marker: bool) -> str:
        """What `_receive` waits for, for its errors."""
        if marker:
            return f"the start of plan {self.seq} (epoch {epoch}, step {step}) from {self.feeder_label}"
        return f"batch {step} of epoch {epoch} from {self.feeder_label}"

    def _advance(self) -> int:
        """The buffer just received is done with by the stream; the other one is next."""
        slot, self.head = self.head, 1 - self.head
        return slot

    def _post(self, slot: int) -> None:
        self.reqs[slot] = self.world.Irecv(self.buffers[slot].raw, source=self.feeder, tag=self.tag)


class HostPart:
    """The steps this host rank builds itself under `--da-host-share` (its own worker processes,
    `--da-host-workers`, or this process with 0), the same batches its feeder would have sent."""

    def __init__(self, dataset: object, sampling: Sampling, split: StepSplit, workers: int,
                 epochs: Optional[int] = None) -> None:
        train = sampling.seeded(dataset)
        self.dataset, self.loader = dataset, RankLoader(sampling, train)
        self.split, self.end = split, STOP if epochs is None else epochs
        self.layout = probe_layout(train, sampling)
        self.pool = WorkerPool(train, self.loader, self.layout, workers, keep=split.host) if workers > 0 else None
        self.running: Optional[Iterator] = None
        self.next: Optional[tuple[int, int]] = None  # (epoch, step) of the pool's next batch

    def batches(self, epoch: int, start: int, stop: int) -> Iterator[Batch]:
        """This rank's steps in [start, stop) of `epoch`, in order."""
        if self.pool is None:
            self.loader.set_epoch(epoch)
            yield from self.loader.batches(start, stop, keep=self.split.host)
            return
        want = self.split.next_of(True, epoch, start)
        if self.next != want or self.running is None:  # the workers run on across epochs otherwise
            self.running = self.pool.batches(*want, self.end)
        for step in range(start, stop):
            if self.split.host(step):
                message = next(self.running)
                if isinstance(message, ValueError):
                    raise unfit_samples(self.dataset, message) from None
                self.next = self.split.next_of(True, epoch, step + 1)
                yield self.layout.unpack_message(message.numpy())

    def close(self) -> None:
        if self.pool is not None:
            self.running = None
            self.pool.close()


class SharedSource:
    """`--da-host-share f`: the host rank builds a share of every epoch's steps, its DPU rank sends
    the rest; both in order, interleaved by `StepSplit`, the same batches as either alone."""

    def __init__(self, remote: RemoteSource, host: HostPart) -> None:
        self.remote, self.host, self.split = remote, host, remote.split

    def batches(self, epoch: int, start: int, stop: int) -> Iterator[Batch]:
        self.remote.begin(epoch, start)  # the feeder starts now, even if the host's step comes first
        remote = self.remote.batches(epoch, start, stop)
        local = self.host.batches(epoch, start, stop)
        for step in range(start, stop):
            yield next(local) if self.split.host(step) else next(remote)

    def defer_float_steps(self) -> Optional[HostSteps]:
        return self.remote.defer_float_steps()  # (this rank's own steps are built whole: float)

    def close(self) -> None:
        self.remote.close()
        self.host.close()


class FallbackSource:
    """`--dpu-failure fallback`: the DPU rank's batches until MPI reports it dead, then this host
    rank's own from the very step that did not arrive (`HostPart` with every step: the same batches,
    since each sample's augmentation is seeded by its index). Nothing more is sent to the dead rank.
    `faults`: the run's failure record, which logs the fallback."""

    def __init__(self, primary: RemoteSource | SharedSource, dataset: object, sampling: Sampling, steps: int,
                 workers: int, epochs: Optional[int], where: str, faults: Faults) -> None:
        self.primary, self.dataset, self.sampling, self.steps = primary, dataset, sampling, steps
        self.workers, self.epochs, self.where, self.faults = workers, epochs, where, faults
        self.local: Optional[HostPart] = None

    def batches(self, epoch: int, start: int, stop: int) -> Iterator[Batch]:
        step, local = start, self.local
        if local is None:
            try:
                for batch in self.primary.batches(epoch, start, stop):
                    yield batch
                    step += 1
                return
            except PeerLost as e:
                local = self.local = self._fall_back(e, epoch, step)
        yield from local.batches(epoch, step, stop)

    def defer_float_steps(self) -> Optional[HostSteps]:
        return self.primary.defer_float_steps()  # (after a fallback every batch is built here, whole)

    def _fall_back(self, e: PeerLost, epoch: int, step: int) -> HostPart:
        """`e` says what did not arrive (logged); the line printed says what happens now."""
        remote = self.primary.remote if isinstance(self.primary, SharedSource) else self.primary
        remote.abandon()
        if isinstance(self.primary, SharedSource):
            self.primary.host.close()
        local = HostPart(self.dataset, self.sampling, StepSplit(1.0, self.steps), self.workers, self.epochs)
        workers = f" ({self.workers} worker process(es), --da-host-workers)" if self.workers else ""
        print(f"[dpuoffload] {self.where}: {remote.feeder_label} is gone; building this rank's batches here from "
              f"step {step} of epoch {epoch} on{workers}, the same ones", flush=True)
        self.faults.note({"event": "fallback", "feeder": remote.feeder, "epoch": epoch, "step": step,
                          "error": str(e), "time": time.time()})
        return local

    def close(self) -> None:
        (self.primary if self.local is None else self.local).close()


class DpuLoader:
    """A host rank's training batches: iterate `loader.epoch(e)` (or the loader itself, epoch after epoch).

    Every batch is `(samples, labels)`: what `DataLoader(seeded(dataset, seed), batch_size,
    sampler=DistributedSampler(dataset, host ranks, host rank, shuffle=shuffle, seed=seed))` yields
    for that epoch, to the bit, wherever it was built.
    """

    def __init__(self, source: Source, sampling: Sampling, steps: int, dataset: object, where: str,
                 epochs: Optional[int] = None) -> None:
        self.source, self.sampling, self._steps, self.dataset = source, sampling, steps, dataset
        self.epochs = epochs
        self.where = where               # "DPU rank 0 (world rank 2, node n0)" or "this process"
        self.batch_size = sampling.batch_size
        self._epochs = itertools.count()
        self.skipped: dict[tuple[int, int], int] = {}  # (epoch, step) -> samples left out (--skip-corrupt)
        self._sizes = sampling.batch_sizes(dataset) if sampling.skip_corrupt else None

    def __len__(self) -> int:
        """Batches per epoch on this host rank (the same on every host rank)."""
        return self._steps

    def epoch(self, epoch: int, start: int = 0, stop: Optional[int] = None) -> Iterator[Batch]:
        """Batches [start, stop) of epoch `epoch`, in order (`start`: where a resumed epoch goes on)."""
        stop = self._steps if stop is None else stop
        if not 0 <= start <= stop <= self._steps:
            raise ConfigError(f"loader.epoch({epoch}, start={start}, stop={stop}): need 0 <= start <= stop <= "
                              f"{self._steps} (batches per epoch)")
        if epoch < 0:
            raise ConfigError(f"loader.epoch({epoch}): epochs are numbered from 0")
        if self.epochs is not None and epoch >= self.epochs:
            raise ConfigError(f"loader.epoch({epoch}): this loader was made for epochs=0..{self.epochs - 1} "
                              f"(job.loader(..., epochs={self.epochs})); raise epochs or leave it unset")
        batches = self.source.batches(epoch, start, stop)
        return batches if self._sizes is None else self._counted(epoch, start, batches)

    def skipped_in(self, epoch: int) -> int:
        """Samples of `epoch` this rank's batches left out (`--skip-corrupt`): short batches, whoever built them."""
        return sum(n for (e, _), n in self.skipped.items() if e == epoch)

    def _counted(self, epoch: int, start: int, batches: Iterator[Batch]) -> Iterator[Batch]:
        """`--skip-corrupt`: count what each batch lacks, and stop past the budget. Counted here, on
        the batches' sizes, so every builder (this process, its workers, a DPU rank) counts alike."""
        sizes, budget = cast(list[int], self._sizes), self.sampling.skip_corrupt
        for step, (x, y) in enumerate(batches, start=start):
            if len(y) < sizes[step]:
                self.skipped[(epoch, step)] = sizes[step] - len(y)
                if self.skipped_in(epoch) > budget:
                    raise ConfigError(f"{self.skipped_in(epoch)} training samples of epoch {epoch} failed to load "
                                      f"for this host rank, more than --skip-corrupt {budget} allows (the lines "
                                      "above name them): fix or remove those files, or raise --skip-corrupt")
            yield x, y

    def set_epoch(self, epoch: int) -> None:
        """Make the next plain `for x, y in loader` iterate epoch `epoch` (as `DistributedSampler.set_epoch`)."""
        self._epochs = itertools.count(epoch)

    def __iter__(self) -> Iterator[Batch]:
        """The next epoch: 0, 1, ... (or from `set_epoch`); like re-iterating a DataLoader each epoch.

        The epoch is taken at the first batch, not here: an iterator made and dropped unused
        (Lightning makes one to check that the loader is iterable) must not use up an epoch."""
        yield from self.epoch(next(self._epochs))

    def defer_float_steps(self) -> Optional[HostSteps]:
        """Under the uint8 wire, hand the float steps (ToTensor, Normalize, ...) to the caller, to run
        on its GPU after copying the uint8 batch there (`HostSteps.batch`; the built-in trainer does
        on a GPU host rank with `--wire uint8`): the batches that arrive as uint8 then stay uint8, a
        quarter of the bytes to copy, and no float steps on this CPU. The steps, or None when no batch
        arrives as uint8 (float wire, local loading). Call it before the first batch."""
        return self.source.defer_float_steps()

    def close(self) -> None:
        """Stop the DPU rank's work for this loader (`job.finish()` closes every loader)."""
        self.source.close()


def local_loader(dataset: object, sampling: Sampling, epochs: Optional[int] = None) -> DpuLoader:
    """Loading in this process, as the DPU rank would (the fallback and `--mode none`)."""
    loader = RankLoader(sampling, sampling.seeded(dataset))
    return DpuLoader(LocalSource(loader), sampling, len(loader), dataset, "this process", epochs)


def check_dataset(dataset: object, batch_size: int) -> object:
    """The mistakes `job.loader` can name before anything is sent; the data set as the loader
    takes it (a stream with the shard protocol wrapped in a `ShardedSet`: its shards counted)."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ConfigError(f"job.loader: batch_size must be an integer >= 1, got {batch_size!r}")
    dataset = as_stream(dataset)
    if not (hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__")):
        raise ConfigError(f"job.loader needs a map-style data set (with __getitem__ and __len__) or a stream of "
                          f"shards (docs/batches.md, \"Streams\"), got {type(dataset).__name__}")
    if len(dataset) == 0:
        raise ConfigError("job.loader: the data set is empty")
    return dataset
