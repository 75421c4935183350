"""Per-sample augmentation seeds: same sample, epoch and seed -> same augmentation, anywhere."""

import random

import torch
from torch.utils.data import Dataset

from dpuoffload.common.data.sampling import PerSampleSeeded, sample_seed


class RandomCrops(Dataset):
    def __len__(self):
        return 10

    def __getitem__(self, i):
        return torch.rand(3) + i, random.random()


def test_sample_seed_is_pure_and_distinct():
    assert sample_seed(0, 1, 2) == sample_seed(0, 1, 2)
    seeds = {sample_seed(s, e, i) for s in range(3) for e in range(3) for i in range(50)}
    assert len(seeds) == 450 and all(0 <= s < 2**63 for s in seeds)


def test_same_item_same_randomness_regardless_of_order_and_caller_rng():
    ds = PerSampleSeeded(RandomCrops(), seed=3)
    ds.set_epoch(2)
    forward = [ds[i] for i in range(10)]
    torch.manual_seed(123)
    random.seed(9)
    backward = [ds[i] for i in reversed(range(10))][::-1]
    for (a, pa), (b, pb) in zip(forward, backward):
        assert torch.equal(a, b) and pa == pb
    ds.set_epoch(3)
    assert not torch.equal(ds[0][0], forward[0][0])


def test_caller_rng_state_is_untouched():
    ds = PerSampleSeeded(RandomCrops(), seed=0)
    torch.manual_seed(7)
    random.seed(7)
    expected = torch.rand(4), random.random()
    torch.manual_seed(7)
    random.seed(7)
    _ = ds[3]
    assert torch.equal(torch.rand(4), expected[0]) and random.random() == expected[1]


def test_batch_fetch_equals_item_fetch():
    ds = PerSampleSeeded(RandomCrops(), seed=1)
    batch = ds.__getitems__([4, 1, 7])
    for (a, pa), i in zip(batch, [4, 1, 7]):
        b, pb = ds[i]
        assert torch.equal(a, b) and pa == pb
