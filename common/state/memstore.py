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

Partner copies (`--ckpt-mem-replicas R`; default 1 with keepers on >= 2 nodes): after keeping its
own hand-offs, each keeper sends them to R keepers on other nodes (`place_copies`: a ring by node),
which keep them beside their own:

    <root>/copies/keeper-001/step-000000120/   (on keeper 0's DPU: keeper 1's hand-offs, same layout)

so when a whole node is lost (its host and its DPU, DPU memory included) a relaunch still finds
every shard in some DPU's memory. A step is usable after a failure when every keeper's part of it
is held somewhere, by the keeper itself or by a holder of its copy (`restart_plan`; a part whose
files are missing or shorter than its header says is not held). Keepers write independently, so a
keeper that died mid-write leaves that step incomplete on its DPU only. The relaunched job's keepers
(or a copy's holder, for a keeper whose memory is gone) send the hand-offs back as received, and the
host ranks rebuild the state the way clone ranks do (`host.clone.assemble`): nothing is read from
the checkpoint disk.

What DPU memory may hold is bounded (`MemoryBudget`, `--ckpt-mem-budget`; default a quarter of the
DPU's RAM): a step that does not fit is not kept there (said once; the disk still has it). Memory is
private (0700 directories, 0600 files) and reclaimed: a job's keepers hold a shared lock on their
run's directory while they live, and a new job's keepers remove what runs no job holds left
unused for over `RECLAIM_AFTER_S` (`reclaim`), saying how much they freed.

Torch-free: the start-up agreement runs on idle DPU ranks too.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Mapping, Optional, Sequence, cast

import numpy as np

from dpuoffload.common import files
from dpuoffload.common.errors import ConfigError
from dpuoffload.common.runtime.messages import CKPT_HEADER
from dpuoffload.common.state.ckptdirs import CheckpointError, committed
from dpuoffload.common.state.meta import CheckpointMeta

if TYPE_CHECKING:
    from typing_extensions import Buffer  # (numpy's stubs give ndarray the buffer protocol on Python 3.12+ only)

    from dpuoffload.common.config import RunConfig
    from dpuoffload.common.runtime.roles import Topology

ENV_ROOT = "DPUOFFLOAD_MEM_DIR"   # where DPU memory lives (default: /dev/shm, else the temp directory)
_STEP = re.compile(r"^step-(\d{9})$")
COPIES = "copies"                 # <root>/copies/keeper-NNN: the copies of other keepers' hand-offs held here
LOCK = ".lock"                    # <root>/.lock: a live job's keepers hold a shared flock on it
RECLAIM_AFTER_S = 600.0           # a run's memory no job holds, unused this long, is reclaimed by the next job
BUDGET_SHARE = 0.25               # the default budget: this share of the DPU's RAM (MemTotal)


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
    """One keeper's hand-offs of its newest checkpoints (see the module docstring for the layout);
    `copy=True`: the copy of that keeper's hand-offs held on another keeper's DPU."""

    def __init__(self, root: Path, keeper: int, keep: int, copy: bool = False) -> None:
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        base = Path(root) / COPIES if copy else Path(root)
        self.dir, self.keep, self.keeper = base / f"keeper-{keeper:03d}", keep, keeper

    def steps(self, senders: Sequence[int] = (), damaged: Optional[list[str]] = None) -> list[int]:
        """The complete steps held, oldest first; only those holding every host rank in `senders`
        whole (a step kept by a run with another layout is of no use to this one). A part whose
        files are missing or shorter than its header says is not whole: `damaged` gets a line for it."""
        if not self.dir.is_dir():
            return []
        found = sorted(int(m.group(1)) for p in self.dir.iterdir() if (m := _STEP.match(p.name)) and p.is_dir())
        whole = []
        for step in found:
            problems = [p for k in senders if (p := self._damage(step, k))]
            if not problems:
                whole.append(step)
            elif damaged is not None and any("missing" not in p for p in problems):
                damaged.append(f"{self.dir}/step-{step:09d}: {'; '.join(problems)}")
        return whole

    def _damage(self, step: int, sender: int) -> Optional[str]:
        """Why host rank `sender`'s part of `step` is not whole (None: it is)."""
        d = self._step_dir(step)
        head_path = d / f"head-{sender:05d}.bin"
        if not head_path.is_file():
            return f"host rank {sender}'s part missing"
        try:
            head = CKPT_HEADER.unpack(np.fromfile(head_path, dtype=np.int64))
        except ValueError:
            return f"{head_path.name} is not a whole header"
        for part in ("small", "shared"):
            path, want = d / f"{part}-{sender:05d}.bin", head[f"{part}_nbytes"]
            have = path.stat().st_size if path.is_file() else None
            if have != want:
                return f"{path.name} has {'no file' if have is None else f'{have} bytes'}, its header says {want}"
        return None

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
                files.write_atomic(tmp / f"{part}-{sender:05d}.bin",
                                   memoryview(cast("Buffer", np.ascontiguousarray(data))).cast("B"),
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


def tree_bytes(path: Path) -> int:
    """The bytes of the files under `path` (0 if it does not exist). Files may come and go meanwhile (a
    keeper thread renames a step into place while its copy thread counts): those are skipped."""
    total = 0
    for top, _, names in os.walk(path):
        for name in names:
            try:
                total += os.lstat(os.path.join(top, name)).st_size
            except FileNotFoundError:
                pass
    return total


# ------------------------------------------------------------------------------ partner copies
@dataclass(frozen=True)
class Placement:
    """Which keepers hold a copy of which keeper's hand-offs (keeper indices, keeper order)."""

    holders: tuple[tuple[int, ...], ...]   # keeper k -> the keepers holding a copy of k's hand-offs

    def sources(self, keeper: int) -> tuple[int, ...]:
        """The keepers whose copies `keeper` holds."""
        return tuple(k for k, hs in enumerate(self.holders) if keeper in hs)

    @property
    def replicas(self) -> int:
        return len(self.holders[0]) if self.holders else 0


def place_copies(nodes: Sequence[str], replicas: Optional[int]) -> Placement:
    """Where each keeper's copies go: a ring by node. `nodes[k]` is keeper k's node (a DPU's node is the
    host node it is plugged into, so a copy never shares a node's fate with its original). The
    distinct nodes in sorted order form a ring; keeper k (the j-th keeper of its node) copies to the
    j-th keeper (wrapping) of each of the next `replicas` nodes. `replicas` None: 1 when the keepers
    are on >= 2 nodes, else 0.

    Raises:
        ConfigError: more replicas than other nodes to put them on.
    """
    ring = sorted(set(nodes))
    if replicas is None:
        replicas = 1 if len(ring) >= 2 else 0
    if replicas > len(ring) - 1:
        raise ConfigError(f"--ckpt-mem-replicas {replicas} puts each keeper's copies on {replicas} other node(s), "
                          f"but this job's keepers are on {len(ring)} node(s) ({', '.join(ring)}): a copy on the "
                          f"same node is lost with it; use --ckpt-mem-replicas {len(ring) - 1} or start DPU ranks on "
                          "more nodes")
    on_node = {n: [k for k, m in enumerate(nodes) if m == n] for n in ring}
    holders = []
    for k, node in enumerate(nodes):
        i, j = ring.index(node), on_node[node].index(k)
        nxt = [on_node[ring[(i + d) % len(ring)]] for d in range(1, replicas + 1)]
        holders.append(tuple(ks[j % len(ks)] for ks in nxt))
    return Placement(tuple(holders))


def memory_placement(cfg: "RunConfig", topo: "Topology") -> Placement:
    """This run's partner copies (none without `--ckpt-mem-keep`); validated in start-up by every rank."""
    if not cfg.ckpt_mem_keep or not cfg.ckpt_dir:
        return Placement(())
    return place_copies([topo.ranks[r].node for r in keeper_ranks(topo)], cfg.ckpt_mem_replicas)


# ------------------------------------------------------------------------------ the budget
def dpu_ram_bytes(meminfo: str = "/proc/meminfo") -> Optional[int]:
    """This machine's RAM (MemTotal), or None where /proc/meminfo does not say."""
    try:
        for line in Path(meminfo).read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


@dataclass(frozen=True)
class MemoryBudget:
    """The most this run may keep in one DPU's memory (its own hand-offs and the copies it holds)."""

    limit: int               # bytes
    chosen: bool             # set by --ckpt-mem-budget (else a share of the DPU's RAM)

    @classmethod
    def of(cls, flag: Optional[int]) -> "MemoryBudget":
        if flag is not None:
            return cls(flag, True)
        ram = dpu_ram_bytes()
        return cls(int(ram * BUDGET_SHARE) if ram else 1 << 30, False)

    def refusal(self, root: Path, incoming: int) -> Optional[str]:
        """Why `incoming` more bytes do not fit beside what this run keeps under `root` (None: they fit).
        Counted before the oldest step is dropped: a new step is written before an old one goes."""
        held = tree_bytes(root)
        if held + incoming <= self.limit:
            return None
        source = ("--ckpt-mem-budget" if self.chosen else
                  f"{BUDGET_SHARE:.0%} of this DPU's RAM; --ckpt-mem-budget sets it")
        return (f"{incoming / 1e6:.1f} MB more beside the {held / 1e6:.1f} MB this run keeps here is over the DPU "
                f"memory budget of {self.limit / 1e6:.1f} MB ({source})")


# ------------------------------------------------------------------------------ reclaiming
class RunLock:
    """A live job's hold on its run's DPU memory: a shared flock on `<root>/.lock`, released when the
    process ends however it ends (so a dead job's hold goes with it)."""

    def __init__(self, root: Path) -> None:
        root.parent.parent.mkdir(parents=True, exist_ok=True)  # (the base: /dev/shm, or $DPUOFFLOAD_MEM_DIR)
        for d in (root.parent, root):
            d.mkdir(mode=0o700, exist_ok=True)
        self.file: IO[bytes] = open(root / LOCK, "ab")
        os.chmod(root / LOCK, 0o600)
        fcntl.flock(self.file, fcntl.LOCK_SH)

    def release(self, root: Path) -> None:
        """Let go; the last job process of this machine to let go of an emptied run removes its directory."""
        try:
            fcntl.flock(self.file, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if not any(p.is_file() and p.name != LOCK for p in root.rglob("*")):
                shutil.rmtree(root, ignore_errors=True)
        except BlockingIOError:
            pass  # (another keeper of this run on this machine still holds it)
        self.file.close()


def reclaim(root: Path, older_than_s: float = RECLAIM_AFTER_S, now: Optional[float] = None) -> tuple[int, int]:
    """Remove what other runs left in this machine's DPU memory (beside `root`, this run's): each
    run directory no live job holds (`RunLock`) and unused for over `older_than_s`. Returns (runs,
    bytes) freed. A run being relaunched by `dpurun --restarts` is held again within seconds."""
    now = time.time() if now is None else now
    runs = freed = 0
    for other in root.parent.iterdir() if root.parent.is_dir() else ():
        if other == root or not other.is_dir() or other.stat().st_uid != os.getuid():
            continue
        try:
            with open(other / LOCK, "ab") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                newest = max((p.stat().st_mtime for p in other.rglob("*") if p.name != LOCK),
                             default=other.stat().st_mtime)
                if now - newest < older_than_s:
                    continue
                size = tree_bytes(other)
                shutil.rmtree(other, ignore_errors=True)
                runs, freed = runs + 1, freed + size
        except (BlockingIOError, FileNotFoundError):
            continue  # (held by a live job, or reclaimed by another keeper of this machine just now)
    return runs, freed


# ------------------------------------------------------------------------------ the restart
@dataclass(frozen=True)
class Held:
    """What one keeper's DPU memory holds: the steps of its own hand-offs, and of each copy it holds."""

    own: tuple[int, ...] = ()
    copies: Mapping[int, tuple[int, ...]] = field(default_factory=dict)   # keeper -> steps of its copy here


def restart_plan(held: Sequence[Held], disk_step: Optional[int]) -> Optional[tuple[int, tuple[int, ...]]]:
    """The step to restart from DPU memory and, per keeper, the keeper that serves its part (itself
    when it still holds it, else the first holder of its copy); None to read the disk instead.

    `held[k]`: what keeper k's DPU memory holds. A step is whole when every keeper's part of it is
    held somewhere; the newest whole step wins unless the checkpoint disk has a newer committed one
    (the memory of a keeper and of every holder of its copy was lost)."""
    if not held:
        return None
    servers: list[dict[int, int]] = []
    for k in range(len(held)):
        where = {s: k for s in held[k].own}
        for h, other in enumerate(held):
            for s in other.copies.get(k, ()):
                where.setdefault(s, h)
        servers.append(where)
    common = set(servers[0]).intersection(*map(set, servers[1:]))
    if not common or (disk_step is not None and max(common) < disk_step):
        return None
    step = max(common)
    return step, tuple(where[step] for where in servers)


def why_the_disk(held: Sequence[Held], disk_step: Optional[int], names: Sequence[str]) -> str:
    """Why `restart_plan` found nothing to restart from in DPU memory (`names[k]`: keeper k's label)."""
    plan = restart_plan(held, None)
    if plan is not None:  # (a whole step, older than the disk's)
        return f"the newest step whose every part DPU memory holds is {plan[0]}, older than the disk's {disk_step}"
    kept = [k for k in range(len(held)) if held[k].own or any(h.copies.get(k) for h in held)]
    if not kept:
        return "DPU memory holds nothing of this run (a new machine, a run that ended, or memory reclaimed)"
    gone = [names[k] for k in range(len(held)) if k not in kept]
    if gone:
        return f"no part of {', '.join(gone)} survives in DPU memory (its own memory and every copy of it are gone)"
    return "the keepers' parts in DPU memory are of different steps (no step is whole)"


def restart_step(held: Sequence[Sequence[int]], disk_step: Optional[int]) -> Optional[int]:
    """`restart_plan`'s step when no copies are held (each keeper's own steps only)."""
    plan = restart_plan([Held(tuple(h)) for h in held], disk_step)
    return None if plan is None else plan[0]


@dataclass(frozen=True)
class MemoryPoint:
    """The state every keeper's part of is held in DPU memory, agreed at start-up (`agree_restart`)."""

    step: int
    meta: CheckpointMeta     # the run-level meta of that hand-off (position, catalog, config)
    root: Path               # `memstore.memory_root` of the run's --ckpt-dir
    keepers: tuple[int, ...]  # world ranks of the keepers, in keeper order
    servers: tuple[int, ...] = ()  # keeper k's part is sent back by keeper servers[k] (k itself, or a copy's holder)

    def server_of(self, keeper: int) -> int:
        """The world rank that sends back the part of keeper `keeper` (a world rank)."""
        k = self.keepers.index(keeper)
        return self.keepers[self.servers[k]] if self.servers else keeper

    @property
    def from_copies(self) -> tuple[tuple[int, int], ...]:
        """(keeper, holder) world ranks of every part that comes from a partner copy."""
        return tuple((self.keepers[k], self.keepers[s]) for k, s in enumerate(self.servers) if s != k)


def keeper_ranks(topo: "Topology") -> tuple[int, ...]:
    """World ranks of the DPU ranks that keep host state, in keeper order (`dpu.main.build_keeper`'s split)."""
    from dpuoffload.common.plan.assign import StateAssignment

    assign = StateAssignment.of(topo)
    return tuple(r for r in topo.dpu_ranks if assign.hosts_kept_by(r))


def agree_restart(cfg: "RunConfig", topo: "Topology") -> Optional[MemoryPoint]:
    """Collective over COMM_WORLD (every rank, in start-up): restart from DPU memory or not.

    Every rank first checks this run's partner copies can be placed (`memory_placement`). Under
    `--resume latest`, each keeper reports what its DPU memory holds (its own steps and the copies it
    holds), world rank 0 picks the newest step whose every part is held somewhere unless the disk has
    a newer committed checkpoint (`restart_plan`), and the keeper serving keeper 0's part broadcasts
    that hand-off's meta, so every rank agrees on the start position. A damaged part is not held,
    and its keeper says so. Returns the point to restart from (None: from the disk, or not resuming),
    which start-up keeps on `Started.run.memory` and hands to what reads it (`resume.find_resume`,
    the keepers, the host ranks)."""
    placement = memory_placement(cfg, topo)
    if not cfg.resumes_newest or not cfg.ckpt_mem_keep or not cfg.ckpt_dir:
        return None
    keepers, root = keeper_ranks(topo), memory_root(cfg.ckpt_dir)
    mine = _held_here(cfg, topo, keepers, root, placement) if topo.world_rank in keepers else None
    held = [h for h in topo.world.allgather(mine) if h is not None]
    plan = None
    if topo.world.Get_rank() == 0:
        disk = committed(cfg.ckpt_dir)
        disk_step = int(disk[-1].name.split("-")[1]) if disk else None
        plan = restart_plan(held, disk_step)
        if plan is None and held:
            why = why_the_disk(held, disk_step, [topo.describe(k) for k in keepers])
            print(f"[dpuoffload] --resume {cfg.resume}: {why}; reading the checkpoint disk", flush=True)
    plan = topo.world.bcast(plan, root=0)
    if plan is None or not keepers:
        return None
    step, servers = plan
    meta, problem = None, None
    if topo.world_rank == keepers[servers[0]]:
        store = MemoryStore(root, 0, cfg.ckpt_mem_keep, copy=servers[0] != 0)
        try:
            meta = store.meta(step)
        except (OSError, ValueError, IndexError) as e:  # (every rank raises it below: no one is left waiting)
            problem = f"DPU memory {store.dir}: step {step} cannot be read back ({type(e).__name__}: {e})"
    meta, problem = topo.world.bcast((meta, problem), root=keepers[servers[0]])
    if problem:
        raise CheckpointError(f"{problem}; resume from the disk with --ckpt-mem-keep 0 --resume latest")
    typed = CheckpointMeta.from_json(meta)
    if typed.writers != len(topo.host_ranks):  # (the disk copy re-slices to another host count)
        return None
    return MemoryPoint(step, typed, root, keepers, servers)


def _held_here(cfg: "RunConfig", topo: "Topology", keepers: Sequence[int], root: Path, placement: Placement) -> Held:
    """What this keeper's DPU memory holds for this run's layout; damaged parts are said and left out."""
    from dpuoffload.common.plan.assign import StateAssignment

    assign = StateAssignment.of(topo)

    def senders(keeper: int) -> list[int]:
        return [topo.host_ranks.index(h) for h in assign.hosts_kept_by(keepers[keeper])]

    damaged: list[str]
    me, damaged = keepers.index(topo.world_rank), []
    own = MemoryStore(root, me, cfg.ckpt_mem_keep).steps(senders(me), damaged)
    copies = {k: tuple(MemoryStore(root, k, cfg.ckpt_mem_keep, copy=True).steps(senders(k), damaged))
              for k in (placement.sources(me) if placement.holders else ())}
    for line in damaged:
        print(f"[dpuoffload] warning: {topo.describe()}: DPU memory {line}; not used (a restart takes the newest "
              "step held whole, or the disk)", flush=True)
    return Held(tuple(own), copies)
