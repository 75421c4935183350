"""The DPU as an Arm computer: an x86-64 host machine (h0) and an aarch64 DPU machine (d0, through
qemu-user: scripts/aarch64.sh, `scripts/nodes.sh up h0 d0:aarch64`) in one Open MPI job over TCP.

The DPU rank is a real aarch64 process (aarch64 prted and Python, torch 2.9.1 against the host's
2.14.1): with a PIL pipeline (the bundled CIFAR-10: crop and flip on the DPU, uint8 on the wire,
ToTensor + Normalize on the host) `da` trains to the bit as `none`, and the numerics check finds the
DPU's samples identical; with a float ColorJitter (which rounds differently there) `--numerics strict`
stops before the first step, naming the step. Needs root (namespaces, binfmt_misc) and the aarch64
venv (bash scripts/test.sh sets it up; DPUOFFLOAD_TEST_AARCH64=0 skips these tests).
"""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.mpijobs import (
    REPO,
    Unavailable,
    job_env,
    machines_broken,
    machines_unavailable,
    read_jsonl,
    skip_or_fail,
)

pytestmark = pytest.mark.mpi
SCRIPT = str(REPO / "scripts" / "nodes.sh")
ARM_VENV = REPO / ".venv-aarch64"
TIMEOUT = 420  # an aarch64 rank that imports torch under qemu adds 30-110 s on the loaded 2-core box


def _why_not() -> Unavailable | None:
    why = machines_unavailable("DPUOFFLOAD_TEST_AARCH64", "ip netns, binfmt_misc, mount namespaces: aarch64 ones")
    if why:
        return why
    if not (ARM_VENV / "bin" / "python").exists():
        return Unavailable(f"no aarch64 venv at {ARM_VENV} (bash scripts/aarch64.sh setup; bash scripts/test.sh "
                           "runs it)", broken=True)
    return None


@pytest.fixture(scope="module")
def arm(tmp_path_factory):
    why = _why_not()
    if why:
        skip_or_fail(why, why.broken)
    env = job_env()
    env["DPUOFFLOAD_NETNS_PREFIX"] = f"dpa{os.getpid()}"
    env["DPUOFFLOAD_NETNS_SUBNET"] = f"10.79.{os.getpid() % 250}"
    up = subprocess.run(["bash", SCRIPT, "up", "h0", "d0:aarch64"], capture_output=True, text=True, env=env,
                        timeout=60)
    if up.returncode != 0:
        machines_broken("h0 and the aarch64 d0 (scripts/nodes.sh up)", up.stderr, "DPUOFFLOAD_TEST_AARCH64")
    try:
        yield env
    finally:
        subprocess.run(["bash", SCRIPT, "down", "h0", "d0"], capture_output=True, env=env, timeout=60)


def job(env: dict, log, *training: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", SCRIPT, "dpurun", "--hosts", "h0:1", "--dpus", "d0:1", "--host-ranks", "1",
                           "--dpu-ranks", "1", "--", *training, "--no-progress", "--log-dir", str(log)],
                          capture_output=True, text=True, env=env, cwd=REPO, timeout=TIMEOUT)


def test_the_machine_is_aarch64(arm):
    out = subprocess.run(["bash", SCRIPT, "run", "d0", str(REPO / ".venv" / "bin" / "python"), "-c",
                          "import platform; print(platform.machine())"], capture_output=True, text=True, env=arm,
                         timeout=120)
    assert out.stdout.strip() == "aarch64", out.stdout + out.stderr


def test_an_aarch64_dpu_rank_feeds_an_x86_host_to_the_bit(arm, bundled_data, tmp_path_factory):
    flags = ("--preset", "debug", "--data", str(bundled_data / "cifar10"), "--epochs", "1", "--train-subset", "128",
             "--val-subset", "64", "--digest-batches")
    logs = {mode: tmp_path_factory.mktemp(f"arm-{mode}") for mode in ("none", "da")}
    for mode, log in logs.items():
        res = job(arm, log, *flags, "--mode", mode)
        assert res.returncode == 0, res.stdout + res.stderr
    runs = {m: [r for r in read_jsonl(log / "metrics.jsonl") if r["event"] in ("epoch", "end")]
            for m, log in logs.items()}
    assert [r.get("step_losses") for r in runs["da"]] == [r.get("step_losses") for r in runs["none"]]
    assert runs["da"][-1]["weights_sha256"] == runs["none"][-1]["weights_sha256"]
    digests = {m: [r["batch_digest"] for r in read_jsonl(log / "phases-rank0.jsonl") if "batch_digest" in r]
               for m, log in logs.items()}
    assert digests["da"] == digests["none"] and len(digests["da"]) == 1
    end = next(r for r in read_jsonl(logs["da"] / "phases-rank1.jsonl") if r.get("event") == "end")
    assert (end["machine"], end["work"], end["wires"]) == ("aarch64", "da", {"0": "uint8"})
    (check,) = read_jsonl(logs["da"] / "numerics-rank0.jsonl")
    assert check["identical"] and check["dpu_platform"]["machine"] == "aarch64"
    assert check["host_platform"]["machine"] == "x86_64" and check["dpu_platform"]["torch"] == "2.9.1"
    assert "they differ in torch 2." in check["line"]  # the caveat: versions differ, these samples agreed


def test_a_float_colorjitter_on_the_arm_dpu_is_stopped_by_strict(arm, tmp_path):
    res = job(arm, tmp_path, "--dataset", "tests.user_factories:photos_jitter", "--model",
              "tests.user_factories:tiny_model", "--epochs", "1", "--batch-size", "8", "--mode", "da",
              "--numerics", "strict")
    out = res.stdout + res.stderr
    assert res.returncode != 0, out
    assert "NumericsError: numerics: samples built by DPU rank 0" in out and "(aarch64, torch 2.9.1" in out, out
    assert "stopped before training (--numerics strict)" in out and "install the same versions" in out
    (check,) = read_jsonl(tmp_path / "numerics-rank0.jsonl")
    assert not check["identical"] and check["wire"] == "float"
    assert check["step_name"].startswith(("ToTensor", "ColorJitter("))  # the first float step that rounds otherwise
    assert not [r for r in read_jsonl(tmp_path / "metrics.jsonl") if r["event"] == "epoch"] \
        if (tmp_path / "metrics.jsonl").exists() else True
