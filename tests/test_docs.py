"""The docs a newcomer reads: short README, a strict MkDocs build, and no figure that has gone stale.

Every figure the README and docs/ quote from a benchmark is marked and written from its results file
by `benchmarks/report.py`; these tests fail when the text and the file disagree (a new run, an edited
number), when a marker names nothing, and when a ratio or a test count is quoted without a marker.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import report

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
# A ratio (1.23×, 1.23x) or a test count (672 tests, 749 passed) quoted in prose must come from a file.
UNSOURCED = re.compile(r"\b\d+\.\d+ ?(×|x\b)|\b\d[\d,]* (tests|passed)\b")


def prose(text: str) -> str:
    """The text a reader takes for claims: without code blocks, inline code and marked figures."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    text = report.TABLE.sub("", report.FIGURE.sub("", text))
    return re.sub(r"`[^`\n]*`", "", text)


@pytest.fixture
def results_copy(tmp_path, monkeypatch):
    """The results files copied to a temporary folder that report.py reads instead."""
    copy = tmp_path / "results"
    shutil.copytree(report.RESULTS, copy, ignore=shutil.ignore_patterns("*.png", "quick"))
    monkeypatch.setattr(report, "RESULTS", copy)
    report.load.cache_clear()
    yield copy
    report.load.cache_clear()


def test_every_quoted_figure_matches_its_results_file():
    stale = [line for page in report.pages() for line in report.stale(page)]
    assert not stale, "run `python benchmarks/report.py`:\n" + "\n".join(stale)


def test_a_new_result_makes_the_quoted_figure_stale(results_copy):
    """What the test above guards against: a results file changes, the page still quotes the old value."""
    path = results_copy / "multinode.json"
    data = json.loads(path.read_text())
    data["report"]["da"]["ratio_to_none"] = 1.5
    path.write_text(json.dumps(data))
    stale = report.stale(ROOT / "docs" / "cluster.md")
    assert any("fig:multinode.da" in line and "1.500×" in line for line in stale), stale


def test_a_changed_verdict_makes_the_targets_table_stale(results_copy):
    path = results_copy / "clone.json"
    data = json.loads(path.read_text())
    for run in data["results"]["resnet50"]["ours-staged"]:
        run["readiness_s"] /= 10
    path.write_text(json.dumps(data))
    assert "benchmarks/RESULTS.md: table:targets differs" in report.stale(ROOT / "benchmarks" / "RESULTS.md")


def test_every_marker_names_a_figure_and_every_figure_is_quoted():
    texts = [page.read_text() for page in report.pages()]
    unknown = [m for text in texts for m in report.unknown_markers(text)]
    assert not unknown, f"markers without a function in benchmarks/report.py: {unknown}"
    used = {name for text in texts for _, name in report.MARKER.findall(text)}
    assert set(report.FIGURES) | set(report.TABLES) <= used, "figures no page quotes: " + str(
        sorted(set(report.FIGURES) | set(report.TABLES) - used))


def test_no_ratio_or_test_count_is_quoted_without_its_results_file():
    found = [(page.name, m.group(0)) for page in [README, *DOCS] for m in UNSOURCED.finditer(prose(page.read_text()))]
    assert not found, f"mark these with <!-- fig:NAME --> (benchmarks/report.py) or drop them: {found}"


def test_every_faults_results_file_is_in_the_run_order():
    """A new `benchmarks/faults.py --out` file must be placed in FAULT_RUNS, or its kinds would be ignored."""
    assert {p.name for p in report.RESULTS.glob("faults*.json")} == set(report.FAULT_RUNS)


def test_the_readme_is_short_and_its_links_resolve():
    text = README.read_text()
    assert len(text.splitlines()) <= 250
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    missing = [link for link in links if "://" not in link and not (ROOT / link).exists()]
    assert links and not missing, missing
    assert "bash scripts/demo.sh" in text and "bash scripts/test.sh" in text


def test_the_docs_build_strictly(tmp_path):
    """Broken links and anchors fail the build (mkdocs.yml's `validation`); scripts/test.sh runs it too."""
    pytest.importorskip("mkdocs")
    res = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
