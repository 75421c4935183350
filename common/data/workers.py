"""Several cores augmenting one host rank's batches: worker processes behind a feeder (`--dpu-workers K`).

One core of JPEG decode + crop + flip augments 200-350 images/s; a GPU host rank training resnet50
eats ~4,000. So a DPU rank that feeds a GPU must use several of the DPU's cores for one stream.
The well-kept way to run a data set on K processes is torch's own `DataLoader` with K workers: it
forks them once (`persistent_workers`), hands each a whole batch of indices, and returns the
batches in order. Two things make its batches the ones `--mode none` builds:

- each batch's keys carry their epoch, `(epoch, index)` (`EpochTagged`): a persistent worker keeps
  its own copy of the data set, so an epoch set in the parent would never reach it, and with
  per-sample seeds (`PerSampleSeeded`) the epoch and the index are all a sample's augmentation
  depends on, whichever worker builds it;
- the keys follow the feeder's plan (`PlannedKeys`): from (epoch, start) on, epoch after epoch,
  over the same order `RankLoader` walks (`epoch_order`). The workers therefore start the next
  epoch's batches while the current one is still being trained on: no drain at an epoch edge,
  which a DataLoader looping over epochs has (its iterator ends with the epoch).

A new plan (a jump) starts a new iterator: the workers stay, the batches they had prefetched for
the old plan are dropped (at most `K * prefetch`).
"""

from __future__ import annotations

import contextlib
import os
import traceback
import warnings
from typing import Any, Callable, Iterator, Optional, Sequence, Union, cast

import torch
from torch.utils.data import DataLoader, Dataset

from dpuoffload.common.data.batches import BatchLayout
from dpuoffload.common.data.loaders import RankLoader
from dpuoffload.common.data.sampling import PerSampleSeeded, loader_generator
from dpuoffload.common.data.streams import STOP
from dpuoffload.common.errors import WorkerError


class EpochTagged:
    """Map-style view of a `PerSampleSeeded` data set fetched with (epoch, index) keys."""

    def __init__(self, dataset: PerSampleSeeded) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitems__(self, keys: Sequence[tuple[int, int]]) -> list[Any]:
        self.dataset.set_epoch(keys[0][0])  # one batch never spans two epochs
        return self.dataset.__getitems__([i for _, i in keys])

    def __getitem__(self, key: tuple[int, int]) -> Any:
        return self.__getitems__([key])[0]


class PlannedKeys:
    """The batches of a `RankLoader` as lists of (epoch, index), from a plan's (epoch, start) on,
    epoch after epoch, up to (not including) epoch `end` (STOP: without end)."""

    def __init__(self, loader: RankLoader, keep: Optional[Callable[[int], bool]] = None) -> None:
        """`keep(step)`: the steps to build (`--da-host-share`: the host's, or the DPU rank's)."""
        self.loader, self.keep = loader, keep
        self.epoch, self.start, self.end = 0, 0, STOP

    def plan(self, epoch: int, start: int, end: int = STOP) -> None:
        self.epoch, self.start, self.end = epoch, start, end

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        epoch, start, b = self.epoch, self.start, self.loader.batch_size
        steps = len(self.loader)
        while self.end == STOP or epoch < self.end:
            order = self.loader.order(epoch)
            for step in range(start, steps):
                if self.keep is None or self.keep(step):
                    yield [(epoch, i) for i in order[step * b: (step + 1) * b]]
            epoch, start = epoch + 1, 0


class Packing(EpochTagged):
    """`EpochTagged` whose workers also stack each batch into its message (`BatchLayout.pack_items`,
    header left for the parent): the batch crosses to the parent as one shared-memory tensor, and
    the parent sends that very memory. Handing back the items instead cost one shared-memory
    segment per sample: a worker then built fewer than half the batches the parent alone did.

    Failures come back as values: the user's data set's as a `WorkerError` that names its line
    (torch's own re-raise names only its worker loop), the packer's `ValueError` as itself (the
    parent names the transform)."""

    def __init__(self, dataset: PerSampleSeeded, layout: BatchLayout) -> None:
        super().__init__(dataset)
        self.layout = layout

    def __getitems__(self, keys: Sequence[tuple[int, int]]) -> Union[torch.Tensor, WorkerError, ValueError]:  # type: ignore[override]
        try:
            items = super().__getitems__(keys)
        except Exception as e:  # noqa: BLE001 - any failure of the user's code goes to the parent
            from dpuoffload.common.faults.abort import describe_error

            return WorkerError(describe_error(e), "".join(traceback.format_exception(type(e), e, e.__traceback__)))
        buf = self.layout.buffer()
        try:
            nbytes = self.layout.pack_items(buf, keys[0][0], -1, items)
        except ValueError as e:
            return e
        return torch.from_numpy(buf.raw)[:nbytes]


class WorkerPool:
    """`workers` processes that build one stream's batches in order, each packed into its batch
    message (a uint8 tensor in shared memory; the parent writes the header's step)."""

    def __init__(self, train: PerSampleSeeded, loader: RankLoader, layout: BatchLayout, workers: int,
                 prefetch: int = 2, keep: Optional[Callable[[int], bool]] = None) -> None:
        self.keys = PlannedKeys(loader, keep)
        with _quiet_about_cores():
            # (`Packing` is a map-style set by its methods, `__len__` and `__getitems__`: no torch Dataset subclass)
            self.loader = DataLoader(cast(Dataset, Packing(train, layout)), batch_sampler=self.keys,
                                     num_workers=workers, collate_fn=_as_is, persistent_workers=True,
                                     prefetch_factor=prefetch, generator=loader_generator())

    def batches(self, epoch: int, start: int, end: int = STOP) -> Iterator[Union[torch.Tensor, ValueError]]:
        """The plan's batches, in order; a previous plan's prefetched batches are dropped."""
        self.keys.plan(epoch, start, end)
        with _quiet_about_cores():
            return _raising(iter(self.loader))

    def close(self) -> None:
        """Stop the workers now (not at interpreter exit, where the MPI library may be gone)."""
        it = getattr(self.loader, "_iterator", None)
        if it is not None:
            it._shutdown_workers()
            self.loader._iterator = None


@contextlib.contextmanager
def _quiet_about_cores() -> Iterator[None]:
    """Without torch's warning about more workers than cores, which it repeats for every loader and
    iterator: `cores_note` says it once per job."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="This DataLoader will create")
        yield


def cores_note(workers: int) -> Optional[str]:
    """A note when `--dpu-workers` asks for more workers than this rank has cores: they share them."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if workers <= cores:
        return None
    return (f"--dpu-workers {workers} on a DPU rank with {cores} core(s): the workers share them, so they build "
            f"batches at most {cores}x as fast as one (give the DPU ranks more cores, e.g. dpurun --dpu-cores)")


def _as_is(batch: Any) -> Any:
    return batch


def _raising(batches: Iterator[Any]) -> Iterator[Any]:
    for batch in batches:
        if isinstance(batch, WorkerError):
            raise batch
        yield batch
