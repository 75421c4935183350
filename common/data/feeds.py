"""Where a training replica's batches come from: the `Feed` protocol and the local loader feed.

Host ranks feed from their own loader (`LocalFeed`, `--mode none`/`mv`) or from a DPU rank
(`host.extensions.LoaderFeed`: the public API's loader, `da`/`hybrid`); in `--mode naive` every
replica, host or DPU, feeds from its own share of the epoch (`common.naive.NaiveFeed`).
"""

from __future__ import annotations

from typing import Iterator, Optional, Protocol

import torch

from dpuoffload.common.data.loaders import RankLoader

Batch = tuple[torch.Tensor, torch.Tensor]


class Feed(Protocol):
    def steps(self) -> int:
        """Batches per epoch (the same on every host rank)."""

    def epoch(self, epoch: int, start: int = 0, stop: Optional[int] = None) -> Iterator[Batch]:
        """Yield batches [start, stop) of this epoch in order (a resumed or stopped run trains part)."""

    def global_samples(self, step: int) -> Optional[int]:
        """Samples in step `step` summed over all replicas when they differ per replica (gradients
        are then weighted by n_i / total and summed), or None: equal batches, plain average."""


class LocalFeed:
    """`--mode none`: the host rank loads and augments its own batches."""

    def __init__(self, loader: RankLoader) -> None:
        self.loader = loader

    def steps(self) -> int:
        return len(self.loader)

    def global_samples(self, step: int) -> Optional[int]:
        return None

    def epoch(self, epoch: int, start: int = 0, stop: Optional[int] = None) -> Iterator[Batch]:
        self.loader.set_epoch(epoch)
        yield from self.loader.batches(start, stop)
