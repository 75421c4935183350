"""The training data pipeline of one host rank, built identically wherever it runs.

In `--mode none` a host rank iterates its own loader; in `--mode da` the DPU rank that feeds it
builds the very same loader (same `DistributedSampler` replicas/rank/seed/epoch, same batch size,
same per-sample seeds, same collate), so the batches it sends are bit-identical to the ones the
host would have built. Sharing this one function is what guarantees that.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional, cast

from torch.utils.data import DataLoader, Dataset, DistributedSampler

from dpuoffload.common.config import RunConfig
from dpuoffload.common.data.batches import BatchLayout, layout_for
from dpuoffload.common.data.sampling import PerSampleSeeded, loader_generator
from dpuoffload.common.data.shards import sharded_of
from dpuoffload.common.errors import ConfigError


@dataclass(frozen=True)
class Sampling:
    """How one host rank walks the data set: what `RankLoader` needs besides the data set itself.

    The same value travels to the DPU rank that feeds the host (`common.data.streams`), so both
    build the same sampler; `seed` is the sampler's shuffle seed and the per-sample augmentation
    seed (`PerSampleSeeded`) alike.
    """

    batch_size: int
    replicas: int = 1
    rank: int = 0
    seed: int = 0
    shuffle: bool = True
    drop_last: bool = False
    skip_corrupt: int = 0  # --skip-corrupt: samples that fail to load, left out of their batch (per epoch, at most)

    @classmethod
    def of(cls, cfg: RunConfig, replicas: int, rank: int) -> "Sampling":
        """The built-in trainer's sampling (always shuffled) from its flags."""
        return cls(cfg.batch_size, replicas, rank, cfg.seed, True, cfg.drop_last, cfg.skip_corrupt)

    def seeded(self, dataset: Any) -> PerSampleSeeded:
        """`dataset` under per-sample seeds as this loader builds it (`--skip-corrupt`: leaving out
        samples that fail to load)."""
        return PerSampleSeeded(dataset, self.seed, skip_corrupt=self.skip_corrupt > 0)

    def batch_sizes(self, dataset: Any) -> list[int]:
        """Every step's batch size on this rank, as built with no sample left out."""
        per_rank, b = samples_per_rank(dataset, self), self.batch_size
        return [min(b, per_rank - s * b) for s in range(steps_for(dataset, self))]


class RankLoader:
    """The loader of host rank `rank` of `replicas`; call `set_epoch` before iterating an epoch."""

    def __init__(self, cfg: "RunConfig | Sampling", dataset: PerSampleSeeded, replicas: Optional[int] = None,
                 rank: Optional[int] = None, collate: bool = True) -> None:
        """`cfg`: the run's flags (with `replicas` and `rank`) or a `Sampling`. `collate=False` yields
        each batch as its list of (sample, label) items, for a caller that stacks them straight
        into its own buffer (the DPU's send ring: one copy instead of two)."""
        s = cfg if isinstance(cfg, Sampling) else Sampling.of(cfg, int(replicas or 1), int(rank or 0))
        self.sampling = s
        self.dataset, self.batch_size, self.drop_last = dataset, s.batch_size, s.drop_last
        self.epoch = 0
        self.collate = None if collate else _items
        self._order: tuple[int, list[int]] = (-1, [])  # (epoch, its order): a stream's costs a plan

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        self.dataset.set_epoch(epoch)

    def order(self, epoch: int) -> list[int]:
        """This rank's sample ids of `epoch`, in training order (`epoch_order`)."""
        if self._order[0] != epoch:
            self._order = (epoch, epoch_order(self.dataset, self.sampling, epoch))
        return self._order[1]

    def __len__(self) -> int:
        return steps_for(self.dataset, self.sampling)

    def __iter__(self) -> Iterator:
        return self.batches()

    def batches(self, start: int = 0, stop: Optional[int] = None,
                keep: Optional[Callable[[int], bool]] = None) -> Iterator:
        """Batches [start, stop) of the epoch set by `set_epoch` (only the steps `keep` accepts);
        skipped batches are never loaded (a resumed epoch starts where the checkpoint was taken at
        the cost of one permutation)."""
        order = self.order(self.epoch)
        b = self.batch_size
        chunks = [order[i: i + b] for i in range(0, len(self) * b, b)]
        steps = range(len(chunks))[start:stop]
        chosen = [chunks[s] for s in steps if keep is None or keep(s)]
        loader = DataLoader(self.dataset, batch_sampler=chosen, num_workers=0, collate_fn=self.collate,
                            generator=loader_generator())
        return iter(loader)


def epoch_order(dataset: Any, s: Sampling, epoch: int, rank: Optional[int] = None) -> list[int]:
    """Host rank `rank`'s (default: `s.rank`'s) sample ids of `epoch` in training order: the
    `DistributedSampler`'s for a map-style set, the `ShardPlan`'s for a stream (`common.data.shards`).
    The one definition of "the batches the host would build" that every builder walks."""
    rank = s.rank if rank is None else rank
    stream = sharded_of(dataset)
    if stream is not None:
        return stream.plan(s.replicas, s.seed, s.shuffle).order(epoch, rank)
    indices = cast(Dataset, range(len(dataset)))  # (a range stands in for the set: the sampler reads its length only)
    sampler: DistributedSampler[int] = DistributedSampler(indices, num_replicas=s.replicas, rank=rank,
                                                          shuffle=s.shuffle, seed=s.seed)
    sampler.set_epoch(epoch)
    return list(sampler)


def samples_per_rank(dataset: Any, s: Sampling) -> int:
    """Samples each host rank's epoch walks: `DistributedSampler`'s ceil(n / replicas), or a stream's plan's."""
    stream = sharded_of(dataset)
    if stream is not None:
        return stream.plan(s.replicas, s.seed, s.shuffle).per_rank
    return -(-len(dataset) // s.replicas)


def steps_for(dataset: Any, s: Sampling) -> int:
    """Batches per epoch of every host rank, for a map-style set or a stream."""
    per_rank = samples_per_rank(dataset, s)
    return per_rank // s.batch_size if s.drop_last else -(-per_rank // s.batch_size)


def steps_per_epoch(n: int, replicas: int, batch_size: int, drop_last: bool) -> int:
    """Batches per epoch of every host rank (`DistributedSampler` pads each rank to ceil(n / replicas))."""
    per_rank = -(-n // replicas)
    return per_rank // batch_size if drop_last else -(-per_rank // batch_size)


def _items(batch: list) -> list:
    return batch


def probe_layout(train: PerSampleSeeded, cfg: "RunConfig | Sampling") -> BatchLayout:
    """The batch message layout, from sample 0 of epoch 0 (host and DPU compute the same one)."""
    saved = train.epoch
    train.set_epoch(0)
    try:
        sample = train[0][0]
    finally:
        train.set_epoch(saved)
    try:
        return layout_for(sample, cfg.batch_size)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"--mode da cannot send this data set's samples: {e}") from None


def transform_name(dataset: Any) -> str:
    """The user's transform, for error messages (looks through Subset wrappers)."""
    while not hasattr(dataset, "transform") and hasattr(dataset, "dataset"):
        dataset = dataset.dataset
    return repr(getattr(dataset, "transform", None)).replace("\n", " ")


def unfit_samples(dataset: Any, error: ValueError) -> ConfigError:
    """A batch whose samples do not fit the layout of sample 0 (`BatchLayout.pack_items`), named
    the same wherever it was built (a DPU rank, its workers, or the host's own share)."""
    return ConfigError(f"--mode da needs every training sample to have the same shape and dtype, but the "
                       f"training transform {transform_name(dataset)} does not ({error}); end it with a "
                       "fixed-size step such as RandomResizedCrop(size) or Resize(size) + CenterCrop(size)")
