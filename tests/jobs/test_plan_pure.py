"""Torch-free planning: the modes enum and `--mode naive`'s arithmetic (also run under Python 3.10).

`scripts/test-min-python.sh` runs this file with the other torch-free tests under the minimum
Python, in a venv that has no torch, so an accidental torch import in `plan/` fails there.

(Here the tests that start processes; those that run in one process: tests/unit/test_plan_pure.py.)
"""

import subprocess
import sys


def test_planning_and_config_import_no_torch():
    """plan/, modes and config stay importable without torch (the launcher and --mode auto's
    prediction use them before any rank starts); checked in a fresh interpreter."""
    code = ("import sys, dpuoffload.common.config, dpuoffload.common.plan.offload, "
            "dpuoffload.common.plan.perfmodel, dpuoffload.common.plan.validation_split, "
            "dpuoffload.common.plan.naive, dpuoffload.launch.command; "
            "print(sorted(m for m in ('torch', 'numpy', 'mpi4py') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "torch" not in out, out
