"""Streams of shards (no processes): the split over host ranks, the shuffle, the reader, tar shards, errors.

(The tests of this feature that start processes: tests/jobs/test_shards.py.)
"""

from __future__ import annotations

import io
import random

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import IterableDataset

from dpuoffload.common.data.loaders import RankLoader, Sampling, epoch_order
from dpuoffload.common.data.sampling import PerSampleSeeded
from dpuoffload.common.data.shards import (
    ShardedSet,
    ShardError,
    ShardPlan,
    as_stream,
    buffered_shuffle,
)
from dpuoffload.common.data.tarshards import TarIndexed, count_records, iter_records, webdataset
from dpuoffload.common.data.workers import PlannedKeys
from dpuoffload.common.errors import ConfigError
from dpuoffload.launch.make_data import _tar

SIZES = (40, 40, 40, 40, 40, 17, 33, 5)  # uneven, as real shard sets end


# ---------------------------------------------------------------------------------------- the plan
@pytest.mark.parametrize("replicas", [1, 2, 3])
def test_every_sample_is_in_exactly_one_ranks_stream_and_epochs_are_equal(replicas):
    plan = ShardPlan(SIZES, replicas, seed=7, buffer=16)
    for epoch in (0, 1):
        streams = [plan.stream(epoch, r) for r in range(replicas)]
        assert sorted(i for s in streams for i in s) == list(range(sum(SIZES)))
        orders = [plan.order(epoch, r) for r in range(replicas)]
        assert {len(o) for o in orders} == {plan.per_rank} == {-(-sum(SIZES) // replicas)}
        loads = [len(s) for s in streams]
        b = plan.balance(epoch)
        assert b == {"padded": sum(max(0, plan.per_rank - n) for n in loads),
                     "dropped": sum(max(0, n - plan.per_rank) for n in loads)}
        for s, o in zip(streams, orders):  # cut at its end, or padded with its own first samples
            assert o == (s + s)[:plan.per_rank]


def test_the_order_depends_on_seed_and_epoch_only_and_each_changes_it():
    a = ShardPlan(SIZES, 2, seed=7, buffer=16)
    assert a.order(3, 1) == ShardPlan(SIZES, 2, seed=7, buffer=16).order(3, 1)
    assert a.order(3, 1) != a.order(4, 1)
    assert a.order(3, 1) != ShardPlan(SIZES, 2, seed=8, buffer=16).order(3, 1)
    unshuffled = list(range(40)) + list(range(80, 120)) + list(range(160, 200)) + list(range(250, 255))
    assert ShardPlan(SIZES, 2, 7, shuffle=False).stream(0, 0) == unshuffled  # greedy: shards 0, 2, 4, 7


def test_shards_are_balanced_greedily_over_host_ranks():
    plan = ShardPlan(SIZES, 3, seed=1)
    for epoch in range(5):
        loads = [sum(SIZES[s] for s in shards) for shards in plan.assignment(epoch)]
        assert max(loads) - min(loads) <= max(SIZES)


def test_fewer_shards_than_host_ranks_is_refused_with_the_fix():
    with pytest.raises(ConfigError, match=r"a stream of 2 shard\(s\) cannot feed 3 host ranks.*at least as many"):
        ShardPlan((10, 10), 3, 0)


def test_the_shuffle_buffer_holds_at_most_its_size_and_emits_a_permutation():
    held = []

    def items():
        for i in range(500):
            held.append(i)
            yield i

    out = []
    for x in buffered_shuffle(items(), 32, random.Random(0)):
        out.append(x)
        assert len(held) - len(out) <= 32
    assert sorted(out) == list(range(500)) and out != list(range(500))
    assert max(abs(p - x) for p, x in enumerate(out[:400])) < 400  # local, not global


# ---------------------------------------------------------------------------------- the data set
class Counting:
    """A user's stream with the shard protocol: records are (shard, offset); opens are counted."""

    def __init__(self, sizes=SIZES):
        self.shards = [f"s{k}" for k in range(len(sizes))]
        self.lengths = dict(zip(self.shards, sizes))
        self.opens = 0
        self.transform = None

    def shard_length(self, shard):
        return self.lengths[shard]

    def open_shard(self, shard):
        self.opens += 1
        return ((shard, o) for o in range(self.lengths[shard]))

    def sample(self, record):
        shard, o = record
        return torch.rand(3) + o, int(shard[1:])


def test_a_rank_walking_its_epoch_opens_each_of_its_shards_once():
    data = ShardedSet(Counting(), shuffle_buffer=16)
    s = Sampling(8, replicas=2, rank=1, seed=5)
    loader = RankLoader(s, PerSampleSeeded(data, s.seed))
    loader.set_epoch(2)
    count = sum(len(ys) for _, ys in loader.batches())
    plan = data.plan(2, 5)
    assert count == plan.per_rank
    stream, order = plan.stream(2, 1), plan.order(2, 1)
    repeated = {data.locate(i)[0] for i in order[len(stream):]}  # padding reads its shards' starts again
    assert data.reader.opened == len(plan.assignment(2)[1]) + len(repeated)


def test_stream_batches_are_the_same_in_process_in_workers_keys_and_resumed_midway():
    data = ShardedSet(Counting(), shuffle_buffer=16)
    s = Sampling(8, replicas=2, rank=0, seed=5)
    loader = RankLoader(s, PerSampleSeeded(data, s.seed))
    loader.set_epoch(1)
    whole = list(loader.batches())
    keys = PlannedKeys(loader)
    keys.plan(1, 0, 2)
    assert [[i for _, i in k] for k in keys] == [epoch_order(data, s, 1)[k * 8:(k + 1) * 8] for k in range(len(loader))]
    fresh = RankLoader(s, PerSampleSeeded(ShardedSet(Counting(), shuffle_buffer=16), s.seed))
    fresh.set_epoch(1)
    resumed = list(fresh.batches(start=5))
    for (x, y), (x2, y2) in zip(whole[5:], resumed):
        assert torch.equal(x, x2) and torch.equal(y, y2)


def test_a_stream_without_the_protocol_is_refused_naming_what_it_lacks():
    class Plain(IterableDataset):
        def __iter__(self):
            yield from range(3)

    with pytest.raises(ConfigError, match=r"Plain is a stream without the shard protocol \(missing: shards, "
                                          r"open_shard, sample\)"):
        as_stream(Plain())


# --------------------------------------------------------------------------------------- tar shards
def jpeg(value: int, side: int = 8) -> bytes:
    """A small JPEG: a gradient from `value`, so crops and flips change it."""
    ramp = (value + np.arange(side * side * 3).reshape(side, side, 3)) % 256
    buf = io.BytesIO()
    Image.fromarray(ramp.astype(np.uint8)).save(buf, format="JPEG")
    return buf.getvalue()


@pytest.fixture
def shards(tmp_path):
    for s, n in enumerate((5, 3, 4)):
        members = [(f"{s}{k:03d}", jpeg(10 * k + s), k % 3) for k in range(n)]
        (tmp_path / f"train-{s:06d}.tar").write_bytes(_tar(members))
    return tmp_path


def test_tar_shards_read_as_records_counted_from_headers(shards):
    assert [count_records(str(shards / f"train-{s:06d}.tar")) for s in range(3)] == [5, 3, 4]
    rec = next(iter_records(str(shards / "train-000001.tar")))
    assert rec["__key__"] == "1000" and rec["cls"] == b"0" and rec["jpg"][:2] == b"\xff\xd8"
    data = webdataset(str(shards / "train-{000000..000002}.tar"))
    assert data.sizes == (5, 3, 4) and len(data) == 12
    image, label = data[6]  # shard 1, record 1
    assert label == 1 and abs(int(np.asarray(image)[0, 0, 0]) - 11) <= 3
    val = TarIndexed(str(shards / "train-{000000..000002}.tar"))
    assert len(val) == 12 and val.labels() == [0, 1, 2, 0, 1, 0, 1, 2, 0, 1, 2, 0]


def test_a_missing_shard_is_named_at_start_up(shards):
    with pytest.raises(ConfigError, match=r"shard .*train-000003.tar does not exist .*pattern"):
        webdataset(str(shards / "train-{000000..000003}.tar"))


def test_a_truncated_shard_is_named_with_the_record_where_it_broke(shards):
    path = shards / "train-000002.tar"
    path.write_bytes(path.read_bytes()[:3000])
    with pytest.raises(ShardError, match=r"shard .*train-000002.tar"):
        webdataset(str(shards / "train-{000000..000002}.tar"))


def test_a_corrupt_image_is_named_with_its_shard_and_record(shards):
    members = [(f"9{k:03d}", jpeg(k) if k != 2 else b"\xff\xd8 not a jpeg", k) for k in range(4)]
    (shards / "train-000001.tar").write_bytes(_tar(members))
    data = webdataset(str(shards / "train-{000000..000002}.tar"))
    with pytest.raises(ConfigError, match=r"sample 7 \(record 2 of shard .*train-000001.tar\) could not be built: "
                                          r"UnidentifiedImageError"):
        data[7]


def test_a_truncated_jpeg_in_an_imagefolder_is_named_with_its_index_and_file(tmp_path):
    from torchvision.datasets import ImageFolder

    from dpuoffload.common.errors import SampleError
    from dpuoffload.common.faults.abort import describe_error

    for k in range(3):
        (tmp_path / "c").mkdir(exist_ok=True)
        (tmp_path / "c" / f"{k}.jpg").write_bytes(jpeg(k, side=32)[: None if k != 1 else 200])
    train = PerSampleSeeded(torch.utils.data.Subset(ImageFolder(str(tmp_path)), [2, 1, 0]), seed=0)
    with pytest.raises(SampleError) as info:
        train[1]
    line = describe_error(info.value)
    assert line.startswith(f"SampleError: training sample 1 ({tmp_path}/c/1.jpg) could not be loaded: OSError: "), line
    assert "truncated" in line.lower()
    assert "(at " in line and "PIL" in line  # where it was raised: PIL's loader


class Augmenting(Counting):
    """A source whose records are finished samples, drawn as they are read (a user's pipeline)."""

    seeded_records = True

    def open_shard(self, shard):
        self.opens += 1
        return ((torch.rand(2), o) for o in range(self.lengths[shard]))

    def sample(self, record):
        return record


def test_records_built_as_they_are_read_get_their_own_seeds_whatever_read_them():
    def build(order):
        data = PerSampleSeeded(ShardedSet(Augmenting(), shuffle_buffer=16), seed=3)
        data.set_epoch(1)
        return {i: data[i][0] for i in order}

    straight, backwards = build(range(0, 60)), build(range(59, -1, -1))
    assert all(torch.equal(straight[i], backwards[i]) for i in range(60))
    assert not torch.equal(straight[3], straight[4])
    other_epoch = PerSampleSeeded(ShardedSet(Augmenting(), shuffle_buffer=16), seed=3)
    other_epoch.set_epoch(2)
    assert not torch.equal(other_epoch[3][0], straight[3])


# ------------------------------------------------------------------------------------ --skip-corrupt
class Flaky(torch.utils.data.Dataset):
    """Samples 5 and 9 fail to load, as a truncated file would."""

    def __len__(self):
        return 24

    def __getitem__(self, i):
        if i in (5, 9):
            raise OSError(f"image file is truncated (sample {i})")
        return torch.rand(3), i


def test_skip_corrupt_leaves_samples_out_of_their_batch_and_counts_them(capsys):
    from dpuoffload.host.loader import local_loader

    loader = local_loader(Flaky(), Sampling(4, skip_corrupt=2, shuffle=False))
    batches = list(loader.epoch(0))
    assert [len(y) for _, y in batches] == [4, 3, 3, 4, 4, 4]
    assert 5 not in torch.cat([y for _, y in batches]).tolist() and loader.skipped_in(0) == 2
    out = capsys.readouterr().out
    assert "--skip-corrupt: left out of its batch in epoch 0: training sample 5 could not be loaded: OSError: " \
           "image file is truncated (sample 5)" in out
    strict = local_loader(Flaky(), Sampling(4, skip_corrupt=1, shuffle=False))
    with pytest.raises(ConfigError, match=r"2 training samples of epoch 0 failed to load for this host rank, more "
                                          r"than --skip-corrupt 1 allows"):
        list(strict.epoch(0))
    with pytest.raises(ConfigError, match="training sample 5 could not be loaded: OSError"):
        list(local_loader(Flaky(), Sampling(4, shuffle=False)).epoch(0))


def test_batch_sizes_of_an_epoch_for_map_style_sets_and_streams():
    assert Sampling(4, replicas=2).batch_sizes(Flaky()) == [4, 4, 4]
    assert Sampling(5, replicas=2).batch_sizes(Flaky()) == [5, 5, 2]
    assert Sampling(5, replicas=2, drop_last=True).batch_sizes(Flaky()) == [5, 5]
    data = ShardedSet(Counting(), shuffle_buffer=16)  # 255 samples: 128 per host rank
    assert Sampling(50, replicas=2).batch_sizes(data) == [50, 50, 28]
