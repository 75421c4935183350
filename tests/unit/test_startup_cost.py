"""Start-up cuts that must not change behaviour: determinism without importing torch._inductor; where a
rank's start-up goes (`StartupClock`).

(The tests of this feature that start processes: tests/jobs/test_startup_cost.py.)
"""



def test_the_startup_clock_gives_each_stage_its_seconds_from_the_process_start(monkeypatch):
    """`startup_parts_s` in the end record: each stage's seconds since the one before, the first
    since the process was created, a stage marked twice added up; they sum to `startup_s`."""
    import psutil

    from dpuoffload.common.runtime import torchsetup as startup

    clock, times = startup.StartupClock(), iter([102.0, 103.5, 106.0, 106.25])
    monkeypatch.setattr(startup.time, "time", lambda: next(times))
    monkeypatch.setattr(psutil.Process, "create_time", lambda self: 100.0)
    for stage in ("interpreter and imports", "data sets", "model on its device", "data sets"):
        clock.mark(stage)
    assert clock.parts() == {"interpreter and imports": 2.0, "data sets": 1.75, "model on its device": 2.5}
    assert sum(clock.parts().values()) == 106.25 - 100.0


def test_a_dpu_rank_imports_ahead_only_what_its_flags_give_it_work_for(capsys):
    """An idle DPU rank (--mode none, no keeper) never imports torch, a keeper of --mode none only
    torch; flags that do not parse are `configure`'s to report, on every rank: nothing is printed here."""
    from dpuoffload.dpu.main import Needs, needs

    assert needs(["--mode", "none"]) is Needs.NOTHING
    assert all(needs(["--mode", m]) is Needs.TORCH_AND_TORCHVISION for m in ("da", "mv", "hybrid", "naive", "auto"))
    assert needs(["--mode", "none", "--ckpt-dir", "/tmp/c", "--ckpt-every", "4"]) is Needs.TORCH
    assert needs(["--mode", "none", "--no-such-flag"]) is needs(["--epochs", "zero"]) is Needs.NOTHING
    assert capsys.readouterr() == ("", "")
