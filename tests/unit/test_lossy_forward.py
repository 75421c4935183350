"""`--recovery lossy-forward`: host ranks survive a dead host rank inside the job (ULFM).

Pure parts: refused flag combinations, which deaths are survived, the takeover's slices and the
lost-sample accounting. Real jobs (host ranks SIGKILLed by `--inject`): the failed step equals the
recovery study's simulated lossy forward to the bit, the lost samples are exactly the dead rank's
batches, and the survivors train every sample of the following epochs.

(The tests of this feature that start processes: tests/jobs/test_lossy_forward.py.)
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from torch.utils.data import DistributedSampler

from dpuoffload.common.config import parse_run_config
from dpuoffload.common.data.loaders import Sampling
from dpuoffload.common.errors import ConfigError
from dpuoffload.common.faults.watch import require_ft
from dpuoffload.host.recovery.survivors import LossyForward, Shrink, Takeover
from tests.unit.test_dpu_failure import D, H, topo_of
from tests.unit.test_dpu_failure import judge as _judge


def order(n: int, replicas: int, rank: int, epoch: int) -> list[int]:
    """The failure-free run's sample order of one host rank (DistributedSampler, seed 0)."""
    s = DistributedSampler(range(n), num_replicas=replicas, rank=rank, shuffle=True, seed=0)
    s.set_epoch(epoch)
    return list(s)


@pytest.mark.parametrize("flags,message", [
    (["--mode", "mv", "--dpu-failure", "fallback"], "cannot go with --dpu-failure fallback in --mode mv"),
    (["--mode", "hybrid", "--mv-dpu-fraction", "auto"], "cannot go with --mv-dpu-fraction auto"),
    (["--mode", "naive"], "cannot go with --mode naive"),
    (["--allreduce", "horovod"], "Horovod and torch.distributed cannot shrink their group"),
    (["--ckpt-dir", "/tmp/x", "--ckpt-every", "2", "--dpu-failure", "fallback"],
     "cannot go with --dpu-failure fallback with checkpoints"),
    (["--clone-at", "4"], "cannot go with clones"),
    (["--inject-simulate", "host:1@3"], "simulated and real failures: one at a time"),
])
def test_refused_combinations(flags, message):
    with pytest.raises(ConfigError, match=message):
        parse_run_config(["--recovery", "lossy-forward", *flags])


def test_flags_and_fault_tolerance():
    with pytest.raises(ConfigError, match="--reassign hands a dead host rank's samples to the survivors: add "
                                          "--recovery lossy-forward"):
        parse_run_config(["--reassign"])
    cfg = parse_run_config(["--recovery", "lossy-forward", "--mode", "da"])
    assert cfg.allreduce == "mpi" and cfg.fault_tolerant
    # (DPU memory keeps only whole hand-offs: after a shrink a relaunch reads the disk, re-sliced)
    assert parse_run_config(["--recovery", "lossy-forward", "--ckpt-dir", "/tmp/x", "--ckpt-every", "2",
                             "--ckpt-mem-keep", "1"]).ckpt_mem_keep == 1
    with pytest.raises(ConfigError, match="--recovery lossy-forward needs MPI fault tolerance"):
        require_ft(cfg)  # (this process was not started by mpirun --with-ft ulfm)


def judge(flags, layout, dead, gone=(), seated=None):
    from dpuoffload.common.faults.watch import verdict
    from dpuoffload.common.plan.offload import plan_offload

    cfg = parse_run_config(flags)
    topo = topo_of(layout)
    return verdict(dead, topo, cfg, plan_offload(topo.ranks, cfg), frozenset({dead, *gone}),
                   None if seated is None else frozenset(seated))


def test_which_host_deaths_are_survived():
    two = [(H, "n0"), (H, "n0"), (D, "n0"), (D, "n0")]
    lf = ["--recovery", "lossy-forward", "--mode", "da"]
    host = judge(lf, two, 1)
    assert host.survivable and host.what == "it trained; the 1 surviving host rank(s) go on without it"
    assert host.by == "--recovery lossy-forward"
    assert not judge(lf, two, 1, gone=[0]).survivable  # the last one
    assert not _judge(["--mode", "da"], two, 1).survivable  # no --recovery
    # host rank 1's feeder dying with it (node:1) is survived; without its host, it is a lost DPU rank
    assert judge(lf, two, 3, gone=[1]).what == "it fed only host ranks that died with it"
    alone = judge(lf, two, 3)
    assert not alone.survivable and "without --dpu-failure fallback" in alone.what
    assert judge([*lf, "--dpu-failure", "fallback"], two, 3).survivable


def test_with_spare_ranks_lossy_forward_fills_seats_and_judges_deaths_by_them():
    """`dpurun --spare-ranks` beside lossy forward: spares fill seats (the group grows back at the next
    epoch: `host.recovery.growback`), so every peer takes a seat's requests from the spare in it, and a
    death is judged by the seats as under rollback, in lossy forward's words."""
    from dpuoffload.common.runtime.roles import Role

    lf = ["--recovery", "lossy-forward", "--mode", "da"]
    policy = parse_run_config(lf).recovery_policy
    assert policy.fills_seats(1) and not policy.fills_seats(0) and not policy.uses_spares
    assert parse_run_config(["--recovery", "rollback"]).recovery_policy.fills_seats(0)
    assert not parse_run_config([]).recovery_policy.fills_seats(1)
    layout = [(H, "n0"), (H, "n0"), (D, "n0"), (Role.SPARE, "n0")]
    host = judge(lf, layout, 1)
    assert host.survivable and host.by == "--recovery lossy-forward"
    assert host.what == ("it trained; the surviving host ranks go on without it, and a spare rank takes its seat at "
                         "the next epoch if one is left")
    assert judge(lf, layout, 0, gone=[1], seated=[0, 3]).survivable  # the spare seated in host rank 1's place
    assert not judge(lf, layout, 3, gone=[0, 1], seated=[0, 3]).survivable  # no seated rank left


def test_takeover_slices_cover_a_dead_ranks_batch_once():
    sampling = Sampling(batch_size=10, replicas=4, rank=0, seed=0)
    data = list(range(100))
    slices = [Takeover(data, sampling, (1, 3), j, 3).mine(2, 1) for j in range(3)]
    expected = order(100, 4, 1, 2)[10:20] + order(100, 4, 3, 2)[10:20]
    assert sorted(i for s in slices for i in s) == sorted(expected)
    assert [len(s) for s in slices] == [8, 6, 6]  # 10 = 4 + 3 + 3 of each dead rank's batch


@dataclass
class Group:
    """The few fields of a SurvivorGroup that `LossyForward` reads (its shrinks, as MPI made them)."""

    alive: tuple[int, ...] = (0, 1, 2)
    shrinks: list[Shrink] = field(default_factory=list)
    start_size: int = 3

    def Get_rank(self) -> int:  # noqa: N802
        return self.alive.index(0)

    def Get_size(self) -> int:  # noqa: N802
        return len(self.alive)

    def lose(self, rank: int) -> None:
        before = self.alive
        self.alive = tuple(r for r in before if r != rank)
        self.shrinks.append(Shrink((rank,), before, self.alive, 0.01, 0.001, 0.0))


@pytest.mark.parametrize("reassign", [False, True])
def test_lost_samples_and_takeover_start(reassign):
    group, sampling = Group(), Sampling(batch_size=4, replicas=3, rank=0, seed=0)
    lf = LossyForward(group, list(range(60)), sampling, steps=5, reassign=reassign)
    group.lose(2)
    [failure] = lf.check(epoch=0, step=1, global_step=2)
    dead = order(60, 3, 2, 0)
    assert failure.lost_ids == (dead[4:8] if reassign else dead[4:20])
    assert lf.takeover_at(0, 2) is (lf.takeovers[0][1] if reassign else None)
    assert lf.takeover_at(1, 0) is lf.takeovers[0][1]
    # a second death: rank 1's own batch and its share of rank 2's batch are lost too
    group.lose(1)
    [second] = lf.check(epoch=1, step=3, global_step=9)
    share = [int(i) for i in order(60, 3, 2, 1)[12:16][2:]]  # survivor 1 of 2 took the second half
    assert second.lost_ids[:4] == order(60, 3, 1, 1)[12:16]
    assert second.lost_ids[4:6] == share
    assert lf.takeover_at(1, 3) is lf.takeovers[0][1]  # the first takeover applies until the second's begins
    assert lf.takeover_at(1, 4) is lf.takeovers[-1 if reassign else 0][1]
    assert lf.takeovers[-1][1].dead == (1, 2) and lf.takeovers[-1][0] == ((1, 4) if reassign else (2, 0))
