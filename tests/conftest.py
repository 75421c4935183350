"""Fixtures shared by several test files."""

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def bundled_data(tmp_path_factory) -> Path:
    """`dpurun make-data` output (cifar10/, svhn/, tinyimagenet/ of real digit images), written once
    per session; pass `bundled_data / "cifar10"` etc. as `--data`."""
    from dpuoffload.launch.make_data import make_data

    out = tmp_path_factory.mktemp("bundled")
    make_data(out, seed=0)
    return out


# ------------------------------------------------------------------------------ the order of the files
FILE_TIMES = Path(__file__).with_name("file_times.json")
UNKNOWN_FILE_S = 30.0  # a file not measured yet (a new one): placed among the real jobs


def pytest_collection_modifyitems(config, items) -> None:
    """Heaviest test files first. The test command runs two workers that take one whole file at a time
    (`--dist loadfile`) in collection order (`--no-loadscope-reorder`): a heavy file taken last keeps one
    worker busy while the other has nothing left, so the suite ends when that file does. Longest first
    (the times a clean clone measured, `tests/file_times.json`; `python -m tests.file_times JUNIT.xml`
    writes them) leaves only short files for the end. The order does not change what a test asserts."""
    import json

    times = json.loads(FILE_TIMES.read_text()) if FILE_TIMES.exists() else {}
    items.sort(key=lambda item: -times.get(Path(str(item.path)).name, UNKNOWN_FILE_S))  # (stable)
