"""Streams of shards: the split over host ranks, the shuffle, the reader, tar shards, errors.

(Here the tests that start processes; those that run in one process: tests/unit/test_shards.py.)
"""

from __future__ import annotations

import pytest

from dpuoffload.common.data.tarshards import webdataset
from dpuoffload.launch.make_data import _tar
from tests.unit.test_shards import jpeg


@pytest.fixture
def shards(tmp_path):
    for s, n in enumerate((5, 3, 4)):
        members = [(f"{s}{k:03d}", jpeg(10 * k + s), k % 3) for k in range(n)]
        (tmp_path / f"train-{s:06d}.tar").write_bytes(_tar(members))
    return tmp_path


def test_pipe_shard_names_are_read_through_webdatasets_gopen(shards):
    data = webdataset(f"pipe:cat {shards}/train-{{000000..000002}}.tar")
    assert data.sizes == (5, 3, 4)
    assert data[6][1] == 1 and data.shards[0] == f"pipe:cat {shards}/train-000000.tar"
