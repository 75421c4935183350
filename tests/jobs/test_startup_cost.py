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


LEAN = """
import sys
from dpuoffload.common.runtime.torchsetup import import_torch_ahead
import_torch_ahead(torchvision=True, compiler=sys.argv[1] == "yes")
import torch, torchvision
print("torch._dynamo" in sys.modules, "sympy" in sys.modules)
boxes = torch.tensor([[0, 0.0, 0.0, 4.0, 4.0]])
print(tuple(torchvision.ops.roi_align(torch.ones(1, 1, 8, 8), boxes, (2, 2)).shape))  # (calls dynamo's helper)
from torch._dynamo.utils import counters  # the real module, not the stand-in
print("torch._dynamo" in sys.modules, type(counters).__name__)
"""


def run_python(code: str, *argv: str, env_update: dict | None = None, path: str = "") -> list[str]:
    import os

    environ = {k: v for k, v in os.environ.items() if not k.startswith("DPUOFFLOAD_")}
    environ.update(env_update or {})
    if path:
        environ["PYTHONPATH"] = os.pathsep.join(p for p in (path, environ.get("PYTHONPATH", "")) if p)
    res = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=120, env=environ)
    assert res.returncode == 0, res.stderr
    return res.stdout.split("\n")[:-1]


def test_a_dpu_rank_imports_torchvision_without_torchs_compiler_and_its_operators_still_work():
    """DPU ranks (`compiler=False`): torchvision without torch._dynamo and sympy (1.2 s of CPU and
    150 MB per rank); roi_align, the operator that wanted dynamo's helper, works, and a later import of
    torch._dynamo gets the real module. Host ranks, and `DPUOFFLOAD_LEAN_TORCHVISION=0`: as torchvision does."""
    assert run_python(LEAN, "no") == ["False False", "(1, 1, 2, 2)", "True defaultdict"]
    assert run_python(LEAN, "yes") == ["True True", "(1, 1, 2, 2)", "True defaultdict"]
    assert run_python(LEAN, "no", env_update={"DPUOFFLOAD_LEAN_TORCHVISION": "0"})[0] == "True True"


def test_a_torchvision_that_needs_more_of_the_compiler_is_imported_as_usual(tmp_path):
    """A torchvision whose import needs more of torch._dynamo than the one helper stood in for (here a
    package of that name that imports `counters` from it): the failed import is undone and redone the
    usual way, with the real module; the rank starts as it would have without the cut."""
    (tmp_path / "torchvision").mkdir()
    package = "from torch._dynamo.utils import counters\nWHICH = 'stand-in'\n"
    (tmp_path / "torchvision" / "__init__.py").write_text(package)
    code = ("import sys\nfrom dpuoffload.common.runtime.torchsetup import import_torchvision_without_compiler\n"
            "import_torchvision_without_compiler()\nimport torchvision\n"
            "print(torchvision.WHICH, 'torch._dynamo' in sys.modules, type(torchvision.counters).__name__)")
    assert run_python(code, path=str(tmp_path)) == ["stand-in True defaultdict"]


PROBE = """
import sys
from dpuoffload.launch.probe import main
main(sys.argv[1:])
print("torch._dynamo" in sys.modules, "torchvision" in sys.modules)
"""


def test_dpuruns_dry_import_builds_data_sets_and_a_model_without_torchs_compiler(bundled_data):
    """The dry import (`launch.probe`, which a user's dpurun waits for before launch) loads torchvision
    without torch._dynamo (1.4 s of its 4 s of CPU here): it builds data sets and a model, never an
    optimizer. It found nothing to report (no output but the check's)."""
    from tests.mpijobs import REPO

    argv = ["--host-ranks", "2", "--", "--preset", "debug", "--data", str(bundled_data / "cifar10"),
            "--model", "tests.user_factories:tiny_model"]
    assert run_python(PROBE, *argv, path=str(REPO)) == ["False True"]
