"""Every host<->DPU message kind, defined once: its MPI tag and its fixed-size header layout.

Headers are flat int64 numpy arrays sent as raw buffers (no pickling) so both programs, and any
future C/aarch64 peer, agree on the bytes. Bump `PROTOCOL_VERSION` in `version.py` when a layout
changes. Payloads that follow a header (batches, weight shards) are described by the header.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Mapping

import numpy as np


class Tag(IntEnum):
    """MPI tags on `COMM_WORLD` for host<->DPU traffic. Never reuse a number for another meaning."""

    CONTROL = 10       # control header: the job's end, a handshake (`ControlKind`)
    # 20 was BATCH (protocol 2): batches now go on per-loader stream tags, STREAM_BASE + loader
    STATE = 30         # model state slices, host -> DPU (--mode mv); packing in `common.sharding`
    METRICS = 31       # validation sums of one epoch, DPU validation rank 0 -> host rank 0
    PROFILE = 32       # float64 [seconds per sample]: measured DPU evaluation cost (--mv-dpu-fraction auto)
    CKPT = 33          # training-state slices, host -> its keeper DPU rank: CKPT_HEADER, then meta+local, then shared
    CKPT_REPORT = 34   # keeper DPU rank -> keeper 0 (on the keepers' communicator): files written for a checkpoint
    CLONE = 35         # keeper DPU rank -> clone rank: CKPT_HEADER then the same two payloads, forwarded as received;
                       # before it PREPARE and HEARTBEAT headers alone
    CKPT_SUMMARY = 36  # keeper 0 -> host rank 0 after the last hand-off: checkpoints taken/failed, newest intact
    RESTORE = 37       # keeper DPU rank -> host rank, once at start-up when restarting from DPU memory: CKPT_HEADER
                       # (kind RESTORE) then the two payloads of that host rank's hand-off, as kept
    MEM_COPY = 38      # keeper -> the keepers holding its partner copies (--ckpt-mem-replicas): COPY_HEADER, then
                       # per host rank kept its CKPT_HEADER (as received) and the two payloads, as kept
    LOADER = 40        # public API loaders, host -> its feeder DPU rank: pickled `common.data.streams` messages
    VALIDATOR = 41     # public API `job.validate`, host rank 0 -> every DPU validation rank, once: a pickled
                       # `common.data.streams.ValidatorSetup` (the model and the validation set)
    NUMERICS = 42      # loader numerics check, DPU -> host, pickled: a `common.data.numerics.Fingerprint` after an
                       # OpenLoader with `check`, a step's output (numpy array) after a NumericsQuery
    STREAM_BASE = 1000  # augmented batches of loader i, DPU -> host (--mode da), on tag STREAM_BASE + i;
                        # layout in `common.data.batches`, protocol in `common.data.streams`


class ControlKind(IntEnum):
    """The job's end, a handshake in three messages (`host.control.end_with_dpus`, `dpu.control.ControlInbox`),
    so that no rank leaves before every living rank knows the job is over: under fault tolerance a rank
    that leaves earlier would be taken for a dead one (`common.faults.watch`), however late a DPU rank
    reads its message. No timer decides it."""

    SHUTDOWN = 1       # the sender (lowest living host rank in a seat) -> each living DPU rank: training ended;
                       # `value`: the sender's world rank, where the reply goes
    ENDING = 2         # DPU rank -> the sender: it knows the job is over (its failure watch judges no more)
    RELEASE = 3        # the sender -> each DPU rank that replied: every one did; it may leave


@dataclass(frozen=True)
class HeaderLayout:
    """A named fixed layout of int64 fields, packed into / unpacked from a numpy buffer."""

    name: str
    tag: Tag
    fields: tuple[str, ...]

    def empty(self) -> np.ndarray:
        """A receive buffer of the right size."""
        return np.zeros(len(self.fields), dtype=np.int64)

    def pack(self, **values: int) -> np.ndarray:
        unknown = set(values) - set(self.fields)
        if unknown:
            raise ValueError(f"{self.name} header has no field(s) {sorted(unknown)}")
        return np.array([int(values.get(f, 0)) for f in self.fields], dtype=np.int64)

    def unpack(self, buf: np.ndarray) -> Mapping[str, int]:
        if buf.shape != (len(self.fields),):
            raise ValueError(f"{self.name} header must have {len(self.fields)} int64 fields, got shape {buf.shape}")
        return {f: int(v) for f, v in zip(self.fields, buf)}


CONTROL = HeaderLayout("control", Tag.CONTROL, ("kind", "epoch", "step", "value"))

# The STATE message: this header (int64) followed by the sender's packed slices (bytes), in one buffer.
# `dpu_share_ppm` is the fraction of the validation set the DPU ranks evaluate, in parts per million.
# `sender` is the sender's rank among the `senders` host ranks that hand this epoch's state over (the
# slices follow `plan_shards(..., senders)`), `source` its world rank (the results go back there under
# --recovery), `to_me` how many STATE messages of this epoch the receiving validation rank gets (under
# --recovery the host group can shrink or take a spare in, so the receiver cannot know it in advance; a
# validation rank no host rank sends to gets a header-only notice, `sender` -1, instead).
STATE_HEADER = HeaderLayout("state", Tag.STATE, ("epoch", "sender", "nbytes", "dpu_share_ppm", "senders", "to_me",
                                                 "source"))
STATE_HEADER_BYTES = 8 * len(STATE_HEADER.fields)


class StateKind(IntEnum):
    """What a CKPT message carries the state for."""

    CHECKPOINT = 1     # persist it (keepers write shards, keeper 0 commits)
    CLONE = 2          # forward it to the clone ranks, no disk
    END = 3            # no more state from this host rank (payload sizes 0)
    PREPARE = 4        # after the first step: `shared_nbytes` of this rank's future hand-offs, so the keeper
                       # (and, forwarded, the clone rank) can fault in its receive buffer off the critical path
    HEARTBEAT = 5      # keeper -> clone rank (Tag.CLONE, header only, sender -1): "alive, the clone state is not
                       # due yet", every peer_timeout/4 s until the clone is served (`host.clone`'s stand-by deadline)
    RESTORE = 6        # keeper -> host rank (Tag.RESTORE): its hand-off kept in DPU memory, to restart from
    JOIN = 7           # --recovery rollback: a spare -> its seat's keeper, header only, on taking the seat at
                       # `global_step` (its hand-offs come from there on, that step's first if one is due)


# The CKPT / CLONE message: this header, then `small_nbytes` bytes = `meta_nbytes` of UTF-8 JSON (run-level:
# position, tensor catalog, optimizer groups, scheduler, config; identical from every host rank) followed by
# the sender's local state (a safetensors blob: BatchNorm buffers, RNG states, epoch progress), then
# `shared_nbytes` bytes: the sender's pieces of the sharded tensors (`common.sharding`, catalog order), in
# `shared_parts` messages: staged, the packed buffer in `chunk_bytes` chunks (the last one shorter; the host
# sends each as soon as it is packed, and a keeper forwarding a clone state passes each on as soon as it
# landed: cut-through, `dpu.keeper.clone`); zero-copy (`chunk_bytes` 0), one per piece, each straight from
# tensor memory, so Open MPI's single-copy path lets the receiver pull it while the sender computes; 1 with
# `chunk_bytes` 0: one buffer (a restore from DPU memory).
# `lost_keepers`: the keepers the host ranks agreed are dead (`StateAssignment.lost_mask`), which routes
# this hand-off (`--dpu-failure fallback`; 0 otherwise). `sender` is the sender's rank among the `senders`
# host ranks handing this state over and `seat` the host rank whose place it trains in (they differ once
# `--recovery lossy-forward` shrank the host group); `to_me` how many hand-offs of this step the receiving
# keeper gets, and `leader` the world rank of the senders' rank 0 (it takes the checkpoint summary). Under
# --recovery a keeper none of whose host ranks is left gets a header-only notice instead (`sender` -1).
# Under --recovery rollback a spare that takes a seat first sends the seat's keeper a JOIN header.
CKPT_HEADER = HeaderLayout("ckpt", Tag.CKPT, ("kind", "global_step", "sender", "senders", "meta_nbytes",
                                              "small_nbytes", "shared_nbytes", "shared_parts", "lost_keepers",
                                              "seat", "to_me", "leader", "chunk_bytes"))
STAGED_CHUNK_BYTES = 8 << 20  # staged hand-offs: the size of one message (a pipeline stage: pack, send, forward)

# The MEM_COPY message: after a keeper kept a checkpoint's hand-offs in its DPU memory, it sends them to
# each keeper holding its partner copy (`memstore.place_copies`): this header (`keeper`: the sender's
# keeper index; `parts`: how many host ranks' hand-offs follow), then per part the CKPT_HEADER array and
# the `small_nbytes` and `shared_nbytes` payloads. `done` 1 (parts 0): no more copies from this keeper.
COPY_HEADER = HeaderLayout("copy", Tag.MEM_COPY, ("global_step", "keeper", "parts", "done"))

# The METRICS message: float64 [epoch, loss sum, correct, count] over the DPU ranks' validation part.
METRICS_FIELDS = ("epoch", "loss_sum", "correct", "count")
