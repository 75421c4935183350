"""Exact mpirun commands and placements of `dpurun`, without starting MPI.

(Here the tests that start processes; those that run in one process: tests/unit/test_launch_command.py.)
"""

from __future__ import annotations

import pytest

from dpuoffload.common.errors import ConfigError
from dpuoffload.launch import cli
from dpuoffload.launch.command import MpiFlavor
from tests.unit.test_launch_command import TRAIN


def test_detect_flavor(tmp_path):
    fake = tmp_path / "mpirun"
    fake.write_text("#!/bin/sh\necho 'HYDRA build details:'\n")
    fake.chmod(0o755)
    assert cli.detect_flavor(str(fake)) is MpiFlavor.MPICH
    fake.write_text("#!/bin/sh\necho 'mpirun (Open MPI) 5.0.11'\n")
    assert cli.detect_flavor(str(fake)) is MpiFlavor.OPENMPI
    assert cli.detect_flavor(str(tmp_path / "missing")) is MpiFlavor.OPENMPI


def test_clone_cores_errors_name_the_fix():
    with pytest.raises(ConfigError, match="--clone-ranks is 0"):
        cli.parse_launcher_args(["--clone-cores", "1"])
    args = cli.parse_launcher_args(["--clone-ranks", "1", "--clone-cores", "4096"])
    with pytest.raises(ConfigError, match=r"--clone-cores 4096: core\(s\) 4096 are not available here"):
        cli.resolve_spec(args, TRAIN)
    args = cli.parse_launcher_args(["--clone-ranks", "1", "--clone-cores", "1", "--hosts", "n0:2"])
    with pytest.raises(ConfigError, match="drop --clone-cores"):
        cli.resolve_spec(args, TRAIN)
