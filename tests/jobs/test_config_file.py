"""`--config FILE.toml`: the preset first, then the file, then flags; mistakes in the file are one
ConfigError naming the file, the key and the fix.

(Here the tests that start processes; those that run in one process: tests/unit/test_config_file.py.)
"""


import pytest

from tests.unit.test_config_file import write


@pytest.mark.mpi
def test_dpurun_with_a_config_file(tmp_path, bundled_data):
    from tests.mpijobs import dpurun, read_jsonl

    path = write(tmp_path, f'data = "{bundled_data / "cifar10"}"\nepochs = 2\ntrain_subset = 64\nval_subset = 64\n'
                           f'batch_size = 16\nlog_dir = "{tmp_path / "log"}"\nprogress = false\n')
    res = dpurun([], ["--preset", "debug", "--config", path, "--epochs", "1"])
    assert res.returncode == 0, res.stderr
    epochs = [r for r in read_jsonl(tmp_path / "log" / "metrics.jsonl") if r["event"] == "epoch"]
    assert len(epochs) == 1 and len(epochs[0]["step_losses"]) == 4  # flag (1 epoch) over file; 64 / 16
    assert "epoch 1/1 |" in res.stdout
