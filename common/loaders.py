"""The training data pipeline of one host rank, built identically wherever it runs.

In `--mode none` a host rank iterates its own loader; in `--mode da` the DPU rank that feeds it
builds the very same loader (same `DistributedSampler` replicas/rank/seed/epoch, same batch size,
same per-sample seeds, same collate), so the batches it sends are bit-identical to the ones the
host would have built. Sharing this one function is what guarantees that.
"""

from __future__ import annotations

from torch.utils.data import DataLoader, DistributedSampler

from dpuoffload.common.batches import BatchLayout, layout_for
from dpuoffload.common.config import RunConfig
from dpuoffload.common.errors import ConfigError
from dpuoffload.common.sampling import PerSampleSeeded


class RankLoader:
    """The loader of host rank `rank` of `replicas`; call `set_epoch` before iterating an epoch."""

    def __init__(self, cfg: RunConfig, dataset: PerSampleSeeded, replicas: int, rank: int,
                 collate: bool = True) -> None:
        """`collate=False` yields each batch as its list of (sample, label) items, for a caller that
        stacks them straight into its own buffer (the DPU's send ring: one copy instead of two)."""
        self.dataset = dataset
        self.sampler = DistributedSampler(dataset, num_replicas=replicas, rank=rank, shuffle=True, seed=cfg.seed)
        self.loader = DataLoader(dataset, batch_size=cfg.batch_size, sampler=self.sampler, num_workers=0,
                                 drop_last=cfg.drop_last, collate_fn=None if collate else _items)

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)
        self.dataset.set_epoch(epoch)

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self):
        return iter(self.loader)



def _items(batch: list) -> list:
    return batch


def probe_layout(train: PerSampleSeeded, cfg: RunConfig) -> BatchLayout:
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
