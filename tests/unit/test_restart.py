"""Restart from DPU memory (`--ckpt-mem-keep`, `dpurun --restarts N`), issue 13 item 2.

Pure: the memory store (complete steps only, pruning, layout filter), the restart choice (the newest
step every keeper holds, unless the disk is newer), the relaunch flags, what is (not) restarted, the
report from the supervisor's event times.

Real jobs (2 host + 2 DPU ranks, da, checkpoints every 2 steps, host rank 0 killed after step 7):
- `dpurun --restarts 1` relaunches, resumes from DPU memory at step 6, replays 1 step, and ends with
  the uninterrupted run's weights and epoch records, to the bit;
- with the disk checkpoints deleted after the failure, `--resume latest` still resumes from DPU
  memory (the disk is not read) to the same weights.

(The tests of this feature that start processes: tests/jobs/test_restart.py.)
"""

import json
import os
import stat

import numpy as np
import pytest

from dpuoffload.common.runtime.messages import CKPT_HEADER, StateKind
from dpuoffload.common.state.memstore import MemoryStore, memory_root, restart_step
from dpuoffload.launch import restart
from dpuoffload.launch.supervise import JobOutcome, RankFailure


def handoff(sender: int, step: int, nbytes: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    meta = json.dumps({"step": step, "host_ranks": 2}).encode()
    small = np.frombuffer(meta + bytes([sender]) * 5, dtype=np.uint8)
    head = CKPT_HEADER.pack(kind=StateKind.CHECKPOINT, global_step=step, sender=sender, senders=2,
                            meta_nbytes=len(meta), small_nbytes=small.nbytes, shared_nbytes=nbytes)
    return head, small, np.arange(nbytes, dtype=np.uint8)


def test_memory_store_keeps_the_newest_complete_steps(tmp_path):
    store = MemoryStore(tmp_path, keeper=1, keep=2)
    for step in (2, 4, 6):
        assert store.put(step, [handoff(0, step, 100), handoff(1, step, 50)]) > 150
    assert store.steps() == [4, 6] and store.steps([0, 1]) == [4, 6] and store.steps([2]) == []
    head, small, shared = store.get(6, 1)
    assert CKPT_HEADER.unpack(head)["sender"] == 1 and (shared == np.arange(50, dtype=np.uint8)).all()
    assert bytes(small[-5:]) == b"\x01" * 5 and store.meta(6) == {"step": 6, "host_ranks": 2}
    (tmp_path / "keeper-001" / ".step-000000008.partial-1").mkdir()  # a write cut short: not a step
    assert store.steps() == [4, 6]
    store.clear()
    assert store.steps() == []


def test_dpu_memory_is_its_owners_alone(tmp_path, monkeypatch):
    """The hand-offs hold the model and optimizer state: 0700 directories, 0600 files (they were 0755 /
    0644, readable by every user of the DPU); a user directory made before is closed on the next write."""
    monkeypatch.setenv("DPUOFFLOAD_MEM_DIR", str(tmp_path))
    root = memory_root(str(tmp_path / "ck"))
    root.parent.mkdir(mode=0o755)
    os.chmod(root.parent, 0o755)  # (as an older version left it)
    store = MemoryStore(root, keeper=0, keep=1)
    store.put(2, [handoff(0, 2, 10)])
    step = root / "keeper-000" / "step-000000002"
    for d in (root.parent, root, root / "keeper-000", step):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700, d
    assert {stat.S_IMODE(f.stat().st_mode) for f in step.iterdir()} == {0o600}


@pytest.mark.parametrize("held, disk, expected", [
    ([[4, 6], [4, 6]], 6, 6),
    ([[4, 6], [4]], 6, None),          # a keeper lost step 6 and the disk has it: the disk
    ([[4, 6], [4]], 4, 4),             # ... the newest step both keepers hold
    ([[4, 6], [4, 6]], 8, None),       # the disk is newer (DPU memory lost the last one)
    ([[4, 6], [4, 6]], None, 6),       # no disk checkpoint (deleted): memory alone
    ([[6], []], None, None),
    ([], 6, None),
])
def test_restart_step_is_the_newest_step_every_keeper_holds(held, disk, expected):
    assert restart_step(held, disk) == expected


def test_relaunch_flags():
    args = ["--ckpt-dir", "d", "--inject", "host:0@7", "--inject=dpu:0@3", "--resume", "x", "--epochs", "2"]
    # (auto: the ranks resume from what was kept, or start from the beginning if nothing was)
    assert restart.relaunch_args(args) == ["--ckpt-dir", "d", "--epochs", "2", "--resume", "auto"]
    # the failures due after the one that ended the job stay (the next ones of a run that meets a rate)
    rate = ["--inject", "host:1@3,host:0@9", "--inject=host:1@13:term,dpu:0@0.9", "--inject", "node:1@20"]
    assert restart.relaunch_args(rate, failed_step=9) == ["--inject", "host:1@13:term,node:1@20", "--resume", "auto"]
    assert restart.relaunch_args(rate, failed_step=20) == restart.relaunch_args(rate) == ["--resume", "auto"]
    assert restart.first_launch_args(["--epochs", "2"]) == ["--epochs", "2", "--ckpt-mem-keep", "2"]
    assert restart.first_launch_args(["--ckpt-mem-keep=1"]) == ["--ckpt-mem-keep=1"]


def outcome(code: int, *failures: RankFailure, interrupted: bool = False, **events) -> JobOutcome:
    return JobOutcome(code, failures, interrupted, events, ended=10.0)


def test_what_is_restarted():
    died = RankFailure(0, "died", "killed by signal 9 (SIGKILL)", "vm")
    assert restart.refusal(outcome(137, died)) is None
    assert restart.refusal(outcome(1, RankFailure(0, "failed first", "InjectedFailure: injected failure x"))) is None
    bug = RankFailure(1, "failed first", "ValueError: sample 3 is corrupt (at a.py:3 in f)")
    assert restart.refusal(outcome(1, bug)) == \
        "a rank raised an exception (ValueError: sample 3 is corrupt), which a restart would repeat"
    assert "interrupted" in restart.refusal(outcome(130, died, interrupted=True))
    assert "exit 2" in restart.refusal(outcome(2))


def test_the_report_from_the_supervisors_event_times():
    failed = outcome(137, injected=(9.0, ("7",)), noticed=(9.4, ()))
    relaunched = JobOutcome(0, (), False, {"from_memory": (14.0, ("6", "2.2", "8")), "resumed": (14.5, ("6",))}, 20.0)
    rep = restart.report(1, failed, relaunched)
    assert (rep.failed_step, rep.resumed_step, rep.replayed_steps, rep.source) == (7, 6, 1, "dpu-memory")
    assert rep.detected_s == pytest.approx(0.4) and rep.ended_s == pytest.approx(0.6)
    assert rep.resumed_s == pytest.approx(4.5) and rep.transfer_s == 0.008
    assert rep.line() == ("dpurun: restart 1: failure detected after 0.40 s, job ended 0.60 s later, training resumed "
                          "4.50 s after that at global step 6; state from DPU memory (2.2 MB in 8 ms); 1 step(s) "
                          "replayed")


def test_the_report_of_a_rank_killed_from_outside_says_what_is_known():
    """No injected-failure line: neither the death's moment nor its step is printed anywhere, so the report
    says so and bounds the replay by --ckpt-every, instead of printing '?'."""
    failed = outcome(137, noticed=(9.4, ()))
    relaunched = JobOutcome(0, (), False, {"resumed": (14.5, ("6",))}, 20.0)
    rep = restart.report(1, failed, relaunched, ckpt_every=2)
    assert rep.failed_step is None and rep.detected_s is None and rep.ended_s == pytest.approx(0.6)
    assert rep.line() == ("dpurun: restart 1: a rank died outside the program (mpirun's report is the first sign of "
                          "it), job ended 0.60 s later, training resumed 4.50 s after that at global step 6; state "
                          "from the checkpoint disk; up to 1 step(s) replayed (checkpoints every 2 steps; the step "
                          "the rank died in is not known)")
    assert "?" not in restart.report(1, failed, relaunched).line()
