"""The docs site builds strictly (mkdocs in a subprocess: broken links and anchors fail it)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_the_docs_build_strictly(tmp_path):
    """Broken links and anchors fail the build (mkdocs.yml's `validation`); scripts/test.sh runs it too."""
    pytest.importorskip("mkdocs")
    res = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
