"""Which DPU rank does what, and for which host ranks (pure; both programs compute the same plan).

`--mode da`: every DPU rank augments; `mv`: every DPU rank validates; `hybrid`: on each node the
first DPU ranks augment and the others validate (`--dpu-da-ranks` / `--dpu-mv-ranks` /
`--da-fanout`; the published single-node layout is 8 host ranks, 4 augmentation ranks feeding 2
host ranks each, 4 validation ranks). Host ranks are paired with DPU ranks of each kind on their
own node (`pair_ranks`); a host rank feeds from its first paired augmentation rank and sends its
state slices to its first paired validation rank, or, on a node without one, to a validation rank
chosen round-robin (validation only needs bandwidth, not locality).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

from dpuoffload.common.config import RunConfig
from dpuoffload.common.errors import ConfigError
from dpuoffload.common.modes import Mode
from dpuoffload.common.runtime.roles import Pairing, RankInfo, Role, feeders, pair_ranks

DA, MV, IDLE = "da", "mv", "idle"


@dataclass(frozen=True)
class OffloadPlan:
    work: Mapping[int, str]          # DPU world rank -> DA | MV | IDLE
    feeder: Mapping[int, int]        # host world rank -> the DA rank that feeds it
    mv_target: Mapping[int, int]     # host world rank -> the MV rank it sends its state slices to

    @property
    def mv_ranks(self) -> tuple[int, ...]:
        return tuple(sorted(r for r, w in self.work.items() if w == MV))

    def fed_by(self, dpu: int) -> tuple[int, ...]:
        return tuple(sorted(h for h, d in self.feeder.items() if d == dpu))

    def states_to(self, dpu: int) -> tuple[int, ...]:
        return tuple(sorted(h for h, d in self.mv_target.items() if d == dpu))


def split_counts(cfg: RunConfig, n_host: int, n_dpu: int) -> tuple[int, int]:
    """(augmentation ranks, validation ranks) over the whole job for `cfg.mode`."""
    if cfg.mode is Mode.DA:
        return n_dpu, 0
    if cfg.mode is Mode.MV:
        return 0, n_dpu
    if cfg.mode is not Mode.HYBRID:
        return 0, 0
    da = cfg.dpu_da_ranks or (-(-n_host // cfg.da_fanout) if cfg.da_fanout else max(1, n_dpu // 2))
    mv = cfg.dpu_mv_ranks or n_dpu - da
    if cfg.da_fanout and da * cfg.da_fanout < n_host:
        raise ConfigError(f"--da-fanout {cfg.da_fanout} with {da} augmentation rank(s) feeds only "
                          f"{da * cfg.da_fanout} of {n_host} host ranks; raise --dpu-da-ranks or --da-fanout")
    if da < 1 or mv < 1 or da + mv > n_dpu:
        raise ConfigError(f"--mode hybrid needs at least one augmentation and one validation DPU rank within "
                          f"the {n_dpu} DPU rank(s); got {da} + {max(mv, 0)} (set --dpu-da-ranks / --dpu-mv-ranks, "
                          "or start more DPU ranks with dpurun --dpu-ranks)")
    return da, mv


def plan_offload(ranks: Sequence[RankInfo], cfg: RunConfig) -> OffloadPlan:
    hosts = [r for r in ranks if r.role is Role.HOST]
    dpus = [r for r in ranks if r.role is Role.DPU]
    n_da, n_mv = split_counts(cfg, len(hosts), len(dpus))
    work = _assign(dpus, n_da, n_mv, {h.node for h in hosts})
    da_pairs = _pairing(hosts, dpus, work, DA)
    mv_pairs = _pairing(hosts, dpus, work, MV)
    mv_ranks = sorted(r for r, w in work.items() if w == MV)
    mv_target = feeders(mv_pairs)
    unpaired = sorted(r.world_rank for r in hosts if r.world_rank not in mv_target)
    for i, h in enumerate(unpaired if mv_ranks else []):
        mv_target[h] = mv_ranks[i % len(mv_ranks)]
    return OffloadPlan(work=work, feeder=feeders(da_pairs), mv_target=mv_target)


def _assign(dpus: Sequence[RankInfo], n_da: int, n_mv: int, host_nodes: set[str]) -> dict[int, str]:
    """Per node, the first DPU ranks augment and the next ones validate.

    The totals are honoured exactly (largest-remainder apportionment over the nodes' DPU ranks);
    every node with host ranks gets an augmentation rank first when there are enough to go round,
    since batches must come from the host's own node.
    """
    work = {d.world_rank: IDLE for d in dpus}
    nodes = sorted({d.node for d in dpus})
    local = {n: sorted(d.world_rank for d in dpus if d.node == n) for n in nodes}
    size = [len(local[n]) for n in nodes]
    needy = [1 if n in host_nodes else 0 for n in nodes]
    da = _apportion(size, n_da, needy if n_da >= sum(needy) else [0] * len(nodes))
    mv = _apportion([c - d for c, d in zip(size, da)], n_mv, [0] * len(nodes))
    for n, k_da, k_mv in zip(nodes, da, mv):
        for r in local[n][:k_da]:
            work[r] = DA
        for r in local[n][k_da: k_da + k_mv]:
            work[r] = MV
    return work


def _apportion(capacity: Sequence[int], total: int, minimum: Sequence[int]) -> list[int]:
    """Split `total` over bins of `capacity`: `minimum` first, the rest proportionally to the free
    capacity (largest remainder, ties to the lower index); never more than a bin holds."""
    got = [min(m, c) for m, c in zip(minimum, capacity)]
    rest = min(total, sum(capacity)) - sum(got)
    free = [c - g for c, g in zip(capacity, got)]
    if rest <= 0 or sum(free) == 0:
        return got
    quotas = [rest * f / sum(free) for f in free]
    add = [min(int(q), f) for q, f in zip(quotas, free)]
    order = sorted(range(len(free)), key=lambda i: (-(quotas[i] - int(quotas[i])), i))
    while sum(add) < rest:
        for i in order:
            if sum(add) < rest and add[i] < free[i]:
                add[i] += 1
    return [g + a for g, a in zip(got, add)]


def _pairing(hosts: Sequence[RankInfo], dpus: Sequence[RankInfo], work: Mapping[int, str], kind: str) -> Pairing:
    return pair_ranks([*hosts, *(d for d in dpus if work[d.world_rank] == kind)])


def require_feeder(plan: OffloadPlan, host: int, label: str) -> int:
    feeder: Optional[int] = plan.feeder.get(host)
    if feeder is None:
        raise ConfigError(f"{label} has no augmentation DPU rank on its node to feed it; start at least one "
                          "DPU rank (augmentation rank, in hybrid mode) per node that has host ranks")
    return feeder
