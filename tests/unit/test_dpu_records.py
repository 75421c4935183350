"""The augmentation DPU rank's per-epoch records (pure: streams stand in by their two counters)."""

from types import SimpleNamespace

from dpuoffload.common.runtime.metrics import PhaseTimer
from dpuoffload.dpu.serve import EpochRecords


def stream(finished: int, sent_in: dict[int, int]) -> SimpleNamespace:
    return SimpleNamespace(finished=finished, sent_in=dict(sent_in))


def test_an_epoch_is_recorded_once_every_open_stream_finished_it():
    records = EpochRecords(PhaseTimer())
    a, b = stream(0, {0: 2, 1: 1}), stream(-1, {0: 1})
    records.done(0, [a, b])
    assert records.records == []  # b is still producing epoch 0
    b.finished, b.sent_in[0] = 0, 2
    records.done(0, [a, b])
    assert [(r["epoch"], r["batches"]) for r in records.records] == [(0, 4)]
    assert a.sent_in == {1: 1}  # the next epoch's batches stay for its record


def test_a_stream_opened_late_adds_its_batches_to_the_epoch_already_recorded():
    """One DPU rank feeds two host ranks; the second host's loader opened after the first host's
    stream had produced epoch 0 (a loaded machine): none of its batches may be lost from the records."""
    records = EpochRecords(PhaseTimer())
    first = stream(0, {0: 2})
    records.done(0, [first])
    late = stream(0, {0: 2})
    records.done(0, [first, late])
    first.finished, late.finished = 1, 1
    first.sent_in[1], late.sent_in[1] = 2, 2
    records.done(1, [first, late])
    assert [(r["epoch"], r["batches"]) for r in records.records] == [(0, 4), (1, 4)]
