"""Where ranks run: pure planning over frozen dataclasses, testable without MPI or a cluster.

Two placements:

- Local emulation (no hosts given): one box plays host node and DPU. Host ranks and DPU ranks get
  disjoint core sets (later pinned with `taskset`), so DPU work cannot steal host cores unseen.
- Cluster: host nodes and their DPUs by name with slot counts. Line (or list item) i of the DPU
  list is the DPU plugged into host node i; the resulting node map lets ranks pair host ranks with
  the DPU ranks of their own node (`dpuoffload.common.runtime.roles.pair_ranks`).

Every user mistake raises `ConfigError` naming the flag and the fix.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from dpuoffload.common.errors import ConfigError

_NODE_ITEM = re.compile(r"^(?P<name>[^\s:,]+)(?::(?P<slots>\d+))?$")


@dataclass(frozen=True)
class Node:
    """A node name and a rank count: its slots when parsed, the ranks placed on it after `fill`."""

    name: str
    slots: int


@dataclass(frozen=True)
class LocalPlacement:
    """Disjoint core sets of the two sides on this box (shared only when oversubscribing 1 core)."""

    host_cores: tuple[int, ...]
    dpu_cores: tuple[int, ...]
    oversubscribed: bool


@dataclass(frozen=True)
class ClusterPlacement:
    """Ranks per node for each side (nodes without ranks dropped) and DPU hostname -> host node."""

    host_nodes: tuple[Node, ...]
    dpu_nodes: tuple[Node, ...]
    node_map: tuple[tuple[str, str], ...]
    oversubscribed: bool


# ------------------------------------------------------------------------------------ parsing
def parse_node_list(text: str, flag: str) -> tuple[Node, ...]:
    """Parse `node1:8,node2:8` (a missing `:N` means 1 slot, as in Open MPI's `--host`).

    Args:
        text: the flag's value.
        flag: the flag name for error messages, e.g. "--hosts".
    """
    nodes = []
    for item in (part.strip() for part in text.split(",")):
        match = _NODE_ITEM.match(item)
        if not match:
            raise ConfigError(f"{flag}: bad entry {item!r}; expected name:slots, "
                              f"e.g. {flag} node1:8,node2:8")
        nodes.append(Node(match["name"], _positive_slots(match["slots"] or "1", flag, item)))
    return _check_unique(tuple(nodes), flag)


def parse_hostfile(path: str, flag: str) -> tuple[Node, ...]:
    """Parse an Open MPI hostfile: one `name slots=N` per line, `#` comments, blank lines.

    `slots=` is required: Open MPI would default it to the remote node's core count, which the
    launcher cannot know, and the fit check and node pairing need the number.
    """
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as e:
        raise ConfigError(f"{flag} {path}: cannot read it ({e.strerror})") from None
    nodes = [node for number, line in enumerate(lines, 1)
             if (node := _parse_hostfile_line(line, number, path, flag)) is not None]
    if not nodes:
        raise ConfigError(f"{flag} {path}: no nodes in it; write one 'name slots=N' per line")
    return _check_unique(tuple(nodes), flag)


def _parse_hostfile_line(line: str, number: int, path: str, flag: str) -> Optional[Node]:
    fields = line.split("#", 1)[0].split()
    if not fields:
        return None
    slots = [f.split("=", 1)[1] for f in fields[1:] if f.startswith("slots=")]
    if not slots:
        raise ConfigError(f"{flag} {path} line {number}: {fields[0]!r} has no slots=N; "
                          f"write e.g. '{fields[0]} slots=8'")
    return Node(fields[0], _positive_slots(slots[0], flag, f"{path} line {number}"))


def _positive_slots(text: str, flag: str, where: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise ConfigError(f"{flag}: {where}: slots must be a whole number >= 1, got {text!r}")
    return int(text)


def _check_unique(nodes: tuple[Node, ...], flag: str) -> tuple[Node, ...]:
    names = [n.name for n in nodes]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ConfigError(f"{flag}: node {duplicates[0]} is listed twice; give each node once "
                          "with its total slots")
    return nodes


def parse_core_list(text: str, flag: str = "--dpu-cores") -> tuple[int, ...]:
    """Parse a Linux cpu list as `taskset -c` takes it: `1`, `2-3`, `2,3`, `0-1,4`."""
    cores: set[int] = set()
    for item in (part.strip() for part in text.split(",")):
        match = re.fullmatch(r"(\d+)(?:-(\d+))?", item)
        if not match or (match[2] is not None and int(match[2]) < int(match[1])):
            raise ConfigError(f"{flag}: bad entry {item!r}; expected core numbers and ranges "
                              "like 1, 2-3 or 2,3")
        cores.update(range(int(match[1]), int(match[2] or match[1]) + 1))
    return tuple(sorted(cores))


def format_core_list(cores: Sequence[int]) -> str:
    """The inverse of `parse_core_list`, compressing runs: (0, 1, 2, 5) -> '0-2,5'."""
    parts: list[str] = []
    start = prev = None
    for core in sorted(cores):
        if prev is not None and core == prev + 1:
            prev = core
            continue
        if start is not None:
            parts.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = core
    if start is not None:
        parts.append(str(start) if start == prev else f"{start}-{prev}")
    return ",".join(parts)


# ------------------------------------------------------------------------------ local planning
def default_dpu_core_count(ncores: int, host_ranks: int, dpu_ranks: int) -> int:
    """Cores for the DPU side: its share of ranks, at least 1, leaving at least 1 for the host."""
    share = max(1, round(ncores * dpu_ranks / (host_ranks + dpu_ranks)))
    return min(share, ncores - 1)


def plan_local(host_ranks: int, dpu_ranks: int, available: Sequence[int],
               dpu_cores: Optional[Sequence[int]] = None,
               oversubscribe: bool = False) -> LocalPlacement:
    """Split this box's cores between host and DPU ranks.

    Args:
        host_ranks: host program ranks (>= 1).
        dpu_ranks: DPU program ranks (0 runs the host program alone on every core).
        available: cores this process may use (`os.sched_getaffinity(0)`).
        dpu_cores: explicit DPU cores (`--dpu-cores`); default: the last cores, see
            `default_dpu_core_count`.
        oversubscribe: allow more ranks than cores on a side.

    Raises:
        ConfigError: bad core choice, or ranks exceed cores without `oversubscribe`.
    """
    cores = tuple(sorted(set(available)))
    if dpu_ranks == 0:
        if dpu_cores is not None:
            raise ConfigError("--dpu-cores needs DPU ranks; drop it or set --dpu-ranks >= 1")
        return _checked(cores, (), host_ranks, 0, oversubscribe)
    if dpu_cores is not None:
        host_set, dpu_set = _split_explicit(cores, dpu_cores)
    elif len(cores) == 1:
        host_set = dpu_set = cores
        if not oversubscribe:
            raise ConfigError(f"only 1 core ({cores[0]}) is available, so host and DPU ranks cannot "
                              "get separate cores; pass --oversubscribe to share it")
    else:
        count = default_dpu_core_count(len(cores), host_ranks, dpu_ranks)
        host_set, dpu_set = cores[:-count], cores[-count:]
    return _checked(host_set, dpu_set, host_ranks, dpu_ranks, oversubscribe)


def _split_explicit(cores: tuple[int, ...],
                    dpu_cores: Sequence[int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    dpu_set = tuple(sorted(set(dpu_cores)))
    outside = [c for c in dpu_set if c not in cores]
    if not dpu_set or outside:
        raise ConfigError(f"--dpu-cores {format_core_list(dpu_set)}: core(s) "
                          f"{format_core_list(outside)} not available here; this process may use "
                          f"cores {format_core_list(cores)}")
    host_set = tuple(c for c in cores if c not in dpu_set)
    if not host_set:
        raise ConfigError(f"--dpu-cores {format_core_list(dpu_set)} takes every available core, "
                          "leaving none for the host ranks; give the DPU ranks fewer cores")
    return host_set, dpu_set


def _checked(host_set: tuple[int, ...], dpu_set: tuple[int, ...], host_ranks: int,
             dpu_ranks: int, oversubscribe: bool) -> LocalPlacement:
    sides = (("host", host_ranks, host_set), ("DPU", dpu_ranks, dpu_set))
    over = [(side, n, s) for side, n, s in sides if n > len(s)]
    shared = bool(dpu_set) and host_set == dpu_set
    if over and not oversubscribe:
        side, n, s = over[0]
        raise ConfigError(f"{n} {side} ranks do not fit on their {len(s)} core(s) "
                          f"({format_core_list(s)}); pass --oversubscribe to run them anyway, "
                          f"or lower --{side.lower()}-ranks")
    return LocalPlacement(host_cores=host_set, dpu_cores=dpu_set, oversubscribed=bool(over) or shared)


def oversubscribe_note(placement: LocalPlacement, host_ranks: int, dpu_ranks: int) -> str:
    """One line saying what shares cores, printed so slow timings are not a surprise."""
    sides = [f"{host_ranks} host rank(s) on core(s) {format_core_list(placement.host_cores)}"]
    if dpu_ranks:
        sides.append(f"{dpu_ranks} DPU rank(s) on core(s) {format_core_list(placement.dpu_cores)}")
    return "oversubscribing: " + ", ".join(sides) + "; timings will not reflect real hardware"


def default_threads(cores: int, ranks: int) -> int:
    """Intra-op threads per rank: the side's cores shared evenly, at least 1."""
    return max(1, cores // ranks) if ranks else 1


# ---------------------------------------------------------------------------- cluster planning
def fill(nodes: Sequence[Node], ranks: int) -> tuple[Node, ...]:
    """Place `ranks` node by node up to each node's slots (Open MPI's `--map-by slot` order).

    Ranks beyond the total slots (oversubscription) go round-robin, one per node. The result lists
    ranks per node, nodes that get none omitted, so the mpirun command fixes the placement instead
    of leaving it to the MPI's defaults (which differ between Open MPI and MPICH).
    """
    counts = [0] * len(nodes)
    left = ranks
    for i, node in enumerate(nodes):
        counts[i] = min(node.slots, left)
        left -= counts[i]
    for i in range(left):
        counts[i % len(nodes)] += 1
    return tuple(Node(n.name, c) for n, c in zip(nodes, counts) if c)


def plan_cluster(host_ranks: int, dpu_ranks: int, hosts: Sequence[Node], dpus: Sequence[Node],
                 oversubscribe: bool = False) -> ClusterPlacement:
    """Check the node lists and place both sides; DPU i belongs to host node i.

    Raises:
        ConfigError: node counts differ, ranks exceed slots without `oversubscribe`, or a node's
            host ranks would have no DPU ranks on its DPU (or the reverse).
    """
    if dpu_ranks and not dpus:
        raise ConfigError("cluster mode needs the DPUs too: give --dpus node1-bf:8,... or "
                          "--dpu-hostfile FILE (line i = the DPU of host node i), or --dpu-ranks 0")
    if dpus and len(dpus) != len(hosts):
        raise ConfigError(f"{len(hosts)} host node(s) but {len(dpus)} DPU node(s): list one DPU "
                          "per host node, in the same order (DPU i is plugged into host node i)")
    over = [_check_fit("host", host_ranks, hosts, oversubscribe)]
    if dpu_ranks:
        over.append(_check_fit("DPU", dpu_ranks, dpus, oversubscribe))
    placed_hosts = fill(hosts, host_ranks)
    placed_dpus = fill(dpus, dpu_ranks) if dpu_ranks else ()
    node_map = tuple((d.name, h.name) for d, h in zip(dpus, hosts))
    if dpu_ranks:
        _check_pairs(placed_hosts, placed_dpus, node_map)
    return ClusterPlacement(host_nodes=placed_hosts, dpu_nodes=placed_dpus, node_map=node_map,
                            oversubscribed=any(over))


def _check_fit(side: str, ranks: int, nodes: Sequence[Node], oversubscribe: bool) -> bool:
    slots = sum(n.slots for n in nodes)
    if ranks > slots and not oversubscribe:
        flag = "--hosts/--hostfile" if side == "host" else "--dpus/--dpu-hostfile"
        raise ConfigError(f"{ranks} {side} ranks do not fit the {slots} slot(s) of {flag}; add "
                          f"nodes or slots, lower --{side.lower()}-ranks, or pass --oversubscribe")
    return ranks > slots


def _check_pairs(hosts: Sequence[Node], dpus: Sequence[Node],
                 node_map: Sequence[tuple[str, str]]) -> None:
    with_hosts = {n.name for n in hosts}
    with_dpus = {dict(node_map)[n.name] for n in dpus}
    for node in sorted(with_hosts ^ with_dpus):
        dpu = next(d for d, h in node_map if h == node)
        what = (f"host node {node} gets host ranks but its DPU {dpu} gets no DPU ranks"
                if node in with_hosts else
                f"DPU {dpu} gets DPU ranks but its host node {node} gets no host ranks")
        raise ConfigError(f"{what} (ranks fill the nodes in list order up to their slots); give "
                          "each node as many slots as ranks it should run, on both sides, or "
                          "change --host-ranks/--dpu-ranks")
