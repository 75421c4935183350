"""Sharded transfer of model state: which host rank sends which slice of which tensor (pure), and
packing those slices into one contiguous buffer and back.

After the allreduce every host rank holds the same weights, so the cheapest hand-off to DPU ranks
(DeepClone, Alg. 1; DeepFreeze) is for each of N host ranks to send 1/N: every tensor with at least
`threshold` elements is cut into N contiguous slices (flat offsets, slice k from host rank k);
smaller tensors go whole, each from one rank, assigned greedily by size so the ranks' loads stay
balanced. The receivers all-gather the pieces and reassemble the full state. Used by `--mode mv`
now, and by checkpoints and clones later: one mechanism, several consumers.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional, Sequence

import numpy as np
import torch

from dpuoffload.common.runtime.messages import STATE_HEADER, STATE_HEADER_BYTES
from dpuoffload.common.train.device import numpy_dtype, to_host
from dpuoffload.common.train.evaluation import shard_range

if TYPE_CHECKING:
    from mpi4py import MPI

DEFAULT_THRESHOLD = 4096  # elements; below this a slice costs more in bookkeeping than it saves


@dataclass(frozen=True)
class Piece:
    """Elements [start, stop) of the flattened tensor number `tensor` (state_dict order)."""

    tensor: int
    start: int
    stop: int


@dataclass(frozen=True)
class ShardPlan:
    """For every sender rank, the pieces it sends, in the order they are packed."""

    numels: tuple[int, ...]
    pieces: tuple[tuple[Piece, ...], ...]

    def rank_pieces(self, rank: int) -> tuple[Piece, ...]:
        return self.pieces[rank]


def plan_shards(numels: Sequence[int], n_ranks: int, threshold: int = DEFAULT_THRESHOLD) -> ShardPlan:
    """Assign every element of every tensor to exactly one of `n_ranks` senders (deterministic)."""
    if n_ranks < 1:
        raise ValueError(f"n_ranks must be >= 1, got {n_ranks}")
    per_rank: list[list[Piece]] = [[] for _ in range(n_ranks)]
    load = [0] * n_ranks
    small = []
    for t, n in enumerate(numels):
        if n >= threshold:
            for r in range(n_ranks):
                span = shard_range(n, r, n_ranks)
                if len(span):
                    per_rank[r].append(Piece(t, span.start, span.stop))
                    load[r] += len(span)
        elif n > 0:
            small.append(t)
    for t in sorted(small, key=lambda t: (-numels[t], t)):
        r = min(range(n_ranks), key=lambda r: (load[r], r))
        per_rank[r].append(Piece(t, 0, numels[t]))
        load[r] += numels[t]
    return ShardPlan(tuple(numels), tuple(tuple(sorted(p, key=lambda x: (x.tensor, x.start))) for p in per_rank))


@functools.lru_cache(maxsize=8)
def cached_plan(numels: tuple[int, ...], n_ranks: int) -> ShardPlan:
    """`plan_shards` for senders that all compute the same plan again and again (one per group size:
    under --recovery the host group that sends the state can shrink)."""
    return plan_shards(numels, n_ranks)


def state_tensors(state: Mapping[str, torch.Tensor]) -> list[torch.Tensor]:
    """The state's tensors in order; they must be contiguous so flat slices are views, not copies."""
    tensors = [t.detach() for t in state.values()]
    for name, t in zip(state, tensors):
        if not t.is_contiguous():
            raise ValueError(f"state tensor {name!r} is not contiguous; cannot be sent in slices")
    return tensors


def state_digest(model: torch.nn.Module) -> str:
    """sha256 over every parameter and buffer, in state_dict order: 'same weights, to the bit'."""
    h = hashlib.sha256()
    for name, t in model.state_dict().items():
        h.update(name.encode())
        h.update(to_host(t).contiguous().numpy().tobytes())
    return h.hexdigest()


def packed_nbytes(tensors: Sequence[torch.Tensor], pieces: Sequence[Piece]) -> int:
    return sum((p.stop - p.start) * tensors[p.tensor].element_size() for p in pieces)


def byte_buffer(nbytes: int, touch: bool = False) -> np.ndarray:
    """A fresh uint8 buffer for state bytes that MPI or a staging copy will overwrite entirely.

    Allocated by torch rather than numpy: torch aligns large blocks to 2 MB and advises
    transparent huge pages, so first touch faults 2 MB pages instead of 4 KB ones (188 MB on
    this VM: numpy `np.empty` + fill 0.55 s, this 0.07-0.14 s). Deterministic mode's NaN fill
    of fresh tensors is skipped (every byte is written anyway); `touch` faults the pages in now,
    to keep that cost off a later critical path."""
    det: Any = torch.utils.deterministic  # (a module object whose property torch's stubs do not declare)
    fill, det.fill_uninitialized_memory = det.fill_uninitialized_memory, False
    try:
        buf = torch.empty(nbytes, dtype=torch.uint8).numpy()
    finally:
        det.fill_uninitialized_memory = fill
    if touch:
        buf.fill(0)
    return buf


def pack_pieces(tensors: Sequence[torch.Tensor], pieces: Sequence[Piece], out: np.ndarray,
                packed: Optional[Callable[[int], None]] = None) -> int:
    """Copy `pieces` of `tensors` into the uint8 buffer `out` (the staging copy); return bytes used.
    `packed(n)`: called after each piece with the bytes packed so far (a sender sends what is ready)."""
    offset = 0
    for p in pieces:
        src = to_host(tensors[p.tensor].reshape(-1)[p.start: p.stop]).numpy().view(np.uint8)  # (a GPU's: a copy)
        out[offset: offset + src.nbytes] = src
        offset += src.nbytes
        if packed is not None:
            packed(offset)
    return offset


def unpack_pieces(buf: np.ndarray, pieces: Sequence[Piece], tensors: Sequence[torch.Tensor]) -> int:
    """Copy packed `pieces` from `buf` into `tensors` (in place); return bytes consumed. Pieces index
    a tensor's elements in logical (row-major) order; a tensor in another layout (channels-last)
    has no flat view, so its pieces land in a row-major copy that is copied back at the end."""
    offset = 0
    staged: dict[int, torch.Tensor] = {}
    for p in pieces:
        t = tensors[p.tensor]
        flat = t.view(-1) if t.is_contiguous() else staged.setdefault(p.tensor, t.contiguous()).view(-1)
        dst = flat[p.start: p.stop]
        n = dst.numel() * dst.element_size()
        dst.copy_(torch.from_numpy(buf[offset: offset + n].view(numpy_dtype(dst.dtype))))
        offset += n
    for i, rowmajor in staged.items():
        tensors[i].copy_(rowmajor)
    return offset


def allgather_bytes(comm: "MPI.Comm", mine: np.ndarray) -> np.ndarray:
    """Every rank's byte buffer of any length, end to end on every rank (one raw Allgatherv): how
    the STATE messages of all host ranks reach every rank that rebuilds the state from them."""
    from mpi4py import MPI

    counts = comm.allgather(len(mine))
    out = byte_buffer(sum(counts))
    displs = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(int).tolist()
    comm.Allgatherv(mine, [out, counts, displs, MPI.BYTE])
    return out


def unpack_states(gathered: np.ndarray, tensors: Sequence[torch.Tensor]) -> list[Mapping[str, int]]:
    """Unpack every STATE message in `gathered` (host ranks' messages end to end, as an all-gather
    of them leaves them) into `tensors`, each by the plan of its header's sender count; return
    their headers (header-only notices, sender -1, included). The DPU validation ranks rebuild an
    epoch's state this way, and so do the host ranks when they validate it themselves after a
    validation rank died (`host.validation.FallbackValidation`)."""
    heads, offset = [], 0
    numels = tuple(t.numel() for t in tensors)
    while offset < len(gathered):
        head = STATE_HEADER.unpack(gathered[offset: offset + STATE_HEADER_BYTES].view(np.int64).copy())
        start = offset + STATE_HEADER_BYTES
        if head["sender"] >= 0:
            pieces = cached_plan(numels, head["senders"]).rank_pieces(head["sender"])
            unpack_pieces(gathered[start: start + head["nbytes"]], pieces, tensors)
        heads.append(head)
        offset = start + head["nbytes"]
    return heads
