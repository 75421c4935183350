"""How the validation set is split between DPU and host ranks in `--mode mv` (pure)."""

from __future__ import annotations


def dpu_count(n: int, dpu_share: float) -> int:
    """The first `dpu_count` validation samples go to the DPU ranks, the rest to the host ranks."""
    return min(n, max(0, round(n * dpu_share)))


def auto_share(train_seconds: float, n: int, dpu_s_per_sample: float, dpu_ranks: int,
               host_s_per_sample: float, host_ranks: int) -> float:
    """The largest DPU share f whose DPU validation still ends within the next host epoch.

    The DPU ranks need f*A seconds (A = n*dpu_s_per_sample/dpu_ranks) and have the next epoch's
    training plus the host's part of validation, T + (1-f)*B (B = n*host_s_per_sample/host_ranks),
    to do it: f*A <= T + (1-f)*B gives f <= (T + B) / (A + B). Every sample moved to the DPU saves
    the host its evaluation time, so the largest feasible f is the best.
    """
    a = n * dpu_s_per_sample / max(dpu_ranks, 1)
    b = n * host_s_per_sample / max(host_ranks, 1)
    if a + b <= 0:
        return 1.0
    return max(0.0, min(1.0, (train_seconds + b) / (a + b)))
