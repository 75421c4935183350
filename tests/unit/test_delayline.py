"""The delay line's pure pieces (scripts/delayline.py, the switch behind `DPUOFFLOAD_NETNS_DELAY`):
parsing a delay, which pairs of machines get which delay, the learning switch's forwarding, and the
queue that holds frames until due. No processes, no root; the delay line at work across emulated
machines is tests/cluster/test_multinode.py's."""

from __future__ import annotations

import pytest

from scripts.delayline import DelayQueue, Switch, describe, main, node_of, parse_delay, plan_delays


@pytest.mark.parametrize("text, seconds", [("200us", 200e-6), ("2ms", 2e-3), ("1.5ms", 1.5e-3), ("0.01s", 0.01),
                                           ("0", 0.0), (" 3ms ", 3e-3), (".5ms", 0.5e-3)])
def test_parse_delay_reads_tc_spellings(text, seconds):
    assert parse_delay(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["2", "2x", "ms", "", "-1ms", "1.5 ms", "2msec", "1e3us"])
def test_a_bad_delay_names_the_knob_and_how_to_write_one(text):
    with pytest.raises(ValueError, match=r"DPUOFFLOAD_NETNS_DELAY=.* is not a delay: .*e\.g\. 200us, 2ms or 1\.5ms"):
        parse_delay(text, "DPUOFFLOAD_NETNS_DELAY")


def test_a_delay_over_10_s_is_refused():
    with pytest.raises(ValueError, match="over 10 s"):
        parse_delay("11s")


def test_a_host_and_its_dpu_share_a_node():
    assert [node_of(m) for m in ("h0", "d0", "h1", "dpu12", "h", "d")] == ["0", "0", "1", "12", "", ""]


def test_pairs_within_a_node_get_the_link_delay_and_across_nodes_the_network_delay():
    plan = plan_delays(["h0", "h1", "d0", "d1"], 200e-6, 2e-3)
    link, net = 200e-6, 2e-3
    assert plan.delays == ((0.0, net, link, net), (net, 0.0, net, link), (link, net, 0.0, net), (net, link, net, 0.0))
    assert "h0 <-> d0: 200 us one way, link (same node)" in describe(plan).splitlines()
    assert "h0 <-> h1: 2000 us one way, network (other node)" in describe(plan).splitlines()
    assert plan_delays(["h", "d"], 1e-3, 5e-3).delays == ((0.0, 1e-3), (1e-3, 0.0))  # one node, no digits


@pytest.mark.parametrize("machines, message", [(["h0"], "at least 2 machines"), (["h0", "d0", "h0"], "h0 named twice")])
def test_bad_machine_lists_are_refused(machines, message):
    with pytest.raises(ValueError, match=message):
        plan_delays(machines, 0.0, 0.0)


def frame(dst: bytes, src: bytes) -> bytes:
    return dst + src + b"\x08\x00" + b"payload"


A, B, C = (bytes([2, 0, 0, 0, 0, n]) for n in (1, 2, 3))  # locally administered unicast MACs
BROADCAST = b"\xff" * 6


def test_the_switch_floods_unknown_and_broadcast_and_sends_learnt_ones_to_their_port():
    switch = Switch(3)
    assert switch.destinations(0, frame(BROADCAST, A)) == [1, 2]  # ARP: flooded; A learnt on port 0
    assert switch.destinations(1, frame(C, B)) == [0, 2]  # C unknown yet: flooded; B learnt on port 1
    assert switch.destinations(2, frame(A, C)) == [0]
    assert switch.destinations(0, frame(B, A)) == [1]
    assert switch.destinations(0, frame(A, A)) == []  # to its own port: not sent back
    assert switch.destinations(0, b"short") == []
    assert switch.destinations(0, frame(b"\x01\x00\x5e\x00\x00\x01", A)) == [1, 2]  # multicast: flooded


def test_the_queue_releases_each_frame_at_arrival_plus_delay_in_order_per_path():
    queue = DelayQueue(limit_bytes=1 << 20)
    queue.push(0.0, 2e-3, 1, b"far-1")
    queue.push(0.5e-3, 0.2e-3, 2, b"near-1")
    queue.push(1.0e-3, 2e-3, 1, b"far-2")
    queue.push(1.0e-3, 0.2e-3, 2, b"near-2")
    assert queue.next_due() == pytest.approx(0.7e-3)
    assert list(queue.pop_due(0.69e-3)) == []
    assert list(queue.pop_due(1.5e-3)) == [(2, b"near-1"), (2, b"near-2")]
    assert queue.next_due() == pytest.approx(2e-3)
    assert list(queue.pop_due(10.0)) == [(1, b"far-1"), (1, b"far-2")]
    assert queue.next_due() is None and queue.held_bytes == 0


def test_a_full_queue_drops_new_frames_as_a_full_switch_buffer_does():
    queue = DelayQueue(limit_bytes=10)
    assert queue.push(0.0, 1e-3, 0, b"12345678") and not queue.push(0.0, 1e-3, 0, b"123")
    assert queue.dropped == 1 and list(queue.pop_due(1.0)) == [(0, b"12345678")]


def test_the_cli_checks_delays_before_making_anything(capsys):
    assert main(["--plan", "--link", "2x", "h0", "d0"]) == 2
    assert "delayline.py: error: DPUOFFLOAD_NETNS_DELAY='2x' is not a delay" in capsys.readouterr().err
    assert main(["--plan", "--link", "1ms", "--network", "3ms", "h0", "d0", "h1"]) == 0
    assert "h0 <-> h1: 3000 us one way, network (other node)" in capsys.readouterr().out
