"""Start-up cuts that must not change behaviour: determinism without importing torch._inductor; where a
rank's start-up goes (`StartupClock`).

(Here the tests that start processes; those that run in one process: tests/unit/test_startup_cost.py.)
"""

import subprocess
import sys

CHECK = """
import sys
import torch
from dpuoffload.common.runtime.torchsetup import use_deterministic_algorithms
use_deterministic_algorithms()
print(torch.are_deterministic_algorithms_enabled(), "torch._dynamo" in sys.modules)
import torchvision  # loads inductor itself; the flag must survive it
print(torch.are_deterministic_algorithms_enabled())
"""


def test_determinism_is_on_without_loading_dynamo():
    res = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["True", "False", "True"]


AHEAD = """
import sys
from dpuoffload.common.runtime.torchsetup import import_torch_ahead
import_torch_ahead(torchvision=sys.argv[1] == "yes")
print("torch" in sys.modules, "torchvision" in sys.modules)
"""


def test_torch_and_torchvision_are_imported_ahead_unless_turned_off():
    """Before MPI init (the programs call it first), so one side's imports do not wait for the other's."""
    import os

    cases = [(None, "yes", ["True", "True"]), (None, "no", ["True", "False"]), ("0", "yes", ["False", "False"])]
    for value, torchvision, expected in cases:
        environ = {k: v for k, v in os.environ.items() if k != "DPUOFFLOAD_IMPORT_AHEAD"}
        if value is not None:
            environ["DPUOFFLOAD_IMPORT_AHEAD"] = value
        res = subprocess.run([sys.executable, "-c", AHEAD, torchvision], capture_output=True, text=True, timeout=120,
                             env=environ)
        assert res.returncode == 0, res.stderr
        assert res.stdout.split() == expected, (value, torchvision)
