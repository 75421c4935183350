"""Background capture of a state slice (`--ckpt-copy overlap`): the copy into the staging buffer runs
beside the next step's forward and backward passes, and only the next optimizer step (which
overwrites the weights and the optimizer state being copied) waits for it.

This is DeepFreeze's fine-grained snapshot: the forward and backward passes only *read* the
parameters and the optimizer state, so a copy of them taken while they run is the state of the
step that just ended, as long as nothing writes them before the copy is done. The one writer is the
optimizer step, and `settle` makes it wait:

- on a CPU host rank a worker thread packs the slice (`sharding.pack_pieces`; numpy and torch
  copies release the GIL), and `settle` waits for the thread: the host blocks for what is left of
  the copy at the next optimizer step, usually nothing;
- on a GPU host rank the copies into a pinned buffer are queued on a side stream (ordered after
  the step that produced the state), and `settle` makes the compute stream wait for that stream:
  the host blocks for launching copies, never for copying (the device orders the optimizer step
  after the last copy).

The caller sends a chunk of the staging buffer once `packed()` covers it (a prefix grows as the
copy runs), so the keeper pulls chunk i while chunk i+1 is still being copied.
"""

from __future__ import annotations

import collections
import concurrent.futures
import threading
from typing import Optional, Protocol, Sequence

import numpy as np
import torch

from dpuoffload.common.errors import InternalError
from dpuoffload.common.state.sharding import Piece, pack_pieces


class Capture(Protocol):
    """A copy of a slice into a staging buffer, running in the background."""

    def packed(self) -> int:
        """Bytes of the staging buffer copied so far (always a prefix)."""

    def settle(self) -> None:
        """Before the tensors are written again (the next optimizer step): the copy must not see it."""

    def wait(self) -> None:
        """Every byte copied (the host blocks until then); a failed copy raises here."""


_WORKER: Optional[concurrent.futures.ThreadPoolExecutor] = None
_WORKER_LOCK = threading.Lock()


def _worker() -> concurrent.futures.ThreadPoolExecutor:
    """One copy thread per process, made on first use (a run without overlap starts none)."""
    global _WORKER
    with _WORKER_LOCK:
        if _WORKER is None:
            _WORKER = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="dpuoffload-capture")
        return _WORKER


class ThreadCapture:
    """CPU tensors: one worker thread packs the pieces in order, publishing its progress."""

    def __init__(self, tensors: Sequence[torch.Tensor], pieces: Sequence[Piece], out: np.ndarray) -> None:
        self._done = 0
        self._future = _worker().submit(pack_pieces, tensors, pieces, out, self._progress)

    def _progress(self, nbytes: int) -> None:
        self._done = nbytes  # (an int store: atomic under the GIL)

    def packed(self) -> int:
        return self._done

    def settle(self) -> None:
        self.wait()

    def wait(self) -> None:
        self._future.result()


class StreamCapture:
    """GPU tensors: device-to-host copies into pinned memory on a side stream, an event per piece."""

    def __init__(self, tensors: Sequence[torch.Tensor], pieces: Sequence[Piece], out: torch.Tensor) -> None:
        device = tensors[pieces[0].tensor].device if pieces else torch.device("cuda")
        self._compute = torch.cuda.current_stream(device)
        self._stream = torch.cuda.Stream(device)
        self._stream.wait_stream(self._compute)  # the state of the step just queued, not an older one
        self._marks: collections.deque[tuple[int, torch.cuda.Event]] = collections.deque()
        self._done = 0
        offset = 0
        with torch.cuda.stream(self._stream):
            for p in pieces:
                src = tensors[p.tensor].reshape(-1)[p.start: p.stop].view(torch.uint8)
                out[offset: offset + src.numel()].copy_(src, non_blocking=True)
                offset += src.numel()
                event = torch.cuda.Event()
                event.record(self._stream)
                self._marks.append((offset, event))

    def packed(self) -> int:
        while self._marks and self._marks[0][1].query():
            self._done = self._marks.popleft()[0]
        return self._done

    def settle(self) -> None:
        self._compute.wait_stream(self._stream)  # the device orders the optimizer step after the copies

    def wait(self) -> None:
        self._stream.synchronize()
        self._marks.clear()
        self.packed()


class PinnedStaging:
    """A reusable staging buffer for background copies: page-locked when the tensors are on a GPU (a
    copy from the device into pageable memory would not be asynchronous), as numpy for MPI."""

    def __init__(self) -> None:
        self.tensor: Optional[torch.Tensor] = None
        self.array: Optional[np.ndarray] = None

    def at_least(self, nbytes: int, pinned: bool) -> np.ndarray:
        fits = self.array is not None and self.array.nbytes >= nbytes
        if not fits or (self.tensor is not None and self.tensor.is_pinned()) != pinned:
            self.tensor = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pinned)
            self.tensor.fill_(0)  # fault the pages in now, not during the first capture
            self.array = self.tensor.numpy()
        if self.array is None:
            raise InternalError("the staging buffer was not made")
        return self.array


def start(tensors: Sequence[torch.Tensor], pieces: Sequence[Piece], staging: PinnedStaging, nbytes: int) -> Capture:
    """Start copying `pieces` of `tensors` into `staging` in the background (a GPU's on a side stream)."""
    on_gpu = any(tensors[p.tensor].is_cuda for p in pieces)
    out = staging.at_least(nbytes, pinned=on_gpu)
    if on_gpu:
        if staging.tensor is None:
            raise InternalError("a GPU capture without its pinned staging tensor")
        return StreamCapture(tensors, pieces, staging.tensor)
    return ThreadCapture(tensors, pieces, out)
