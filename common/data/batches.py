"""The batch message (`--mode da`): one raw buffer per batch, header + labels + samples, no pickling.

    offset 0                 BATCH_HEADER: int64 fields below
    offset HEADER_BYTES      labels: int64[max_batch]          (first `count` valid)
    offset + 8*max_batch     samples: dtype[max_batch, *shape] (first `count` valid)

One message per batch keeps MPI's ordering trivial (the host posts a single `Irecv` of the maximum
size per buffer) and lets the host use the received memory in place (`unpack` returns views).
Both sides derive the same `BatchLayout` from the data set, and every header repeats dtype and
shape so a mismatch is caught, not silently misread.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Callable, Mapping, Optional

import numpy as np
import torch

from dpuoffload.common.errors import PeerError
from dpuoffload.common.runtime.messages import HeaderLayout, Tag

MAX_DIMS = 4
BATCH_HEADER = HeaderLayout("batch", Tag.STREAM_BASE, ("kind", "epoch", "step", "count", "flags", "dtype", "ndim",
                                                  *(f"dim{i}" for i in range(MAX_DIMS))))
# `flags`, set by the sender's ring on every message (`dpu.serve.SendRing`): FLAG_POLL = this stream's
# large messages move only while both ends call into MPI (another machine, or shared memory without
# single-copy), so the receiver polls often too.
FLAG_POLL = 1
_FLAGS_AT = 8 * BATCH_HEADER.fields.index("flags")  # its byte offset
HEADER_BYTES = 8 * len(BATCH_HEADER.fields)
PACK_CHUNK_BYTES = 1 << 20  # `pack_items(between=...)`: samples stacked between two calls


class BatchKind(IntEnum):
    BATCH = 1
    # 2 was EPOCH_END (protocol 2): plans and markers (`common.data.streams`) replaced it
    MARKER = 3     # no payload: the batches of plan number `epoch` follow (`common.data.streams`)


_KINDS = frozenset(int(k) for k in BatchKind)
_DTYPES = {1: np.float32, 2: np.float16, 3: np.uint8, 4: np.float64, 5: np.int64}
_CODES = {np.dtype(v): k for k, v in _DTYPES.items()}


@dataclass(frozen=True)
class BatchLayout:
    """Sizes of the batch message for one run: per-sample shape and dtype, and the largest batch."""

    sample_shape: tuple[int, ...]
    dtype: np.dtype
    max_batch: int

    def __post_init__(self) -> None:
        if len(self.sample_shape) > MAX_DIMS:
            raise ValueError(f"samples with {len(self.sample_shape)} dims; the batch header holds {MAX_DIMS}")
        if np.dtype(self.dtype) not in _CODES:
            raise ValueError(f"sample dtype {self.dtype} cannot be sent; supported: "
                             f"{', '.join(str(np.dtype(d)) for d in _DTYPES.values())}")
        # Per-batch work is on the hot path (~0.1 ms of Python per batch would cap small-batch
        # bandwidth), so the fields every header shares are built once: dtype, ndim, dims.
        static = [_CODES[np.dtype(self.dtype)], len(self.sample_shape), *self.sample_shape]
        static += [0] * (MAX_DIMS - len(self.sample_shape))
        object.__setattr__(self, "_static", static)
        object.__setattr__(self, "_torch_dtype", torch.from_numpy(np.empty(0, self.dtype)).dtype)
        object.__setattr__(self, "_sample_bytes",
                           int(np.prod(self.sample_shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize)

    @property
    def torch_dtype(self) -> torch.dtype:
        return self._torch_dtype  # type: ignore[attr-defined]

    @property
    def sample_items(self) -> int:
        return int(np.prod(self.sample_shape, dtype=np.int64))

    @property
    def labels_offset(self) -> int:
        return HEADER_BYTES

    @property
    def samples_offset(self) -> int:
        return HEADER_BYTES + 8 * self.max_batch

    def nbytes(self, count: int) -> int:
        return self.samples_offset + count * self._sample_bytes  # type: ignore[attr-defined]

    def empty(self) -> np.ndarray:
        """A buffer for the largest batch (what receivers post and senders fill)."""
        return np.zeros(self.nbytes(self.max_batch), dtype=np.uint8)

    def buffer(self, pinned: bool = False) -> "BatchBuffer":
        """`empty()` with its typed views built once: what the hot paths (send ring, receive
        feed) reuse, since building the views costs more per batch than the header itself.
        `pinned`: page-locked memory (a host rank that trains on a GPU), so the batch's copy to
        the GPU is a real asynchronous DMA rather than a staged, blocking one; needs CUDA."""
        if not pinned:
            return self.views(self.empty())
        raw = torch.zeros(self.nbytes(self.max_batch), dtype=torch.uint8, pin_memory=True)
        return self.views(raw.numpy())  # the array keeps the pinned tensor alive

    def views(self, buf: "np.ndarray | BatchBuffer") -> "BatchBuffer":
        if isinstance(buf, BatchBuffer):
            return buf
        samples = buf[self.samples_offset: self.nbytes(self.max_batch)].view(self.dtype)
        samples = samples.reshape(self.max_batch, *self.sample_shape)
        labels = buf[self.labels_offset: self.samples_offset].view(np.int64)
        return BatchBuffer(buf, buf[:HEADER_BYTES].view(np.int64), labels, torch.from_numpy(labels),
                           torch.from_numpy(samples))

    def header(self, kind: BatchKind, epoch: int, step: int, count: int) -> np.ndarray:
        """The BATCH_HEADER fields: kind, epoch, step, count, then dtype, ndim, dim0..dim3."""
        out = np.zeros(len(BATCH_HEADER.fields), dtype=np.int64)
        self._write_header(out, kind, epoch, step, count)
        return out

    def _write_header(self, head: np.ndarray, kind: BatchKind, epoch: int, step: int, count: int) -> None:
        """Every field but `flags`, which the sender's ring stamps when it sends (`stamp_flags`)."""
        head[:4] = (int(kind), epoch, step, count)
        head[5:] = self._static  # type: ignore[attr-defined]

    def pack(self, buf: np.ndarray, epoch: int, step: int, samples: torch.Tensor, labels: torch.Tensor) -> int:
        """Copy one collated batch into `buf`; return the number of bytes to send."""
        count = samples.shape[0]
        if tuple(samples.shape[1:]) != self.sample_shape or samples.dtype != self.torch_dtype:
            raise ValueError(f"batch of shape {tuple(samples.shape)} {samples.dtype}; every batch must be "
                             f"[n, {', '.join(map(str, self.sample_shape))}] {np.dtype(self.dtype)}")
        if count > self.max_batch:
            raise ValueError(f"batch of {count} samples exceeds the layout's {self.max_batch}")
        v = self.views(buf)
        self._write_header(v.head, BatchKind.BATCH, epoch, step, count)
        v.labels[:count] = labels.numpy()
        v.samples[:count] = samples
        return self.nbytes(count)

    def pack_items(self, buf: "np.ndarray | BatchBuffer", epoch: int, step: int, items: list,
                   between: Optional[Callable[[], None]] = None) -> int:
        """Stack a batch's (sample, label) items straight into `buf` (what `default_collate` would
        build, bit for bit, without the intermediate batch tensor); return the bytes to send.
        `between`: called after every PACK_CHUNK_BYTES of samples stacked (a sender whose messages
        in flight move only while it calls into MPI keeps them moving meanwhile)."""
        count = len(items)
        if count > self.max_batch:
            raise ValueError(f"batch of {count} samples exceeds the layout's {self.max_batch}")
        samples, labels = zip(*items)
        # One shape check (torch.stack itself refuses samples of unequal shapes) and a dtype check
        # of all (stack would cast silently into the buffer's dtype, unlike default_collate).
        first = samples[0]
        if tuple(first.shape) != self.sample_shape or {x.dtype for x in samples} != {self.torch_dtype}:
            bad = next((x for x in samples if x.dtype != self.torch_dtype), first)
            raise ValueError(f"a sample of shape {tuple(bad.shape)} {bad.dtype}; every sample must be "
                             f"[{', '.join(map(str, self.sample_shape))}] {np.dtype(self.dtype)}")
        v = self.views(buf)
        out = v.samples if count == self.max_batch else v.samples[:count]  # (no slice per full batch)
        try:
            if between is None:
                torch.stack(samples, out=out)
            else:
                per = max(1, PACK_CHUNK_BYTES // self._sample_bytes)  # type: ignore[attr-defined]
                for at in range(0, count, per):
                    torch.stack(samples[at:at + per], out=out[at:at + per])
                    between()
        except RuntimeError as e:  # unequal shapes
            raise ValueError(f"samples of different shapes in one batch ({e}); every sample must be "
                             f"[{', '.join(map(str, self.sample_shape))}] {np.dtype(self.dtype)}") from None
        # Python ints go in as they are; other labels (0-d tensors, numpy integers) through int().
        v.labels[:count] = labels if type(labels[0]) is int else [int(y) for y in labels]
        self._write_header(v.head, BatchKind.BATCH, epoch, step, count)
        return self.nbytes(count)

    def pack_header(self, buf: "np.ndarray | BatchBuffer", epoch: int, step: int, count: int) -> int:
        """Only the header of a batch whose samples and labels are already in `buf`; the bytes to send."""
        self._write_header(_head(buf), BatchKind.BATCH, epoch, step, count)
        return self.nbytes(count)

    def pack_marker(self, buf: "np.ndarray | BatchBuffer", seq: int) -> int:
        self._write_header(_head(buf), BatchKind.MARKER, seq, -1, 0)
        return HEADER_BYTES

    def read_header(self, buf: "np.ndarray | BatchBuffer") -> tuple[int, int, int, int, int]:
        """(kind, epoch, step, count, flags) of a received message, checked against this layout. The
        receive path's form of `unpack_header`: it runs once per batch, where a dict costs more
        than the check itself."""
        kind, epoch, step, count, flags, *static = _head(buf).tolist()  # one conversion for all fields
        if kind not in _KINDS:
            raise PeerError(f"batch message of unknown kind {kind}: host and DPU programs disagree "
                            "on the protocol")
        if kind == BatchKind.BATCH and static != self._static:  # type: ignore[attr-defined]
            raise PeerError(f"batch header {dict(BATCH_HEADER.unpack(_head(buf)))} does not match this run's layout "
                            f"({self.sample_shape} {np.dtype(self.dtype)}); host and DPU disagree on the data")
        return kind, epoch, step, count, flags

    def unpack_header(self, buf: "np.ndarray | BatchBuffer") -> Mapping[str, int]:
        return dict(zip(("kind", "epoch", "step", "count", "flags"), self.read_header(buf)))

    def unpack_message(self, message: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """Samples and labels of one whole message of exactly its size (a worker's packed batch,
        `common.data.workers`), as views (no copy)."""
        count = self.unpack_header(message)["count"]
        samples = message[self.samples_offset: self.nbytes(count)].view(self.dtype).reshape(count, *self.sample_shape)
        labels = message[self.labels_offset: self.labels_offset + 8 * count].view(np.int64)
        return torch.from_numpy(samples), torch.from_numpy(labels)

    def unpack(self, buf: "np.ndarray | BatchBuffer", count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Views (no copy) of the samples and labels of a received batch of `count` samples."""
        v = self.views(buf)
        if count == self.max_batch:  # (the usual batch: the whole views, no slicing per batch)
            return v.samples, v.labels_t
        return v.samples[:count], v.labels_t[:count]


@dataclass(frozen=True)
class BatchBuffer:
    """One batch buffer (`raw`, what MPI sends or receives into) and typed views of its parts,
    built once per buffer by `BatchLayout.buffer()`. Every view shares `raw`'s memory."""

    raw: np.ndarray             # uint8[nbytes(max_batch)]
    head: np.ndarray            # int64 BATCH_HEADER fields
    labels: np.ndarray          # int64[max_batch]
    labels_t: torch.Tensor      # the same labels as a tensor
    samples: torch.Tensor       # dtype[max_batch, *sample_shape]


def _head(buf: "np.ndarray | BatchBuffer") -> np.ndarray:
    """The int64 header fields of a batch buffer (without building the other views)."""
    return buf.head if isinstance(buf, BatchBuffer) else buf[:HEADER_BYTES].view(np.int64)


def stamp_flags(message: np.ndarray, flags: int) -> None:
    """Set the `flags` field of a packed message (raw bytes from offset 0) just before it is sent."""
    message[_FLAGS_AT:_FLAGS_AT + 8].view(np.int64)[0] = flags


def layout_for(sample: torch.Tensor, max_batch: int) -> BatchLayout:
    """The layout for samples like `sample` (one transformed training sample)."""
    if not isinstance(sample, torch.Tensor):
        raise TypeError(f"the training transform returns {type(sample).__name__}; --mode da sends tensors, "
                        "so the transform must end in a tensor (e.g. ToTensor())")
    try:
        dtype = np.dtype(torch.empty(0, dtype=sample.dtype).numpy().dtype)
    except TypeError:  # e.g. bfloat16 has no numpy dtype
        raise ValueError(f"sample dtype {sample.dtype} cannot be sent; supported: "
                         f"{', '.join(str(np.dtype(d)) for d in _DTYPES.values())}") from None
    return BatchLayout(tuple(sample.shape), dtype, max_batch)
