"""The batch message of `--mode da` (pure): header + labels + samples in one raw buffer, and back."""

import re

import numpy as np
import pytest
import torch
from PIL import Image

from dpuoffload.common.data.batches import BATCH_HEADER, HEADER_BYTES, BatchKind, BatchLayout, layout_for
from dpuoffload.common.errors import PeerError
from dpuoffload.common.runtime.messages import Tag

SHAPES = [(5,), (3, 4), (3, 8, 8), (2, 3, 4, 5)]
DTYPES = [np.float32, np.uint8, np.float16]


def random_batch(layout: BatchLayout, count: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    shape = (count, *layout.sample_shape)
    if layout.dtype == np.uint8:
        samples = torch.randint(0, 256, shape, generator=g, dtype=torch.uint8)
    else:
        samples = torch.randn(shape, generator=g).to(layout.torch_dtype)
    return samples, torch.randint(0, 1000, (count,), generator=g)


def test_header_is_defined_once_with_its_tag():
    assert BATCH_HEADER.tag is Tag.STREAM_BASE  # (plus the loader's number: `streams.stream_tag`)
    assert BATCH_HEADER.fields == ("kind", "epoch", "step", "count", "flags", "dtype", "ndim", "dim0", "dim1", "dim2",
                                   "dim3")
    assert HEADER_BYTES == 88


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("count", [6, 1])  # full batch, and a partial last batch
def test_pack_then_unpack_is_bit_identical(shape, dtype, count):
    layout = BatchLayout(shape, np.dtype(dtype), max_batch=6)
    samples, labels = random_batch(layout, count)
    buf = layout.empty()
    sent = layout.pack(buf, epoch=2, step=5, samples=samples, labels=labels)
    assert sent == layout.nbytes(count)
    head = layout.unpack_header(buf)
    assert (head["kind"], head["epoch"], head["step"], head["count"]) == (BatchKind.BATCH, 2, 5, count)
    got_samples, got_labels = layout.unpack(buf, head["count"])
    assert got_samples.dtype == samples.dtype and got_samples.shape == samples.shape
    assert got_samples.numpy().tobytes() == samples.numpy().tobytes()
    assert torch.equal(got_labels, labels)


def test_special_float_values_survive_bit_for_bit():
    layout = BatchLayout((4,), np.dtype(np.float32), max_batch=2)
    samples = torch.tensor([[float("nan"), -0.0, float("inf"), 1e-45], [1.0, 2.0, 3.0, 4.0]])
    buf = layout.empty()
    layout.pack(buf, 0, 0, samples, torch.tensor([0, 1]))
    assert layout.unpack(buf, 2)[0].numpy().tobytes() == samples.numpy().tobytes()


@pytest.mark.parametrize("count", [1, 3, 4])
@pytest.mark.parametrize("label", [int, torch.tensor, np.int64], ids=["int", "tensor", "numpy"])
def test_pack_items_is_default_collate_for_every_kind_of_label(label, count):
    """The stack into the buffer (whole or part of it) and the labels (Python ints as they are,
    0-d tensors and numpy integers through int()) give default_collate's batch, bit for bit."""
    from torch.utils.data import default_collate

    layout = BatchLayout((3, 8, 8), np.float32, 4)
    samples, labels = random_batch(layout, count, seed=count)
    items = [(x, label(int(y))) for x, y in zip(samples, labels)]
    buf = layout.buffer()
    layout.pack_items(buf, 2, 5, items)
    assert layout.read_header(buf) == (BatchKind.BATCH, 2, 5, count, 0)
    got_x, got_y = layout.unpack(buf, count)
    want_x, want_y = default_collate(items)
    assert got_x.numpy().tobytes() == want_x.numpy().tobytes()
    assert torch.equal(got_y, torch.as_tensor(want_y))


def test_pack_items_in_chunks_calls_between_and_packs_the_same_bytes(monkeypatch):
    """A polled ring stacks a batch in chunks and calls into MPI between them: same message."""
    import dpuoffload.common.data.batches as batches

    layout = BatchLayout((3, 8, 8), np.float32, 10)
    samples, labels = random_batch(layout, 10)
    items = [(x, int(y)) for x, y in zip(samples, labels)]
    whole, chunked = layout.buffer(), layout.buffer()
    n = layout.pack_items(whole, 0, 1, items)
    monkeypatch.setattr(batches, "PACK_CHUNK_BYTES", 3 * 3 * 8 * 8 * 4)  # 3 samples a chunk
    calls = []
    assert layout.pack_items(chunked, 0, 1, items, between=lambda: calls.append(1)) == n
    assert len(calls) == 4 and chunked.raw[:n].tobytes() == whole.raw[:n].tobytes()


def test_only_the_first_count_bytes_are_sent():
    layout = BatchLayout((3, 8, 8), np.dtype(np.float32), max_batch=16)
    assert layout.samples_offset == HEADER_BYTES + 8 * 16
    assert layout.nbytes(3) == HEADER_BYTES + 8 * 16 + 3 * 192 * 4
    assert layout.empty().nbytes == layout.nbytes(16)


def test_marker_round_trip():
    layout = BatchLayout((3, 4), np.dtype(np.uint8), max_batch=4)
    buf = layout.empty()
    assert layout.pack_marker(buf, seq=7) == HEADER_BYTES
    head = layout.unpack_header(buf)
    assert head["kind"] == BatchKind.MARKER and head["epoch"] == 7 and head["count"] == 0


def test_unpack_returns_views_into_the_buffer():
    layout = BatchLayout((2, 3), np.dtype(np.float32), max_batch=4)
    buf = layout.empty()
    layout.pack(buf, 0, 0, *random_batch(layout, 4))
    samples, labels = layout.unpack(buf, 4)
    assert samples.data_ptr() == buf.ctypes.data + layout.samples_offset
    assert labels.data_ptr() == buf.ctypes.data + layout.labels_offset
    samples[1].fill_(42.0)
    labels[3] = -5
    assert (buf[layout.samples_offset + 24: layout.samples_offset + 48].view(np.float32) == 42.0).all()
    again_samples, again_labels = layout.unpack(buf, 4)
    assert (again_samples[1] == 42.0).all() and again_labels[3] == -5


# ----------------------------------------------------------------------------------------- errors
def test_wrong_sample_shape_is_rejected_with_both_shapes():
    layout = BatchLayout((3, 4, 4), np.dtype(np.float32), max_batch=8)
    with pytest.raises(ValueError, match=re.escape("batch of shape (2, 3, 4, 5)") + ".*" + re.escape("[n, 3, 4, 4]")):
        layout.pack(layout.empty(), 0, 0, torch.zeros(2, 3, 4, 5), torch.zeros(2, dtype=torch.int64))


def test_wrong_sample_dtype_is_rejected():
    layout = BatchLayout((3, 4, 4), np.dtype(np.float32), max_batch=8)
    with pytest.raises(ValueError, match=re.escape("(2, 3, 4, 4) torch.float64") + ".*float32"):
        layout.pack(layout.empty(), 0, 0, torch.zeros(2, 3, 4, 4, dtype=torch.float64),
                    torch.zeros(2, dtype=torch.int64))


def test_batch_larger_than_max_batch_is_rejected():
    layout = BatchLayout((3,), np.dtype(np.float32), max_batch=4)
    buf = layout.empty()
    with pytest.raises(ValueError, match="batch of 5 samples exceeds the layout's 4"):
        layout.pack(buf, 0, 0, torch.zeros(5, 3), torch.zeros(5, dtype=torch.int64))
    assert not buf.any()  # nothing written


def test_five_dim_samples_are_rejected():
    with pytest.raises(ValueError, match="samples with 5 dims; the batch header holds 4"):
        BatchLayout((1, 2, 3, 4, 5), np.dtype(np.float32), max_batch=2)


@pytest.mark.parametrize("dtype", [np.int32, np.bool_, np.complex64])
def test_unsupported_dtype_is_rejected_with_the_supported_list(dtype):
    with pytest.raises(ValueError, match="cannot be sent; supported: float32, float16, uint8, float64, int64"):
        BatchLayout((3,), np.dtype(dtype), max_batch=2)


@pytest.mark.parametrize("other", [BatchLayout((3, 4, 5), np.dtype(np.float32), 8),   # shape
                                   BatchLayout((3, 4, 4), np.dtype(np.uint8), 8),     # dtype
                                   BatchLayout((12, 4), np.dtype(np.float32), 8)])    # ndim
def test_header_from_a_different_layout_is_a_peer_error(other):
    ours = BatchLayout((3, 4, 4), np.dtype(np.float32), max_batch=8)
    buf = np.zeros(max(ours.nbytes(8), other.nbytes(8)), dtype=np.uint8)
    other.pack(buf, 0, 0, *random_batch(other, 2))
    with pytest.raises(PeerError, match="does not match this run's layout"):
        ours.unpack_header(buf)


def test_header_with_unknown_kind_is_a_peer_error():
    layout = BatchLayout((3,), np.dtype(np.float32), max_batch=2)
    buf = layout.empty()
    layout.pack(buf, 0, 0, torch.zeros(1, 3), torch.zeros(1, dtype=torch.int64))
    buf[:8].view(np.int64)[0] = 99  # corrupted kind field
    with pytest.raises(PeerError):
        layout.unpack_header(buf)


# ------------------------------------------------------------------------------------- layout_for
def test_layout_for_a_sample_tensor():
    assert layout_for(torch.zeros(3, 32, 32), 16) == BatchLayout((3, 32, 32), np.dtype(np.float32), 16)
    assert layout_for(torch.zeros(28, 28, dtype=torch.uint8), 4).torch_dtype == torch.uint8


@pytest.mark.parametrize("sample", [Image.new("RGB", (4, 4)), np.zeros((3, 4, 4), dtype=np.float32)])
def test_layout_for_a_non_tensor_asks_for_to_tensor(sample):
    with pytest.raises(TypeError, match=r"returns (Image|ndarray); --mode da sends tensors.*ToTensor\(\)"):
        layout_for(sample, 4)


def test_layout_for_an_unsupported_tensor_dtype_is_a_value_error():
    with pytest.raises(ValueError, match="sample dtype int32 cannot be sent"):
        layout_for(torch.zeros(3, dtype=torch.int32), 4)


def test_layout_for_a_bfloat16_sample_is_a_value_error():
    with pytest.raises(ValueError, match="cannot be sent"):
        layout_for(torch.zeros(3, dtype=torch.bfloat16), 4)
