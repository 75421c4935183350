"""`--dpu-workers K`: worker processes building one stream's batches (no MPI: the pool alone; the
real job is tests/jobs/test_api_jobs.py's walk, with fan-out and 2 workers per stream).

(Here the tests that start processes; those that run in one process: tests/unit/test_workers.py.)
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dpuoffload.common.data.batches import BatchLayout
from dpuoffload.common.data.loaders import RankLoader, Sampling, probe_layout
from dpuoffload.common.data.streams import StepSplit
from dpuoffload.common.data.workers import STOP, WorkerPool
from dpuoffload.common.errors import ConfigError, WorkerError
from dpuoffload.common.faults.abort import describe_error
from dpuoffload.host.loader import HostPart, local_loader
from tests.unit.test_workers import Jitter, _loader


def _content(layout: BatchLayout, message: np.ndarray) -> tuple[bytes, bytes]:
    """A batch message's labels and samples (what a receiver reads: `count` of each)."""
    full = layout.empty()
    full[:len(message)] = message
    x, y = layout.unpack(full, layout.unpack_header(full)["count"])
    return y.numpy().tobytes(), x.numpy().tobytes()


def _in_process(loader: RankLoader, epoch: int, start: int = 0) -> list[tuple[bytes, bytes]]:
    """What a DPU rank without workers packs for (epoch, start..)."""
    layout = probe_layout(loader.dataset, loader.sampling)
    buf = layout.buffer()
    loader.set_epoch(epoch)
    return [_content(layout, buf.raw[:layout.pack_items(buf, epoch, 0, items)]) for items in loader.batches(start)]


def test_pool_batches_equal_the_in_process_ones_across_edges_and_jumps():
    train, loader = _loader(Jitter(21))
    layout = probe_layout(train, loader.sampling)
    pool = WorkerPool(train, loader, layout, workers=2)
    try:
        run_on = [_content(layout, t.numpy()) for t in pool.batches(0, 1, 3)]  # epochs 0 (from step 1), 1, 2
        assert run_on == _in_process(loader, 0, 1) + _in_process(loader, 1) + _in_process(loader, 2)
        first = next(pool.batches(1, 2, STOP))                  # a jump back, mid-epoch, to an open end
        assert _content(layout, first.numpy()) == _in_process(loader, 1, 2)[0]
        head = layout.unpack_header(first.numpy())
        assert (head["epoch"], head["count"]) == (1, 3)          # the epoch's short last batch; step is the sender's
    finally:
        pool.close()


def test_a_failing_sample_is_named_at_its_line_in_the_parent():
    train, loader = _loader(Jitter(21, bad=5), replicas=1, rank=0)
    pool = WorkerPool(train, loader, probe_layout(train, loader.sampling), workers=1)
    try:
        with pytest.raises(WorkerError) as info:
            list(pool.batches(0, 0, 1))
    finally:
        pool.close()
    assert describe_error(info.value).startswith("SampleError: training sample 5 could not be loaded: ValueError: "
                                                 "sample 5 is corrupt (at tests/unit/test_workers.py:")
    assert "in __getitem__" in str(info.value) and "raise ValueError" in info.value.traceback_text


def test_samples_that_do_not_fit_the_layout_come_back_as_the_packers_error():
    train, loader = _loader(Jitter(8, shape="ragged"), replicas=1, rank=0)
    train.set_epoch(0)
    pool = WorkerPool(train, loader, probe_layout(train, loader.sampling), workers=1)
    try:
        got = next(pool.batches(0, 0, 1))
    finally:
        pool.close()
    assert isinstance(got, ValueError) and "every sample must be [3, 4, 4]" in str(got)


def test_the_hosts_own_share_names_unfit_samples_as_the_dpu_rank_does():
    """--da-host-share with host workers: the same ConfigError as a DPU rank's (`unfit_samples`)."""
    ds = Jitter(8, shape="ragged")
    ds.transform = "RaggedCrop()"  # what the message names (a torchvision Compose's repr in real use)
    part = HostPart(ds, Sampling(4, 1, 0, seed=7), StepSplit(1.0, 2), workers=1)
    try:
        with pytest.raises(ConfigError, match=r"same shape and dtype, but the training transform 'RaggedCrop\(\)' "
                                              r"does not \(.*every sample must be \[3, 4, 4\].*RandomResizedCrop"):
            next(part.batches(0, 0, 2))
    finally:
        part.close()


@pytest.mark.parametrize("workers", [0, 1])
def test_the_hosts_part_is_the_local_loaders_steps_through_edges_and_jumps(workers):
    ds = Jitter(21)
    sampling = Sampling(4, 2, 1, seed=7)
    split = StepSplit(0.5, 3)                             # 3 steps per epoch: step 1 is the host's
    part = HostPart(ds, sampling, split, workers, epochs=4)
    reference = local_loader(ds, sampling)
    try:
        for epoch, start in ((0, 0), (1, 0), (2, 0), (1, 1), (3, 2)):  # on across edges, then jumps
            got = list(part.batches(epoch, start, 3))
            want = [b for s, b in enumerate(reference.epoch(epoch), 0) if s >= start and split.host(s)]
            assert len(got) == len(want) == (1 if start <= 1 else 0)
            for (x, y), (wx, wy) in zip(got, want):
                assert torch.equal(x, wx) and torch.equal(y, wy) and x.dtype == wx.dtype
    finally:
        part.close()
