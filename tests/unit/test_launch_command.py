"""Exact mpirun commands and placements of `dpurun`, without starting MPI.

(The tests of this feature that start processes: tests/jobs/test_launch_command.py.)
"""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from dpuoffload.common.runtime import env
from dpuoffload.common.runtime.roles import RankInfo, Role, node_of, pair_ranks
from dpuoffload.launch import cli, placement, throttle
from dpuoffload.launch.command import LaunchSpec, MpiFlavor, build_command
from dpuoffload.launch.placement import Node

MPIRUN = "/venv/bin/mpirun"
PY = "/venv/bin/python"
TRAIN = ("--preset", "debug", "--dataset", "fake")


def local_spec(**changes) -> LaunchSpec:
    values = dict(mpirun=MPIRUN, host_ranks=1, dpu_ranks=1, host_python=PY, dpu_python=PY,
                  training_args=TRAIN, host_cores=(0,), dpu_cores=(1,))
    values.update(changes)
    return LaunchSpec(**values)


def cluster_spec(**changes) -> LaunchSpec:
    values = dict(mpirun=MPIRUN, host_ranks=16, dpu_ranks=4, host_python=PY, dpu_python="/dpu/python",
                  training_args=TRAIN, host_nodes=(Node("n1", 8), Node("n2", 8)),
                  dpu_nodes=(Node("n1-bf", 2), Node("n2-bf", 2)),
                  node_map=(("n1-bf", "n1"), ("n2-bf", "n2")), host_threads=2, dpu_threads=4)
    values.update(changes)
    return LaunchSpec(**values)


HOST_TAIL = [PY, "-m", "dpuoffload.host", *TRAIN]
DPU_TAIL = [PY, "-m", "dpuoffload.dpu", *TRAIN]
ENV1 = ["env", "OMP_NUM_THREADS=1", "DPUOFFLOAD_THREADS=1"]
YIELD = "OMPI_MCA_mpi_yield_when_idle=1"  # (command._yield_env: the host program's waits give up the core)


# ------------------------------------------------------------------------ local emulation
def test_local_default_openmpi():
    assert build_command(local_spec()) == [
        MPIRUN, "--bind-to", "none", "--use-hwthread-cpus", "--mca", "btl", "^ofi",
        "-np", "1", *ENV1, YIELD, "taskset", "-c", "0", *HOST_TAIL,
        ":", "-np", "1", *ENV1, "taskset", "-c", "1", *DPU_TAIL]


def test_session_base_goes_to_mpiruns_own_node_and_the_users_setting_wins():
    base = ["--bind-to", "none", "--use-hwthread-cpus", "--mca", "btl", "^ofi"]
    own = ["--prtemca", "prte_local_tmpdir_base", "/tmp/dpurun-mpi-x"]
    assert build_command(local_spec(session_base="/tmp/dpurun-mpi-x"))[:10] == [MPIRUN, *base, *own]
    users = ("--prtemca", "prte_local_tmpdir_base", "/scratch/mine")
    assert build_command(local_spec(session_base="/tmp/dpurun-mpi-x", extra_args=users))[:10] == [MPIRUN, *base, *users]
    assert "--prtemca" not in build_command(cluster_spec(flavor="mpich", session_base="/tmp/dpurun-mpi-x"))


def test_the_host_programs_waits_yield_their_core_unless_the_user_sets_it():
    """Host ranks (and clone or spare ranks: the host program) yield; the DPU program's waits sleep
    already, and it keeps Open MPI's default; a setting of the user's replaces it."""
    cmd = build_command(local_spec(clone_ranks=1))
    assert cmd.count(YIELD) == 2 and cmd.index(YIELD) < cmd.index(":")
    assert YIELD not in cmd[cmd.index(":"):cmd.index("dpuoffload.dpu")]  # (the DPU context)
    users = ("--mca", "mpi_yield_when_idle", "0")
    assert YIELD not in build_command(local_spec(extra_args=users))
    assert YIELD not in build_command(local_spec(yield_when_idle=False))  # (dpurun: the user's environment)
    assert YIELD not in build_command(local_spec(flavor="mpich"))


def test_local_root_oversubscribe_threads_and_core_ranges():
    spec = local_spec(host_ranks=2, dpu_ranks=3, host_cores=(0, 1, 2, 5), dpu_cores=(6, 7),
                      host_threads=2, dpu_threads=1, oversubscribe=True, run_as_root=True,
                      extra_args=("--mca", "btl", "self,vader"))
    assert build_command(spec) == [
        MPIRUN, "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "--use-hwthread-cpus",
        "--mca", "btl", "self,vader",
        "-np", "2", "env", "OMP_NUM_THREADS=2", "DPUOFFLOAD_THREADS=2", YIELD, "taskset", "-c", "0-2,5",
        *HOST_TAIL,
        ":", "-np", "3", *ENV1, "taskset", "-c", "6-7", *DPU_TAIL]


def test_local_throttled_dpu_enters_cgroup_before_exec():
    cg = "/sys/fs/cgroup/cpu/dpuoffload-42"
    assert build_command(local_spec(cgroup=cg)) == [
        MPIRUN, "--bind-to", "none", "--use-hwthread-cpus", "--mca", "btl", "^ofi",
        "-np", "1", *ENV1, YIELD, "taskset", "-c", "0", *HOST_TAIL,
        ":", "-np", "1", *ENV1, f"DPUOFFLOAD_CGROUP={cg}", "taskset", "-c", "1",
        "sh", "-c", f'echo $$ > {cg}/cgroup.procs && exec "$@"', "dpuoffload-cgexec", *DPU_TAIL]


def test_cgroup_path_with_spaces_is_quoted_for_the_shell():
    cmd = build_command(local_spec(cgroup="/cg/my group"))
    assert "echo $$ > '/cg/my group/cgroup.procs' && exec \"$@\"" in cmd


def test_no_dpu_ranks_gives_one_app_context():
    spec = local_spec(dpu_ranks=0, dpu_cores=None, host_cores=(0, 1))
    assert build_command(spec) == [MPIRUN, "--bind-to", "none", "--use-hwthread-cpus", "--mca", "btl", "^ofi",
                                   "-np", "1",
                                   *ENV1, YIELD, "taskset", "-c", "0-1", *HOST_TAIL]


def test_local_mpich_has_no_openmpi_flags():
    spec = local_spec(flavor="mpich", oversubscribe=True, run_as_root=True)
    assert build_command(spec) == [
        MPIRUN, "-n", "1", *ENV1, "taskset", "-c", "0", *HOST_TAIL,
        ":", "-n", "1", *ENV1, "taskset", "-c", "1", *DPU_TAIL]


# ------------------------------------------------------------------------------- cluster mode
NODE_MAP = "DPUOFFLOAD_NODE_MAP=n1-bf=n1,n2-bf=n2"


KEEPALIVE = ["--prtemca", "oob_tcp_keepalive_time", "15", "--prtemca", "oob_tcp_keepalive_intvl", "5",
             "--prtemca", "oob_tcp_keepalive_probes", "3"]  # (a lost machine noticed within 30 s)


def test_cluster_openmpi_per_app_context_hosts_and_node_map():
    assert build_command(cluster_spec()) == [
        MPIRUN, "--bind-to", "none", *KEEPALIVE,
        "-np", "16", "--host", "n1:8,n2:8",
        "env", "OMP_NUM_THREADS=2", "DPUOFFLOAD_THREADS=2", NODE_MAP, YIELD, *HOST_TAIL,
        ":", "-np", "4", "--host", "n1-bf:2,n2-bf:2",
        "env", "OMP_NUM_THREADS=4", "DPUOFFLOAD_THREADS=4", NODE_MAP,
        "/dpu/python", "-m", "dpuoffload.dpu", *TRAIN]


def test_cluster_mpich_one_global_host_list_hosts_first():
    assert build_command(cluster_spec(flavor="mpich")) == [
        MPIRUN, "-hosts", "n1:8,n2:8,n1-bf:2,n2-bf:2",
        "-n", "16", "env", "OMP_NUM_THREADS=2", "DPUOFFLOAD_THREADS=2", NODE_MAP, *HOST_TAIL,
        ":", "-n", "4", "env", "OMP_NUM_THREADS=4", "DPUOFFLOAD_THREADS=4", NODE_MAP,
        "/dpu/python", "-m", "dpuoffload.dpu", *TRAIN]


def test_spec_rejects_inconsistent_fields():
    with pytest.raises(ValueError, match="host_cores .* or host_nodes"):
        local_spec(host_nodes=(Node("n1", 1),))
    with pytest.raises(ValueError, match="local emulation only"):
        cluster_spec(cgroup="/cg")
    with pytest.raises(ValueError, match="host_nodes place 16 ranks, expected host_ranks=3"):
        cluster_spec(host_ranks=3)
    with pytest.raises(ValueError, match="flavor 'intel' is not one of openmpi, mpich"):
        local_spec(flavor="intel")
    assert local_spec(flavor="mpich").flavor is MpiFlavor.MPICH  # (a plain name, as from --mpi-flavor)


# ------------------------------------------------------------------------------- placement
@pytest.mark.parametrize("ncores,n,m,expected_dpu", [
    (2, 1, 1, (1,)),
    (8, 3, 1, (6, 7)),
    (8, 1, 1, (4, 5, 6, 7)),
    (2, 1, 8, (1,)),        # at least one core stays with the host
    (16, 15, 1, (15,)),     # at least one core for the DPU side
])
def test_plan_local_default_split(ncores, n, m, expected_dpu):
    plan = placement.plan_local(n, m, range(ncores), oversubscribe=True)
    assert plan.dpu_cores == expected_dpu
    assert plan.host_cores == tuple(c for c in range(ncores) if c not in expected_dpu)


def test_plan_local_respects_affinity_and_explicit_cores():
    plan = placement.plan_local(2, 1, [4, 5, 6, 9], dpu_cores=[5])
    assert (plan.host_cores, plan.dpu_cores, plan.oversubscribed) == ((4, 6, 9), (5,), False)


def test_plan_local_single_core_shared_when_oversubscribing():
    plan = placement.plan_local(1, 1, [3], oversubscribe=True)
    assert (plan.host_cores, plan.dpu_cores, plan.oversubscribed) == ((3,), (3,), True)


def test_plan_local_without_dpu_ranks_uses_every_core():
    plan = placement.plan_local(2, 0, [0, 1])
    assert (plan.host_cores, plan.dpu_cores) == ((0, 1), ())


@pytest.mark.parametrize("text,cores", [("1", (1,)), ("2-3", (2, 3)), ("2,3", (2, 3)),
                                        ("0-1,4", (0, 1, 4)), ("3,1,1", (1, 3))])
def test_core_lists_round_trip(text, cores):
    assert placement.parse_core_list(text) == cores
    assert placement.parse_core_list(placement.format_core_list(cores)) == cores


def test_format_core_list_compresses_runs():
    assert placement.format_core_list([5, 0, 1, 2, 7, 8]) == "0-2,5,7-8"


def test_fill_places_in_order_and_spreads_oversubscription():
    nodes = (Node("a", 2), Node("b", 2), Node("c", 2))
    assert placement.fill(nodes, 3) == (Node("a", 2), Node("b", 1))
    assert placement.fill(nodes, 8) == (Node("a", 3), Node("b", 3), Node("c", 2))


def test_plan_cluster_pairs_dpu_i_with_host_node_i():
    hosts = placement.parse_node_list("n1:8,n2:8", "--hosts")
    dpus = placement.parse_node_list("n1-bf:2,n2-bf:2", "--dpus")
    plan = placement.plan_cluster(12, 4, hosts, dpus)
    assert plan.host_nodes == (Node("n1", 8), Node("n2", 4))
    assert plan.dpu_nodes == (Node("n1-bf", 2), Node("n2-bf", 2))
    assert plan.node_map == (("n1-bf", "n1"), ("n2-bf", "n2"))
    assert not plan.oversubscribed


def test_hostfiles_parse_like_open_mpi(tmp_path: Path):
    hf = tmp_path / "hosts"
    hf.write_text("# host nodes\nn1 slots=8\n\nn2  slots=4 max_slots=8  # comment\n")
    assert placement.parse_hostfile(str(hf), "--hostfile") == (Node("n1", 8), Node("n2", 4))


def test_node_map_pairs_ranks_of_the_same_node():
    """The placement's node map, as the ranks parse it, pairs host and DPU ranks per node."""
    hosts = placement.parse_node_list("n1:2,n2:2", "--hosts")
    dpus = placement.parse_node_list("n1-bf:1,n2-bf:1", "--dpus")
    plan = placement.plan_cluster(4, 2, hosts, dpus)
    node_map = env.parse_node_map(env.format_node_map(dict(plan.node_map)))
    names = [n.name for n in plan.host_nodes for _ in range(n.slots)]
    names += [n.name for n in plan.dpu_nodes for _ in range(n.slots)]
    ranks = [RankInfo(world_rank=i, role=Role.HOST if i < 4 else Role.DPU, hostname=h,
                      node=node_of(h, node_map)) for i, h in enumerate(names)]
    assert pair_ranks(ranks).host_to_dpus == {0: (4,), 1: (4,), 2: (5,), 3: (5,)}


# ---------------------------------------------------------------------------------- throttle
def fake_v1_tree(tmp_path: Path, own: str = "/") -> tuple[Path, Path]:
    root = tmp_path / "cgroup"
    (root / "cpu" / own.lstrip("/")).mkdir(parents=True)
    (root / "cpu" / "cpu.cfs_quota_us").write_text("-1")
    proc = tmp_path / "proc_cgroup"
    proc.write_text(f"4:memory:/x\n1:cpu,cpuacct:{own}\n0::/\n")
    return root, proc


def test_quota_is_speed_times_period_times_cores():
    assert throttle.quota_us(0.25, 1) == 25_000
    assert throttle.quota_us(0.5, 3) == 150_000
    assert throttle.quota_us(0.001, 1) == throttle.MIN_QUOTA_US


def test_plan_cgroup_v1_nests_under_own_cgroup(tmp_path: Path):
    root, proc = fake_v1_tree(tmp_path, own="/jobs/7")
    plan = throttle.plan_cgroup(0.25, 2, pid=42, root=root, proc_cgroup=proc)
    assert plan == throttle.CgroupPlan(str(root / "cpu/jobs/7/dpuoffload-42"), 1, 100_000, 50_000)


def test_create_and_remove_v1_cgroup(tmp_path: Path):
    root, proc = fake_v1_tree(tmp_path)
    plan = throttle.plan_cgroup(0.5, 1, pid=1, root=root, proc_cgroup=proc)
    throttle.create(plan)
    assert (Path(plan.path) / "cpu.cfs_quota_us").read_text() == "50000"
    for f in Path(plan.path).iterdir():  # a real cgroupfs has no files to delete; emulate that
        f.unlink()
    assert throttle.remove(plan) is None and not Path(plan.path).exists()


def test_plan_cgroup_v2(tmp_path: Path):
    root = tmp_path / "cgroup"
    root.mkdir()
    (root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    plan = throttle.plan_cgroup(0.25, 1, pid=9, root=root, proc_cgroup=tmp_path / "none")
    assert (plan.version, plan.path) == (2, str(root / "dpuoffload-9"))


def test_plan_cgroup_without_controller_says_why(tmp_path: Path):
    with pytest.raises(throttle.ThrottleUnavailable, match="no cgroup cpu controller"):
        throttle.plan_cgroup(0.25, 1, root=tmp_path, proc_cgroup=tmp_path / "none")


# ------------------------------------------------------------------ the CLI builds the same
@pytest.fixture
def four_cores(monkeypatch):
    monkeypatch.setattr(cli.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    monkeypatch.setattr(cli.os, "geteuid", lambda: 1000)


def dry_run(capsys, *argv: str) -> list[str]:
    assert cli.main(["--dry-run", "--mpirun", "/bin/true", "--python", PY, *argv]) == 0
    return shlex.split(capsys.readouterr().out)


def test_cli_local_defaults(four_cores, capsys):
    cmd = dry_run(capsys, "--mpi-flavor", "openmpi", "--host-ranks", "3", "--", *TRAIN)
    assert cmd == ["/bin/true", "--bind-to", "none", "--use-hwthread-cpus", "--mca", "btl", "^ofi",
                   "-np", "3", *ENV1, YIELD, "taskset", "-c", "0-2", *HOST_TAIL,
                   ":", "-np", "1", *ENV1, "taskset", "-c", "3", *DPU_TAIL]


def test_cli_leaves_the_yield_to_a_users_environment(four_cores, capsys, monkeypatch):
    monkeypatch.setenv("OMPI_MCA_mpi_yield_when_idle", "0")
    assert YIELD not in dry_run(capsys, "--mpi-flavor", "openmpi", "--", *TRAIN)


def test_cli_threads_from_core_share_and_flags(four_cores, capsys):
    cmd = dry_run(capsys, "--mpi-flavor", "openmpi", "--dpu-cores", "2-3", "--dpu-threads", "1",
                  "--", *TRAIN)
    assert cmd[cmd.index("taskset") - 3:cmd.index("taskset") + 3] == [
        "OMP_NUM_THREADS=2", "DPUOFFLOAD_THREADS=2", YIELD, "taskset", "-c", "0-1"]
    assert cmd[cmd.index(":"):cmd.index(":") + 8] == [":", "-np", "1", *ENV1, "taskset", "-c"]


def test_cli_oversubscribe_prints_note(four_cores, capsys):
    assert cli.main(["--dry-run", "--mpirun", "/bin/true", "--mpi-flavor", "openmpi",
                     "--host-ranks", "4", "--oversubscribe", "--", *TRAIN]) == 0
    out = capsys.readouterr()
    assert "--oversubscribe" in shlex.split(out.out)
    assert "note: oversubscribing: 4 host rank(s) on core(s) 0-2" in out.err


def test_cli_cluster_with_hostfiles(tmp_path, capsys):
    (tmp_path / "h").write_text("n1 slots=4\nn2 slots=4\n")
    (tmp_path / "d").write_text("n1-bf slots=8\nn2-bf slots=8\n")
    cmd = dry_run(capsys, "--mpi-flavor", "openmpi", "--hostfile", str(tmp_path / "h"),
                  "--dpu-hostfile", str(tmp_path / "d"), "--host-ranks", "8", "--dpu-ranks", "16",
                  "--", *TRAIN)
    assert cmd[cmd.index("-np"):cmd.index("-np") + 4] == ["-np", "8", "--host", "n1:4,n2:4"]
    assert cmd[cmd.index(":"):cmd.index(":") + 5] == [":", "-np", "16", "--host", "n1-bf:8,n2-bf:8"]
    assert cmd.count(NODE_MAP) == 2
    assert "OMP_NUM_THREADS=1" in cmd  # 4 slots / 4 ranks per host node


def test_cli_cluster_mpich_from_lists(capsys):
    cmd = dry_run(capsys, "--mpi-flavor", "mpich", "--hosts", "n1:2,n2:2", "--dpus",
                  "n1-bf:1,n2-bf:1", "--host-ranks", "4", "--dpu-ranks", "2", "--", *TRAIN)
    assert cmd[:3] == ["/bin/true", "-hosts", "n1:2,n2:2,n1-bf:1,n2-bf:1"]


def test_cli_dpu_python_defaults_to_python(four_cores, capsys):
    cmd = dry_run(capsys, "--mpi-flavor", "openmpi", "--", *TRAIN)
    assert cmd.count(PY) == 2
    cmd = dry_run(capsys, "--mpi-flavor", "openmpi", "--dpu-python", "/arm/python", "--", *TRAIN)
    assert cmd[cmd.index("dpuoffload.dpu") - 2] == "/arm/python"


def test_clone_ranks_are_a_third_app_context_on_the_host_cores():
    cmd = build_command(local_spec(clone_ranks=2))
    contexts = " ".join(cmd).split(" : ")
    assert len(contexts) == 3
    assert contexts[2].startswith("-np 2 env ") and "taskset -c 0" in contexts[2]
    assert contexts[2].endswith(f"{PY} -m dpuoffload.host {' '.join(TRAIN)}")


def test_clone_cores_pin_the_clone_context_only():
    contexts = " ".join(build_command(local_spec(clone_ranks=1, clone_cores=(1,)))).split(" : ")
    assert "taskset -c 0 " in contexts[0] and "taskset -c 1 " in contexts[2]


def test_the_users_opt_outs_reach_every_rank_on_every_node(monkeypatch):
    """mpirun forwards no environment to other nodes: dpurun sets the opt-outs the user set (and
    only those) in every app context's `env` prefix."""
    monkeypatch.setenv("DPUOFFLOAD_FAST_EXIT", "0")
    monkeypatch.setenv("DPUOFFLOAD_IMPORT_AHEAD", "0")
    monkeypatch.delenv("DPUOFFLOAD_MALLOC", raising=False)
    monkeypatch.delenv("DPUOFFLOAD_GC_FREEZE", raising=False)
    monkeypatch.setattr(cli, "resolve_mpirun", lambda path: MPIRUN)  # (the command is only built: no MPI needed)
    args = cli.parse_launcher_args(["--hosts", "n1:2", "--dpus", "n1-bf:1", "--host-ranks", "2", "--dpu-ranks", "1",
                                    "--clone-ranks", "1", "--mpi-flavor", "openmpi"])
    spec, _ = cli.resolve_spec(args, TRAIN)
    contexts = " ".join(build_command(spec)).split(" : ")
    assert len(contexts) == 3
    for context in contexts:
        assert "DPUOFFLOAD_FAST_EXIT=0 DPUOFFLOAD_IMPORT_AHEAD=0 " in context, context
        assert "DPUOFFLOAD_MALLOC" not in context and "DPUOFFLOAD_GC_FREEZE" not in context


def test_a_users_keepalive_setting_wins_and_one_box_sets_none():
    spec = cluster_spec(extra_args=("--prtemca", "oob_tcp_keepalive_time", "60"))
    cmd = build_command(spec)
    assert cmd.count("oob_tcp_keepalive_time") == 1 and cmd[cmd.index("oob_tcp_keepalive_time") + 1] == "60"
    assert "oob_tcp_keepalive_intvl" in cmd
    assert "oob_tcp_keepalive_time" not in build_command(local_spec())
