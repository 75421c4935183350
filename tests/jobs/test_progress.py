"""Sends that move only while their sender polls: a DPU rank's ring finds out with its first marker.

Open MPI's single-copy shared memory lets the host pull a batch while the DPU rank augments the
next; without it (`--mca smsc ^cma`, or a container that forbids cross-process reads) a large
message moves only while both ends call into MPI, as over TCP, and a ring that slept between polls
moved 0.01-0.02 of raw MPI at 3-19 MB (benchmarks/RESULTS.md). The ring's first marker is padded to
a full batch and left alone for a while (`SendRing.probe`): if it has not arrived, the stream polls
often, and its messages say so (`FLAG_POLL`) so the host polls as often.
"""

from __future__ import annotations

import pytest

from tests.mpijobs import dpurun, read_jsonl

pytestmark = pytest.mark.mpi


def _da(bundled_data, log, *launcher: str) -> dict:
    res = dpurun(["--host-ranks", "1", "--dpu-ranks", "1", *launcher],
                 ["--preset", "debug", "--data", str(bundled_data / "cifar10"), "--epochs", "1", "--mode", "da",
                  "--batch-size", "64", "--train-subset", "128", "--val-subset", "32", "--digest-batches",
                  "--no-progress",
                  "--log-dir", str(log)])
    assert res.returncode == 0, res.stdout + res.stderr
    dpu_end = next(r for r in read_jsonl(log / "phases-rank1.jsonl") if r.get("event") == "end")
    return {"polls": dpu_end["polls"], "digests": [e["batch_digest"] for e in read_jsonl(log / "phases-rank0.jsonl")],
            "weights": next(m for m in read_jsonl(log / "metrics.jsonl") if m["event"] == "end")["weights_sha256"]}


def test_without_single_copy_the_stream_polls_and_trains_to_the_bit_as_with_it(bundled_data, tmp_path):
    """Batches of 64 CIFAR samples (787 KB messages: Open MPI pipelines them in 32 KB fragments
    without single-copy, so the probe cannot pass by luck)."""
    single_copy = _da(bundled_data, tmp_path / "cma")
    without = _da(bundled_data, tmp_path / "no-cma", "--mpirun-arg=--mca smsc ^cma")
    assert single_copy["polls"] == {"0": False}  # the padded marker arrived while the ring slept
    assert without["polls"] == {"0": True}       # it did not: the stream polls
    assert without["digests"] == single_copy["digests"] and len(without["digests"]) == 1
    assert without["weights"] == single_copy["weights"]
