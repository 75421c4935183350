"""`dpurun` inside a Slurm allocation: the host nodes and their slots from Slurm's environment, and
the DPU of each host node, so `sbatch train.sbatch` needs no hostfile typed by hand.

Slurm knows nothing of DPUs, and sites expose them in two ways:
- **DPUs as Slurm nodes** (the allocation holds host nodes and DPU nodes, told apart by name, e.g.
  `thor-bf01`): allocated nodes whose name matches `--dpu-nodes` (a regular expression, default `bf`)
  are DPUs, the others host nodes, each host paired with the DPU its name relates to (`pair_nodes`:
  the host's name inside the DPU's, else the same last number, else allocation order, said so);
  each side's slots are its nodes' tasks (`SLURM_TASKS_PER_NODE`). With `--dpu-ranks 0` an
  allocation without DPU nodes is fine (a `none` job).
- **DPUs outside Slurm**, reachable under a name derived from the host's: `--dpu-name '{host}-bf'`
  (a pattern of the host's name) or `--dpu-map FILE` (`host dpu` per line); every allocated node is
  a host node, and its DPU gets the DPU ranks in equal shares. A derived name must resolve here.

The result is the `--hosts`/`--dpus` lists the rest of dpurun already takes (`launch.placement`), with
the reasons `--dry-run` prints. Host ranks default to the host nodes' slots, DPU ranks to the DPU
nodes' slots (Slurm nodes) or one per DPU (outside Slurm).
"""

from __future__ import annotations

import math
import re
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Optional

from dpuoffload.common.errors import ConfigError

DEFAULT_DPU_NODES = "bf"


@dataclass(frozen=True)
class Allocation:
    """The nodes of this Slurm job and the tasks Slurm gives each, in Slurm's order."""

    job_id: str
    nodelist: str
    nodes: tuple[str, ...]
    tasks: tuple[int, ...]

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Optional["Allocation"]:
        """The allocation dpurun runs in (None outside one: no `SLURM_JOB_ID`).

        Raises:
            ConfigError: an allocation whose node list or task counts cannot be read.
        """
        job = env.get("SLURM_JOB_ID")
        if not job:
            return None
        nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
        if not nodelist:
            raise ConfigError(f"Slurm job {job}: SLURM_JOB_NODELIST is not set, so the allocation's nodes are "
                              "unknown; run dpurun inside the job (sbatch, salloc), or give --hosts/--dpus")
        nodes = tuple(expand_nodelist(nodelist))
        spec = env.get("SLURM_TASKS_PER_NODE") or env.get("SLURM_JOB_CPUS_PER_NODE") or ""
        tasks = tuple(expand_counts(spec)) if spec else (1,) * len(nodes)
        if len(tasks) != len(nodes):
            raise ConfigError(f"Slurm job {job}: SLURM_TASKS_PER_NODE={spec} gives {len(tasks)} node(s), "
                              f"SLURM_JOB_NODELIST={nodelist} {len(nodes)}; give --hosts/--dpus instead")
        return cls(job, nodelist, nodes, tasks)


def expand_nodelist(nodelist: str) -> list[str]:
    """Slurm's hostlist syntax (`h[0-3],bf[01-02]`) as node names, by python-hostlist (what Slurm
    sites use for it; `scontrol show hostnames` gives the same)."""
    import hostlist

    try:
        return list(hostlist.expand_hostlist(nodelist))
    except hostlist.BadHostlist as e:
        raise ConfigError(f"SLURM_JOB_NODELIST={nodelist}: not a Slurm host list ({e})") from None


def expand_counts(spec: str) -> list[int]:
    """`SLURM_TASKS_PER_NODE` as one count per node: `2(x3),1` is 2, 2, 2, 1."""
    out: list[int] = []
    for part in spec.split(","):
        found = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if not found:
            raise ConfigError(f"SLURM_TASKS_PER_NODE={spec}: cannot read {part!r} (expected N or N(xK))")
        out += [int(found.group(1))] * int(found.group(2) or 1)
    return out


@dataclass(frozen=True)
class DpuNaming:
    """How a host node's DPU is found (the launcher's `--dpu-name`, `--dpu-map`, `--dpu-nodes`)."""

    pattern: Optional[str] = None
    map_file: Optional[str] = None
    nodes: str = DEFAULT_DPU_NODES

    def __post_init__(self) -> None:
        if self.pattern is not None and self.map_file is not None:
            raise ConfigError("--dpu-name and --dpu-map both name the DPUs: give one")
        if self.pattern is not None and "{host}" not in self.pattern:
            raise ConfigError(f"--dpu-name {self.pattern!r} has no {{host}}: write the DPU's name as a pattern of "
                              "its host's, e.g. '{host}-bf'")
        try:
            re.compile(self.nodes)
        except re.error as e:
            raise ConfigError(f"--dpu-nodes {self.nodes!r} is not a regular expression ({e})") from None

    @property
    def outside(self) -> bool:
        """The DPUs are outside the allocation (named from their hosts' names)."""
        return self.pattern is not None or self.map_file is not None


@dataclass(frozen=True)
class Derived:
    """Host and DPU nodes with slots, in pairing order, and why (for `--dry-run`)."""

    hosts: tuple[tuple[str, int], ...]
    dpus: tuple[tuple[str, int], ...]
    why: tuple[str, ...]

    @property
    def host_list(self) -> str:
        return ",".join(f"{n}:{s}" for n, s in self.hosts)

    @property
    def dpu_list(self) -> str:
        return ",".join(f"{n}:{s}" for n, s in self.dpus)

    @property
    def host_slots(self) -> int:
        return sum(s for _, s in self.hosts)

    @property
    def dpu_slots(self) -> int:
        return sum(s for _, s in self.dpus)


def derive(alloc: Allocation, naming: DpuNaming, dpu_ranks: Optional[int] = None,
           resolves: Optional[Callable[[str], bool]] = None) -> Derived:
    """The host nodes and their DPUs for this allocation (pure but for `resolves`: name lookup).

    Raises:
        ConfigError: no DPUs found, unequal host and DPU node counts, a map without a host, a
            derived name that does not resolve.
    """
    head = f"Slurm job {alloc.job_id}: SLURM_JOB_NODELIST={alloc.nodelist} ({len(alloc.nodes)} node(s))"
    if naming.outside:
        return _outside(alloc, naming, dpu_ranks, resolves or _resolves, head)
    return _allocated(alloc, naming, head, dpu_ranks)


def _allocated(alloc: Allocation, naming: DpuNaming, head: str, dpu_ranks: Optional[int] = None) -> Derived:
    match = re.compile(naming.nodes)
    nodes = list(zip(alloc.nodes, alloc.tasks))
    dpus = [(n, t) for n, t in nodes if match.search(n)]
    hosts = [(n, t) for n, t in nodes if not match.search(n)]
    if not dpus and dpu_ranks == 0:  # (--mode none without DPUs: the host nodes alone)
        return Derived(tuple(hosts), (), (head, f"host nodes: all {len(hosts)} (--dpu-ranks 0: no DPU needed)"))
    if not dpus:
        raise ConfigError(f"{head} has no DPU node (no name matches --dpu-nodes {naming.nodes!r}); if the DPUs are "
                          "outside Slurm, name each host node's DPU: --dpu-name '{host}-bf' or --dpu-map FILE")
    if len(hosts) != len(dpus):
        raise ConfigError(f"{head}: {len(hosts)} host node(s) ({', '.join(n for n, _ in hosts) or 'none'}) and "
                          f"{len(dpus)} DPU node(s) matching --dpu-nodes {naming.nodes!r} "
                          f"({', '.join(n for n, _ in dpus)}); every host node needs its own DPU: allocate them in "
                          "pairs, or fix --dpu-nodes")
    order, rule = pair_nodes([n for n, _ in hosts], [n for n, _ in dpus], head)
    dpus = [dpus[i] for i in order]
    why = (head, f"DPU nodes: the {len(dpus)} whose names match --dpu-nodes {naming.nodes!r}; host nodes: the others",
           f"pairs {rule}: " + ", ".join(f"{h} -> {d}" for (h, _), (d, _) in zip(hosts, dpus)),
           "slots: each node's tasks (SLURM_TASKS_PER_NODE)")
    return Derived(tuple(hosts), tuple(dpus), why)


def pair_nodes(hosts: list[str], dpus: list[str], head: str) -> tuple[list[int], str]:
    """Which DPU node belongs to which host node: for each host (in order) the index of its DPU, and
    the rule that said so. Slurm orders an allocation by name, not by pairs, so order alone would
    pair h0 with h1-bf in an allocation of h0, h1, h1-bf, h2-bf; the names decide where they can:

    1. by name: the host's name inside its DPU's (`h0` -> `h0-bf`; the longest such host name);
    2. by number: the last number in each name (`thor001` -> `thor-bf01`);
    3. neither relates any pair: allocation order, and the rule says so (`--dry-run` shows it).

    Raises:
        ConfigError: the names relate some nodes but not as one DPU per host (a DPU of a host that
            is not in the allocation, two DPUs named for one host).
    """
    for rule, key_of_host, key_of_dpu in (("by name (the host's name inside its DPU's)", lambda h: h,
                                           lambda d: _host_named_in(d, hosts)),
                                          ("by number (the last number in each name)", _last_number, _last_number)):
        keys = [key_of_dpu(d) for d in dpus]
        found = {k: i for i, k in enumerate(keys) if k is not None}
        if len(found) == len(keys) == len(hosts) and all(key_of_host(h) in found for h in hosts):
            return [found[k] for k in map(key_of_host, hosts) if k is not None], rule  # (all in `found`: no None)
        if rule.startswith("by name") and found:
            lost = [h for h in hosts if h not in found]
            stray = [d for d, k in zip(dpus, keys) if k is None]
            raise ConfigError(f"{head}: host node(s) {', '.join(lost)} have no DPU node of their own in the allocation "
                              f"(DPU node(s) {', '.join(stray) or 'none'} name no allocated host); allocate each host "
                              "node with its own DPU (e.g. sbatch --nodelist), or fix --dpu-nodes")
    return list(range(len(hosts))), "in allocation order (the names do not say which DPU is whose: check them here)"


def _host_named_in(dpu: str, hosts: list[str]) -> Optional[str]:
    named = [h for h in hosts if h in dpu]
    return max(named, key=len) if named else None


def _last_number(name: str) -> Optional[int]:
    found = re.findall(r"\d+", name)
    return int(found[-1]) if found else None


def _outside(alloc: Allocation, naming: DpuNaming, dpu_ranks: Optional[int], resolves: Callable[[str], bool],
             head: str) -> Derived:
    hosts = tuple(zip(alloc.nodes, alloc.tasks))
    names = _read_map(naming.map_file, alloc.nodes) if naming.map_file else \
        {h: naming.pattern.format(host=h) for h in alloc.nodes}  # type: ignore[union-attr]
    source = f"--dpu-map {naming.map_file}" if naming.map_file else f"--dpu-name {naming.pattern!r}"
    for host in alloc.nodes:
        if not resolves(names[host]):
            raise ConfigError(f"the DPU of {host}, {names[host]} (from {source}), does not resolve here; check the "
                              "name the site gives its DPUs (e.g. `getent hosts NAME`) and fix " + source)
    per = max(1, math.ceil((dpu_ranks or len(hosts)) / len(hosts)))
    dpus = tuple((names[h], per) for h in alloc.nodes)
    why = (head, f"host nodes: all of them; their DPUs by {source}: "
                 + ", ".join(f"{h} -> {names[h]}" for h in alloc.nodes),
           f"slots: host nodes' tasks (SLURM_TASKS_PER_NODE), {per} per DPU")
    return Derived(hosts, dpus, why)


def _read_map(path: str, hosts: tuple[str, ...]) -> dict[str, str]:
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise ConfigError(f"--dpu-map {path}: cannot read it ({e.strerror})") from None
    found: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        if len(words) != 2:
            raise ConfigError(f"--dpu-map {path}:{number}: {line.strip()!r}; write 'HOST DPU' per line")
        found[words[0]] = words[1]
    missing = [h for h in hosts if h not in found]
    if missing:
        raise ConfigError(f"--dpu-map {path} names no DPU for {', '.join(missing)}; add a 'HOST DPU' line for each "
                          "allocated node")
    return found


def _resolves(name: str) -> bool:
    try:
        socket.getaddrinfo(name, None)
    except (socket.gaierror, UnicodeError):
        return False
    return True
