"""`--mode naive`: DPU ranks are extra data-parallel replicas with a smaller batch.

Every replica (host ranks with `--batch-size B`, DPU ranks with `--dpu-batch-size b`) trains on
its own share of each epoch, proportional to its batch size: the epoch's permutation (seed,
epoch) is cut into steps of sum(batch sizes) samples and each step's chunk is dealt out in world
rank order, so every sample is visited exactly once per epoch (the last step may leave some
replicas fewer or no samples; with `--drop-last` the partial step is dropped). Gradients are the
sample-weighted mean, not the published design's plain average of unequal batches: each replica
scales its mean loss by n_i / sum(n) and the allreduce sums (`Stepper.step`).
"""

from __future__ import annotations

import copy
import statistics
import time
from typing import Any, Iterator, Optional, Sequence, Union

import torch
from torch import nn
from torch.utils.data import default_collate

from dpuoffload.common.config import RunConfig
from dpuoffload.common.data.feeds import Batch
from dpuoffload.common.data.sampling import PerSampleSeeded, collated
from dpuoffload.common.modes import AllReduce
from dpuoffload.common.plan.naive import balanced_dpu_batch, naive_steps
from dpuoffload.common.runtime.roles import Role, Topology

Plan = list[list[list[int]]]  # [replica][step] -> sample indices


def naive_plan(n: int, seed: int, epoch: int, batch_sizes: Sequence[int], drop_last: bool) -> Plan:
    """Indices of every replica's batch at every step of `epoch` (pure; same on every rank)."""
    gen = torch.Generator()
    gen.manual_seed(seed + epoch)
    perm = torch.randperm(n, generator=gen).tolist()
    total = sum(batch_sizes)
    plan: Plan = [[] for _ in batch_sizes]
    for step in range(naive_steps(n, batch_sizes, drop_last)):
        chunk, offset = perm[step * total: (step + 1) * total], 0
        for replica, b in enumerate(batch_sizes):
            plan[replica].append(chunk[offset: offset + b])
            offset += b
    return plan


def replica_batch_sizes(cfg: RunConfig, n_host: int, n_dpu: int, dpu_batch: int) -> list[int]:
    """Batch size of every replica in world rank order (host ranks first, as dpurun starts them)."""
    return [cfg.batch_size] * n_host + [dpu_batch] * n_dpu


class NaiveFeed:
    """One replica's batches of the naive plan, built from its own (per-sample seeded) data set."""

    def __init__(self, cfg: RunConfig, dataset: PerSampleSeeded, replica: int, batch_sizes: Sequence[int],
                 sample_shape: tuple[int, ...]) -> None:
        self.cfg, self.dataset, self.replica, self.batch_sizes = cfg, dataset, replica, list(batch_sizes)
        self.sample_shape = sample_shape
        self.totals: list[int] = []

    def steps(self) -> int:
        return naive_steps(len(self.dataset), self.batch_sizes, self.cfg.drop_last)

    def global_samples(self, step: int) -> Optional[int]:
        return self.totals[step]

    def skipped(self, epoch: int) -> int:
        return 0  # (--skip-corrupt is refused with --mode naive)

    def epoch(self, epoch: int, start: int = 0, stop: Optional[int] = None) -> Iterator[Batch]:
        """(`start`/`stop` exist for the Feed protocol; naive runs never resume mid-epoch.)"""
        plan = naive_plan(len(self.dataset), self.cfg.seed, epoch, self.batch_sizes, self.cfg.drop_last)
        self.totals = [sum(len(plan[r][s]) for r in range(len(plan))) for s in range(self.steps())]
        self.dataset.set_epoch(epoch)
        for indices in plan[self.replica][start:stop]:
            if not indices:
                yield torch.empty(0, *self.sample_shape), torch.empty(0, dtype=torch.int64)
            else:
                yield default_collate(self.dataset.__getitems__(indices))


def train_seconds_per_sample(model: nn.Module, dataset: PerSampleSeeded, batch_size: int, steps: int = 4) -> float:
    """Measured forward+backward cost per sample on this rank (on a copy: the weights stay untouched).

    Shaped as the trainer's "forward_backward" phase (`step.Stepper.step`): the gradients zeroed in
    place (not freed: the trainer keeps them for the allreduce), forward, loss, backward, and the
    loss and correct count read. A bare forward/backward left the zeroing and the reads out, 2-6 %
    of resnet20's step. The median of `steps` timed steps after one warm-up: on a shared machine
    one step in a few is slowed by a neighbour, and a mean of two steps carried that into every
    prediction (+60 % for shufflenet_v2 in one benchmark run).
    """
    probe = copy.deepcopy(model).train()
    x, y = collated(dataset, 0, batch_size)
    criterion = nn.CrossEntropyLoss()

    def one_step() -> float:
        t0 = time.perf_counter()
        forward_backward(probe, criterion, x, y)
        return time.perf_counter() - t0

    one_step()  # warm-up (and the gradients allocated, as after the trainer's first step)
    return statistics.median(one_step() for _ in range(steps)) / len(y)


def forward_backward(model: nn.Module, criterion: nn.Module, x: torch.Tensor, y: torch.Tensor) -> None:
    """The work of the trainer's "forward_backward" phase on a CPU (`step.Stepper.step`), for the
    profiles that time it: the gradients zeroed in place (the trainer keeps them for the allreduce),
    forward, loss, backward, and the loss and correct count read."""
    model.zero_grad(set_to_none=False)
    out = model(x)
    loss = criterion(out, y)
    loss.backward()
    float(loss.detach()), int((out.detach().argmax(1) == y).sum())


def resolve_dpu_batch(cfg: RunConfig, host_cost: Optional[float], dpu_cost: Optional[float]) -> int:
    value: Union[int, str, None] = cfg.dpu_batch_size
    if value not in (None, "auto"):
        return int(value)
    if host_cost is None or dpu_cost is None:
        raise RuntimeError("--dpu-batch-size auto needs the measured costs of host rank 0 and DPU rank 0")
    return balanced_dpu_batch(cfg.batch_size, host_cost, dpu_cost)


def measure_profile(cfg: RunConfig, topo: Topology, model: nn.Module, train: PerSampleSeeded) -> dict[str, Any]:
    """With `--dpu-batch-size auto`, every rank measures its training cost at the same time (ranks
    that share cores then measure the shared speed they will train at); host rank 0's and DPU rank
    0's numbers are used."""
    if not cfg.mode.dpu_trains or cfg.dpu_batch_size not in (None, "auto"):
        return {}
    batch = cfg.batch_size if topo.role is Role.HOST else max(1, cfg.batch_size // 4)
    return {"train_cost": train_seconds_per_sample(model, train, batch)}


def build_naive_feed(cfg: RunConfig, topo: Topology, train: PerSampleSeeded,
                     profiles: Sequence[dict[str, Any]], batch_source: str = "from --dpu-batch-size") -> NaiveFeed:
    """This replica's feed; every rank derives the same DPU batch size from the same profiles.

    Args:
        batch_source: where a fixed `cfg.dpu_batch_size` came from, for the message (`--mode auto`
            fills it in from its profile; the user never gave the flag then).
    """
    host_cost = profiles[topo.host_ranks[0]].get("train_cost")
    dpu_cost = profiles[topo.dpu_ranks[0]].get("train_cost")
    dpu_batch = resolve_dpu_batch(cfg, host_cost, dpu_cost)
    if topo.world_rank == topo.host_ranks[0]:
        how = (f"measured {host_cost * 1e3:.2f} vs {dpu_cost * 1e3:.2f} ms/sample" if host_cost and dpu_cost
               else batch_source)
        print(f"[dpuoffload] naive: host batch {cfg.batch_size}, DPU batch {dpu_batch} ({how})", flush=True)
    sizes = replica_batch_sizes(cfg, len(topo.host_ranks), len(topo.dpu_ranks), dpu_batch)
    sample_shape = tuple(train[0][0].shape)
    return NaiveFeed(cfg, train, topo.world_rank, sizes, sample_shape)


def naive_backend(cfg: RunConfig, profiles: Sequence[dict[str, Any]]) -> AllReduce:
    """'auto' picks Horovod only if every rank, host and DPU, can import it (they must agree)."""
    if cfg.allreduce is not AllReduce.AUTO:
        return cfg.allreduce
    return AllReduce.HOROVOD if all(p.get("horovod") for p in profiles) else AllReduce.TORCH
