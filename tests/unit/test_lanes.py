"""The suite's lanes (tests/conftest.py): which test file each pytest worker takes next."""

from pathlib import Path

from tests.conftest import BUSY, WAITING, lane_rank

REPO = Path(__file__).resolve().parents[2]


def test_every_file_the_lanes_name_exists():
    """A renamed or removed test file would otherwise drop out of its lane without a word."""
    missing = [path for path in (*BUSY, *WAITING) if not (REPO / path).is_file()]
    assert not missing, f"tests/conftest.py names test files that do not exist: {missing}"
    assert not set(BUSY) & set(WAITING)


def pick(queue: list[str], busy_lane: bool) -> str:
    return min(queue, key=lambda path: lane_rank(path, busy_lane))


def test_each_lane_takes_its_longest_file_first_then_helps_the_other():
    queue = ["tests/unit/test_config.py", WAITING[1], BUSY[2], WAITING[0], BUSY[0], "tests/jobs/test_new.py"]
    assert pick(queue, busy_lane=True) == BUSY[0]
    assert pick(queue, busy_lane=False) == WAITING[0]
    # a file neither list names goes after the named ones of its lane (a new job file: the waiting lane's)
    assert pick(["tests/jobs/test_new.py", WAITING[1]], busy_lane=False) == WAITING[1]
    assert pick(["tests/jobs/test_new.py", BUSY[3]], busy_lane=False) == "tests/jobs/test_new.py"
    # a lane with nothing of its own left takes the other's next file, longest first
    assert pick(["tests/unit/test_config.py", WAITING[2]], busy_lane=True) == WAITING[2]
    assert pick([BUSY[5], BUSY[1]], busy_lane=False) == BUSY[1]
