"""A new user's mistakes are caught by `dpurun` before any rank starts: one line each, exit code 2.

Every test runs the real `dpurun` console script with `--mpirun` pointing at a stand-in that only
writes a marker file, so "no rank started" is a file that does not exist (and no MPI job runs).
The user factories with the mistakes are in tests/bad_factories.py; dpurun runs from the
repository root, so `tests.bad_factories:...` is found by `python -m`'s rule (cwd on sys.path).

(Here the tests that start processes; those that run in one process: tests/unit/test_prelaunch.py.)
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.unit.test_prelaunch import DPURUN

REPO = Path(__file__).resolve().parents[2]
TINY = ["--dataset", "tests.user_factories:tiny_dataset", "--model", "tests.user_factories:tiny_model",
        "--epochs", "1", "--batch-size", "8"]

pytestmark = pytest.mark.skipif(not DPURUN.exists(), reason="the dpurun console script is not installed "
                                                            "(pip install -e .)")


@dataclass
class Result:
    returncode: int
    errors: list[str]    # the `dpurun: error:` lines
    warnings: list[str]  # the `dpurun: warning:` lines
    stderr: str
    launched: bool       # the stand-in mpirun ran
    seconds: float


def dpurun(tmp_path: Path, *argv: str, cwd: Path = REPO) -> Result:
    """`dpurun --mpirun <marker script> ... argv` from `cwd`, without PYTHONPATH (so only the cwd rule
    can find the tests' factories)."""
    marker = tmp_path / "launched"
    fake = tmp_path / "fake-mpirun"
    fake.write_text(f"#!/bin/sh\ntouch {marker}\n")
    fake.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    head = [] if argv[:1] in (("export-checkpoint",), ("project",)) else [
        "--mpirun", str(fake), "--mpi-flavor", "openmpi"]
    t0 = time.perf_counter()
    proc = subprocess.run([str(DPURUN), *head, *argv], capture_output=True, text=True, cwd=cwd, env=env,
                          timeout=120)
    seconds = time.perf_counter() - t0
    lines = proc.stderr.splitlines()
    return Result(proc.returncode, [ln for ln in lines if ": error: " in ln],
                  [ln for ln in lines if ": warning: " in ln], proc.stderr, marker.exists(), seconds)


def refused(result: Result, line: str) -> None:
    """Exit 2, exactly this one error line, no traceback, and no rank started."""
    assert result.returncode == 2, result.stderr
    assert result.errors == [line], result.stderr
    assert "Traceback" not in result.stderr
    assert not result.launched


# ------------------------------------------------------------------------------- user factories
def test_model_factory_with_wrong_signature(tmp_path):
    r = dpurun(tmp_path, "--", *TINY, "--model", "tests.bad_factories:model_without_num_classes")
    refused(r, "dpurun: error: --model tests.bad_factories:model_without_num_classes (tests/bad_factories.py:11) "
               "takes (), but dpuoffload calls it as factory(num_classes); give it exactly these parameters")


def test_dataset_factory_with_wrong_signature(tmp_path):
    r = dpurun(tmp_path, "--", *TINY, "--dataset", "tests.bad_factories:dataset_without_download")
    refused(r, "dpurun: error: --dataset tests.bad_factories:dataset_without_download (tests/bad_factories.py:16) "
               "takes (root, train), but dpuoffload calls it as factory(root, train, download); give it exactly "
               "these parameters")


def test_dataset_items_are_pil_images(tmp_path):
    r = dpurun(tmp_path, "--", *TINY, "--dataset", "tests.bad_factories:pil_images")
    refused(r, "dpurun: error: --dataset tests.bad_factories:pil_images: train item 0 is (PIL.Image.Image, int), "
               "a PIL image, not a tensor; add transforms.ToTensor() to the data set's transform "
               "(e.g. Compose([..., ToTensor()]))")


def test_num_classes_smaller_than_the_labels(tmp_path):
    r = dpurun(tmp_path, "--", *TINY, "--dataset", "tests.bad_factories:four_labels", "--num-classes", "2")
    refused(r, "dpurun: error: --dataset tests.bad_factories:four_labels: the train set has label 3, outside "
               "0..1 for 2 classes; pass --num-classes 4 (labels are class indices from 0)")


def test_wrong_data_for_a_user_factory(tmp_path):
    wrong = tmp_path / "photos"  # the user's ImageFolder factory wants photos/train/<class>/...
    wrong.mkdir()
    r = dpurun(tmp_path, "--", *TINY, "--dataset", "tests.bad_factories:image_folder", "--data", str(wrong))
    refused(r, f"dpurun: error: --dataset tests.bad_factories:image_folder raised FileNotFoundError: [Errno 2] "
               f"No such file or directory: '{wrong}/train' (at tests/bad_factories.py:50 in image_folder) "
               f"(with --data {wrong}: is that the right directory?)")


def test_skip_checks_skips_the_dry_import(tmp_path):
    r = dpurun(tmp_path, "--skip-checks", "--", *TINY, "--dataset", "tests.bad_factories:pil_images")
    assert (r.returncode, r.errors, r.launched) == (0, [], True), r.stderr


# ---------------------------------------------------------------------- checkpoints and logs
def test_resume_latest_with_an_empty_ckpt_dir(tmp_path, bundled_data):
    empty = tmp_path / "ckpt"
    empty.mkdir()
    r = dpurun(tmp_path, "--", "--preset", "debug", "--data", str(bundled_data / "cifar10"),
               "--ckpt-dir", str(empty), "--resume", "latest")
    refused(r, f"dpurun: error: --resume latest: no complete checkpoint (step-<N>/ with COMMITTED) in {empty}; "
               "start without --resume (or with --resume auto, which starts from the beginning when nothing was "
               "kept), or pass the directory of one checkpoint")


def test_resume_auto_with_an_empty_ckpt_dir_is_not_refused(tmp_path, bundled_data):
    empty = tmp_path / "ckpt"
    empty.mkdir()
    r = dpurun(tmp_path, "--", "--preset", "debug", "--data", str(bundled_data / "cifar10"),
               "--ckpt-dir", str(empty), "--resume", "auto")
    assert r.returncode == 0 and r.errors == [] and r.launched, r.stderr   # (the ranks start from the beginning)


def test_a_scripts_resume_and_ckpt_dir_are_checked_before_launch(tmp_path):
    (tmp_path / "runs").write_text("not a directory\n")
    r = dpurun(tmp_path, "--", "--mode", "da", "--ckpt-dir", str(tmp_path / "runs" / "c"), "--resume",
               str(tmp_path / "gone"), "examples/ddp_loop.py")
    assert r.returncode == 2 and not r.launched and r.errors == [
        f"dpurun: error: --ckpt-dir {tmp_path}/runs/c: {tmp_path}/runs is a file, not a directory; "
        "pass a directory path (or move the file)",
        f"dpurun: error: --resume {tmp_path}/gone: no such checkpoint directory"], r.stderr


def test_an_injection_naming_a_rank_that_does_not_exist(tmp_path):
    r = dpurun(tmp_path, "--dpu-ranks", "1", "--", "--dataset", "fake", "--mode", "da", "--inject", "dpu:1@3")
    refused(r, "dpurun: error: --inject dpu:1@3:kill: there is no DPU rank 1 (this job has 1: dpu:0..0)")


def test_ckpt_dir_under_proc(tmp_path, bundled_data):
    r = dpurun(tmp_path, "--", "--preset", "debug", "--data", str(bundled_data / "cifar10"),
               "--ckpt-dir", "/proc/dpurun-ckpt", "--ckpt-every", "5")
    reason = r.errors[0].split("(")[1].split(")")[0] if r.errors else ""  # ENOENT as root, EACCES otherwise
    assert reason in ("No such file or directory", "Permission denied"), r.stderr
    refused(r, f"dpurun: error: --ckpt-dir /proc/dpurun-ckpt: cannot create it ({reason}); "
               "pass a directory you can write to")


def test_ckpt_dir_with_a_file_in_the_way(tmp_path, bundled_data):
    (tmp_path / "runs").write_text("not a directory\n")
    r = dpurun(tmp_path, "--", "--preset", "debug", "--data", str(bundled_data / "cifar10"),
               "--ckpt-dir", str(tmp_path / "runs" / "ckpt"), "--ckpt-every-epoch")
    refused(r, f"dpurun: error: --ckpt-dir {tmp_path}/runs/ckpt: {tmp_path}/runs is a file, not a directory; "
               "pass a directory path (or move the file)")


def test_all_problems_are_reported_at_once_the_cheap_ones_first(tmp_path):
    """Every check that imports nothing reports together, at once; the dry import of the factories (seconds)
    comes on the next try, once those are fixed, and a warning says so."""
    (tmp_path / "logs").write_text("")
    argv = ["--", *TINY, "--model", "tests.bad_factories:model_without_num_classes", "--inject", "dpu:3@2"]
    r = dpurun(tmp_path, *argv, "--log-dir", str(tmp_path / "logs"))
    assert r.returncode == 2 and not r.launched
    assert [ln.split(":")[2].strip() for ln in r.errors] == ["--inject dpu", "--log-dir " + str(tmp_path / "logs")]
    assert r.warnings == ["dpurun: warning: the model and data set factories were not imported yet (a dry import "
                          "takes seconds): they are checked once the errors below are fixed"]
    r = dpurun(tmp_path, *argv[:-2], "--log-dir", str(tmp_path / "new-logs"))
    assert [ln.split(":")[2].strip() for ln in r.errors] == ["--model tests.bad_factories"] and not r.warnings


def test_a_flag_mistake_is_told_before_the_factories_are_imported(tmp_path):
    """`--dpu-ranks 0 --mode da` with user factories: the rank check's line alone (no dry import first)."""
    r = dpurun(tmp_path, "--dpu-ranks", "0", "--", *TINY, "--mode", "da",
               "--model", "tests.bad_factories:model_without_num_classes")
    assert r.errors == ["dpurun: error: --mode da offloads work to DPU ranks, but --dpu-ranks is 0; use --dpu-ranks 1 "
                        "or more (or --mode none)"], r.stderr
    assert "model_without_num_classes" not in r.stderr


# ---------------------------------------------------------------------------- batch vs data
def test_batch_larger_than_the_dataset_warns_and_still_launches(tmp_path):
    r = dpurun(tmp_path, "--", *TINY, "--batch-size", "64")
    assert (r.returncode, r.errors, r.launched) == (0, [], True), r.stderr
    assert r.warnings == ["dpurun: warning: --batch-size 64 is larger than the 24 training samples each host "
                          "rank gets (24 samples / 1 host rank(s)): one short step of 24 per epoch; use "
                          "--batch-size 24 or less for full batches"]


# ------------------------------------------------------------------------------- module lookup
def test_a_module_in_the_current_directory_is_found(tmp_path):
    work = tmp_path / "project"
    work.mkdir()
    shutil.copy(REPO / "tests" / "user_factories.py", work / "mymodels.py")
    r = dpurun(tmp_path, "--", "--dataset", "mymodels:tiny_dataset", "--model", "mymodels:tiny_model",
               "--epochs", "1", cwd=work)
    assert (r.returncode, r.errors, r.launched) == (0, [], True), r.stderr


def test_a_user_module_that_fails_at_import_names_its_line(tmp_path):
    work = tmp_path / "project"
    work.mkdir()
    (work / "broken.py").write_text("import torch\n\nSIZE = undefined_name\n")
    r = dpurun(tmp_path, "--", "--dataset", "broken:make", "--model", "broken:make", cwd=work)
    refused(r, "dpurun: error: the dry import of your factories raised NameError: name 'undefined_name' is not "
               "defined (at broken.py:3 in <module>); fix it (or pass dpurun --skip-checks)")


def test_clone_override_is_checked_before_launch(tmp_path):
    r = dpurun(tmp_path, "--clone-ranks", "1", "--oversubscribe", "--", "--dataset", "fake", "--clone-at", "3",
               "--clone-override", "lr=fast")
    refused(r, "dpurun: error: --clone-override 'lr=fast': 'fast' is not a valid lr")


# ------------------------------------------------------------------------------ subcommands
def test_export_checkpoint_of_a_missing_directory(tmp_path):
    r = dpurun(tmp_path, "export-checkpoint", str(tmp_path / "MISSING"), str(tmp_path / "out.pt"))
    assert r.returncode == 2 and "--resume" not in r.stderr
    assert r.errors == [f"dpurun export-checkpoint: error: {tmp_path}/MISSING: no such directory; pass a "
                        "checkpoint directory (step-<N>/ with COMMITTED) or the --ckpt-dir that holds them"]
    assert not (tmp_path / "out.pt").exists()


def test_project_given_metrics_jsonl(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text(json.dumps({"event": "epoch", "epoch": 0, "train_loss": 2.1, "val_acc": 0.3}) + "\n")
    r = dpurun(tmp_path, "project", str(metrics))
    assert r.returncode == 2
    assert r.errors == [f"dpurun: error: {metrics} is not a dpuoffload profile: its last record has keys epoch, "
                        "event, train_loss, val_acc (it looks like a training log such as metrics.jsonl), a "
                        "profile has allreduce, batch, dpu_aug, dpu_eval, ...; pass the auto.jsonl that a "
                        "`--mode auto --log-dir DIR` run writes to DIR"]
