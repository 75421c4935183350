"""`--mode da` on the host side: training batches that arrive from a DPU rank.

`RemoteFeed` is a `common.feeds.Feed`; the trainer times the wait for each batch as the "data"
phase, which in this mode is the host's stall on the DPU. It double-buffers: the receive for batch
i+1 is posted as batch i is handed to the trainer, i.e. before its forward pass, and waited for at
the start of step i+1.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator, Optional

from dpuoffload.common.data.batches import BatchBuffer, BatchKind, BatchLayout
from dpuoffload.common.data.feeds import Batch
from dpuoffload.common.errors import PeerError
from dpuoffload.common.runtime.messages import Tag
from dpuoffload.common.runtime.waits import wait

if TYPE_CHECKING:
    from mpi4py import MPI

BATCH_POLL_MAX_SLEEP = 0.001  # a batch is on the critical path: poll at least every millisecond
BATCH_POLL_SPIN = 0.0005      # and spin briefly first: a batch in flight lands within microseconds


class RemoteFeed:
    """`--mode da`: batches arrive from DPU rank `source` into two alternating receive buffers.

    A yielded batch is a view of a receive buffer and stays valid until the next batch is
    requested (the trainer finishes step i before asking for batch i+1).
    """

    def __init__(self, world: "MPI.Comm", source: int, source_label: str, layout: BatchLayout,
                 steps: int, timeout: float) -> None:
        self.world, self.source, self.source_label = world, source, source_label
        self.layout, self._steps, self.timeout = layout, steps, timeout
        self.buffers = [layout.buffer(), layout.buffer()]

    def steps(self) -> int:
        return self._steps

    def global_samples(self, step: int) -> Optional[int]:
        return None

    def epoch(self, epoch: int, start: int = 0, stop: Optional[int] = None) -> Iterator[Batch]:
        """Batches [start, stop), then the DPU's end-of-part message (both sides derive the same
        range from `common.trainstate.epoch_spans`)."""
        stop = self._steps if stop is None else stop
        req = self._post(start % 2)
        for step in range(start, stop):
            buf = self._wait(req, epoch, step)
            head = self.layout.unpack_header(buf)
            self._check(head, BatchKind.BATCH, epoch, step)
            req = self._post((step + 1) % 2)  # batch step+1 (or the epoch end) lands while we compute
            yield self.layout.unpack(buf, head["count"])
        end = self.layout.unpack_header(self._wait(req, epoch, stop))
        self._check(end, BatchKind.EPOCH_END, epoch, -1)

    def _post(self, slot: int) -> "MPI.Request":
        return self.world.Irecv(self.buffers[slot].raw, source=self.source, tag=Tag.BATCH)

    def _wait(self, req: "MPI.Request", epoch: int, step: int) -> BatchBuffer:
        if not req.Test():  # (a batch already here skips building the wait's message)
            wait(req, self.timeout, f"batch {step} of epoch {epoch} from {self.source_label}",
                 max_sleep=BATCH_POLL_MAX_SLEEP, spin=BATCH_POLL_SPIN)
        return self.buffers[step % 2]

    def _check(self, head: dict, kind: BatchKind, epoch: int, step: int) -> None:
        if head["kind"] != kind or head["epoch"] != epoch or head["step"] != step:
            raise PeerError(f"expected {kind.name} epoch {epoch} step {step} from {self.source_label}, got "
                            f"{BatchKind(head['kind']).name} epoch {head['epoch']} step {head['step']}: "
                            "host and DPU programs disagree on the epoch's batches")
