"""Training flags -> RunConfig: presets, validation messages, hash stability."""

import pytest

from dpuoffload.common.config import RunConfig, parse_run_config
from dpuoffload.common.errors import ConfigError
from dpuoffload.common.runtime.handshake import Identity, find_mismatch
from dpuoffload.common.runtime.roles import Role


def test_preset_then_explicit_flags_override():
    cfg = parse_run_config(["--preset", "debug", "--epochs", "7"])
    assert cfg.epochs == 7 and cfg.train_subset == 512 and cfg.model == "resnet20"


def test_defaults_without_preset():
    assert parse_run_config([]) == RunConfig()


@pytest.mark.parametrize("argv, message", [
    (["--epochs", "0"], "--epochs must be >= 1"),
    (["--lr", "-1"], "--lr must be > 0"),
    (["--momentum", "1.5"], "--momentum must be in [0, 1)"),
    (["--train-subset", "0"], "--train-subset must be >= 1"),
    (["--peer-timeout", "0"], "--peer-timeout must be > 0"),
])
def test_bad_values_name_the_flag(argv, message):
    with pytest.raises(ConfigError) as e:
        parse_run_config(argv)
    assert message in str(e.value)


def test_hash_is_stable_and_sensitive():
    a, b = RunConfig(), RunConfig()
    assert a.config_hash() == b.config_hash()
    assert a.config_hash() != a.replace(seed=1).config_hash()


def ident(rank, role, version="0.1.0", protocol=1, cfg=RunConfig()):
    return Identity(rank, role, version, protocol, cfg.config_hash(), cfg.to_dict())


def test_handshake_names_both_values():
    assert find_mismatch([ident(0, Role.HOST), ident(1, Role.DPU)]) is None
    msg = find_mismatch([ident(0, Role.HOST), ident(1, Role.DPU, version="0.2.0")])
    assert "host program (world rank 0) runs dpuoffload 0.1.0" in msg and "DPU program (world rank 1) runs 0.2.0" in msg
    msg = find_mismatch([ident(0, Role.HOST), ident(1, Role.DPU, protocol=2)])
    assert "speaks protocol 1" in msg and "speaks 2" in msg
    msg = find_mismatch([ident(0, Role.HOST), ident(1, Role.DPU, cfg=RunConfig(seed=5))])
    assert "run config mismatch" in msg and "seed=0 vs 5" in msg
    msg = find_mismatch([ident(0, Role.HOST), ident(1, Role.DPU, cfg=RunConfig(allreduce="mpi", mode="da"))])
    assert "allreduce='auto' vs 'mpi'" in msg and "mode='none' vs 'da'" in msg  # a flag enum: as the flag reads


def test_handshake_takes_another_architecture_but_not_another_byte_order():
    x86 = Identity(0, Role.HOST, "0.1.0", 1, "h", {}, "x86_64")
    arm = Identity(1, Role.DPU, "0.1.0", 1, "h", {}, "aarch64")
    assert find_mismatch([x86, arm]) is None
    big = Identity(1, Role.DPU, "0.1.0", 1, "h", {}, "s390x", "big")
    msg = find_mismatch([x86, big])
    assert "byte order mismatch: host program (world rank 0) runs on x86_64 (little-endian)" in msg
    assert "DPU program (world rank 1) on s390x (big-endian)" in msg and "machines of one byte order" in msg

