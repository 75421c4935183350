"""DPU memory: the newest checkpoint hand-offs, kept where they outlive the MPI job (`--ckpt-mem-keep K`).

Why: after a host rank dies, `dpurun --restarts N` relaunches the job, and the state to continue
from is already on the DPUs (the keepers received it). Reading it back from the checkpoint disk
costs a file-system round trip per shard; from the DPU's own memory it is one message per host
rank. The memory must outlive the MPI job (every rank of a failed Open MPI job is ended), so it is
a RAM-backed file system on the DPU: `/dev/shm` (POSIX shared memory; each BlueField has its own,
and on the emulated box all keepers share the box's). Each keeper keeps its own directory:

    <root>/keeper-000/step-000000120/     (renamed into place when complete: its existence = complete)
        head-00000.bin                    host rank 0's CKPT header, as received
        small-00000.bin                   its meta JSON + local state, as received
        shared-00000.bin                  its packed slice of the shared tensors, as received
        ...                               one triple per host rank this keeper keeps

A step is usable after a failure when *every* keeper holds it (`restart_step`): keepers write
independently, so a keeper that died mid-write leaves that step incomplete on its DPU only. The
relaunched job's keepers send the hand-offs back as received, and the host ranks rebuild the state
the way clone ranks do (`host.clone.assemble`): nothing is read from the checkpoint disk.

Torch-free: the start-up agreement runs on idle DPU ranks too.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Optional, Sequence

import numpy as np

from dpuoffload.common import files
from dpuoffload.common.runtime.messages import CKPT_HEADER
from dpuoffload.common.state.ckptdirs import CheckpointError, committed
from dpuoffload.common.state.meta import CheckpointMeta

if TYPE_CHECKING:
    from dpuoffload.common.config import RunConfig
    from dpuoffload.common.runtime.roles import Topology

ENV_ROOT = "DPUOFFLOAD_MEM_DIR"   # where DPU memory lives (default: /dev/shm, else the temp directory)
_STEP = re.compile(r"^step-(\d{9})$")


def memory_root(ckpt_dir: str) -> Path:
    """The DPU-memory directory of the run that checkpoints to `ckpt_dir`.

    Keyed by the checkpoint directory's absolute path: a relaunch with the same `--ckpt-dir` finds
    it, another run does not. RAM-backed `/dev/shm` where it exists ($DPUOFFLOAD_MEM_DIR overrides)."""
    base = os.environ.get(ENV_ROOT) or ("/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir())
    key = hashlib.sha256(os.path.abspath(ckpt_dir).encode()).hexdigest()[:16]
    return Path(base) / f"dpuoffload-mem-{os.getuid()}" / key


def private_dirs(keeper_dir: Path) -> None:
    """Make `<base>/dpuoffload-mem-<uid>/<run>/keeper-NNN` with every level ours alone (0700): DPU memory
    holds the model and optimizer state, which other users of the machine must not read (its files are
    0600 too). A user directory made before this rule (0755) is closed now."""
    user_dir = keeper_dir.parent.parent
    user_dir.parent.mkdir(parents=True, exist_ok=True)  # (the base: /dev/shm, or $DPUOFFLOAD_MEM_DIR)
    for d in (user_dir, keeper_dir.parent, keeper_dir):
        d.mkdir(mode=0o700, exist_ok=True)
        if d.stat().st_uid == os.getuid() and d.stat().st_mode & 0o077:
            os.chmod(d, 0o700)


class MemoryStore:
    """One keeper's hand-offs of its newest checkpoints (see the module docstring for the layout)."""

    def __init__(self, root: Path, keeper: int, keep: int) -> None:
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.dir, self.keep = Path(root) / f"keeper-{keeper:03d}", keep

    def steps(self, senders: Sequence[int] = ()) -> list[int]:
        """The complete steps held, oldest first; only those holding every host rank in `senders`
        (a step kept by a run with another layout is of no use to this one)."""
        if not self.dir.is_dir():
            return []
        found = (int(m.group(1)) for p in self.dir.iterdir() if (m := _STEP.match(p.name)) and p.is_dir())
        return sorted(s for s in found if all((self._step_dir(s) / f"head-{k:05d}.bin").is_file() for k in senders))

    def put(self, step: int, handoffs: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray]]) -> int:
        """Keep `(header, small, shared)` of every host rank this keeper keeps for `step`, then drop
        all but the `keep` newest steps. Returns the bytes written. The step appears complete or not
        at all (written under a temporary name, renamed)."""
        final = self._step_dir(step)
        tmp = self.dir / f".{final.name}.partial-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        private_dirs(self.dir)
        tmp.mkdir(mode=0o700)
        written = 0
        for head, small, shared in handoffs:
            sender = CKPT_HEADER.unpack(head)["sender"]
            for part, data in (("head", head), ("small", small), ("shared", shared)):
                files.write_atomic(tmp / f"{part}-{sender:05d}.bin", memoryview(np.ascontiguousarray(data)).cast("B"),
                                   sync_dir=False, mode=0o600)
                written += data.nbytes
        shutil.rmtree(final, ignore_errors=True)  # (a step received again after a restart)
        os.replace(tmp, final)
        for old in self.steps()[:-self.keep]:
            shutil.rmtree(self._step_dir(old), ignore_errors=True)
        return written

    def get(self, step: int, sender: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Host rank `sender`'s `(header, small, shared)` at `step`, as received.

        Raises:
            FileNotFoundError: this keeper does not hold that step or that host rank's part of it.
        """
        d = self._step_dir(step)
        head = np.fromfile(d / f"head-{sender:05d}.bin", dtype=np.int64)
        small = np.fromfile(d / f"small-{sender:05d}.bin", dtype=np.uint8)
        shared = np.fromfile(d / f"shared-{sender:05d}.bin", dtype=np.uint8)
        return head, small, shared

    def meta(self, step: int) -> dict:
        """The run-level meta (JSON, as received; `CheckpointMeta.from_json` types it) of the
        hand-offs at `step` (identical from every host rank)."""
        d = self._step_dir(step)
        first = sorted(d.glob("head-*.bin"))[0]
        head, small, _ = self.get(step, int(first.stem.split("-")[1]))
        return json.loads(small[:CKPT_HEADER.unpack(head)["meta_nbytes"]].tobytes())

    def clear(self) -> None:
        """Forget everything (a run that ended normally has nothing to restart from)."""
        shutil.rmtree(self.dir, ignore_errors=True)

    def _step_dir(self, step: int) -> Path:
        return self.dir / f"step-{step:09d}"


def restart_step(held: Sequence[Sequence[int]], disk_step: Optional[int]) -> Optional[int]:
    """The step to restart from DPU memory, or None to read the disk instead.

    `held`: the steps each keeper holds in memory. Only a step that every keeper holds is whole;
    the newest such step wins unless the checkpoint disk has a newer committed one (the memory of a
    keeper was lost, e.g. its DPU went down with it)."""
    if not held:
        return None
    common = set(held[0]).intersection(*map(set, held[1:]))
    if not common:
        return None
    step = max(common)
    return step if disk_step is None or step >= disk_step else None


@dataclass(frozen=True)
class MemoryPoint:
    """The state every keeper holds in DPU memory, agreed at start-up (`agree_restart`)."""

    step: int
    meta: CheckpointMeta     # the run-level meta of that hand-off (position, catalog, config)
    root: Path               # `memstore.memory_root` of the run's --ckpt-dir
    keepers: tuple[int, ...]  # world ranks of the keepers, in keeper order


def keeper_ranks(topo: "Topology") -> tuple[int, ...]:
    """World ranks of the DPU ranks that keep host state, in keeper order (`dpu.main.build_keeper`'s split)."""
    from dpuoffload.common.plan.assign import StateAssignment

    assign = StateAssignment.of(topo)
    return tuple(r for r in topo.dpu_ranks if assign.hosts_kept_by(r))


def agree_restart(cfg: "RunConfig", topo: "Topology") -> Optional[MemoryPoint]:
    """Collective over COMM_WORLD (every rank, in start-up): restart from DPU memory or not.

    Each keeper reports the steps its DPU memory holds; world rank 0 picks the newest step held by
    all keepers unless the disk has a newer committed checkpoint (`memstore.restart_step`), and the
    first keeper broadcasts that hand-off's meta, so every rank agrees on the start position.
    Returns the point to restart from (None: from the disk, or not resuming), which start-up keeps
    on `Started.run.memory` and hands to what reads it (`resume.find_resume`, the keepers)."""
    if cfg.resume != "latest" or not cfg.ckpt_mem_keep or not cfg.ckpt_dir:
        return None
    from dpuoffload.common.plan.assign import StateAssignment

    keepers, root = keeper_ranks(topo), memory_root(cfg.ckpt_dir)
    store, mine = None, None
    if topo.world_rank in keepers:
        store = MemoryStore(root, keepers.index(topo.world_rank), cfg.ckpt_mem_keep)
        kept = StateAssignment.of(topo).hosts_kept_by(topo.world_rank)
        mine = store.steps([topo.host_ranks.index(h) for h in kept])
    held = [h for h in topo.world.allgather(mine) if h is not None]
    step = None
    if topo.world.Get_rank() == 0:
        disk = committed(cfg.ckpt_dir)
        step = restart_step(held, int(disk[-1].name.split("-")[1]) if disk else None)
    step = topo.world.bcast(step, root=0)
    if step is None or not keepers:
        return None
    meta, problem = None, None
    if topo.world_rank == keepers[0] and store is not None:
        try:
            meta = store.meta(step)
        except (OSError, ValueError, IndexError) as e:  # (every rank raises it below: no one is left waiting)
            problem = f"DPU memory {store.dir}: step {step} cannot be read back ({type(e).__name__}: {e})"
    meta, problem = topo.world.bcast((meta, problem), root=keepers[0])
    if problem:
        raise CheckpointError(f"{problem}; resume from the disk with --ckpt-mem-keep 0 --resume latest")
    typed = CheckpointMeta.from_json(meta)
    if typed.writers != len(topo.host_ranks):  # (the disk copy re-slices to another host count)
        return None
    return MemoryPoint(step, typed, root, keepers)
