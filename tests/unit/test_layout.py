"""The layout page (docs/layout.md) names every module, so a newcomer finds any concern in one hop."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LAYOUT = ROOT / "docs" / "layout.md"
FOLDERS = ("host", "dpu", "launch", "common", "benchmarks")


def layout_table() -> dict[str, str]:
    text = LAYOUT.read_text()
    table = text[text.index("# Layout"):].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([^`]+)/` \| (.*) \|$", table, flags=re.M)
    return dict(rows)


def test_every_module_is_in_the_layout_table():
    rows = layout_table()
    missing = []
    for path in sorted(ROOT.glob("*/**/*.py")):
        rel = path.relative_to(ROOT)
        if rel.parts[0] not in FOLDERS or path.name in ("__init__.py", "__main__.py"):
            continue
        folder = str(rel.parent)
        if f"`{path.name}`" not in rows.get(folder, ""):
            missing.append(str(rel))
    assert not missing, f"docs/layout.md lacks: {missing}"


def test_layout_table_names_no_missing_module():
    for folder, text in layout_table().items():
        for name in re.findall(r"`([a-z_]+\.py)`", text):
            assert (ROOT / folder / name).is_file(), f"docs/layout.md names {folder}/{name}, which does not exist"
