"""The scripts under examples/ run as they are."""

import os
import pathlib
import re
import subprocess
import sys

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"


def run_example(name, tmp_path):
    env = dict(os.environ, KPT_EXAMPLE_QUICK="1", TF_CPP_MIN_LOG_LEVEL="2")
    return subprocess.run(
        [sys.executable, str(EXAMPLES / name)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_custom_loop_example_prints_the_verdict(tmp_path):
    result = run_example("custom_loop.py", tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    verdict = re.search(r"^Verdict: (.+?) \(", result.stdout, re.MULTILINE)
    assert verdict is not None, result.stdout
    # The example's pipeline decodes in Python, one example at a time.
    assert verdict.group(1) == "highly input-bound"
    assert (tmp_path / "logs" / "custom_loop" / "report.json").is_file()
