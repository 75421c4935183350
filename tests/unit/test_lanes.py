"""The suite's lanes (tests/conftest.py): which test file each pytest worker takes next."""

from pathlib import Path

from tests.conftest import BUSY, WAITING, next_file

REPO = Path(__file__).resolve().parents[2]


def test_every_file_the_lanes_name_exists():
    """A renamed or removed test file would otherwise drop out of its lane without a word."""
    missing = [path for path in (*BUSY, *WAITING) if not (REPO / path).is_file()]
    assert not missing, f"tests/conftest.py names test files that do not exist: {missing}"
    assert not set(BUSY) & set(WAITING)


def test_each_lane_takes_its_longest_file_first():
    queue = ["tests/unit/test_config.py", WAITING[1], BUSY[2], WAITING[0], BUSY[0], "tests/jobs/test_new.py"]
    assert next_file(queue, busy_lane=True) == BUSY[0]
    assert next_file(queue, busy_lane=False) == WAITING[0]
    # a file neither list names goes to the waiting lane, after the files it names
    assert next_file(["tests/jobs/test_new.py", WAITING[1]], busy_lane=False) == WAITING[1]
    assert next_file(["tests/jobs/test_new.py", BUSY[3]], busy_lane=False) == "tests/jobs/test_new.py"


def test_the_busy_lane_helps_the_waiting_one_but_not_the_other_way_round():
    """A third busy job beside two cost more CPU than it saved; a waiting file beside them fills gaps."""
    assert next_file(["tests/unit/test_config.py", WAITING[2]], busy_lane=True) == WAITING[2]
    assert next_file([BUSY[5], BUSY[1]], busy_lane=False) is None
    assert next_file([], busy_lane=True) is None and next_file([], busy_lane=False) is None
