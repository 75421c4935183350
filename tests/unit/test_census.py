"""tests/census.py: what a process is, which test started it, and the summary's arithmetic (`/proc` of this
process only: no process started here)."""

import os

from tests.census import Census, Process, kind_of, started_by, summary


def test_a_process_is_named_by_its_command_line_the_programs_own_parts_first():
    py = "/repo/.venv/bin/python"
    assert kind_of([py, "-m", "dpuoffload.host", "--preset", "debug", "--data", "/tmp/pytest-of-root/x"]) == "host rank"
    assert kind_of([py, "-m", "dpuoffload.dpu", "--mode", "da"]) == "DPU rank"
    assert kind_of([py, "-m", "dpuoffload.launch.probe", "--host-ranks", "2", "--"]) == "dry import"
    assert kind_of([py, "/repo/benchmarks/checkpoint.py", "--quick"]) == "benchmark"
    assert kind_of([py, "-m", "benchmarks.clone_host", "--preset", "debug"]) == "benchmark"
    assert kind_of([py, "/repo/.venv/bin/dpurun", "--host-ranks", "2"]) == "dpurun"
    assert kind_of(["/repo/.venv/bin/prterun", "--np", "2"]) == "mpirun"
    assert kind_of([py, "-u", "-c", "import sys;exec(eval(sys.stdin.readline()))"]) == "pytest"
    assert kind_of([py, "-m", "tests.census", "out.json", "--", py, "-m", "pytest"]) == "census"
    assert kind_of(["/usr/sbin/slurmctld", "-D"]) == "Slurm"
    assert kind_of(["/usr/bin/ssh", "h1"]) == "ssh" and kind_of([]) == "kernel"


def test_the_test_comes_from_the_environment_the_process_started_with():
    env = {"PATH": "/bin", "PYTEST_CURRENT_TEST": "tests/jobs/test_rollback.py::test_x[rollback] (call)"}
    assert started_by(env) == "tests/jobs/test_rollback.py"
    assert started_by({"PATH": "/bin"}) == ""


def test_a_sample_finds_this_process_and_counts_only_the_cpu_used_after_the_first():
    census = Census()
    census.sample()
    me = next(p for (pid, _), p in census.seen.items() if pid == os.getpid())
    assert me.cpu_s == 0.0 and me.baseline_s > 0  # (there before the census: its CPU so far is not counted)
    deadline = os.times().elapsed + 0.3
    while os.times().elapsed < deadline:
        pass  # (a third of a second of CPU)
    census.sample()
    assert 0.1 < me.cpu_s < 5


def test_the_summary_adds_up_by_kind_and_by_test_file():
    procs = [Process(1, "host rank", "tests/jobs/a.py", "", 4.0), Process(2, "host rank", "tests/jobs/a.py", "", 3.0),
             Process(3, "DPU rank", "tests/jobs/b.py", "", 2.0), Process(4, "pytest", "", "", 1.0)]
    text = summary(procs, wall_s=5.0)
    assert text.splitlines()[0] == "census: 10 CPU s in 5 s of wall (2.00 cores busy)"
    assert "     7.0 s      2 processes   3.50 s each  host rank" in text
    assert "     7.0 s  tests/jobs/a.py: host rank 7" in text and "(outside any test): pytest 1" in text
