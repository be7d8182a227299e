"""Every page's code runs, on tiny data, as a user would paste it (tests/helpers/docs_pages.py)."""

import os
import subprocess
import sys

import pytest

from tests.helpers import docs_pages
from tests.helpers.paths import REPO_ROOT

PAGES = docs_pages.pages()
TIMEOUT_S = 600


def _params():
    for page in PAGES:
        if not page.runs_code():
            continue
        marks = [pytest.mark.multiprocess] + ([pytest.mark.slow] if page.slow else [])
        yield pytest.param(page, id=page.name, marks=marks)


@pytest.mark.parametrize("page", list(_params()))
def test_the_page_code_runs(page, tmp_path):
    env = dict(os.environ, KERAS_BACKEND=page.backend, KPT_EXAMPLE_QUICK="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    for number, script in enumerate(page.scripts(), 1):
        path = tmp_path / f"page_{number}.py"
        path.write_text(script)
        done = subprocess.run(
            [sys.executable, str(path)],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
        )
        assert done.returncode == 0, (
            f"{page.name}, part {number}, exited {done.returncode}:\n{done.stderr[-4000:]}"
        )


def test_every_python_block_runs_or_says_why_not():
    shown = 0
    for page in PAGES:
        for block in page.blocks:
            if block.lang in ("python", "py") and not block.hidden:
                shown += 1
                assert block.skip is None or block.skip.strip(), (page.name, block.line)
    assert shown >= 10


def test_shell_blocks_asked_to_run_are_shell():
    for page in PAGES:
        for block in page.blocks:
            if block.run:
                assert block.lang in ("bash", "sh"), (page.name, block.line, block.lang)


@pytest.mark.parametrize("page", PAGES, ids=[page.name for page in PAGES])
def test_sentences_are_under_40_words(page):
    long = [
        sentence
        for sentence in docs_pages.prose(page.path.read_text())
        if len(sentence.split()) >= 40
    ]
    assert not long, "\n\n".join(long)
