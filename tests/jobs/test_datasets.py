"""Data sets by name, and the bundled real data that `dpurun make-data` writes for torchvision.

(Here the tests that start processes; those that run in one process: tests/unit/test_datasets.py.)
"""

import subprocess
import sys


def test_importing_the_data_modules_does_not_import_torch():
    """The launcher's check and `dpurun make-data` should not pay torch's import time."""
    code = ("import sys, dpuoffload.common.data.datasets, dpuoffload.launch.make_data; "
            "print('torch' in sys.modules or 'torchvision' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
