"""Under CI (CI=true) a broken set-up of the emulation (emulated machines, the aarch64 DPU, Slurm, the MPICH
venv) fails its tests instead of skipping them; a deliberate skip (a DPUOFFLOAD_TEST_*=0 switch, not root)
stays a skip (`tests/mpijobs.py`: `skip_or_fail`, `machines_unavailable`)."""

from types import SimpleNamespace

import pytest

from tests import mpijobs
from tests.mpijobs import Unavailable, machines_unavailable, skip_or_fail, under_ci


@pytest.mark.parametrize("ci", ["true", "TRUE", "1"])
def test_a_broken_set_up_fails_under_ci_with_the_same_message(monkeypatch, ci):
    monkeypatch.setenv("CI", ci)
    assert under_ci()
    with pytest.raises(pytest.fail.Exception) as info:
        skip_or_fail("the emulated machines did not come up: unshare failed", broken=True)
    assert str(info.value) == "the emulated machines did not come up: unshare failed"


@pytest.mark.parametrize("ci", [None, "", "false", "0"])
def test_a_broken_set_up_skips_outside_ci(monkeypatch, ci):
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    assert not under_ci()
    with pytest.raises(pytest.skip.Exception) as info:
        skip_or_fail("no aarch64 venv", broken=True)
    assert str(info.value) == "no aarch64 venv"


@pytest.mark.parametrize("ci", [None, "true"])
def test_a_deliberate_skip_stays_a_skip_under_ci_too(monkeypatch, ci):
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    with pytest.raises(pytest.skip.Exception) as info:
        skip_or_fail("DPUOFFLOAD_TEST_SLURM=0: turned off", broken=False)
    assert str(info.value) == "DPUOFFLOAD_TEST_SLURM=0: turned off"


def test_machines_unavailable_tells_a_choice_from_a_broken_set_up(monkeypatch):
    """Turned off and not root are choices; no ip or unshare, or namespaces refused, a broken set-up.
    (The unshare probe is replaced here: this tier starts no process.)"""
    monkeypatch.setenv("DPUOFFLOAD_TEST_SLURM", "0")
    monkeypatch.delenv("DPUOFFLOAD_TEST_NODES", raising=False)
    off = machines_unavailable("DPUOFFLOAD_TEST_SLURM")
    assert off == "DPUOFFLOAD_TEST_SLURM=0: turned off" and isinstance(off, Unavailable) and not off.broken
    monkeypatch.setattr(mpijobs.os, "geteuid", lambda: 1000)
    not_root = machines_unavailable("DPUOFFLOAD_TEST_NODES")
    assert not_root == "emulated machines need root (ip netns add)" and not not_root.broken
    monkeypatch.setattr(mpijobs.os, "geteuid", lambda: 0)
    monkeypatch.setattr("shutil.which", lambda name: None)
    no_tools = machines_unavailable("DPUOFFLOAD_TEST_NODES")
    assert no_tools == "emulated machines need iproute2's ip and util-linux's unshare" and no_tools.broken
    monkeypatch.setattr("shutil.which", lambda name: f"/usr/bin/{name}")
    refused = SimpleNamespace(returncode=1, stderr="unshare: unshare failed: Operation not permitted\n")
    monkeypatch.setattr(mpijobs.subprocess, "run", lambda *a, **k: refused)
    no_namespaces = machines_unavailable("DPUOFFLOAD_TEST_NODES")
    assert no_namespaces.broken and no_namespaces == ("this machine cannot make network and mount namespaces "
                                                      "(unshare: unshare: unshare failed: Operation not permitted)")
    monkeypatch.setattr(mpijobs.subprocess, "run", lambda *a, **k: SimpleNamespace(returncode=0, stderr=""))
    assert machines_unavailable("DPUOFFLOAD_TEST_NODES") is None
