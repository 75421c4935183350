"""Per-sample augmentation seeds: a sample is augmented identically wherever it is augmented.

torchvision transforms draw from torch's global RNG (and user transforms may use `random` or
numpy's global RNG), so the random crop a sample gets would depend on which process built the
batch and in what order. `PerSampleSeeded` runs each `__getitem__` under RNG states derived from
(seed, epoch, sample index) and restores the caller's RNG states afterwards, so training-side
randomness is unaffected by data loading — in every mode, `none` included.
"""

from __future__ import annotations

import contextlib
import random
from typing import Any, Iterator, Sequence, Sized, cast

import numpy as np
import torch
from torch.utils.data import Dataset

from dpuoffload.common.errors import ConfigError, SampleError

_MASK64 = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def sample_seed(seed: int, epoch: int, index: int) -> int:
    """A well-mixed 63-bit seed for one sample of one epoch (pure; same on every rank)."""
    return _splitmix64(_splitmix64(_splitmix64(seed & _MASK64) ^ epoch) ^ index) >> 1


def training_seed(seed: int, rank: int) -> int:
    """The seed of a training rank's own randomness (dropout, stochastic depth: the global RNGs the
    model draws from), from `--seed` and its rank among the training ranks (pure). Separate from
    the samples' seeds (`sample_seed`: epochs are >= 0, this mixes in -1 - rank)."""
    return sample_seed(seed, -1 - rank, 0)


def seed_training(seed: int, rank: int) -> None:
    """Seed torch's (every device's), Python's and numpy's global RNGs for training. Without it
    torch starts from a random seed in each process, so a model with dropout trained twice, or in
    `none` and in `da`, would differ; a resume, a clone or a spare then restores the RNG states
    the checkpoint carried, over this."""
    s = training_seed(seed, rank)
    torch.manual_seed(s)
    random.seed(s)
    np.random.seed(s & 0xFFFFFFFF)


def loader_generator() -> torch.Generator:
    """A `DataLoader`'s own generator. Each iterator a DataLoader starts draws a base seed for its
    workers from its generator, by default the global one that dropout draws from: a host rank that
    loads its own batches (`none`, its validation) would take one more draw per epoch than one fed
    by its DPU rank, and a model with dropout would train differently in `da`. (The base seed is
    unused here: our samples are seeded by index, `PerSampleSeeded`.)"""
    return torch.Generator()


def reseed(s: int) -> None:
    """torch's, Python's and numpy's global RNGs from one sample seed (what a sample is built under)."""
    torch.default_generator.manual_seed(s)
    random.seed(s)
    np.random.seed(s & 0xFFFFFFFF)


@contextlib.contextmanager
def callers_rng() -> Iterator[None]:
    """Leave torch's, Python's and numpy's global RNG states as the caller had them: data loading
    reseeds them per sample and must not change training-side randomness."""
    gen = torch.default_generator
    saved = gen.get_state(), random.getstate(), np.random.get_state()
    try:
        yield
    finally:
        gen.set_state(saved[0])
        random.setstate(saved[1])
        np.random.set_state(saved[2])


class PerSampleSeeded(Dataset):
    """Wrap a map-style dataset so item i of epoch e is produced under `sample_seed(seed, e, i)`.

    `DataLoader` fetches whole batches through `__getitems__`, so the caller's RNG states are saved
    and restored once per batch (numpy's state copy alone costs ~0.1 ms), and each sample costs only
    three cheap re-seeds (~15 us in all; `torch.manual_seed` is avoided, it costs ~0.25 ms here).
    """

    def __init__(self, dataset: Dataset, seed: int, skip_corrupt: bool = False) -> None:
        """`skip_corrupt` (`--skip-corrupt`): a sample that fails to load is left out of its batch
        (`__getitems__`), with a line that names it; its loader counts and bounds them."""
        self.dataset = dataset
        self.seed = seed
        self.epoch = 0
        self.skip_corrupt = skip_corrupt
        self._bind()

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        self._bind()

    def _bind(self) -> None:
        """A data set that builds samples while it reads ahead (a stream over a user's pipeline,
        `common.data.shards`) seeds each one itself: it is told the seed and the epoch."""
        bind = getattr(self.dataset, "bind_sample_seeds", None)
        if bind is not None:
            bind(self.seed, self.epoch)

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, index: int) -> Any:
        """Sample `index` of the set epoch, never left out (`--skip-corrupt` acts on whole batches)."""
        with callers_rng():
            reseed(sample_seed(self.seed, self.epoch, int(index)))
            return self._load(int(index))

    def _load(self, index: int) -> Any:
        """The data set's sample `index` (under the seeds already set); a failure named as a `SampleError`."""
        try:
            return self.dataset[index]
        except (ConfigError, IndexError):
            raise
        except Exception as e:  # noqa: BLE001 - the user's data set: say which sample
            raise SampleError(f"training {describe_sample(self.dataset, index)} could not be loaded: "
                              f"{type(e).__name__}: {e}") from e

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        with callers_rng():
            out = []
            for index in indices:
                reseed(sample_seed(self.seed, self.epoch, int(index)))
                try:
                    out.append(self._load(int(index)))
                except SampleError as e:
                    if not self.skip_corrupt:
                        raise
                    print(f"[dpuoffload] --skip-corrupt: left out of its batch in epoch {self.epoch}: {e}", flush=True)
            if not out and indices:
                raise SampleError(f"--skip-corrupt: every sample of a batch failed to load (samples "
                                  f"{', '.join(str(int(i)) for i in indices)} of epoch {self.epoch}); a batch cannot "
                                  "be left empty: fix or remove the files")
            return out


def describe_sample(dataset: Any, index: int) -> str:
    """'sample 1234 (/data/train/n01/x.JPEG)': the index, and the file where the data set says it
    (ImageFolder's `samples`, through `Subset`s)."""
    ds, i = dataset, index
    for _ in range(8):
        if hasattr(ds, "indices") and hasattr(ds, "dataset"):  # a Subset: its own index into the set under it
            ds, i = ds.dataset, int(ds.indices[i])
            continue
        files = getattr(ds, "samples", None)
        if isinstance(files, list) and 0 <= i < len(files) and isinstance(files[i], (tuple, list)):
            return f"sample {index} ({files[i][0]})"
        break
    return f"sample {index}"


def collated(dataset: Dataset, start: int, batch_size: int) -> Any:
    """`batch_size` samples of `dataset` from index `start` on, going round its end, collated as a
    loader does (the fixed batches the profiles time and build; fewer where the set is smaller)."""
    from torch.utils.data import default_collate

    n = len(cast(Sized, dataset))
    fetch = dataset.__getitems__  # type: ignore[attr-defined]  # (optional in torch's Dataset: not in its stubs)
    return default_collate(fetch([(start + i) % n for i in range(min(batch_size, n))]))


def seeded(dataset: Dataset, seed: int = 0) -> PerSampleSeeded:
    """`dataset` with sample i of epoch e augmented under its own seed (public API: `dpuoffload.seeded`).

    What `job.loader` iterates: `DataLoader(seeded(ds, seed), batch_size, sampler=DistributedSampler(ds,
    replicas, rank, shuffle=True, seed=seed))`, with `set_epoch(e)` called on both the sampler and the
    seeded set before epoch e, yields the very batches `job.loader(ds, batch_size, seed=seed)` does.
    """
    return PerSampleSeeded(dataset, seed)
