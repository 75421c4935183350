"""A dead DPU rank is not fatal (`--dpu-failure fallback`, issue 13 item 3), under Open MPI's ULFM.

Pure: which deaths the run survives (`faults.verdict`), the flags refused, the mpirun line.
Real jobs (2 host + 2 DPU ranks, `da`, 2 epochs of 256 samples; DPU rank 1 feeds host rank 1):
- DPU rank 1 SIGKILLed: the job ends 0, host rank 1 builds its own batches from the step that did
  not arrive, and every epoch's losses, validation sums and weights equal a `--mode none` run's, to the bit;
- a validation DPU rank SIGKILLed (mv, hybrid): the host ranks validate, the epoch it had not
  reported included, and the run still equals `none`'s to the bit;
- a checkpoint keeper SIGKILLed on getting a checkpoint's state (keeper 0, which commits, or 1): that
  checkpoint is never committed, the next ones are (the other keeper takes the state), training is
  unchanged, and a resume from a checkpoint written after the death is bit-exact;
- a host rank SIGKILLed, and a keeper under --ckpt-mem-keep: the job ends non-zero within
  seconds, dpurun naming the dead rank, and no committed checkpoint is damaged;
- started without fault tolerance, the flag is refused in one line.

(The tests of this feature that start processes: tests/jobs/test_dpu_failure.py.)
"""


import pytest

from dpuoffload.common.config import parse_run_config
from dpuoffload.common.errors import ConfigError
from dpuoffload.common.faults.watch import verdict
from dpuoffload.common.plan.offload import plan_offload
from dpuoffload.common.runtime.roles import RankInfo, Role, Topology, pair_ranks
from dpuoffload.launch.command import LaunchSpec, build_command

H, D = Role.HOST, Role.DPU


def topo_of(layout) -> Topology:
    ranks = tuple(RankInfo(i, role, node, node) for i, (role, node) in enumerate(layout))
    return Topology(world=None, side_comm=None, role=H, ranks=ranks, pairing=pair_ranks(ranks))


def judge(flags, layout, dead):
    cfg = parse_run_config(["--dpu-failure", "fallback", *flags])
    topo = topo_of(layout)
    return verdict(dead, topo, cfg, plan_offload(topo.ranks, cfg))


def test_which_deaths_the_run_survives():
    two = [(H, "n0"), (H, "n0"), (D, "n0"), (D, "n0")]
    feeder = judge(["--mode", "da"], two, 3)
    assert feeder.survivable and feeder.what == "it augmented for host rank 1 (world rank 1, node n0), which " \
                                                 "builds its own batches from here on"
    assert judge(["--mode", "none"], two, 2).survivable  # idle
    assert not judge(["--mode", "da"], two, 1).survivable  # a host rank
    validator = judge(["--mode", "mv"], two, 2)
    assert validator.survivable and validator.what == "it validated; the host ranks validate from here on"
    keeper = judge(["--mode", "da", "--ckpt-dir", "/tmp/x", "--ckpt-every", "2"], two, 2)
    assert keeper.survivable and keeper.what.startswith(
        "it kept the checkpoint state of host rank 0 (world rank 0, node n0) (the living keepers take it from the next "
        "checkpoint)")
    mem = judge(["--mode", "da", "--ckpt-dir", "/tmp/x", "--ckpt-every", "2", "--ckpt-mem-keep", "1"], two, 2)
    assert mem.survivable and mem.what == keeper.what  # (a relaunch reads the disk: the dead keeper's memory stopped)
    clone = judge(["--mode", "da", "--ckpt-dir", "/tmp/x", "--ckpt-every", "2", "--clone-at", "3"], two, 2)
    assert not clone.survivable and "without clones)" in clone.what
    cfg = parse_run_config(["--dpu-failure", "fallback", "--mode", "none", "--ckpt-dir", "/tmp/x", "--ckpt-every", "2"])
    topo = topo_of(two)
    assert not verdict(3, topo, cfg, plan_offload(topo.ranks, cfg), frozenset({2, 3})).survivable  # no keeper left
    # a fan-out: one augmentation rank feeds both host ranks, the other one is left over
    fan = judge(["--mode", "hybrid", "--dpu-da-ranks", "1", "--dpu-mv-ranks", "1"], two, 2)
    assert fan.survivable and "host rank 0 (world rank 0, node n0), host rank 1" in fan.what


@pytest.mark.parametrize("flags,message", [
    (["--mode", "naive"], "DPU ranks train, so a lost one is a lost replica"),
    (["--mode", "da", "--trace", "/tmp/t.json"], "leave out --trace or --dpu-failure fallback"),
])
def test_refused_combinations(flags, message):
    with pytest.raises(ConfigError, match=message):
        parse_run_config(["--dpu-failure", "fallback", *flags])


def test_mpirun_gets_fault_tolerance_and_mpich_is_refused():
    base = dict(mpirun="mpirun", host_python="py", dpu_python="py", host_cores=(0,), dpu_cores=(1,))
    cmd = build_command(LaunchSpec(**base, fault_tolerant=True))
    assert cmd[cmd.index("--with-ft") + 1] == "ulfm"
    assert "--with-ft" not in build_command(LaunchSpec(**base))
    with pytest.raises(ConfigError, match="need Open MPI 5's fault tolerance"):
        LaunchSpec(**base, flavor="mpich", fault_tolerant=True)
