"""`--mode naive`'s arithmetic (pure): steps per epoch and the balanced DPU batch size."""

from __future__ import annotations

import math
from typing import Sequence


def naive_steps(n: int, batch_sizes: Sequence[int], drop_last: bool) -> int:
    """Steps of one epoch of `n` samples dealt out `sum(batch_sizes)` at a time."""
    total = sum(batch_sizes)
    return n // total if drop_last else math.ceil(n / total)


def balanced_dpu_batch(host_batch: int, host_cost: float, dpu_cost: float) -> int:
    """The DPU batch whose step takes about as long as a host step: b = B * host_cost / dpu_cost."""
    return max(1, round(host_batch * host_cost / dpu_cost)) if dpu_cost > 0 else host_batch
