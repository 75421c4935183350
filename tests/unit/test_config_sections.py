"""`RunConfig` in sections (`common.config.sections`): one dataclass per concern, each checking its own
fields, inherited into one flat config whose fields, JSON form and hash are those of the config before
the split (checkpoints and the start-up handshake compare them); and the flags whose values are a fixed
set as `str` enums (`common.modes`) that hash, print and parse as their strings."""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json

import pytest

from dpuoffload.common import clones
from dpuoffload.common.config import (
    SECTIONS,
    CheckpointConfig,
    Concern,
    DataConfig,
    LaunchConfig,
    OffloadConfig,
    RecoveryConfig,
    ReportingConfig,
    RunConfig,
    TrainingConfig,
    meaning,
    parse_run_config,
)
from dpuoffload.common.errors import ConfigError
from dpuoffload.common.modes import AllReduce, Amp, CkptErrors, Device, LrSchedule, Mode

# The fields in the order of the single dataclass before the split: the JSON form's order.
FIELDS = [
    "dataset", "data", "download", "num_classes", "train_subset", "val_subset", "skip_corrupt",
    "model", "epochs", "batch_size", "val_batch_size", "drop_last", "lr", "momentum", "weight_decay", "lr_schedule",
    "seed", "allreduce", "device", "amp", "channels_last",
    "mode", "da_buffers", "dpu_workers", "da_host_share", "da_host_workers", "numerics", "numerics_samples", "wire",
    "mv_dpu_fraction", "dpu_da_ranks", "dpu_mv_ranks", "da_fanout", "dpu_batch_size", "auto_allow",
    "ckpt_dir", "ckpt_every", "ckpt_every_epoch", "ckpt_keep", "ckpt_mem_keep", "ckpt_mem_replicas", "ckpt_mem_budget",
    "ckpt_copy", "ckpt_errors", "resume", "stop_at_step", "clone_at", "clone_override",
    "dpu_failure", "recovery", "reassign", "inject", "inject_simulate", "simulate_recovery",
    "log_dir", "progress", "digest_batches", "save_weights", "trace", "tensorboard", "plots",
    "peer_timeout", "script",
]

# argv -> (config_hash(), sha256 of json.dumps(to_dict()) unsorted), both computed before the split.
HASHES = [
    ([], "08567763fd87c58e", "1589c3fbe945ca14"),
    (["--mode", "da", "--amp", "bf16", "--allreduce", "mpi", "--lr-schedule", "step", "--ckpt-errors", "fail",
      "--device", "cpu"], "70eb328595d1ba3b", "a9bc9385fe163676"),
    (["--preset", "debug", "--mode", "hybrid", "--amp", "fp16", "--allreduce", "torch", "--lr-schedule", "constant",
      "--device", "cuda", "--ckpt-dir", "/tmp/x", "--ckpt-every", "5", "--inject", "host:1@3", "--clone-at", "4",
      "--clone-override", "lr=0.01"], "d11f8436f4b474f7", "0f98957fe948e055"),
    (["--mode", "mv", "--recovery", "lossy-forward", "--allreduce", "auto", "--reassign", "--ckpt-dir", "/tmp/y",
      "--ckpt-every-epoch", "--wire", "auto", "--mv-dpu-fraction", "0.5", "--da-host-share", "0"],
     "cd628d356a16d80f", "caea3f7f1b1a9ef5"),
    (["--mode", "naive", "--dpu-batch-size", "auto", "--lr", "1", "--device", "cpu", "--amp", "off"],
     "b129f5308bdc7117", "c6b96776f034f7c4"),
]

CONCERN_OF = {DataConfig: Concern.DATA, TrainingConfig: Concern.TRAINING, OffloadConfig: Concern.OFFLOAD,
              CheckpointConfig: Concern.CHECKPOINT, RecoveryConfig: Concern.RECOVERY,
              ReportingConfig: Concern.REPORTING, LaunchConfig: Concern.LAUNCH}


def test_the_fields_keep_their_order_through_the_sections():
    assert [f.name for f in dataclasses.fields(RunConfig)] == FIELDS
    assert [f.name for s in SECTIONS for f in dataclasses.fields(s)] == FIELDS


@pytest.mark.parametrize("argv, config_hash, json_digest", HASHES)
def test_hash_and_json_are_those_before_the_split(argv, config_hash, json_digest):
    cfg = parse_run_config(argv)
    text = json.dumps(cfg.to_dict())
    assert cfg.config_hash() == config_hash
    assert hashlib.sha256(text.encode()).hexdigest()[:16] == json_digest, text
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in json.loads(text).items()}
    assert RunConfig(**values) == cfg  # (the manifest's form, strings and lists, reads back as the same config)


def test_every_section_declares_its_own_concern_only():
    assert set(SECTIONS) == set(CONCERN_OF)
    for section, concern in CONCERN_OF.items():
        assert {meaning(f).concern for f in dataclasses.fields(section)} == {concern}, section.__name__


def test_run_config_and_each_section_stay_small():
    assert len(inspect.getsourcelines(RunConfig)[0]) < 300
    for section in SECTIONS:
        assert len(inspect.getsourcelines(section)[0]) < 100, section.__name__


def test_a_section_checks_its_own_fields_when_built_alone():
    assert OffloadConfig(mode="da").mode is Mode.DA
    assert TrainingConfig(amp="bf16").amp is Amp.BF16
    with pytest.raises(ConfigError, match="--skip-corrupt must be >= 0, got -1"):
        DataConfig(skip_corrupt=-1)
    with pytest.raises(ConfigError, match="--ckpt-every must be >= 1 \\(a global step number\\), got 0"):
        CheckpointConfig(ckpt_every=0, ckpt_dir="/c")
    with pytest.raises(ConfigError, match="--reassign hands a dead host rank's samples"):
        RecoveryConfig(reassign=True)
    with pytest.raises(ConfigError, match="--peer-timeout must be > 0 seconds"):
        LaunchConfig(peer_timeout=0)


@pytest.mark.parametrize("changes, message", [
    (dict(device="cuda", mode="naive"), "--device cuda with --mode naive: the DPU ranks would train as replicas"),
    (dict(skip_corrupt=1, mode="naive"), "--skip-corrupt with --mode naive"),
    (dict(resume="/c/step-1", mode="auto"), "checkpoints, --resume and clones need DPU ranks that do not train"),
    (dict(dpu_failure="fallback", trace="/t.json"), "--trace gathers every rank's events at the end"),
    (dict(recovery="rollback", allreduce="torch"), "--recovery rollback cannot go with --allreduce torch"),
    (dict(script="train.py", amp="bf16"), "--amp configures dpurun's built-in trainer"),
])
def test_checks_across_sections_are_the_run_configs(changes, message):
    """Each value alone is accepted by its own section; together `RunConfig.check` refuses them."""
    for section in SECTIONS:
        section(**{k: v for k, v in changes.items() if k in {f.name for f in dataclasses.fields(section)}})
    with pytest.raises(ConfigError, match=message):
        RunConfig(**changes)


@pytest.mark.parametrize("flag, value, member", [
    ("--allreduce", "mpi", AllReduce.MPI), ("--device", "cpu", Device.CPU), ("--amp", "fp16", Amp.FP16),
    ("--lr-schedule", "step", LrSchedule.STEP), ("--ckpt-errors", "fail", CkptErrors.FAIL),
])
def test_flag_strings_become_members_that_still_read_as_strings(flag, value, member):
    cfg = parse_run_config([flag, value])
    name = flag[2:].replace("-", "_")
    assert getattr(cfg, name) is member and member == value and f"{member}" == value == str(member)
    assert json.loads(json.dumps(cfg.to_dict()))[name] == value
    assert cfg == RunConfig(**{name: value}) == RunConfig(**{name: member})


@pytest.mark.parametrize("name, value, message", [
    ("allreduce", "nccl", "--allreduce 'nccl' is not one of: auto, horovod, torch, mpi"),
    ("device", "tpu", "--device 'tpu' is not one of: auto, cpu, cuda"),
    ("amp", "fp8", "--amp 'fp8' is not one of: off, bf16, fp16"),
    ("lr_schedule", "poly", "--lr-schedule 'poly' is not one of: cosine, step, constant"),
    ("ckpt_errors", "retry", "--ckpt-errors 'retry' is not one of: continue, fail"),
])
def test_a_bad_value_names_the_choices_as_before(name, value, message):
    with pytest.raises(ConfigError) as e:
        RunConfig(**{name: value})
    assert str(e.value) == message


def test_recovery_resolves_the_allreduce_to_the_mpi_member():
    cfg = RunConfig(mode="da", recovery="lossy-forward")
    assert cfg.allreduce is AllReduce.MPI and cfg.allreduce.shrinks
    assert not AllReduce.HOROVOD.shrinks and not AllReduce.TORCH.shrinks


def test_a_clone_override_of_an_enum_field_reads_its_string():
    clone = clones.clone_config(RunConfig(clone_at=2, clone_override=("lr_schedule=step", "allreduce=mpi")))
    assert clone.lr_schedule is LrSchedule.STEP and clone.allreduce is AllReduce.MPI
    with pytest.raises(ConfigError, match="--lr-schedule 'poly' is not one of"):
        clones.clone_config(RunConfig(clone_at=2, clone_override=("lr_schedule=poly",)))
