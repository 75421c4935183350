"""Checkpoints on disk: one directory per checkpoint, written by DPU ranks, committed last.

    <ckpt-dir>/step-000000120/
        shard-00000.safetensors   host rank 0's slices of the shared tensors (flat pieces, typed)
        local-00000.safetensors   host rank 0's local state (BatchNorm buffers, RNG, epoch progress)
        ...                       one pair per host rank of the run that wrote it
        manifest.json             catalog, where every piece is, sha256 and size of every file, meta
        COMMITTED                 written last: only a directory with it is a checkpoint

Every file is written to a temporary name, fsynced and renamed, and the directory fsynced, so a
crash leaves either the old state or a complete new file, never half of one (DeepFreeze's
consistency rule; torch.distributed.checkpoint writes its metadata file last for the same
reason). Reading verifies every file's checksum and names the file that is missing or corrupt.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Collection, Mapping, Optional, cast

import numpy as np
import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from dpuoffload.common import files
from dpuoffload.common.files import fsync_dir
from dpuoffload.common.state.ckptdirs import (  # noqa: F401  (re-exported: one import for writers and readers)
    COMMITTED,
    MANIFEST,
    CheckpointError,
    committed,
    prune,
    read_checked,
    read_manifest,
    resolve,
    step_dir,
)
from dpuoffload.common.state.meta import CheckpointMeta
from dpuoffload.common.state.sharding import DEFAULT_THRESHOLD, Piece, ShardPlan, plan_shards
from dpuoffload.common.state.trainstate import Catalog, LocalState, dtype_of, numel, parse_local

if TYPE_CHECKING:
    from typing_extensions import Buffer  # (numpy's stubs give ndarray the buffer protocol on Python 3.12+ only)

Meta = CheckpointMeta | Mapping[str, Any]  # typed, or its JSON as a keeper received it


def shard_name(sender: int) -> str:
    return f"shard-{sender:05d}.safetensors"


def local_name(sender: int) -> str:
    return f"local-{sender:05d}.safetensors"


def piece_key(name: str, piece: Piece) -> str:
    return f"{name}[{piece.start}:{piece.stop}]"


# ------------------------------------------------------------------------------------------ writing
def write_atomic(path: Path, data: bytes | memoryview) -> dict[str, Any]:
    """Write `data` to `path` durably (`common.files.write_atomic`); return its sha256 and size.
    The directory is fsynced once, after the last file of the checkpoint (`write_manifest`)."""
    files.write_atomic(path, data, sync_dir=False)
    return {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}


def shard_blob(catalog: Catalog, plan: ShardPlan, sender: int, payload: np.ndarray, meta: Mapping[str, str]) -> bytes:
    """Sender's packed pieces (as received) as a safetensors blob of typed flat tensors."""
    tensors: dict[str, torch.Tensor] = {}
    offset = 0
    buf = memoryview(cast("Buffer", payload)).cast("B")
    for p in plan.rank_pieces(sender):
        name, dtype, _ = catalog[p.tensor]
        dt = dtype_of(dtype)
        n = (p.stop - p.start) * torch.empty((), dtype=dt).element_size()
        piece = buf[offset: offset + n]
        tensors[piece_key(name, p)] = torch.frombuffer(piece, dtype=dt) if n else torch.empty(0, dtype=dt)
        offset += n
    return st_save(tensors, metadata=dict(meta))


def missing_senders(files: Mapping[str, Any], senders: int) -> list[int]:
    """The host ranks (of `senders`) whose shard or local file is not among `files`: a checkpoint
    is committed only when none is missing, whichever keepers wrote what."""
    return [k for k in range(senders) if not {shard_name(k), local_name(k)} <= files.keys()]


def write_manifest(directory: Path, meta: Meta, files: Mapping[str, Mapping[str, Any]], plan: ShardPlan) -> None:
    """Manifest (the meta, where every piece lives, every file's checksum), then the commit marker."""
    meta = CheckpointMeta.of(meta)
    tensors = []
    for t, (name, dtype, shape) in enumerate(meta.catalog):
        pieces = [[shard_name(k), piece_key(name, p), p.start, p.stop]
                  for k in range(len(plan.pieces)) for p in plan.rank_pieces(k) if p.tensor == t]
        tensors.append({"name": name, "dtype": dtype, "shape": list(shape), "pieces": pieces})
    manifest = {**meta.to_json(), "tensors": tensors, "files": dict(sorted(files.items()))}
    write_atomic(directory / MANIFEST, json.dumps(manifest, indent=1).encode())
    write_atomic(directory / COMMITTED, f"{meta.position.global_step}\n".encode())
    fsync_dir(directory)


@dataclass
class Received:
    """One host rank's hand-off, as it arrived (header fields, meta + local bytes, shared bytes):
    what a keeper receives from a host rank, and a clone rank from a keeper."""

    head: dict[str, int]
    small: np.ndarray
    shared: np.ndarray

    @property
    def meta(self) -> dict[str, Any]:
        """The meta as JSON, as the keeper passes it on (`CheckpointMeta.from_json` types it)."""
        return json.loads(self.small[: self.head["meta_nbytes"]].tobytes())

    @property
    def local(self) -> memoryview:
        return memoryview(cast("Buffer", self.small))[self.head["meta_nbytes"]:]


def plan_for(meta: Meta) -> ShardPlan:
    """The slicing a checkpoint was written with (pure: from its catalog and sender count)."""
    meta = CheckpointMeta.of(meta)
    threshold = DEFAULT_THRESHOLD if meta.threshold is None else meta.threshold
    return plan_shards([numel(s) for _, _, s in meta.catalog], meta.writers, threshold)


def part_sizes(handoff: Received) -> list[int]:
    """Byte sizes of the messages a hand-off's shared slice comes in, from its header (and, for
    zero-copy's one message per piece, its meta): `common.runtime.messages`' CKPT layout.

    Raises:
        CheckpointError: the header's part count does not fit its sizes or its slice plan.
    """
    head = handoff.head
    parts, nbytes, chunk = head["shared_parts"], head["shared_nbytes"], head["chunk_bytes"]
    if chunk:
        sizes = chunk_sizes(nbytes, chunk)
    elif parts == 1:
        return [nbytes]
    else:
        meta = CheckpointMeta.of(handoff.meta)
        sizes = [(p.stop - p.start) * torch.empty((), dtype=dtype_of(meta.catalog[p.tensor][1])).element_size()
                 for p in plan_for(meta).rank_pieces(head["sender"])]
    if len(sizes) != parts or sum(sizes) != nbytes:
        how = f"{chunk}-byte chunks" if chunk else "its slice plan"
        raise CheckpointError(f"host rank {head['sender']} sent {parts} parts / {nbytes} bytes, {how} give(s) "
                              f"{len(sizes)} / {sum(sizes)}")
    return sizes


def chunk_sizes(nbytes: int, chunk: int) -> list[int]:
    """A staged buffer of `nbytes` in messages of `chunk` bytes, the last one shorter (none if empty)."""
    return [min(chunk, nbytes - a) for a in range(0, nbytes, chunk)]


def part_bounds(sizes: list[int]) -> list[tuple[int, int]]:
    """(start, stop) byte offsets of consecutive parts of these sizes."""
    stops = list(itertools.accumulate(sizes))
    return list(zip([0, *stops[:-1]], stops))


# ------------------------------------------------------------------------------------------ reading
def read_verified(directory: Path, name: str, manifest: Mapping[str, Any],
                  verified: Optional[Mapping[str, bytes]] = None) -> bytes:
    """A file's bytes, after checking size and sha256 against the manifest (or as `verified`
    holds them: read and checked already, by `--resume latest`'s choice of checkpoint)."""
    if verified and name in verified:
        return verified[name]
    path = directory / name
    expected = manifest["files"].get(name)
    if expected is None:
        raise CheckpointError(f"checkpoint {directory}: {name} is not listed in {MANIFEST}")
    data, why = read_checked(path, expected)
    if why == "is missing":
        raise CheckpointError(f"checkpoint shard {path} is missing; the checkpoint cannot be restored "
                              "(use an older checkpoint)")
    if why is not None:
        raise CheckpointError(f"checkpoint shard {path} is corrupt (size or sha256 differs from {MANIFEST}); "
                              "use an older checkpoint")
    return data


@dataclass
class Checkpoint:
    """A checkpoint read back: its manifest as JSON (`meta`: the on-disk record, which tools and
    tests read; `CheckpointMeta.from_json(meta)` types it), full shared tensors, every host rank's
    local state."""

    path: Path
    meta: dict[str, Any]
    shared: dict[str, torch.Tensor]
    locals: list[LocalState]


def load(directory: Path, verified: Optional[Mapping[str, bytes]] = None) -> Checkpoint:
    """Read, verify and reassemble one checkpoint (any number of host ranks wrote it); `verified`:
    files read and checked already (`ckptdirs.damage`)."""
    manifest = read_manifest(directory)
    shards = {name: st_load(read_verified(directory, name, manifest, verified)) for name in
              sorted({p[0] for t in manifest["tensors"] for p in t["pieces"]})}
    shared: dict[str, torch.Tensor] = {}
    for t in manifest["tensors"]:
        flat = torch.empty(numel(t["shape"]), dtype=dtype_of(t["dtype"]))
        covered = 0
        for file, key, start, stop in t["pieces"]:
            flat[start:stop] = shards[file][key]
            covered += stop - start
        if covered != flat.numel():
            raise CheckpointError(f"checkpoint {directory}: pieces of {t['name']} cover {covered} of "
                                  f"{flat.numel()} elements ({MANIFEST} is inconsistent)")
        shared[t["name"]] = flat.reshape(t["shape"])
    locals_ = [parse_local(read_verified(directory, local_name(k), manifest, verified))
               for k in range(CheckpointMeta.from_json(manifest).writers)]
    return Checkpoint(directory, manifest, shared, locals_)


def plain_state_dicts(ckpt: Checkpoint) -> dict[str, Any]:
    """`{"model": state_dict, "optimizer": state_dict, ...}` for `torch.load(weights_only=True)`.

    Parameters are identical on every rank; BatchNorm buffers are taken from host rank 0 (after an
    epoch end they are identical too)."""
    from dpuoffload.common.state.trainstate import optimizer_state_dict

    names = [n.removeprefix("model.") for n in ckpt.shared if n.startswith("model.")]
    model = {n: ckpt.shared[f"model.{n}"] for n in names}
    model.update(ckpt.locals[0].buffers)
    meta = CheckpointMeta.from_json(ckpt.meta)
    config, pos = meta.config or {}, meta.position
    return {"model": model, "optimizer": optimizer_state_dict(meta, ckpt.shared, names),
            "epoch": pos.epoch, "step": pos.step, "global_step": pos.global_step,
            "model_name": config.get("script") or config["model"]}


def check_compatible(meta: Meta, config: Mapping[str, Any], ignore: Collection[str]) -> list[str]:
    """Config fields that differ between the checkpoint's run and this one (excluding `ignore`)."""
    old = CheckpointMeta.of(meta).config or {}
    return sorted(k for k in set(old) | set(config) if k not in ignore and old.get(k) != config.get(k))
