"""Write `tests/file_times.json`, each test file's seconds in a run, from that run's JUnit XML.

    bash scripts/test.sh --junitxml=/tmp/junit.xml      # a clean clone, nothing else running
    python -m tests.file_times /tmp/junit.xml

`tests/conftest.py` orders the files heaviest first with it (why: its `pytest_collection_modifyitems`).
A testcase's time in the XML includes its fixtures' set-up, so a file's sum is what a worker spends on it.
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

OUT = Path(__file__).with_name("file_times.json")


def file_times(junit: Path) -> dict[str, float]:
    """Seconds per test file (`tests/test_x.py` -> `test_x.py`), heaviest first."""
    totals: dict[str, float] = defaultdict(float)
    for case in ET.parse(junit).getroot().iter("testcase"):
        module = case.get("classname", "").split(".")
        name = next((f"{part}.py" for part in module if part.startswith("test_")), None)
        if name is not None:
            totals[name] += float(case.get("time", 0.0))
    return {k: round(v, 1) for k, v in sorted(totals.items(), key=lambda kv: -kv[1])}


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    times = file_times(Path(sys.argv[1]))
    OUT.write_text(json.dumps(times, indent=1) + "\n")
    print(f"{OUT}: {len(times)} files, {sum(times.values()) / 60:.1f} min in all; heaviest: "
          + ", ".join(f"{k} {v:.0f} s" for k, v in list(times.items())[:5]))


if __name__ == "__main__":
    main()
