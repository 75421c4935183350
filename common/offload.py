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
from dpuoffload.common.roles import Pairing, RankInfo, Role, feeders, pair_ranks

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
    if cfg.mode == "da":
        return n_dpu, 0
    if cfg.mode == "mv":
        return 0, n_dpu
    if cfg.mode != "hybrid":
        return 0, 0
    da = cfg.dpu_da_ranks or (-(-n_host // cfg.da_fanout) if cfg.da_fanout else max(1, n_dpu // 2))
    mv = cfg.dpu_mv_ranks or n_dpu - da
    if cfg.da_fanout and da * cfg.da_fanout < n_host:
        raise ConfigError(f"--da-fanout {cfg.da_fanout} with {da} augmentation rank(s) feeds only "
                          f"{da * cfg.da_fanout} of {n_host} host ranks; raise --dpu-da-ranks or --da-fanout")
    if da < 1 or mv < 1 or da + mv > n_dpu:
        raise ConfigError(f"--mode hybrid needs at least one augmentation and one validation DPU rank within "
                          f"the {n_dpu} DPU rank(s); got {da} + {mv} (set --dpu-da-ranks / --dpu-mv-ranks, "
                          "or start more DPU ranks with dpurun --dpu-ranks)")
    return da, mv


def plan_offload(ranks: Sequence[RankInfo], cfg: RunConfig) -> OffloadPlan:
    hosts = [r for r in ranks if r.role is Role.HOST]
    dpus = [r for r in ranks if r.role is Role.DPU]
    n_da, n_mv = split_counts(cfg, len(hosts), len(dpus))
    work = _assign(dpus, n_da, n_mv)
    da_pairs = _pairing(hosts, dpus, work, DA)
    mv_pairs = _pairing(hosts, dpus, work, MV)
    mv_ranks = sorted(r for r, w in work.items() if w == MV)
    mv_target = feeders(mv_pairs)
    for i, h in enumerate(sorted(r.world_rank for r in hosts)):
        if mv_ranks and h not in mv_target:
            mv_target[h] = mv_ranks[i % len(mv_ranks)]
    return OffloadPlan(work=work, feeder=feeders(da_pairs), mv_target=mv_target)


def _assign(dpus: Sequence[RankInfo], n_da: int, n_mv: int) -> dict[int, str]:
    """Per node, the first DPU ranks augment and the next ones validate, proportionally to the totals."""
    work = {d.world_rank: IDLE for d in dpus}
    total = len(dpus)
    for node in sorted({d.node for d in dpus}):
        local = sorted(d.world_rank for d in dpus if d.node == node)
        k_da = min(len(local), round(len(local) * n_da / total)) if total else 0
        k_mv = min(len(local) - k_da, round(len(local) * n_mv / total)) if total else 0
        for r in local[:k_da]:
            work[r] = DA
        for r in local[k_da: k_da + k_mv]:
            work[r] = MV
    return work


def _pairing(hosts: Sequence[RankInfo], dpus: Sequence[RankInfo], work: Mapping[int, str], kind: str) -> Pairing:
    return pair_ranks([*hosts, *(d for d in dpus if work[d.world_rank] == kind)])


def require_feeder(plan: OffloadPlan, host: int, label: str) -> int:
    feeder: Optional[int] = plan.feeder.get(host)
    if feeder is None:
        raise ConfigError(f"{label} has no augmentation DPU rank on its node to feed it; start at least one "
                          "DPU rank (augmentation rank, in hybrid mode) per node that has host ranks")
    return feeder
