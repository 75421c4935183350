"""Which program a rank runs, its communicators, and the host<->DPU pairing.

Every rank learns its role from `MPI.APPNUM` (app context 0 = host program, 1 = DPU program, 2 =
the host program's standby ranks, as `dpurun` writes the MPMD command: the clone group of
`--clone-at`, or with `DPUOFFLOAD_STANDBY=spare` the spare host ranks of `--recovery rollback`), splits
`COMM_WORLD` into `host_comm` and `dpu_comm`, and computes the same pairing from an allgather of
(role, hostname). The pairing itself is the pure function `pair_ranks`, testable without
processes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from enum import IntEnum
from typing import TYPE_CHECKING, Mapping, Optional, Sequence

from dpuoffload.common.errors import ConfigError
from dpuoffload.common.runtime import env

if TYPE_CHECKING:  # mpi4py is imported lazily so pure logic stays importable without MPI
    from mpi4py import MPI


class Role(IntEnum):
    """A rank's program; the value is the MPMD app context number (`MPI.APPNUM`)."""

    HOST = 0
    DPU = 1
    CLONE = 2  # host program ranks standing by to continue a clone of the training (--clone-at)
    SPARE = 3  # host program ranks standing by to take a dead host rank's place (--recovery rollback; app context 2)

    @property
    def program(self) -> str:
        return {Role.HOST: "host program", Role.DPU: "DPU program", Role.CLONE: "host program (clone group)",
                Role.SPARE: "host program (spare)"}[self]

    @property
    def kind(self) -> str:
        """'host', 'DPU', 'clone', 'spare': the word in rank labels."""
        return {Role.HOST: "host", Role.DPU: "DPU", Role.CLONE: "clone", Role.SPARE: "spare"}[self]


@dataclass(frozen=True)
class RankInfo:
    world_rank: int
    role: Role
    hostname: str
    node: str  # the physical node: a DPU's node is the host node it is plugged into


@dataclass(frozen=True)
class Pairing:
    """Which DPU ranks serve which host rank (world ranks), always within one node."""

    host_to_dpus: Mapping[int, tuple[int, ...]]
    dpu_to_hosts: Mapping[int, tuple[int, ...]]


def node_of(hostname: str, node_map: Mapping[str, str]) -> str:
    short = env.short_hostname(hostname)
    return node_map.get(short, short)


def pair_ranks(ranks: Sequence[RankInfo]) -> Pairing:
    """Pair host and DPU ranks node by node, deterministically.

    On each node, host ranks and DPU ranks are ordered by world rank. With fewer (or as many) DPU
    ranks than host ranks, host i gets DPU floor(i * n_dpu / n_host): consecutive host ranks share a
    DPU rank (fan-out). With more DPU ranks than host ranks, DPU j serves host floor(j * n_host /
    n_dpu): a host rank gets several DPU ranks. A node without DPU ranks leaves its hosts unpaired.
    """
    host_to: dict[int, list[int]] = {r.world_rank: [] for r in ranks if r.role is Role.HOST}
    dpu_to: dict[int, list[int]] = {r.world_rank: [] for r in ranks if r.role is Role.DPU}
    for node in sorted({r.node for r in ranks}):
        hosts = sorted(r.world_rank for r in ranks if r.node == node and r.role is Role.HOST)
        dpus = sorted(r.world_rank for r in ranks if r.node == node and r.role is Role.DPU)
        if not hosts or not dpus:
            continue
        if len(dpus) <= len(hosts):
            pairs = [(h, dpus[i * len(dpus) // len(hosts)]) for i, h in enumerate(hosts)]
        else:
            pairs = [(hosts[j * len(hosts) // len(dpus)], d) for j, d in enumerate(dpus)]
        for h, d in pairs:
            host_to[h].append(d)
            dpu_to[d].append(h)
    return Pairing(host_to_dpus={k: tuple(v) for k, v in host_to.items()},
                   dpu_to_hosts={k: tuple(v) for k, v in dpu_to.items()})


@dataclass
class Topology:
    """This rank's view of the job. `side_comm` is `host_comm` on host ranks, `dpu_comm` on DPU ranks."""

    world: "MPI.Comm"
    side_comm: "MPI.Comm"
    role: Role
    ranks: tuple[RankInfo, ...]
    pairing: Pairing
    host_ranks: tuple[int, ...] = field(init=False)
    dpu_ranks: tuple[int, ...] = field(init=False)
    clone_ranks: tuple[int, ...] = field(init=False)
    spare_ranks: tuple[int, ...] = field(init=False)
    pool: Optional["MPI.Comm"] = None  # host and spare ranks (with spare ranks only; None elsewhere)

    def __post_init__(self) -> None:
        self.host_ranks = tuple(r.world_rank for r in self.ranks if r.role is Role.HOST)
        self.dpu_ranks = tuple(r.world_rank for r in self.ranks if r.role is Role.DPU)
        self.clone_ranks = tuple(r.world_rank for r in self.ranks if r.role is Role.CLONE)
        self.spare_ranks = tuple(r.world_rank for r in self.ranks if r.role is Role.SPARE)

    @property
    def world_rank(self) -> int:
        return self.world.Get_rank()

    @property
    def side_rank(self) -> int:
        return self.side_comm.Get_rank()

    @property
    def host_comm(self) -> Optional["MPI.Comm"]:
        return self.side_comm if self.role is Role.HOST else None

    @property
    def dpu_comm(self) -> Optional["MPI.Comm"]:
        return self.side_comm if self.role is Role.DPU else None

    @property
    def peers(self) -> tuple[int, ...]:
        """World ranks paired with this rank (its DPU ranks on a host, its host ranks on a DPU)."""
        table = self.pairing.host_to_dpus if self.role is Role.HOST else self.pairing.dpu_to_hosts
        return table[self.world_rank]

    def side_ranks(self, role: Role) -> tuple[int, ...]:
        return {Role.HOST: self.host_ranks, Role.DPU: self.dpu_ranks, Role.CLONE: self.clone_ranks,
                Role.SPARE: self.spare_ranks}[role]

    @property
    def local_rank(self) -> int:
        """This rank's index among the ranks of its role on its node (a GPU host rank's GPU number)."""
        me = self.ranks[self.world_rank]
        return [r.world_rank for r in self.ranks if r.role is me.role and r.node == me.node].index(self.world_rank)

    def on_other_machine(self, world_rank: int) -> bool:
        """Whether `world_rank` runs on another machine than this rank (its hostname; a real DPU is
        a machine of its own even though it serves this node). Messages between the two then cross
        a network, where a large one moves only while both ranks call into MPI."""
        return self.ranks[world_rank].hostname != self.ranks[self.world_rank].hostname

    def describe(self, world_rank: Optional[int] = None) -> str:
        """'host rank 1 (world rank 1, node n0)' — the label used in every log and error."""
        wr = self.world_rank if world_rank is None else world_rank
        info = self.ranks[wr]
        side = self.side_ranks(info.role).index(wr)
        return f"{info.role.kind} rank {side} (world rank {wr}, node {info.node})"


def role_from_appnum(appnum: Optional[int], expected: Role, standby: Optional[str] = None) -> Role:
    """Check the app context number against the program that is running.

    `appnum` is None when a program was started without mpirun (singleton) or by an MPI without
    APPNUM support; the program's own role is used then. `standby`: `DPUOFFLOAD_STANDBY`, which
    dpurun sets to "spare" on app context 2 when it holds spare ranks instead of clone ranks.
    """
    if appnum is None:
        return expected
    if appnum not in (0, 1, 2):
        raise ConfigError(f"MPI app context {appnum}: dpuoffload jobs have two or three (0 = host "
                          "program, 1 = DPU program, 2 = clone group); start them with dpurun")
    if appnum == Role.CLONE and expected is Role.HOST:
        return Role.SPARE if standby == "spare" else Role.CLONE
    if Role(appnum) is not expected:
        raise ConfigError(f"the {expected.program} runs in MPI app context {appnum}, but context "
                          f"{int(expected)} is reserved for it: put the host program first and the "
                          "DPU program second in the mpirun command (dpurun does this)")
    return expected


INIT_BOUND_S = 600.0   # MPI init's bound when the command line sets no --peer-timeout (RunConfig's default)
INIT_MIN_S = 120.0     # ...and never less: init waits for the slowest rank's start (its imports, on a busy core)


def init_bound(argv: Sequence[str], environ: Mapping[str, str]) -> float:
    """Seconds MPI init may take: `DPUOFFLOAD_INIT_TIMEOUT` when set (tests), else `--peer-timeout`
    from the rank's command line (read before any config exists: a value set only in a `--config`
    file is not seen here) or `INIT_BOUND_S`, at least `INIT_MIN_S`: a peer timeout of seconds bounds
    waits between running ranks, while init also waits for every rank to get there."""
    if environ.get(env.INIT_TIMEOUT):
        return max(float(environ[env.INIT_TIMEOUT]), 1.0)
    bound = INIT_BOUND_S
    for i, arg in enumerate(argv):
        value = argv[i + 1] if arg == "--peer-timeout" and i + 1 < len(argv) else \
            arg.split("=", 1)[1] if arg.startswith("--peer-timeout=") else None
        if value is not None:
            try:
                bound = float(value)
            except ValueError:
                pass   # (the config's own check names a bad value, once MPI is up)
            break
    return max(bound, INIT_MIN_S)


def init_mpi(bound: float) -> None:
    """`MPI_Init` (mpi4py's import), ended with exit status 1 if it takes longer than `bound` seconds.

    Why: under MPI's fault tolerance (`--recovery`, `--dpu-failure fallback`: `mpirun --with-ft ulfm`)
    a rank that dies before every rank has finished MPI init leaves the others in init's exchange
    forever: mpirun does not end a job for a death there, and init holds the interpreter, so no
    Python timer could run. `faulthandler`'s watchdog is a C thread: past the bound it prints where
    the rank waited (the `init_mpi` frame, under a "Timeout" line) and exits the process with status
    1, which ends the job as a failure. Cancelled as soon as init returns."""
    import faulthandler

    faulthandler.dump_traceback_later(max(bound, 1.0), exit=True)
    try:
        from mpi4py import MPI  # noqa: F401 - initializes MPI
    finally:
        faulthandler.cancel_dump_traceback_later()


def build_topology(expected: Role, world: Optional["MPI.Comm"] = None) -> Topology:
    """Collective over `world`: determine roles, split communicators, compute the pairing."""
    import sys

    init_mpi(init_bound(sys.argv, os.environ))
    from mpi4py import MPI

    world = MPI.COMM_WORLD if world is None else world
    role = role_from_appnum(world.Get_attr(MPI.APPNUM), expected, os.environ.get(env.STANDBY))
    node_map = env.parse_node_map(os.environ.get(env.NODE_MAP))
    hostname = MPI.Get_processor_name()
    gathered = world.allgather((int(role), hostname))
    ranks = tuple(RankInfo(world_rank=i, role=Role(r), hostname=h, node=node_of(h, node_map))
                  for i, (r, h) in enumerate(gathered))
    side = world.Split(color=int(role), key=world.Get_rank())
    pool = None
    if any(r.role is Role.SPARE for r in ranks):  # (every rank knows: all of them split, or none)
        pool = world.Split(color=0 if role in (Role.HOST, Role.SPARE) else MPI.UNDEFINED, key=world.Get_rank())
    return Topology(world=world, side_comm=side, role=role, ranks=ranks, pairing=pair_ranks(ranks), pool=pool)


def feeders(pairing: Pairing) -> dict[int, int]:
    """The one DPU rank that feeds each paired host rank: its first paired DPU rank.

    Extra DPU ranks of a host (more DPU ranks than host ranks on a node) feed nobody.
    """
    return {h: dpus[0] for h, dpus in pairing.host_to_dpus.items() if dpus}

