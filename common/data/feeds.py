"""Where a training replica's batches come from: the `Feed` protocol.

Host ranks feed from the public API's loader (`host.extensions.LoaderFeed` over `job.loader`:
built here in `--mode none`/`mv`, sent by a DPU rank in `da`/`hybrid`); in `--mode naive` every
replica, host or DPU, feeds from its own share of the epoch (`common.naive.NaiveFeed`).
"""

from __future__ import annotations

from typing import Iterator, Optional, Protocol

import torch

Batch = tuple[torch.Tensor, torch.Tensor]


class Feed(Protocol):
    def steps(self) -> int:
        """Batches per epoch (the same on every host rank)."""

    def epoch(self, epoch: int, start: int = 0, stop: Optional[int] = None) -> Iterator[Batch]:
        """Yield batches [start, stop) of this epoch in order (a resumed or stopped run trains part)."""

    def skipped(self, epoch: int) -> int:
        """Samples of `epoch` this replica's batches left out (`--skip-corrupt`; 0 without it)."""

    def global_samples(self, step: int) -> Optional[int]:
        """Samples in step `step` summed over all replicas when they differ per replica (gradients
        are then weighted by n_i / total and summed), or None: equal batches, plain average."""

    # Optional (the trainer asks with getattr): `defer_float_steps() -> Optional[Callable]`, the uint8
    # wire's float steps handed to a GPU host rank's trainer (`host.loader.DpuLoader.defer_float_steps`).
