"""The README is a first page: short, its commands first, its terminal summary true."""

import io
import re

import pytest

from keras_pipeline_tuner.outputs.report import Report
from keras_pipeline_tuner.outputs.terminal import print_summary
from keras_pipeline_tuner.timing import step_stats
from keras_pipeline_tuner.timing.step_stats import verdict_for
from tests.helpers.paths import REPO_ROOT

README = REPO_ROOT / "README.md"
DEMO_COMMAND = 'pip install ".[cpu]" && keras-pipeline-tuner demo'
TEST_COMMAND = 'pip install -e ".[test]" && python -m pytest -q'
# A real report, from the naive fit of `keras-pipeline-tuner demo` (see
# docs/diagrams/demo_assets.py), and the pages that show its summary.
DEMO_REPORT = REPO_ROOT / "docs" / "demo-report.json"
SHOWN_IN = [README, REPO_ROOT / "docs" / "reading-the-report.md"]
_SUMMARY = re.compile(
    r"<!-- terminal-summary -->\s*```text\n(?P<text>.*?)```\s*<!-- /terminal-summary -->", re.S
)


def test_the_readme_is_at_most_150_lines_with_both_commands_in_its_first_10():
    lines = README.read_text().splitlines()
    assert len(lines) <= 150
    head = lines[:10]
    assert DEMO_COMMAND in head
    assert TEST_COMMAND in head


def test_ci_runs_the_readme_test_command():
    assert TEST_COMMAND in (REPO_ROOT / ".ci" / "run").read_text()


@pytest.mark.parametrize("page", SHOWN_IN, ids=[p.name for p in SHOWN_IN])
def test_the_terminal_summary_shown_is_what_the_library_prints(page, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    printed = io.StringIO()
    print_summary(Report.from_json(DEMO_REPORT.read_text()), file=printed)
    shown = _SUMMARY.search(page.read_text())
    assert shown, f"{page.name} has no block between <!-- terminal-summary --> comments"
    assert shown.group("text") == printed.getvalue()


def test_the_verdict_table_matches_the_thresholds():
    text = README.read_text()
    high = step_stats.HIGHLY_INPUT_BOUND_FRACTION
    moderate = step_stats.MODERATELY_INPUT_BOUND_FRACTION
    h, m = round(high * 100), round(moderate * 100)
    for row in (
        f"| >= {h} % | {verdict_for(high).value} |",
        f"| {m}-{h} % | {verdict_for(moderate).value} |",
        f"| < {m} % | {verdict_for(0.0).value} |",
    ):
        assert row in text
