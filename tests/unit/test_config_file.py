"""`--config FILE.toml`: the preset first, then the file, then flags; mistakes in the file are one
ConfigError naming the file, the key and the fix.

(The tests of this feature that start processes: tests/jobs/test_config_file.py.)
"""

from pathlib import Path

import pytest

from dpuoffload.common.config import RunConfig, parse_run_config
from dpuoffload.common.errors import ConfigError

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "debug.toml"


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "run.toml"
    path.write_text(text)
    return str(path)


def test_precedence_is_preset_then_file_then_flags(tmp_path):
    path = write(tmp_path, 'epochs = 7\nbatch-size = 8\nlr_schedule = "step"\n')
    cfg = parse_run_config(["--preset", "debug", "--config", path, "--batch-size", "4"])
    assert cfg.train_subset == 512          # from the preset (the file does not set it)
    assert cfg.epochs == 7                  # the file overrides the preset (3)
    assert cfg.lr_schedule == "step"        # the file overrides the dataclass default
    assert cfg.batch_size == 4              # the flag overrides the file (8)


def test_file_and_flags_resolve_to_the_same_config_and_hash(tmp_path):
    path = write(tmp_path, 'model = "resnet20"\nlr = 1\nmv_dpu_fraction = 1\nclone_override = ["lr=0.01"]\n'
                           "clone_at = 2\n")
    from_file = parse_run_config(["--config", path])
    from_flags = parse_run_config(["--lr", "1", "--mv-dpu-fraction", "1", "--clone-override", "lr=0.01",
                                   "--clone-at", "2"])
    assert from_file == from_flags and from_file.config_hash() == from_flags.config_hash()


def test_example_file_parses():
    cfg = parse_run_config(["--config", str(EXAMPLE)])
    assert (cfg.epochs, cfg.train_subset, cfg.val_subset, cfg.data) == (1, 64, 64, ".cache/data/cifar10")


def test_unknown_key_names_file_key_and_fix(tmp_path):
    path = write(tmp_path, "epoch = 2\n")
    with pytest.raises(ConfigError) as e:
        parse_run_config(["--config", path])
    assert str(e.value).startswith(f"--config {path}: 'epoch' is not a setting: did you mean 'epochs'?")


def test_wrong_types_are_one_error_with_every_key(tmp_path):
    path = write(tmp_path, 'batch_size = "16"\nprogress = 1\nepochs = true\nlr = "fast"\n')
    with pytest.raises(ConfigError) as e:
        parse_run_config(["--config", path])
    message = str(e.value)
    assert message.startswith(f"--config {path}: ")
    assert "'batch_size' must be int, got str '16': write it as batch_size = 16" in message
    assert "'progress' must be bool, got int 1: write it as progress = true" in message
    assert "'epochs' must be int, got bool True" in message
    assert "'lr' must be float or int, got str 'fast'" in message


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(ConfigError, match=r"cannot read it \(No such file or directory\)"):
        parse_run_config(["--config", str(tmp_path / "missing.toml")])
    with pytest.raises(ConfigError, match="not valid TOML"):
        parse_run_config(["--config", write(tmp_path, "epochs = = 2\n")])


def test_values_from_the_file_are_still_range_checked(tmp_path):
    with pytest.raises(ConfigError, match="--epochs must be >= 1, got 0"):
        parse_run_config(["--config", write(tmp_path, "epochs = 0\n")])


def test_every_run_config_field_is_a_valid_key():
    """A new RunConfig field needs no edit here: the file's keys come from the dataclass."""
    import dataclasses

    from dpuoffload.common.config import _config_value

    for field in dataclasses.fields(RunConfig):
        default = field.default
        if default is not None and default != ():
            assert _config_value(field.name, default) == default, field.name


def test_an_enum_setting_is_written_as_its_flag_value(tmp_path):
    from dpuoffload.common.modes import AllReduce, Amp, Numerics

    path = write(tmp_path, 'mode = "da"\nallreduce = "mpi"\namp = "bf16"\nnumerics = "strict"\n')
    cfg = parse_run_config(["--config", path])
    assert (cfg.allreduce, cfg.amp, cfg.numerics) == (AllReduce.MPI, Amp.BF16, Numerics.STRICT)
    assert cfg == parse_run_config(["--mode", "da", "--allreduce", "mpi", "--amp", "bf16", "--numerics", "strict"])
    with pytest.raises(ConfigError, match="'amp' must be str, got int 16"):
        parse_run_config(["--config", write(tmp_path, "amp = 16\n")])
    with pytest.raises(ConfigError, match="--amp 'fp8' is not one of: off, bf16, fp16"):
        parse_run_config(["--config", write(tmp_path, 'amp = "fp8"\n')])
