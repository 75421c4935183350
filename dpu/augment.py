"""`--mode da`: a DPU rank loads and augments the batches of the host ranks it feeds and sends them.

For every host rank it feeds, the DPU rank builds that host's own loader (`RankLoader`: the same
sampler, per-sample seeds and collate the host would use), so each batch is bit-identical to the
one the host would have built. Batches go out with `Isend` from `--da-buffers` pre-allocated
buffers used as a circular queue: a buffer is refilled only once its previous send completed, so
memory stays bounded however far the DPU runs ahead. With several host ranks (fan-out), batches
are produced round-robin, step by step, so no host waits for another host's whole epoch.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Optional

from dpuoffload.common.config import RunConfig
from dpuoffload.common.data.batches import BatchBuffer, BatchLayout
from dpuoffload.common.data.loaders import RankLoader
from dpuoffload.common.data.sampling import PerSampleSeeded
from dpuoffload.common.errors import ConfigError
from dpuoffload.common.runtime.messages import Tag
from dpuoffload.common.runtime.metrics import PhaseTimer
from dpuoffload.common.runtime.roles import Topology
from dpuoffload.common.runtime.waits import wait
from dpuoffload.common.state.trainstate import EpochSpan, Position, epoch_spans

if TYPE_CHECKING:
    from mpi4py import MPI


RING_POLL_MAX_SLEEP = 0.002  # a full ring waits for the host's next receive: poll often...
RING_POLL_SPIN = 0.0002      # ...and spin briefly first, a send of a posted receive completes in microseconds


class SendRing:
    """K send buffers used in turn; `acquire` waits (sleeping) until the next one is free."""

    def __init__(self, world: "MPI.Comm", layout: BatchLayout, k: int, timeout: Optional[float],
                 tag: int = Tag.BATCH) -> None:
        self.world, self.timeout, self.tag = world, timeout, tag
        self.buffers = [layout.buffer() for _ in range(k)]
        self.pending: list[Optional["MPI.Request"]] = [None] * k
        self.dests: list[int] = [-1] * k
        self.next = 0

    def acquire(self) -> tuple[int, BatchBuffer]:
        slot = self.next
        self.next = (self.next + 1) % len(self.buffers)
        self._complete(slot)
        return slot, self.buffers[slot]

    def ready(self) -> bool:
        """Whether `acquire` would return at once (the next buffer's previous send completed)."""
        req = self.pending[self.next]
        return req is None or bool(req.Test())

    def send(self, slot: int, nbytes: int, dest: int) -> None:
        self.pending[slot] = self.world.Isend(self.buffers[slot].raw[:nbytes], dest=dest, tag=self.tag)
        self.dests[slot] = dest

    def drain(self) -> None:
        for slot in range(len(self.buffers)):
            self._complete(slot)

    def _complete(self, slot: int) -> None:
        req = self.pending[slot]
        if req is None:
            return
        if not req.Test():  # (a completed send skips building the wait's message)
            wait(req, self.timeout, f"host world rank {self.dests[slot]} to receive a batch",
                 max_sleep=RING_POLL_MAX_SLEEP, spin=RING_POLL_SPIN)
        self.pending[slot] = None


def transform_name(dataset: Any) -> str:
    """The user's transform, for error messages (looks through Subset wrappers)."""
    while not hasattr(dataset, "transform") and hasattr(dataset, "dataset"):
        dataset = dataset.dataset
    return repr(getattr(dataset, "transform", None)).replace("\n", " ")


class Augmenter:
    """Produces and sends every batch of every epoch for the host ranks this DPU rank feeds."""

    def __init__(self, cfg: RunConfig, topo: Topology, train: PerSampleSeeded, layout: BatchLayout,
                 hosts: tuple[int, ...], start: Position = Position()) -> None:
        """`start`: where a resumed run begins (the host ranks derive the same batches from it)."""
        self.cfg, self.topo, self.layout, self.hosts, self.start = cfg, topo, layout, hosts, start
        self.loaders = {h: RankLoader(cfg, train, len(topo.host_ranks), topo.host_ranks.index(h), collate=False)
                        for h in hosts}
        self.ring = SendRing(topo.world, layout, cfg.da_buffers, cfg.peer_timeout)
        self.timer = PhaseTimer()
        self.transform = transform_name(train.dataset)

    def run(self) -> list[dict[str, Any]]:
        steps = len(next(iter(self.loaders.values())))
        return [self.run_span(span) for span in epoch_spans(steps, self.cfg.epochs, self.start, self.cfg.stop_at_step)]

    def run_span(self, span: EpochSpan) -> dict[str, Any]:
        """Batches [span.start, span.stop) of one epoch for every fed host, then an end message each."""
        self.timer.reset()
        t0 = time.perf_counter()
        epoch, iters = span.epoch, {}
        for h, loader in self.loaders.items():
            loader.set_epoch(epoch)
            iters[h] = loader.batches(span.start, span.stop)
        for step in range(span.start, span.stop):
            for h in self.hosts:
                self.produce(h, iters[h], epoch, step)
        for h in self.hosts:
            slot, buf = self.ring.acquire()
            self.ring.send(slot, self.layout.pack_end(buf, epoch), h)
        return {"epoch": epoch, "epoch_time": time.perf_counter() - t0,
                "batches": (span.stop - span.start) * len(self.hosts), "phases": dict(self.timer.totals)}

    def produce(self, host: int, batches: Any, epoch: int, step: int) -> None:
        with self.timer.phase("augment"):
            items = next(batches)  # the transformed samples, not yet collated
        with self.timer.phase("buffer_wait"):
            slot, buf = self.ring.acquire()
        with self.timer.phase("send"):  # collate straight into the send buffer, then Isend
            try:
                nbytes = self.layout.pack_items(buf, epoch, step, items)
            except ValueError as e:
                raise self.shape_error(str(e)) from None
            self.ring.send(slot, nbytes, host)

    def shape_error(self, detail: str) -> ConfigError:
        return ConfigError(f"--mode da needs every training sample to have the same shape and dtype, but "
                           f"the training transform {self.transform} does not ({detail}); end it with a "
                           "fixed-size step such as RandomResizedCrop(size) or Resize(size) + CenterCrop(size)")

    def close(self) -> None:
        self.ring.drain()
