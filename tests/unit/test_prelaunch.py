"""A new user's mistakes are caught by `dpurun` before any rank starts: one line each, exit code 2.

Every test runs the real `dpurun` console script with `--mpirun` pointing at a stand-in that only
writes a marker file, so "no rank started" is a file that does not exist (and no MPI job runs).
The user factories with the mistakes are in tests/bad_factories.py; dpurun runs from the
repository root, so `tests.bad_factories:...` is found by `python -m`'s rule (cwd on sys.path).

(The tests of this feature that start processes: tests/jobs/test_prelaunch.py.)
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

DPURUN = Path(sys.executable).parent / "dpurun"

pytestmark = pytest.mark.skipif(not DPURUN.exists(), reason="the dpurun console script is not installed "
                                                            "(pip install -e .)")


# --------------------------------------------------------------------------- directory probe
def test_directory_probe_creates_only_when_launching_locally(tmp_path):
    """The probe leaves nothing but the directory; --dry-run creates nothing; in cluster mode a path
    that does not exist here is the nodes' business."""
    from dpuoffload.launch.checks import LaunchFacts, check_writable

    target = tmp_path / "a" / "b"
    check_writable(str(target), "--ckpt-dir", LaunchFacts(create_dirs=False))
    assert not (tmp_path / "a").exists()
    check_writable("/only/on/the/nodes/ckpt", "--ckpt-dir", LaunchFacts(cluster=True))
    check_writable(str(target), "--ckpt-dir", LaunchFacts())
    assert target.is_dir() and list(target.iterdir()) == []
