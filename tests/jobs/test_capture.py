"""`--ckpt-copy overlap`'s background copy (`host.capture`): it packs the bytes a staged copy packs,
its progress is a prefix, and once settled nothing written to the tensors afterwards reaches the
copy (the next optimizer step's writes). The real-job check (checkpoints and clone equal to a staged
run's, to the bit) is `tests/jobs/test_checkpoint.py::test_an_overlapped_copy_hands_off_the_same_state_as_a_staged_one`.

(Here the tests that start processes; those that run in one process: tests/unit/test_capture.py.)
"""

import pytest

from tests.unit.test_capture import needs_gpu


@needs_gpu
@pytest.mark.gpu
@pytest.mark.mpi
def test_gpu_checkpoints_copied_on_a_side_stream_equal_staged_ones(bundled_data, tmp_path):
    """The built-in trainer on a GPU: `--ckpt-copy overlap`'s checkpoints (copied on a side stream beside
    the next step) hold the same bytes as `staged` ones (copied before the host goes on), every one of
    them, and training is unchanged."""
    import json

    from dpuoffload.common.state import ckptfiles
    from tests.mpijobs import dpurun

    def run(copy: str) -> tuple:
        log, ck = tmp_path / copy, tmp_path / f"{copy}-ck"
        r = dpurun(["--dpu-ranks", "1"], ["--preset", "debug", "--data", str(bundled_data / "cifar10"), "--epochs",
                                          "1", "--train-subset", "128", "--device", "cuda", "--mode", "da",
                                          "--ckpt-dir", str(ck), "--ckpt-every", "2", "--ckpt-keep", "8",
                                          "--ckpt-copy", copy, "--log-dir", str(log), "--no-progress"])
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        end = [json.loads(x) for x in (log / "metrics.jsonl").read_text().splitlines()][-1]
        shards = {d.name: ckptfiles.read_manifest(d)["files"][ckptfiles.shard_name(0)] for d in ckptfiles.committed(ck)}
        return end["weights_sha256"], shards

    weights, shards = run("overlap")
    assert (weights, shards) == run("staged") and len(shards) >= 3
