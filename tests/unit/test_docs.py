"""The docs a newcomer reads: short README, a strict MkDocs build, and no figure that has gone stale.

Every figure the README and docs/ quote from a benchmark is marked and written from its results file
by `benchmarks/report.py`; these tests fail when the text and the file disagree (a new run, an edited
number), when a marker names nothing, and when a ratio or a test count is quoted without a marker.

Every other measured figure in prose must say where it comes from (`unsourced_figures`). A measured
figure is a decimal with a unit of time, share, ratio or rate (0.6 ms, 4.6 %, 1.15×, 18.5 Gbit/s), a
span with such a unit (27-59 s, 5-16 %), "N times", "N vs M", or a number to three decimals or more
(a loss, a ratio: 2.8488, 0.964). It passes when it is marked, when it is code (a fenced block: real
output, dated; inline code: a flag, a constant), or when its paragraph names its source: a results
file (`benchmarks/results/NAME`, which must exist), `benchmarks/RESULTS.md` or its archive (which
hold the by-hand measurements, dated), or a paper of ../shared/papers by name (`PAPERS`). Not
checked: a whole number with a unit (30 s, 90 %: how settings are written) and sizes (MB, GB: a
model's or a setting's, not a measurement). The paragraph is the unit: the lines up to a blank line,
with each list item, table row and heading on its own.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from benchmarks import report

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
# A ratio (1.23×, 1.23x) or a test count (672 tests, 749 passed) quoted in prose must come from a file.
UNSOURCED = re.compile(r"\b\d+\.\d+ ?(×|x\b)|\b\d[\d,]* (tests|passed)\b")
FENCED = re.compile(r"^[ \t]*```.*?^[ \t]*```[^\n]*$", re.S | re.M)
INLINE_CODE = re.compile(r"`[^`]*`")

# A measured figure (the module's docstring): a decimal with a unit, a span with a unit, N times, N vs M,
# a number to three decimals or more.
_NUM = r"[-+−±]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?"
_UNIT = r"(?:ms|µs|us|ns|s|min|minutes|seconds|hours|%|×|x|points|img/s|samples/s|Gbit/s|Mbit/s|MB/s|GB/s)"
MEASURED = re.compile(rf"(?<![\w.])(?:[-+−±]?\d+\.\d+|{_NUM} ?(?:-|–|to) ?{_NUM}) ?{_UNIT}(?![\w/])"
                      rf"|(?<![\w.]){_NUM} times\b|(?<![\w.]){_NUM} vs\.? {_NUM}\b"
                      r"|(?<![\w.])[-+−]?\d+\.\d{3,}(?![\w.]?\d)")
# What a paragraph names as its figures' source: a results file, RESULTS.md or its archive, or a paper.
PAPERS = ("shared/papers/", "DeepFreeze", "DeepClone", "the recovery study", "the published BlueField-2 designs")
SOURCE = re.compile(r"benchmarks/results/|RESULTS(?:-archive)?\.md|" + "|".join(map(re.escape, PAPERS)))
CITED = re.compile(r"benchmarks/results/([\w.-]+(?:/[\w.-]+)*)")


def prose(text: str) -> str:
    """The text a reader takes for claims: without code blocks, inline code and marked figures."""
    text = FENCED.sub("", text)
    text = report.TABLE.sub("", report.FIGURE.sub("", text))
    return re.sub(r"`[^`\n]*`", "", text)


def paragraphs(text: str) -> list[str]:
    """The page without code blocks, marked figures and tables, in paragraphs: a blank line ends one,
    and each list item, table row and heading begins one. (A marked figure leaves a word in its place,
    so that a figure on a line of its own does not split its paragraph.)"""
    text = report.TABLE.sub("(table)", report.FIGURE.sub("(figure)", FENCED.sub("", text)))
    return [p for p in re.split(r"\n[ \t]*\n|\n(?=[ \t]*(?:[-*+] |\d+\. |\||#))", text) if p.strip()]


def unsourced_figures(text: str) -> list[tuple[str, str]]:
    """Each measured figure outside code whose paragraph names no source, with the paragraph's start."""
    found = []
    for paragraph in paragraphs(text):
        if SOURCE.search(paragraph):
            continue
        found += [(m.group(0), " ".join(paragraph.split())[:80])
                  for m in MEASURED.finditer(INLINE_CODE.sub("", paragraph))]
    return found


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


def test_every_measured_figure_in_prose_names_its_source():
    found = [f"{page.name}: {figure!r} in {start!r}" for page in [README, *DOCS]
             for figure, start in unsourced_figures(page.read_text())]
    assert not found, ("mark these (<!-- fig:NAME -->, benchmarks/report.py), or name the results file in their "
                       "paragraph, or drop them:\n" + "\n".join(found))


def test_every_results_file_a_page_names_as_a_source_exists():
    cited = {m[1].rstrip(".") for page in [README, *DOCS] for paragraph in paragraphs(page.read_text())
             for m in CITED.finditer(paragraph)}
    missing = sorted(name for name in cited if not (report.RESULTS / name).exists())
    assert cited and not missing, missing


@pytest.mark.parametrize("text, figures", [
    ("One host and one DPU rank trained 1.15 times slower with every rank yielding.", ["1.15 times"]),
    ("One host and one DPU rank trained 1.15 times slower (benchmarks/results/x.json).", []),
    ("It trained 1.15 times slower (by hand, `benchmarks/RESULTS.md`).", []),
    ("A step took 164 vs 175 ms,\nand 0.6 ms for the float steps, 1.1 % of a step.\n\nNext (RESULTS.md).",
     ["164 vs 175", "0.6 ms", "1.1 %"]),
    ("The jobs took 27-59 s; rollback 5-16 % longer; -8.2 % to +4.4 %.", ["27-59 s", "5-16 %", "-8.2 %", "+4.4 %"]),
    ("```\nepoch 1/3 | 2.6 s, 228 samples/s | data 4%\n```\n\nThe output above.", []),
    ("- a list item:\n\n  ```\n  took 0.38 s\n  ```\n- the next item", []),
    ("Run `--dpu-speed 0.5` or `timeout=0.5 s`.", []),
    ("Faster by <!-- fig:baseline.spin_vs_yield -->1.46×<!-- /fig --> here.", []),
    ("Slurm waits 30 s, keeps 8 MB and fails at 90 %; torch 2.14.1, Python 3.10, 1,797 digits.", []),
    ("- 2.2 s in this item\n- none in this one (RESULTS.md)", ["2.2 s"]),
    ("An AVX2 VM printed 2.9389 / 1.9719; torch 2.14.1, Open MPI 5.0.11.", ["2.9389", "1.9719"]),
    ("Its blocking phase was 2.5 times shorter than a synchronous save's.", ["2.5 times"]),
    ("DeepFreeze's blocking phase was 2.5 times shorter than a synchronous save's.", []),
])
def test_the_figure_scanner(text, figures):
    """What counts as a measured figure, and what sources or exempts it (the module's docstring)."""
    assert [figure for figure, _ in unsourced_figures(text)] == figures


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
