"""Who keeps which host rank's training state, and which clone rank continues from which slice (pure).

Checkpoints and clones move each host rank's 1/N slice of the training state through one DPU rank,
its *keeper*: its first paired DPU rank on its own node (`roles.feeders`), so the bytes leave the
host over the local link and the host goes on computing. A clone group of M ranks gets host rank
k's slice on clone rank k mod M (the keeper forwards it there; the clone ranks then all-gather the
rest), and clone rank c adopts the local state (BatchNorm buffers, RNG, epoch progress) of host
rank c mod N. Host, DPU and clone ranks all compute the same `StateAssignment` from the job's
pairing, so none of it is ever sent; this module is the only place that decides it.

Under `--dpu-failure fallback` a keeper may die: its host ranks' state then goes to the surviving
keepers (`lost`: the keepers known dead, which every hand-off's header carries as a bit mask, so
host ranks and keepers route each hand-off alike).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, AbstractSet, Mapping

from dpuoffload.common.errors import ConfigError
from dpuoffload.common.runtime.roles import feeders

if TYPE_CHECKING:
    from dpuoffload.common.runtime.roles import Topology


@dataclass(frozen=True)
class StateAssignment:
    """The state routes of one job. All ranks are world ranks; host rank k is `host_ranks[k]`.

    Attributes:
        host_ranks: the original group's host ranks, in host rank order.
        clone_ranks: the clone group's ranks, in clone rank order (empty without `--clone-ranks`).
        keepers: host rank -> its keeper DPU rank; a host rank without a DPU rank on its node is absent.
        labels: host rank -> how errors name it ('host rank 1 (world rank 1, node n0)').
    """

    host_ranks: tuple[int, ...]
    clone_ranks: tuple[int, ...]
    keepers: Mapping[int, int]
    labels: Mapping[int, str]

    @classmethod
    def of(cls, topo: "Topology") -> "StateAssignment":
        """The assignment of `topo`'s job (the same on every rank: it only reads the shared pairing)."""
        return cls(host_ranks=topo.host_ranks, clone_ranks=topo.clone_ranks, keepers=feeders(topo.pairing),
                   labels={h: topo.describe(h) for h in topo.host_ranks})

    def keeper_of(self, host: int, lost: AbstractSet[int] = frozenset()) -> int:
        """The DPU rank that keeps `host`'s state slices: its first paired DPU rank, or (that one in
        `lost`) the surviving keeper `survivors` gives it.

        Raises:
            ConfigError: `host` has no DPU rank on its node, so checkpoints and clones cannot work.
        """
        keeper = self.keepers.get(host)
        if keeper is None:
            raise ConfigError(f"checkpoints and clones need a DPU rank on every host rank's node, but "
                              f"{self.labels[host]} has none: start DPU ranks on that node (dpurun --dpus)")
        return self.survivors(lost)[host] if keeper in lost else keeper

    def hosts_kept_by(self, dpu: int, lost: AbstractSet[int] = frozenset()) -> tuple[int, ...]:
        """The host ranks whose state `dpu` keeps, in host rank order (empty: `dpu` keeps nothing)."""
        if dpu in lost:
            return ()
        routes = self.survivors(lost) if lost else self.keepers
        return tuple(h for h in self.host_ranks if routes.get(h) == dpu)

    @property
    def keeper_ranks(self) -> tuple[int, ...]:
        """Every keeper, in world rank order (the first commits checkpoints)."""
        return tuple(sorted(set(self.keepers.values())))

    def survivors(self, lost: AbstractSet[int]) -> dict[int, int]:
        """host rank -> keeper when the keepers in `lost` are dead: a dead keeper's host ranks go, in
        host rank order, each to the surviving keeper with the fewest host ranks so far (the lowest
        world rank among equals). Empty if no keeper survives."""
        alive = [k for k in self.keeper_ranks if k not in lost]
        if not alive:
            return {}
        routes = {h: k for h, k in self.keepers.items() if k not in lost}
        load = {k: sum(1 for v in routes.values() if v == k) for k in alive}
        for h in self.host_ranks:
            if h in self.keepers and h not in routes:
                routes[h] = min(alive, key=lambda k: (load[k], k))
                load[routes[h]] += 1
        return routes

    def lost_mask(self, lost: AbstractSet[int]) -> int:
        """`lost` as the bit mask hand-off headers carry (bit i: the i-th of `keeper_ranks`)."""
        return sum(1 << i for i, k in enumerate(self.keeper_ranks) if k in lost)

    def lost_of(self, mask: int) -> frozenset[int]:
        return frozenset(k for i, k in enumerate(self.keeper_ranks) if mask >> i & 1)

    def clone_target(self, host: int) -> int:
        """The clone rank that host rank k's slice is forwarded to: clone rank k mod M."""
        if not self.clone_ranks:
            raise ValueError("this job has no clone ranks to forward state to")
        return self.clone_ranks[self.host_ranks.index(host) % len(self.clone_ranks)]

    def clone_targets_of(self, dpu: int) -> tuple[int, ...]:
        """The clone ranks keeper `dpu` forwards to (each once, in clone rank order)."""
        if not self.clone_ranks:
            return ()
        targets = {self.clone_target(h) for h in self.hosts_kept_by(dpu)}
        return tuple(c for c in self.clone_ranks if c in targets)

    def sources_of(self, clone: int) -> tuple[tuple[int, int], ...]:
        """(host rank number k, keeper DPU rank) of every slice forwarded to `clone`, in the order
        the clone rank receives them (host rank order)."""
        return tuple((k, self.keeper_of(h)) for k, h in enumerate(self.host_ranks) if self.clone_target(h) == clone)

    def local_state_of(self, clone: int, senders: int) -> int:
        """Whose local state (host rank number) clone rank `clone` adopts, when `senders` host ranks
        handed the state over: clone rank c takes host rank c mod `senders`'s."""
        return self.clone_ranks.index(clone) % senders
