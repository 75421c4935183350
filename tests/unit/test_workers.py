"""`--dpu-workers K`: worker processes building one stream's batches (no MPI: the pool alone; the
real job is tests/jobs/test_api_jobs.py's walk, with fan-out and 2 workers per stream).

(The tests of this feature that start processes: tests/jobs/test_workers.py.)
"""

from __future__ import annotations

import random

import pytest
import torch
from torch.utils.data import Dataset, DistributedSampler

from dpuoffload.common.config import RunConfig, parse_run_config
from dpuoffload.common.data.loaders import RankLoader, Sampling
from dpuoffload.common.data.sampling import PerSampleSeeded
from dpuoffload.common.data.streams import StepSplit
from dpuoffload.common.data.workers import PlannedKeys, cores_note
from dpuoffload.common.errors import ConfigError


class Jitter(Dataset):
    """Random augmentation from torch's and Python's global RNGs (what per-sample seeds must pin)."""

    def __init__(self, n: int, bad: int = -1, shape: tuple[int, ...] = (3, 4, 4)) -> None:
        self.n, self.bad, self.shape = n, bad, shape

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        if i == self.bad:
            raise ValueError(f"sample {i} is corrupt")
        shape = (3, 5, 5) if self.shape == "ragged" and i % 2 else (3, 4, 4)
        return torch.full(shape, float(i)) + torch.rand(shape) + random.random(), i % 3


def _loader(ds: Dataset, batch: int = 4, replicas: int = 2, rank: int = 1) -> tuple[PerSampleSeeded, RankLoader]:
    train = PerSampleSeeded(ds, seed=7)
    return train, RankLoader(Sampling(batch, replicas, rank, seed=7), train, collate=False)


def test_planned_keys_run_across_epochs_in_the_loaders_order():
    _, loader = _loader(Jitter(21))
    keys = PlannedKeys(loader)
    keys.plan(2, 1, 4)
    got = list(keys)
    want = []
    for e, start in ((2, 1), (3, 0)):  # (a map-style set's order: torch's own DistributedSampler)
        s = loader.sampling
        sampler = DistributedSampler(range(21), num_replicas=s.replicas, rank=s.rank, shuffle=s.shuffle, seed=s.seed)
        sampler.set_epoch(e)
        order = list(sampler)
        want += [[(e, i) for i in order[s * 4:(s + 1) * 4]] for s in range(start, len(loader))]
    assert got == want and len(loader) == 3


def test_cores_note_and_flag_checks(monkeypatch):
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1})
    assert cores_note(2) is None
    assert cores_note(4).startswith("--dpu-workers 4 on a DPU rank with 2 core(s): the workers share them")
    assert RunConfig(mode="hybrid", dpu_workers=3).dpu_workers == 3
    with pytest.raises(ConfigError, match="--dpu-workers only applies where DPU ranks augment"):
        RunConfig(mode="mv", dpu_workers=2)
    with pytest.raises(ConfigError, match="--dpu-workers must be >= 0, got -1"):
        RunConfig(mode="da", dpu_workers=-1)


# ------------------------------------------------------------------------ --da-host-share
def test_step_split_spreads_the_hosts_steps_and_finds_each_sides_next():
    split = StepSplit(0.25, 8)
    assert [s for s in range(8) if split.host(s)] == [3, 7]
    assert (split.owned(True), split.owned(False)) == (2, 6)
    assert split.next_of(True, 0, 4) == (0, 7) and split.next_of(True, 0, 8) == (1, 3)
    assert split.next_of(False, 0, 7) == (1, 0) and split.next_of(False, 2, 3) == (2, 4)
    assert StepSplit(0.0, 5).owned(True) == 0 and StepSplit(1.0, 5).owned(False) == 0
    third = StepSplit(0.3, 7)
    assert [s for s in range(7) if third.host(s)] == [3, 6] and not third.host(0)


def test_host_share_flag_checks():
    assert RunConfig(mode="da", da_host_share=1.0, da_host_workers=0).da_host_share == 1.0
    with pytest.raises(ConfigError, match=r"--da-host-share must be in \[0, 1\]"):
        RunConfig(mode="da", da_host_share=1.5)
    with pytest.raises(ConfigError, match="--da-host-share only applies where DPU ranks augment"):
        RunConfig(mode="none", da_host_share=0.5)
    with pytest.raises(ConfigError, match="--da-host-workers must be >= 0"):
        RunConfig(mode="da", da_host_workers=-2)
    assert parse_run_config(["--mode", "hybrid", "--da-host-share", "auto"]).da_host_share == "auto"
    with pytest.raises(ConfigError, match=r"--da-host-share must be in \[0, 1\] \(.*\) or 'auto', got 'half'"):
        RunConfig(mode="da", da_host_share="half")
    with pytest.raises(ConfigError, match="--da-host-share auto measures the built-in trainer's training set"):
        RunConfig(mode="da", da_host_share="auto", script="train.py")
