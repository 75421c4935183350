"""Rollback's keeper route (`dpu.keeper.recovery.SeatsRoute`): whose part of a hand-off it waits for.

Two host ranks (world 0 and 1), one keeper (world 2), one spare (world 3). The route's MPI receives
are scripted (`Scripted`): the headers that landed from each sender, in order, and the parts behind
them; the failure record says which ranks are dead. No MPI, no threads.
"""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import pytest

from dpuoffload.common.config import parse_run_config
from dpuoffload.common.errors import PeerError
from dpuoffload.common.runtime.messages import StateKind
from dpuoffload.common.runtime.roles import RankInfo, Role, Topology, pair_ranks
from dpuoffload.dpu.keeper.recovery import SeatBook, SeatsRoute


def header(kind: StateKind, step: int, seat: int, sender: int) -> dict[str, int]:
    return {"kind": int(kind), "global_step": step, "sender": sender, "senders": 2, "seat": seat, "to_me": 2,
            "small_nbytes": 0}


class Scripted:
    """Stands for `PostedHeaders` and the `Inbox`: each sender's landed headers in order."""

    def __init__(self, landed: dict[int, list[dict[str, int]]]) -> None:
        self.queue = landed
        self.gone: set[int] = set()

    def next_heads(self, keep: Any = None) -> dict[int, dict[str, int]]:
        return {r: self.head(r) for r in self.landed(keep)}

    def landed(self, keep: Any = None) -> list[int]:
        ranks = [r for r, q in self.queue.items() if q]
        return [r for r in ranks if keep(r)] if keep is not None else ranks

    def head(self, rank: int) -> dict[str, int]:
        return self.queue[rank][0]

    def take(self, rank: int) -> dict[str, int]:
        return self.queue[rank].pop(0)

    def parts(self, source: int, head: dict[str, int]) -> SimpleNamespace:
        return SimpleNamespace(head=head, meta={})


def seats_route(landed: dict[int, list[dict[str, int]]], dead: set[int], peer_timeout: float = 600) -> SeatsRoute:
    roles = [Role.HOST, Role.HOST, Role.DPU, Role.SPARE]
    ranks = tuple(RankInfo(i, role, "n0", "n0") for i, role in enumerate(roles))
    topo = Topology(world=SimpleNamespace(Get_rank=lambda: 2), side_comm=None, role=Role.DPU, ranks=ranks,
                    pairing=pair_ranks(ranks))
    cfg = parse_run_config(["--mode", "none", "--recovery", "rollback", "--ckpt-dir", "/tmp/x", "--ckpt-every", "2",
                            "--epochs", "2", "--peer-timeout", str(peer_timeout)])
    route = SeatsRoute(cfg, topo, inbox=None, faults=SimpleNamespace(dead_ranks=lambda: frozenset(dead)))
    route.headers = route.inbox = Scripted(landed)  # type: ignore[assignment]
    route.steps_per_epoch = 8
    return route


def test_the_seat_book_names_who_hands_each_step_over():
    book = SeatBook({0: 0, 1: 1})
    assert (book.holder(1, 12), book.last_join(1)) == (1, -1)
    book.join(1, 3, 13)   # spare 3 took seat 1 with the state of step 13 (it re-sends step 13's hand-off)
    book.join(1, 4, 20)   # and died; spare 4 took the seat at step 20
    assert [book.holder(1, s) for s in (12, 13, 19, 20, 21)] == [1, 3, 3, 4, 4]
    assert (book.holder(0, 21), book.last_join(1), book.last_join(0)) == (0, 20, -1)


def test_a_part_the_dead_rank_never_brought_is_missed_once_its_spare_joined_after_the_step():
    """Host rank 1 posted its part of step 12, died before it came whole (a loaded box: the keeper had
    not pulled it), and spare 3 took its seat with the state of step 13. The step-12 checkpoint is
    torn at once. Before (the seat's holder asked *now*, the living spare) the keeper waited for it
    until --peer-timeout (600 s by default): a rollback run hung at its end, every host rank
    waiting for its last hand-off."""
    route = seats_route({0: [header(StateKind.CHECKPOINT, 12, 0, 0)],
                         3: [header(StateKind.JOIN, 13, 1, 3), header(StateKind.CHECKPOINT, 14, 1, 3)]},
                        dead={1}, peer_timeout=5)
    route.last_order = 10
    t0 = time.monotonic()
    handoff = route.receive()
    assert time.monotonic() - t0 < 1.0
    assert [p.head["seat"] for p in handoff.parts] == [0] and handoff.missed == [1]
    assert route.headers.queue[3] == [header(StateKind.CHECKPOINT, 14, 1, 3)]   # (the spare's next: its turn)


def test_a_part_the_spare_brings_is_waited_for_and_a_silent_living_one_times_out_by_name():
    """The spare joined at step 12 (it re-sends step 12's hand-off): seat 1's part is the spare's to
    bring, so the keeper waits for it; a living spare that never sends it is named at the timeout."""
    route = seats_route({0: [header(StateKind.CHECKPOINT, 12, 0, 0)], 3: [header(StateKind.JOIN, 12, 1, 3)]},
                        dead={1}, peer_timeout=0.3)
    route.last_order = 10
    with pytest.raises(PeerError, match=r"hand-off of step 12 from host rank 1 \(world rank 3|"
                                        r"hand-off of step 12 from spare rank 0 \(world rank 3"):
        route.receive()
