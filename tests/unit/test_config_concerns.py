"""What a `RunConfig` field means beyond its flag is declared next to the field (`common.config.flag`);
these tests check that the code deciding scripts, resumes, clones and recovery follows the declarations."""

from __future__ import annotations

import dataclasses

import pytest

from dpuoffload.common import clones
from dpuoffload.common.config import (
    SCRIPT_FIELDS,
    Concern,
    InClone,
    OnResume,
    RunConfig,
    field_names,
    flag,
    meaning,
)
from dpuoffload.common.errors import ConfigError


def test_flag_keeps_the_default_and_the_declaration():
    declared = flag(3, Concern.TRAINING, resume=OnResume.FREE, clone=InClone.RESET | InClone.OVERRIDE)
    assert declared.default == 3
    m = declared.metadata["meaning"]
    assert (m.concern, m.script, m.resume, m.refused_by_recovery) == (Concern.TRAINING, False, OnResume.FREE, None)
    assert InClone.RESET in m.clone and InClone.OVERRIDE in m.clone and InClone.SUBDIR not in m.clone


def test_field_names_follow_the_declaration_order():
    names = [f.name for f in dataclasses.fields(RunConfig)]
    assert list(field_names(lambda m: True)) == names
    assert list(SCRIPT_FIELDS) == [n for n in names if n in SCRIPT_FIELDS]


def test_a_clone_resets_every_field_declared_reset_and_nests_its_log_dir():
    everything = RunConfig(mode="mv", ckpt_dir="/c", ckpt_every=2, ckpt_every_epoch=True, resume="latest",
                           stop_at_step=9, clone_at=4, clone_override=("seed=7",), trace="/t.json",
                           save_weights="/w.pt", log_dir="/l")
    clone = clones.clone_config(everything)
    for f in dataclasses.fields(RunConfig):
        if InClone.RESET in meaning(f).clone:
            assert getattr(clone, f.name) == f.default, f.name
    assert clone.log_dir == "/l/clone" and clone.seed == 7
    assert clones.clone_config(RunConfig(clone_at=4)).log_dir is None


def test_clone_overrides_parse_as_the_fields_type():
    changes = clones.parse_clone_overrides(("drop-last=true", "train_subset=64", "lr=0.5", "save_weights=/w.pt"))
    assert changes == {"drop_last": True, "train_subset": 64, "lr": 0.5, "save_weights": "/w.pt"}
    with pytest.raises(ConfigError, match="KEY one of"):
        clones.parse_clone_overrides(("mode=da",))  # (declared RESET only: the clone offloads nothing)


def test_an_override_of_a_type_no_parser_reads_is_a_declaration_error():
    with pytest.raises(TypeError, match="da_host_share"):
        clones._parser("da_host_share")


@pytest.mark.parametrize("changes, what", [
    (dict(clone_at=5), "cannot go with clones"),
    (dict(trace="/tmp/t.json"), "cannot go with --trace"),
    (dict(inject_simulate=("host:1@3",)), "cannot go with --inject-simulate"),
    (dict(script="train.py"), "cannot go with a training script"),
])
def test_recovery_refuses_every_field_declared_so(changes, what):
    with pytest.raises(ConfigError, match=what):
        RunConfig(recovery="lossy-forward", **changes)


def test_a_script_refuses_a_field_not_declared_for_scripts():
    assert "epochs" not in SCRIPT_FIELDS
    with pytest.raises(ConfigError, match="--train-subset configures dpurun's built-in trainer"):
        RunConfig(script="train.py", train_subset=10)
    assert RunConfig(script="train.py", mode="mv", ckpt_dir="/c", peer_timeout=5.0).script == "train.py"
