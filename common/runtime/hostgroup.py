"""The host ranks' group as training uses it: one type for "a communicator or a SurvivorGroup".

The gradient allreduce, validation sums, state hand-offs and the end-of-run barrier run over the
training replicas: the host ranks' mpi4py communicator (`Topology.side_comm`; COMM_WORLD's ranks in
`--mode naive`), or under `--recovery` the host program's `host.recovery.survivors.SurvivorGroup`,
which redoes each collective on the survivors after a death. `HostGroup` names exactly the calls
made on it, which both offer (mpi4py's names), so the code over it never asks which one it has.
What only a changing group has (`generation`) is read through `generation` here, its communicator
through `communicator`; whether the
group can change at all is the run's recovery policy (`cfg.recovery_policy.survives_host_loss`).

Torch-free and MPI-free: a type and two helpers.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np


class HostGroup(Protocol):
    """The collectives training makes over the host ranks (an `MPI.Comm` or a `SurvivorGroup`).

    Every call is collective over the group, made by all its ranks in the same order. Over a
    `SurvivorGroup` a call may complete on fewer ranks than it started on (a rank died and the
    group changed in it: `generation` moves); the result is then the survivors'.
    """

    def Get_rank(self) -> int: ...  # noqa: N802 - mpi4py's names, so a communicator is one

    def Get_size(self) -> int: ...  # noqa: N802

    def Allreduce(self, sendbuf: np.ndarray, recvbuf: np.ndarray, /, op: Any = ...) -> None: ...  # noqa: N802

    def Bcast(self, buf: np.ndarray, /, root: int = 0) -> None: ...  # noqa: N802

    def Barrier(self) -> None: ...  # noqa: N802


def generation(group: HostGroup) -> int:
    """How many times `group` has changed (a death shrank it, or spares took seats): 0 for a plain
    communicator, which never changes. A caller compares it before and after a collective to know
    whether the result is the survivors' (and recomputes what depended on the group's size)."""
    return getattr(group, "generation", 0)


def communicator(group: HostGroup) -> Any:
    """The mpi4py communicator under `group`: a `SurvivorGroup`'s own (as it is now, after any change),
    a plain communicator itself. For a call made once, outside what `HostGroup` names, whose failure
    nobody recovers (the job's last barrier, `host.control.end_with_dpus`)."""
    return getattr(group, "comm", group)
