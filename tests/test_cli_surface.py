"""Freeze the command-line surface: adding or removing a flag must be a deliberate edit here."""

from __future__ import annotations

import shlex
import sys
import types

from dpuoffload.common.config import build_parser, parse_run_config
from dpuoffload.launch import cli

LAUNCHER_FLAGS = {
    "-h", "--help",
    "--host-ranks", "--dpu-ranks", "--dpu-cores", "--dpu-speed", "--host-threads", "--dpu-threads",
    "--oversubscribe", "--share-cores", "--clone-ranks", "--spare-ranks", "--clone-cores", "--restarts",
    "--hosts", "--dpus", "--hostfile", "--dpu-hostfile", "--dpu-name", "--dpu-map", "--dpu-nodes",
    "--mpi-flavor", "--mpirun", "--python", "--dpu-python", "--mpirun-arg", "--dry-run",
    "--skip-checks",
}

TRAINING_FLAGS = {
    "-h", "--help",
    "--preset", "--mode", "--model", "--dataset", "--data", "--download", "--num-classes",
    "--epochs", "--batch-size", "--val-batch-size", "--drop-last", "--train-subset", "--val-subset",
    "--lr", "--momentum", "--weight-decay", "--lr-schedule", "--seed", "--allreduce", "--device", "--amp",
    "--channels-last", "--log-dir",
    "--no-progress", "--peer-timeout", "--digest-batches", "--da-buffers", "--dpu-workers",
    "--da-host-share", "--da-host-workers", "--numerics", "--numerics-samples", "--wire", "--mv-dpu-fraction",
    "--dpu-da-ranks", "--dpu-mv-ranks", "--da-fanout", "--dpu-batch-size", "--auto-allow", "--save-weights", "--trace",
    "--ckpt-dir", "--ckpt-every", "--ckpt-every-epoch", "--ckpt-keep", "--ckpt-mem-keep", "--ckpt-copy",
    "--ckpt-errors", "--dpu-failure", "--recovery", "--reassign", "--resume", "--stop-at-step",
    "--clone-at", "--clone-override", "--inject", "--inject-simulate", "--simulate-recovery",
    "--config", "--tensorboard", "--plots", "--script",
}


def option_strings(parser) -> set[str]:
    return {s for action in parser._actions for s in action.option_strings}


def test_launcher_flags_are_frozen():
    assert option_strings(cli.build_launcher_parser()) == LAUNCHER_FLAGS


def test_training_flags_are_frozen():
    assert option_strings(build_parser()) == TRAINING_FLAGS


def test_launcher_and_training_flags_do_not_overlap():
    assert option_strings(cli.build_launcher_parser()) & TRAINING_FLAGS == {"-h", "--help"}


def test_help_shows_a_default_for_every_flag(capsys):
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    parser = cli.build_launcher_parser()
    formatter = parser._get_formatter()
    for action in parser._actions:
        if action.option_strings and action.dest != "help":
            assert "(default:" in formatter._get_help_string(action), action.option_strings
    assert "examples:" in out and "dpurun --hosts node1:8,node2:8" in out


def test_training_help_defaults_come_from_the_run_config():
    """Defaults are written once (RunConfig); the help text shows them, so the two cannot drift."""
    from dpuoffload.common.config import RunConfig

    helps = {a.dest: a.help for a in build_parser()._actions}
    assert helps["epochs"].endswith(f"(default: {RunConfig().epochs})")
    assert helps["peer_timeout"].endswith(f"(default: {RunConfig().peer_timeout})")
    assert helps["mode"].endswith("(default: none)")


def test_training_help_via_separator(capsys):
    assert cli.main(["--", "--help"]) == 0
    assert "--peer-timeout" in capsys.readouterr().out


def test_epilog_examples_parse():
    lines = cli.EPILOG.replace("\\\n", " ").splitlines()
    examples = [shlex.split(ln)[1:] for ln in lines if ln.strip().startswith("dpurun -")]
    assert len(examples) == 6
    for argv in examples:
        launcher_argv, training_args = cli.split_argv(argv)
        cli.parse_launcher_args(launcher_argv)
        flags, script, _ = cli.split_script(training_args)
        parse_run_config(flags + (["--script", script] if script else []))


def test_mpirun_arg_is_repeatable_and_shell_split(monkeypatch, capsys):
    monkeypatch.setattr(cli.os, "sched_getaffinity", lambda pid: {0, 1})
    argv = ["--dry-run", "--mpirun", "/bin/true", "--mpi-flavor", "openmpi",
            "--mpirun-arg=--mca btl tcp,self", "--mpirun-arg=--report-bindings",
            "--", "--dataset", "fake"]
    assert cli.main(argv) == 0
    cmd = shlex.split(capsys.readouterr().out)
    i = cmd.index("--mca")
    assert cmd[i:i + 4] == ["--mca", "btl", "tcp,self", "--report-bindings"]


def test_make_data_subcommand_dispatches(monkeypatch):
    seen = []
    fake = types.ModuleType("dpuoffload.launch.make_data")
    fake.main = lambda argv: seen.append(argv) or 0
    monkeypatch.setitem(sys.modules, "dpuoffload.launch.make_data", fake)
    assert cli.main(["make-data", "/tmp/out", "--force"]) == 0
    assert seen == [["/tmp/out", "--force"]]
