"""The host ranks' group as training uses it: one type for "a fixed communicator or a SurvivorGroup".

The gradient allreduce, validation sums, state hand-offs and the end-of-run barrier run over the
training replicas: the host ranks' communicator (`Topology.side_comm`, as a `FixedGroup`; COMM_WORLD's
ranks in `--mode naive`), or under `--recovery` the host program's `host.recovery.survivors.SurvivorGroup`,
which redoes each collective on the survivors after a death. `HostGroup` names every call made on
it, and what a changing group must say about itself (its `generation`, its `seats`, its `members`), so
the code over it never asks which one it has. Whether the group can change at all is the run's
recovery policy (`cfg.recovery_policy.survives_host_loss`).

Torch-free and MPI-free: a protocol and the fixed group.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Protocol, Sequence

import numpy as np

if TYPE_CHECKING:
    from mpi4py import MPI

    from dpuoffload.common.runtime.roles import Topology


class HostGroup(Protocol):
    """The collectives training makes over the host ranks (a `FixedGroup` or a `SurvivorGroup`).

    Every call is collective over the group, made by all its ranks in the same order. Over a
    `SurvivorGroup` a call may complete on fewer ranks than it started on (a rank died and the
    group changed in it: `generation` moves); the result is then the survivors'.
    """

    def Get_rank(self) -> int: ...  # noqa: N802 - mpi4py's names, so a communicator's calls read alike

    def Get_size(self) -> int: ...  # noqa: N802

    def Allreduce(self, sendbuf: np.ndarray, recvbuf: np.ndarray, /,  # noqa: N802
                  op: Optional["MPI.Op"] = None) -> None:
        """`recvbuf` = the reduction of every rank's `sendbuf` by `op` (None: MPI.SUM)."""

    def Bcast(self, buf: np.ndarray, /, root: int = 0) -> None: ...  # noqa: N802

    def Barrier(self) -> None: ...  # noqa: N802

    @property
    def generation(self) -> int:
        """How many times the group has changed (a death shrank it, or spares took seats): 0 for a
        group that never changes. A caller compares it before and after a collective to know whether
        the result is the survivors' (and recomputes what depended on the group's size)."""

    @property
    def comm(self) -> "MPI.Comm":
        """The communicator under the group as it is now (after any change). For a call made once,
        outside what `HostGroup` names, whose failure nobody recovers (the job's last barrier,
        `host.control.end_with_dpus`), and for allreduce libraries that take a communicator."""

    def seats(self) -> Sequence[int]:
        """The seat each rank of the group fills, in its rank order: the index among the job's
        host ranks of the rank whose place it trains in (a survivor its own; under rollback a spare
        the dead rank's). State hand-offs route by seat."""

    def members(self) -> list[int]:
        """World ranks of the group's ranks, in its rank order (a spare in a seat is itself, not the
        host rank whose seat it fills). Replies (the checkpoint summary) go here."""


class FixedGroup:
    """A communicator that never changes, as a `HostGroup`: rank i fills seat i."""

    def __init__(self, comm: "MPI.Comm", members: Sequence[int]) -> None:
        """`members`: the world ranks of `comm`'s ranks, in its rank order."""
        self._comm, self._members = comm, list(members)

    @classmethod
    def of_side(cls, topo: "Topology") -> "FixedGroup":
        """This rank's side of the job: the host ranks (or the clone ranks, the DPU ranks)."""
        return cls(topo.side_comm, topo.side_ranks(topo.role))

    @classmethod
    def of_world(cls, topo: "Topology") -> "FixedGroup":
        """Every rank of the job (`--mode naive`: host and DPU ranks are replicas alike)."""
        return cls(topo.world, range(topo.world.Get_size()))

    def Get_rank(self) -> int:  # noqa: N802
        return self._comm.Get_rank()

    def Get_size(self) -> int:  # noqa: N802
        return self._comm.Get_size()

    def Allreduce(self, sendbuf: np.ndarray, recvbuf: np.ndarray, /,  # noqa: N802
                  op: Optional["MPI.Op"] = None) -> None:
        if op is None:
            self._comm.Allreduce(sendbuf, recvbuf)
        else:
            self._comm.Allreduce(sendbuf, recvbuf, op=op)

    def Bcast(self, buf: np.ndarray, /, root: int = 0) -> None:  # noqa: N802
        self._comm.Bcast(buf, root=root)

    def Barrier(self) -> None:  # noqa: N802
        self._comm.Barrier()

    @property
    def generation(self) -> int:
        return 0

    @property
    def comm(self) -> "MPI.Comm":
        return self._comm

    def seats(self) -> Sequence[int]:
        return range(self._comm.Get_size())

    def members(self) -> list[int]:
        return list(self._members)


def seat_hosts(group: HostGroup, host_ranks: Sequence[int]) -> list[int]:
    """World ranks of the host ranks whose seats the ranks of `group` fill, in its rank order: a
    `SurvivorGroup`'s survivors (or spares in dead ranks' seats), or a fixed group's ranks. State
    hand-offs route by seat, so a spare sends where the rank it replaced would have."""
    return [host_ranks[s] for s in group.seats()]
