"""uint8 on the wire (`common.data.wire`): where a transform can be split, and that the split keeps every
batch bit-identical: the DPU's part per sample, then the host's float steps on the whole uint8 batch,
give the bytes the whole transform gives sample by sample, for v1 and v2 pipelines.

(Here the tests that start processes; those that run in one process: tests/unit/test_wire.py.)
"""

from __future__ import annotations

import pytest


@pytest.mark.mpi
def test_a_loader_hands_its_float_steps_over_and_sends_uint8_batches():
    """`DpuLoader.defer_float_steps` in a real job (one host, one DPU rank, `--wire uint8`): the
    batches stay uint8, and the handed steps on whole batches give the usual loader's bytes."""
    import json

    from tests.mpijobs import dpurun

    r = dpurun([], ["--mode", "da", "--wire", "uint8", "tests/api_scripts/deferred_float_steps.py"])
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    got = json.loads(next(ln for ln in r.stdout.splitlines() if ln.startswith("RESULT "))[len("RESULT "):])
    assert got == {"same": True, "deferred_dtypes": ["torch.uint8"], "steps": "HostSteps(ToTensor, Normalize)"}
