"""The clone stand-by's heartbeat schedule and deadline (`common.runtime.heartbeat`), without processes."""

import pytest

from dpuoffload.common.runtime.heartbeat import BEATS_PER_TIMEOUT, Heartbeat, interval_for
from dpuoffload.common.runtime.messages import CKPT_HEADER, StateKind


def test_interval_is_a_quarter_of_the_peer_timeout():
    assert BEATS_PER_TIMEOUT == 4
    assert interval_for(600.0) == 150.0 and interval_for(2.0) == 0.5


def test_first_beat_at_once_then_one_per_interval():
    beat = Heartbeat(interval=10.0)
    sent = [t for t in (100.0, 100.0, 105.0, 109.9, 110.0, 111.0, 120.0, 155.0) if beat.take(t)]
    assert sent == [100.0, 110.0, 120.0, 155.0]


def test_polled_often_the_receiver_never_waits_longer_than_an_interval_plus_a_poll():
    """A keeper polls every 10 ms while it waits hours: the gaps between beats stay about
    `interval`, so a clone rank with deadline peer_timeout (= 4 intervals) never gives up on it."""
    timeout, poll = 8.0, 0.01
    beat = Heartbeat(interval_for(timeout))
    sent = [i * poll for i in range(int(3600 / poll)) if beat.take(i * poll)]
    gaps = [b - a for a, b in zip(sent, sent[1:])]
    assert len(sent) > 3600 / interval_for(timeout) - 1
    assert max(gaps) <= interval_for(timeout) + poll + 1e-9 < timeout


def test_interval_must_be_positive():
    with pytest.raises(ValueError, match="interval must be > 0"):
        Heartbeat(0.0)


def test_heartbeat_is_a_header_only_state_kind():
    head = CKPT_HEADER.unpack(CKPT_HEADER.pack(kind=StateKind.HEARTBEAT, global_step=-1, sender=-1))
    assert StateKind(head["kind"]) is StateKind.HEARTBEAT
    assert head["small_nbytes"] == head["shared_nbytes"] == 0
    assert len({k.value for k in StateKind}) == len(StateKind)  # no number reused
