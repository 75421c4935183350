"""Sharded model-state hand-off (pure): who sends which slice, and packing slices to bytes and back."""

import copy
import random
from collections import defaultdict

import numpy as np
import pytest
import torch

from dpuoffload.common.config import RunConfig
from dpuoffload.common.models.zoo import build_model
from dpuoffload.common.state.sharding import (
    DEFAULT_THRESHOLD,
    Piece,
    ShardPlan,
    pack_pieces,
    packed_nbytes,
    plan_shards,
    state_digest,
    state_tensors,
    unpack_pieces,
)

THRESHOLD = 64  # small threshold so random cases exercise both kinds of tensor without huge numels


def random_numels(rng: random.Random) -> list[int]:
    """A state_dict-like mix: zeros, scalars, small tensors and tensors above the threshold."""
    kinds = [lambda: 0, lambda: 1, lambda: rng.randint(1, THRESHOLD - 1), lambda: rng.randint(THRESHOLD, 2000)]
    return [rng.choice(kinds)() for _ in range(rng.randint(0, 25))]


def random_cases(n_cases: int = 300):
    rng = random.Random(1234)
    for _ in range(n_cases):
        yield random_numels(rng), rng.randint(1, 9)


def loads(plan) -> list[int]:
    return [sum(p.stop - p.start for p in pieces) for pieces in plan.pieces]


def pieces_by_tensor(plan) -> dict[int, list[tuple[int, Piece]]]:
    """tensor -> [(sender rank, piece)], in rank order."""
    out = defaultdict(list)
    for rank, pieces in enumerate(plan.pieces):
        for p in pieces:
            out[p.tensor].append((rank, p))
    return out


# ------------------------------------------------------------------------------------------- plan
def test_every_element_is_sent_by_exactly_one_rank():
    for numels, n_ranks in random_cases():
        plan = plan_shards(numels, n_ranks, THRESHOLD)
        assert len(plan.pieces) == n_ranks and plan.numels == tuple(numels)
        count = [np.zeros(n, dtype=np.int64) for n in numels]
        for pieces in plan.pieces:
            for p in pieces:
                assert 0 <= p.start < p.stop <= numels[p.tensor]  # no empty or out-of-range piece
                count[p.tensor][p.start: p.stop] += 1
        assert all((c == 1).all() for c in count), (numels, n_ranks)


def test_large_tensors_get_one_contiguous_slice_per_rank_in_rank_order():
    for numels, n_ranks in random_cases():
        by_tensor = pieces_by_tensor(plan_shards(numels, n_ranks, THRESHOLD))
        for t, n in enumerate(numels):
            if n < THRESHOLD:
                continue
            ranks = [r for r, _ in by_tensor[t]]
            assert ranks == list(range(n_ranks))  # slice k comes from rank k
            bounds = [(p.start, p.stop) for _, p in by_tensor[t]]
            assert [b[0] for b in bounds[1:]] == [b[1] for b in bounds[:-1]]  # back to back
            sizes = [stop - start for start, stop in bounds]
            assert max(sizes) - min(sizes) <= 1


def test_small_tensors_go_whole_to_one_rank_and_empty_tensors_nowhere():
    for numels, n_ranks in random_cases():
        by_tensor = pieces_by_tensor(plan_shards(numels, n_ranks, THRESHOLD))
        for t, n in enumerate(numels):
            if n == 0:
                assert t not in by_tensor
            elif n < THRESHOLD:
                assert [p for _, p in by_tensor[t]] == [Piece(t, 0, n)]


def test_load_balance_within_greedy_bound():
    """Greedy (largest first, to the least loaded rank) bound: the most loaded rank either got no
    small tensor (then the gap is at most the imbalance of the large slices, <= 1 element per large
    tensor) or was the least loaded one when it got its last small tensor (gap <= that tensor)."""
    for numels, n_ranks in random_cases():
        plan = plan_shards(numels, n_ranks, THRESHOLD)
        large_load = [sum(p.stop - p.start for p in pieces if numels[p.tensor] >= THRESHOLD)
                      for pieces in plan.pieces]
        largest_small = max([n for n in numels if n < THRESHOLD], default=0)
        n_large = sum(n >= THRESHOLD for n in numels)
        assert max(large_load) - min(large_load) <= n_large
        gap = max(loads(plan)) - min(loads(plan))
        assert gap <= max(largest_small, max(large_load) - min(large_load)), (numels, n_ranks)


def test_small_tensors_only_balance_on_a_hand_example():
    plan = plan_shards([10, 7, 6, 5, 2], 2, threshold=100)
    # 10 -> r0; 7 -> r1; 6 -> r1 (7 < 10); 5 -> r0 (10 < 13); 2 -> r1 (13 < 15)
    assert plan.pieces == ((Piece(0, 0, 10), Piece(3, 0, 5)),
                           (Piece(1, 0, 7), Piece(2, 0, 6), Piece(4, 0, 2)))
    assert loads(plan) == [15, 15]


def test_large_tensor_split_on_a_hand_example():
    plan = plan_shards([10], 3, threshold=4)
    assert plan.pieces == ((Piece(0, 0, 3),), (Piece(0, 3, 6),), (Piece(0, 6, 10),))


def test_pieces_within_a_rank_are_in_tensor_order():
    for numels, n_ranks in random_cases(50):
        for pieces in plan_shards(numels, n_ranks, THRESHOLD).pieces:
            assert list(pieces) == sorted(pieces, key=lambda p: (p.tensor, p.start))


def test_plan_is_deterministic():
    for numels, n_ranks in random_cases(50):
        assert plan_shards(list(numels), n_ranks, THRESHOLD) == plan_shards(tuple(numels), n_ranks, THRESHOLD)


def test_single_rank_sends_everything():
    plan = plan_shards([5000, 3, 0, 4096], 1)
    assert plan.pieces == ((Piece(0, 0, 5000), Piece(1, 0, 3), Piece(3, 0, 4096)),)
    assert DEFAULT_THRESHOLD == 4096


@pytest.mark.parametrize("n_ranks", [0, -1])
def test_n_ranks_below_one_is_rejected(n_ranks):
    with pytest.raises(ValueError, match=f"n_ranks must be >= 1, got {n_ranks}"):
        plan_shards([10, 20], n_ranks)


# ---------------------------------------------------------------------------------------- tensors
def test_non_contiguous_tensor_is_rejected_by_name():
    state = {"fc.weight": torch.zeros(3, 4), "fc.weight_t": torch.zeros(3, 4).t()}
    with pytest.raises(ValueError, match="'fc.weight_t' is not contiguous"):
        state_tensors(state)


def test_state_tensors_are_detached_views_in_order():
    model = torch.nn.Linear(3, 2)
    tensors = state_tensors(model.state_dict())
    assert [t.shape for t in tensors] == [(2, 3), (2,)]
    assert not any(t.requires_grad for t in tensors)
    assert tensors[0].data_ptr() == model.weight.data_ptr()


def test_packed_nbytes_counts_element_sizes():
    tensors = [torch.zeros(10, dtype=torch.float32), torch.zeros(3, dtype=torch.int64),
               torch.zeros(5, dtype=torch.float16)]
    pieces = [Piece(0, 2, 7), Piece(1, 0, 3), Piece(2, 1, 2)]
    assert packed_nbytes(tensors, pieces) == 5 * 4 + 3 * 8 + 1 * 2


# ------------------------------------------------------------------------------------- round trip
def model(name: str, seed: int) -> torch.nn.Module:
    m = build_model(RunConfig(model=name, seed=seed), 10)
    for i, (key, t) in enumerate(m.state_dict().items()):  # buffers that differ from a fresh model
        if key.endswith("num_batches_tracked"):
            t.fill_(1000 + 7 * i + seed)
        elif key.endswith(("running_mean", "running_var")):
            t.uniform_(0.5, 1.5, generator=torch.Generator().manual_seed(seed + i))
    return m


@pytest.fixture(scope="module", params=["resnet20", "shufflenet_v2"])
def pristine(request):
    return model(request.param, seed=1), model(request.param, seed=2)


@pytest.fixture
def models(pristine):
    """(source, receiver): same architecture, different seeds and buffers; fresh copies per test."""
    return tuple(copy.deepcopy(m) for m in pristine)


def send_and_gather(src: torch.nn.Module, n_senders: int, gap: int) -> tuple[bytes, list[int], ShardPlan]:
    """Each sender packs its pieces; the packed buffers are concatenated with `gap` junk bytes in
    front of each (so pieces land at unaligned offsets, as after a header of odd size)."""
    tensors = state_tensors(src.state_dict())
    plan = plan_shards([t.numel() for t in tensors], n_senders)
    gathered, offsets = bytearray(), []
    for k in range(n_senders):
        out = np.full(packed_nbytes(tensors, plan.rank_pieces(k)), 0xAB, dtype=np.uint8)
        assert pack_pieces(tensors, plan.rank_pieces(k), out) == out.nbytes
        gathered += b"\xff" * gap
        offsets.append(len(gathered))
        gathered += out.tobytes()
    return bytes(gathered), offsets, plan


@pytest.mark.parametrize("n_senders,gap", [(1, 0), (3, 1), (8, 5)])
def test_pack_unpack_rebuilds_state_bit_for_bit(models, n_senders, gap):
    src, dst = models
    assert state_digest(src) != state_digest(dst)
    gathered, offsets, plan = send_and_gather(src, n_senders, gap)
    buf = np.frombuffer(gathered, dtype=np.uint8).copy()
    tensors = state_tensors(dst.state_dict())
    for k, offset in enumerate(offsets):
        used = unpack_pieces(buf[offset:], plan.rank_pieces(k), tensors)
        assert used == packed_nbytes(tensors, plan.rank_pieces(k))
    assert state_digest(dst) == state_digest(src)
    tracked = [k for k in src.state_dict() if k.endswith("num_batches_tracked")]
    assert tracked and all(torch.equal(dst.state_dict()[k], src.state_dict()[k]) for k in tracked)


def test_round_trip_covers_int64_pieces_at_unaligned_offsets(models):
    """The case above really reads int64 buffers from addresses that are not multiples of 8."""
    src, _ = models
    tensors = state_tensors(src.state_dict())
    _, offsets, plan = send_and_gather(src, 3, gap=1)
    misaligned = []
    for k, offset in enumerate(offsets):
        for p in plan.rank_pieces(k):
            if tensors[p.tensor].dtype == torch.int64 and offset % 8:
                misaligned.append(p)
            offset += (p.stop - p.start) * tensors[p.tensor].element_size()
    assert misaligned


def test_state_digest_sees_an_off_by_one_in_an_int64_buffer():
    m = model("resnet20", seed=0)
    before = state_digest(m)
    m.state_dict()["bn1.num_batches_tracked"].add_(1)
    assert state_digest(m) != before
    assert state_digest(model("resnet20", seed=0)) == before


def test_states_of_a_shrunk_group_and_a_notice_unpack_whole():
    """Under --recovery an epoch's STATE messages come from however many host ranks are left, each
    header naming the plan's sender count, with header-only notices (sender -1) among them: the
    receivers rebuild the whole state from any such set, in any order."""
    from dpuoffload.common.runtime.messages import STATE_HEADER, STATE_HEADER_BYTES
    from dpuoffload.common.state.sharding import cached_plan, unpack_states

    torch.manual_seed(0)
    src = [torch.randn(300), torch.randn(5, 7), torch.randn(2000), torch.zeros(0), torch.randn(3)]
    numels = tuple(t.numel() for t in src)
    messages = []
    for sender in range(3):
        pieces = cached_plan(numels, 3).rank_pieces(sender)
        body = np.zeros(packed_nbytes(src, pieces), dtype=np.uint8)
        n = pack_pieces(src, pieces, body)
        head = STATE_HEADER.pack(epoch=4, sender=sender, nbytes=n, dpu_share_ppm=500_000, senders=3, to_me=1,
                                 source=10 + sender).view(np.uint8)
        messages.append(np.concatenate([head, body]))
    notice = STATE_HEADER.pack(epoch=4, sender=-1, nbytes=0, dpu_share_ppm=500_000, senders=3, to_me=0, source=10)
    messages.insert(1, notice.view(np.uint8))
    assert len(messages[1]) == STATE_HEADER_BYTES
    dst = [torch.zeros_like(t) for t in src]
    heads = unpack_states(np.concatenate(messages[::-1]), dst)
    assert [h["sender"] for h in heads] == [2, 1, -1, 0]
    assert all(torch.equal(a, b) for a, b in zip(src, dst))


# ------------------------------------------------------------------ staged hand-offs in chunks
def test_a_staged_buffer_is_cut_into_chunks_the_last_one_shorter():
    from dpuoffload.common.state.ckptfiles import chunk_sizes, part_bounds

    assert chunk_sizes(25, 10) == [10, 10, 5]
    assert chunk_sizes(20, 10) == [10, 10]
    assert chunk_sizes(0, 10) == []
    assert part_bounds([10, 10, 5]) == [(0, 10), (10, 20), (20, 25)]


def test_packing_reports_its_progress_so_chunks_can_go_as_they_are_packed():
    tensors = [torch.arange(6, dtype=torch.float32), torch.arange(3, dtype=torch.int64)]
    plan = plan_shards([t.numel() for t in tensors], 1, threshold=1)
    out, seen = np.zeros(packed_nbytes(tensors, plan.rank_pieces(0)), dtype=np.uint8), []
    pack_pieces(tensors, plan.rank_pieces(0), out, seen.append)
    assert seen == [24, 48]   # after each piece: the bytes packed so far
    assert out[:24].view(np.float32).tolist() == list(range(6))


@pytest.mark.parametrize("parts, chunk, ok", [(3, 10, True), (2, 10, False), (1, 0, True)])
def test_a_hand_off_header_names_how_its_shared_bytes_come(parts, chunk, ok):
    from dpuoffload.common.runtime.messages import CKPT_HEADER
    from dpuoffload.common.state.ckptfiles import CheckpointError, Received, part_sizes

    head = CKPT_HEADER.unpack(CKPT_HEADER.pack(sender=0, shared_nbytes=25, shared_parts=parts, chunk_bytes=chunk))
    got = Received(dict(head), np.zeros(0, np.uint8), np.zeros(25, np.uint8))
    if not ok:
        with pytest.raises(CheckpointError, match=r"sent 2 parts / 25 bytes, 10-byte chunks give\(s\) 3 / 25"):
            part_sizes(got)
        return
    assert part_sizes(got) == ([10, 10, 5] if chunk else [25])
