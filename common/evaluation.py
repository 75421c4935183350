"""Validation arithmetic shared by every side that evaluates (host ranks now, DPU ranks in --mode mv).

Ranks evaluate contiguous, unshuffled shards of the validation set and sum (loss, correct, count);
summing the per-rank sums gives the metrics of the whole set no matter how it was split.
"""

from __future__ import annotations

import time
from typing import Sequence

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, Subset


def shard_range(n: int, rank: int, size: int) -> range:
    """Contiguous shard `rank` of `size` over n items; sizes differ by at most one."""
    return range(rank * n // size, (rank + 1) * n // size)


@torch.no_grad()
def evaluate_sums(model: nn.Module, dataset: Dataset, indices: Sequence[int], batch_size: int) -> np.ndarray:
    """Return float64 [loss sum, correct, count] over `indices` (model left in eval mode)."""
    model.eval()
    sums = np.zeros(3, dtype=np.float64)
    if len(indices) == 0:
        return sums
    loader = DataLoader(Subset(dataset, list(indices)), batch_size=batch_size, shuffle=False)
    for x, y in loader:
        out = model(x)
        sums[0] += float(nn.functional.cross_entropy(out, y, reduction="sum"))
        sums[1] += int((out.argmax(1) == y).sum())
        sums[2] += len(y)
    return sums


def eval_seconds_per_sample(model: nn.Module, dataset: Dataset, batch_size: int, batches: int = 2) -> float:
    """Measured evaluation cost on this rank: one warm-up batch, then `batches` timed batches."""
    n = len(dataset)  # type: ignore[arg-type]
    evaluate_sums(model, dataset, range(min(batch_size, n)), batch_size)
    timed = range(min(batches * batch_size, n))
    t0 = time.perf_counter()
    evaluate_sums(model, dataset, timed, batch_size)
    return (time.perf_counter() - t0) / max(len(timed), 1)


def metrics_from_sums(sums: np.ndarray) -> tuple[float, float]:
    """(mean loss, accuracy) from summed [loss, correct, count]."""
    count = max(sums[2], 1.0)
    return float(sums[0] / count), float(sums[1] / count)
