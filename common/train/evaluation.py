"""Validation arithmetic shared by every side that evaluates (host ranks now, DPU ranks in --mode mv).

Ranks evaluate contiguous, unshuffled shards of the validation set and sum (loss, correct, count);
summing the per-rank sums gives the metrics of the whole set no matter how it was split.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable, Optional, Protocol, Sequence

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, Subset

from dpuoffload.common.data.sampling import loader_generator
from dpuoffload.common.runtime.hostgroup import HostGroup
from dpuoffload.common.train.device import model_device

Sums = np.ndarray  # float64 [loss sum, correct, count]
SharePolicy = Callable[[float], float]  # this epoch's training seconds -> DPU share of validation


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
    loader = DataLoader(Subset(dataset, list(indices)), batch_size=batch_size, shuffle=False,
                        generator=loader_generator())
    device = model_device(model)
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        out = model(x)
        sums[0] += float(nn.functional.cross_entropy(out, y, reduction="sum"))
        sums[1] += int((out.argmax(1) == y).sum())
        sums[2] += len(y)
    return sums


def eval_seconds_per_sample(model: nn.Module, dataset: Dataset, batch_size: int, batches: int = 3) -> float:
    """Measured evaluation cost on this rank: one warm-up batch, then the median of `batches`
    timings of the same batch (robust to one batch slowed by a neighbour on a shared machine)."""
    first = range(min(batch_size, len(dataset)))  # type: ignore[arg-type]
    evaluate_sums(model, dataset, first, batch_size)

    def one_batch() -> float:
        t0 = time.perf_counter()
        evaluate_sums(model, dataset, first, batch_size)
        return (time.perf_counter() - t0) / max(len(first), 1)

    return statistics.median(one_batch() for _ in range(batches))


def metrics_from_sums(sums: np.ndarray) -> tuple[float, float]:
    """(mean loss, accuracy) from summed [loss, correct, count]."""
    count = max(sums[2], 1.0)
    return float(sums[0] / count), float(sums[1] / count)


def allreduce_sums(comm: HostGroup, sums: Sums) -> Sums:
    from mpi4py import MPI

    out = np.empty_like(sums)
    comm.Allreduce(sums, out, op=MPI.SUM)
    return out


def allreduce_shards(comm: HostGroup, sums_of: Callable[[int, int], Sums]) -> Sums:
    """Sum `sums_of(rank, size)` (sums over this rank's shard of a set) over `comm`.

    On a `host.recovery.survivors.SurvivorGroup` that lost a rank during the sum (its `generation`
    moved), the shards are recomputed for the new size: else the dead rank's shard would be missing.
    """
    while True:
        before = comm.generation
        out = allreduce_sums(comm, sums_of(comm.Get_rank(), comm.Get_size()))
        if comm.generation == before:
            return out


class Validation(Protocol):
    """Per epoch: `epoch_end(epoch, share)` on every host rank, then `ready()`; `finish()` at the end.
    `ready`/`finish` return (epoch, summed validation metrics) on host rank 0, in epoch order."""

    def epoch_end(self, epoch: int, dpu_share: float) -> None: ...

    def ready(self) -> list[tuple[int, Sums]]: ...

    def finish(self) -> list[tuple[int, Sums]]: ...


class LocalValidation:
    """Every host rank evaluates its shard; `host_comm` None: one process without MPI, all of it."""

    def __init__(self, model: nn.Module, val_set: Dataset, batch_size: int, host_comm: Optional[HostGroup]) -> None:
        self.model, self.val_set, self.batch_size, self.comm = model, val_set, batch_size, host_comm
        self.done: list[tuple[int, Sums]] = []

    def epoch_end(self, epoch: int, dpu_share: float = 0.0) -> None:
        if self.comm is None:
            indices = range(len(self.val_set))  # type: ignore[arg-type]
            self.done.append((epoch, evaluate_sums(self.model, self.val_set, indices, self.batch_size)))
            return
        n = len(self.val_set)  # type: ignore[arg-type]
        self.done.append((epoch, allreduce_shards(self.comm, lambda rank, size: evaluate_sums(
            self.model, self.val_set, shard_range(n, rank, size), self.batch_size))))

    def ready(self) -> list[tuple[int, Sums]]:
        out, self.done = self.done, []
        return out

    def finish(self) -> list[tuple[int, Sums]]:
        return self.ready()


class NoValidation:
    """A replica that does not validate (DPU ranks in `--mode naive`); the host ranks do."""

    def __init__(self) -> None:
        self.done: list[tuple[int, Sums]] = []

    def epoch_end(self, epoch: int, dpu_share: float = 0.0) -> None:
        self.done.append((epoch, np.zeros(3, dtype=np.float64)))

    def ready(self) -> list[tuple[int, Sums]]:
        out, self.done = self.done, []
        return out

    def finish(self) -> list[tuple[int, Sums]]:
        return self.ready()
