"""The host program's extension points: where a variant plugs in without replacing module attributes.

The benchmarks run the project's own host program with one part swapped (a multi-worker
DataLoader as the feed, `torch.save` checkpoints on the host ranks, clones through a file or
point-to-point): they pass a `HostExtensions` to `host.main.main(argv, extensions=...)`. Each field
is a small Protocol whose docstring says who calls it and when; the defaults are the real program.

Order of calls on one host program rank (host ranks in app context 0, clone ranks in 2):

1. start-up (`prepare`, every host and clone rank, before any host-only communication):
   `feed_factory` once. A clone rank builds it with the clone group's config.
2. host ranks only, after the gradient sync and validation are built: `hooks_factory` once, from
   inside the `Trainer` constructor (the hooks need its optimizer and schedule), before a resume
   restores the state; the trainer then calls the hooks as `common.train.loop.StateHooks` says.
3. clone ranks only: `adopt` once, after their `Trainer` is built, before it trains. Clone ranks
   never hand state off (the clone group's config has no checkpoints or clone step), so they do
   not call `hooks_factory`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Iterator, Optional, Protocol

from dpuoffload.common.config import RunConfig
from dpuoffload.common.data.datasets import build_train_set
from dpuoffload.common.data.feeds import Batch, Feed
from dpuoffload.common.data.loaders import Sampling
from dpuoffload.common.data.sampling import PerSampleSeeded
from dpuoffload.common.data.wire import HostSteps
from dpuoffload.common.plan.offload import OffloadPlan
from dpuoffload.common.runtime.roles import Topology
from dpuoffload.common.train.loop import StateHooks, Trainer
from dpuoffload.host.checkpoint import StateHandoff
from dpuoffload.host.clone import adopt
from dpuoffload.host.library import current
from dpuoffload.host.loader import DpuLoader, local_loader


class FeedFactory(Protocol):
    """Builds the rank's training batches, once per host and clone rank at start-up.

    Called with the rank's config (the clone group's on clone ranks), its topology, the training
    set under per-sample seeds and the offload plan; no communication may happen in it (start-up
    errors must stay collective). `--mode naive` replaces the feed later, once the DPU batch size
    is agreed.
    """

    def __call__(self, cfg: RunConfig, topo: Topology, train: PerSampleSeeded, plan: OffloadPlan) -> Feed: ...


class HooksFactory(Protocol):
    """Builds the state hooks of a host rank's trainer, or None for no hand-offs.

    Called once per host rank (never on clone ranks or DPU ranks) at the end of the `Trainer`
    constructor: model, optimizer, scheduler and feed exist, the state is not restored yet.
    """

    def __call__(self, cfg: RunConfig, topo: Topology, trainer: Trainer) -> Optional[StateHooks]: ...


class CloneAdopter(Protocol):
    """Gives a clone rank's trainer the original group's state; returns the `clone_start` record.

    Called once per clone rank after its `Trainer` is built, with the original and the clone
    group's configs; it stands by, receives, restores and calls `trainer.resume_at`. Collective
    over the clone ranks (the default all-gathers the slices).
    """

    def __call__(self, trainer: Trainer, topo: Topology, original: RunConfig, clone: RunConfig) -> dict[str, Any]: ...


class LoaderFeed:
    """The trainer's batches from the public API's loader: built here, or fed by a DPU rank (da)."""

    def __init__(self, loader: DpuLoader) -> None:
        self.loader = loader

    def steps(self) -> int:
        return len(self.loader)

    def global_samples(self, step: int) -> Optional[int]:
        return None

    def skipped(self, epoch: int) -> int:
        return self.loader.skipped_in(epoch)

    def epoch(self, epoch: int, start: int = 0, stop: Optional[int] = None) -> Iterator[Batch]:
        return self.loader.epoch(epoch, start, stop)

    def defer_float_steps(self) -> Optional[HostSteps]:
        return self.loader.defer_float_steps()


def build_feed(cfg: RunConfig, topo: Topology, train: PerSampleSeeded, plan: OffloadPlan) -> Feed:
    """The public API's loader: local (`--mode none`/`mv`, and clone ranks, which have no job), or
    `job.loader`, batches from this rank's DPU rank, which builds the training set from the run's
    flags rather than receiving it."""
    if not cfg.mode.augments_on_dpu:
        return LoaderFeed(local_loader(train.dataset, Sampling.of(cfg, len(topo.host_ranks), topo.side_rank)))
    loader = current().loader(train.dataset, cfg.batch_size, seed=cfg.seed, drop_last=cfg.drop_last, copy=False,
                              epochs=cfg.epochs, build_on_dpu=functools.partial(build_train_set, cfg))
    return LoaderFeed(loader)


def build_hooks(cfg: RunConfig, topo: Topology, trainer: Trainer,
                handoff: type[StateHandoff] = StateHandoff) -> Optional[StateHooks]:
    """Hand the state to the DPU keepers when checkpoints or a clone are asked for; else no hooks.
    `handoff`: the class that does it (the clone benchmark's baselines subclass `StateHandoff`)."""
    if not cfg.hands_state_off:
        return None
    return handoff.for_trainer(cfg, topo, trainer)


@dataclass(frozen=True)
class HostExtensions:
    """What a variant of the host program replaces; every default is the real program's part."""

    feed_factory: FeedFactory = build_feed
    hooks_factory: HooksFactory = build_hooks
    adopt: CloneAdopter = adopt
