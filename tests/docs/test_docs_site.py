"""The documentation site builds with no warning: broken links, missing pages, bad docstrings."""

import os
import subprocess
import sys

import pytest

from tests.helpers.paths import REPO_ROOT

pytest.importorskip("mkdocs", reason="the docs extra is not installed: pip install -e '.[docs]'")


def test_mkdocs_build_strict(tmp_path):
    site = tmp_path / "site"
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, NO_MKDOCS_2_WARNING="1"),
    )
    assert done.returncode == 0, done.stderr[-4000:]
    # The API reference is generated from the docstrings.
    api = (site / "api" / "index.html").read_text()
    assert "PipelineTuner" in api and "Verdict" in api
