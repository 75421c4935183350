"""`--ckpt-copy overlap`'s background copy (`host.capture`): it packs the bytes a staged copy packs,
its progress is a prefix, and once settled nothing written to the tensors afterwards reaches the
copy (the next optimizer step's writes). The real-job check (checkpoints and clone equal to a staged
run's, to the bit) is `tests/jobs/test_checkpoint.py::test_an_overlapped_copy_hands_off_the_same_state_as_a_staged_one`.

(The tests of this feature that start processes: tests/jobs/test_capture.py.)
"""

import numpy as np
import pytest
import torch

from dpuoffload.common.state.sharding import byte_buffer, pack_pieces, packed_nbytes, plan_shards
from dpuoffload.host import capture

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (bash scripts/test.sh -m gpu "
                                                                     "on a GPU node)")


def state(device: str = "cpu") -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    shapes = [(2048, 2048), (64,), (512, 3, 3, 3), (5,), (1024, 1024)]  # ~22 MB: the copy takes a while
    return [torch.randn(s, generator=g).to(device) for s in shapes]


def staged_bytes(tensors: list[torch.Tensor], rank: int, size: int) -> np.ndarray:
    pieces = plan_shards([t.numel() for t in tensors], size, 1 << 14).rank_pieces(rank)
    out = byte_buffer(packed_nbytes(tensors, pieces))
    pack_pieces([t.cpu() for t in tensors], pieces, out)
    return out


@pytest.mark.parametrize("rank", [0, 1])
def test_a_settled_background_copy_is_the_state_before_the_next_write(rank):
    tensors = state()
    expected = staged_bytes(tensors, rank, 2)
    pieces = plan_shards([t.numel() for t in tensors], 2, 1 << 14).rank_pieces(rank)
    staging = capture.PinnedStaging()
    copy = capture.start(tensors, pieces, staging, expected.nbytes)
    assert isinstance(copy, capture.ThreadCapture)
    seen = [copy.packed()]
    copy.settle()  # the optimizer step may write now
    for t in tensors:
        t.add_(1.0)
    seen.append(copy.packed())
    copy.wait()
    assert seen == sorted(seen) and seen[-1] == expected.nbytes == copy.packed()
    assert np.array_equal(staging.array[: expected.nbytes], expected)


def test_a_failed_background_copy_raises_when_waited_for():
    tensors = state()
    pieces = plan_shards([t.numel() for t in tensors], 1, 1 << 14).rank_pieces(0)
    staging = capture.PinnedStaging()
    staging.at_least(16, pinned=False)
    too_small = staging.array[:16]
    copy = capture.ThreadCapture(tensors, pieces, too_small)
    with pytest.raises(ValueError):
        copy.wait()
    assert copy.packed() < packed_nbytes(tensors, pieces)


def test_the_staging_buffer_is_reused_while_large_enough():
    staging = capture.PinnedStaging()
    first = staging.at_least(1000, pinned=False)
    assert staging.at_least(800, pinned=False) is first
    assert staging.at_least(2000, pinned=False).nbytes == 2000


@needs_gpu
@pytest.mark.gpu
def test_a_gpu_copy_runs_on_a_side_stream_and_the_next_write_waits_for_it():
    tensors = state("cuda")
    expected = staged_bytes(tensors, 0, 1)
    pieces = plan_shards([t.numel() for t in tensors], 1, 1 << 14).rank_pieces(0)
    staging = capture.PinnedStaging()
    copy = capture.start(tensors, pieces, staging, expected.nbytes)
    assert isinstance(copy, capture.StreamCapture) and staging.tensor.is_pinned()
    copy.settle()  # no host wait: the compute stream waits for the copies
    for t in tensors:
        t.add_(1.0)  # queued after the copies
    copy.wait()
    assert copy.packed() == expected.nbytes
    assert np.array_equal(staging.array[: expected.nbytes], expected)
