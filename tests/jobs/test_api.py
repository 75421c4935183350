"""The public API without dpurun (pure, no MPI): the local fallback, argument errors, script mode parsing.

(Here the tests that start processes; those that run in one process: tests/unit/test_api.py.)
"""

from __future__ import annotations

import subprocess
import sys


def test_importing_dpuoffload_does_not_import_torch():
    """The launcher and the torch-free planning code import the package first."""
    code = "import sys, dpuoffload; print(dpuoffload.API_VERSION, 'torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out[1] == "False" and out[0].count(".") == 2
