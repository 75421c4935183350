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
    "--preset", "--mode", "--model", "--dataset", "--data", "--download", "--num-classes", "--skip-corrupt",
    "--epochs", "--batch-size", "--val-batch-size", "--drop-last", "--train-subset", "--val-subset",
    "--lr", "--momentum", "--weight-decay", "--lr-schedule", "--seed", "--allreduce", "--device", "--amp",
    "--channels-last", "--log-dir",
    "--no-progress", "--peer-timeout", "--digest-batches", "--da-buffers", "--dpu-workers",
    "--da-host-share", "--da-host-workers", "--numerics", "--numerics-samples", "--wire", "--mv-dpu-fraction",
    "--dpu-da-ranks", "--dpu-mv-ranks", "--da-fanout", "--dpu-batch-size", "--auto-allow", "--save-weights", "--trace",
    "--ckpt-dir", "--ckpt-every", "--ckpt-every-epoch", "--ckpt-keep", "--ckpt-mem-keep",
    "--ckpt-mem-replicas", "--ckpt-mem-budget", "--ckpt-copy",
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


# ------------------------------------------------------------------ what each field means beyond its flag
# Each `RunConfig` field declares its concern and meaning next to itself (`common.config.flag`); the tables
# the code consults are derived from those declarations. Frozen here: changing what a field means (applies
# to scripts, may change on resume, may differ in clones) must be a deliberate edit, as adding a flag is.
CONCERNS = {
    "data": {"dataset", "data", "download", "num_classes", "train_subset", "val_subset", "skip_corrupt"},
    "model and training": {"model", "epochs", "batch_size", "val_batch_size", "drop_last", "lr", "momentum",
                           "weight_decay", "lr_schedule", "seed", "allreduce", "device", "amp", "channels_last"},
    "offload": {"mode", "da_buffers", "dpu_workers", "da_host_share", "da_host_workers", "numerics",
                "numerics_samples", "wire", "mv_dpu_fraction", "dpu_da_ranks", "dpu_mv_ranks", "da_fanout",
                "dpu_batch_size", "auto_allow"},
    "checkpoints and clones": {"ckpt_dir", "ckpt_every", "ckpt_every_epoch", "ckpt_keep", "ckpt_mem_keep",
                               "ckpt_mem_replicas", "ckpt_mem_budget",
                               "ckpt_copy", "ckpt_errors", "resume", "stop_at_step", "clone_at", "clone_override"},
    "failures and recovery": {"dpu_failure", "recovery", "reassign", "inject", "inject_simulate",
                              "simulate_recovery"},
    "logs and reports": {"log_dir", "progress", "digest_batches", "save_weights", "trace", "tensorboard", "plots"},
    "launch": {"peer_timeout", "script"},
}
SCRIPT_FIELDS = {"mode", "script", "da_buffers", "dpu_workers", "da_host_share", "da_host_workers", "numerics",
                 "numerics_samples", "wire", "log_dir", "peer_timeout", "progress", "mv_dpu_fraction", "dpu_da_ranks",
                 "dpu_mv_ranks", "da_fanout", "ckpt_dir", "ckpt_keep", "ckpt_copy", "ckpt_errors", "resume",
                 "clone_at", "device", "skip_corrupt"}
FREE_ON_RESUME = {"resume", "ckpt_dir", "ckpt_every", "ckpt_every_epoch", "ckpt_keep", "ckpt_mem_keep",
                  "ckpt_mem_replicas", "ckpt_mem_budget", "ckpt_copy",
                  "stop_at_step", "dpu_failure", "recovery", "reassign", "log_dir", "trace", "save_weights",
                  "progress", "peer_timeout", "digest_batches", "clone_at", "clone_override", "inject",
                  "inject_simulate", "simulate_recovery", "mode", "da_buffers", "dpu_workers", "da_host_share",
                  "da_host_workers", "mv_dpu_fraction", "dpu_da_ranks", "dpu_mv_ranks", "da_fanout", "val_batch_size",
                  "allreduce", "device", "amp", "channels_last", "download", "data", "skip_corrupt"}
FATAL_ON_RESUME = {"model", "dataset", "num_classes"}
CLONE_OVERRIDES = {"lr": float, "momentum": float, "weight_decay": float, "lr_schedule": str, "seed": int,
                   "epochs": int, "batch_size": int, "train_subset": int, "val_subset": int, "drop_last": "bool",
                   "allreduce": str, "save_weights": str, "stop_at_step": int}
CLONE_RESETS = {"mode", "clone_at", "clone_override", "ckpt_dir", "ckpt_every", "ckpt_every_epoch", "resume",
                "stop_at_step", "trace", "save_weights"}
REFUSED_BY_RECOVERY = {"clone_at", "trace", "inject_simulate", "script"}


def _fields():
    import dataclasses

    from dpuoffload.common.config import RunConfig

    return dataclasses.fields(RunConfig)


def test_every_field_declares_a_concern_and_has_its_flag():
    from dpuoffload.common.config import Concern, meaning

    dests = {a.dest: a.option_strings for a in build_parser()._actions}
    for f in _fields():
        assert isinstance(meaning(f).concern, Concern), f.name
        assert dests.get(f.name), f"RunConfig.{f.name} has no training flag"
    assert set(dests) - {f.name for f in _fields()} == {"help", "preset", "config"}
    assert {c.value: {f.name for f in _fields() if meaning(f).concern is c} for c in Concern} == CONCERNS


def test_fields_are_grouped_by_concern():
    """One section per concern in the class body: a field added far from its concern's is a mistake."""
    from dpuoffload.common.config import meaning

    order = [meaning(f).concern for f in _fields()]
    sections = [c for i, c in enumerate(order) if i == 0 or c is not order[i - 1]]
    assert len(sections) == len(set(sections)), sections


def test_derived_tables_equal_the_frozen_declarations():
    from dpuoffload.common import clones, config
    from dpuoffload.common.state import resume

    assert set(config.SCRIPT_FIELDS) == SCRIPT_FIELDS
    assert resume.FREE == FREE_ON_RESUME and set(resume.FATAL) == FATAL_ON_RESUME
    assert {k: ("bool" if v is clones._boolean else v) for k, v in clones.OVERRIDABLE.items()} == CLONE_OVERRIDES
    assert set(clones.RESET) == CLONE_RESETS and clones.SUBDIRS == ("log_dir",)
    assert {f.name for f in config._REFUSED_BY_RECOVERY} == REFUSED_BY_RECOVERY
    assert not FREE_ON_RESUME & FATAL_ON_RESUME
