"""Start-up cuts that must not change behaviour: determinism without importing torch._inductor."""

import subprocess
import sys

CHECK = """
import sys
import torch
from dpuoffload.common.runtime.startup import use_deterministic_algorithms
use_deterministic_algorithms()
print(torch.are_deterministic_algorithms_enabled(), "torch._dynamo" in sys.modules)
import torchvision  # loads inductor itself; the flag must survive it
print(torch.are_deterministic_algorithms_enabled())
"""


def test_determinism_is_on_without_loading_dynamo():
    res = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["True", "False", "True"]
