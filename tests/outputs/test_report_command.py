"""`keras-pipeline-tuner report LOGDIR` on the log dir of a real fit, as a user runs it."""

import os
import shutil
import subprocess
import sys

import pytest

from keras_pipeline_tuner import cli
from keras_pipeline_tuner.advice.recommendation import describe_gain
from tests.helpers import advised_fits

COMMAND = shutil.which("keras-pipeline-tuner")


def run(*args, env=None):
    command = [COMMAND] if COMMAND else [sys.executable, "-m", "keras_pipeline_tuner.cli"]
    return subprocess.run(
        command + list(args), capture_output=True, text=True, timeout=120, env=env
    )


def without_colour_settings():
    colour = ("FORCE_COLOR", "NO_COLOR", "TTY_COMPATIBLE")
    return {k: v for k, v in os.environ.items() if k not in colour}


@pytest.fixture(scope="module")
def input_bound(tmp_path_factory):
    return advised_fits.input_bound_run(tmp_path_factory)


def test_report_prints_verdict_then_ranked_advice(input_bound):
    done = run("report", str(input_bound.log_dir), env=without_colour_settings())
    assert done.returncode == 0, done.stderr
    out = done.stdout
    report = input_bound.report
    assert out.startswith("Input pipeline: highly input-bound")
    assert f"{report.input_fraction * 100:.1f} %" in out
    assert "Recommendations" in out
    for rank, recommendation in enumerate(report.recommendations, 1):
        assert f"{rank}. {recommendation.title}" in out
        assert describe_gain(recommendation.expected_gain) in out
    # Long code wraps at the terminal's width.
    assert " ".join(report.recommendations[0].fix.split()) in " ".join(out.split())
    assert "profiler: map(load_slowly)" in out
    # Not a terminal: no colour codes.
    assert "\x1b[" not in out


def test_report_uses_colour_when_asked(input_bound):
    env = dict(without_colour_settings(), FORCE_COLOR="1")
    done = run("report", str(input_bound.log_dir), env=env)
    assert done.returncode == 0, done.stderr
    assert "\x1b[" in done.stdout


def test_report_command_does_not_import_tensorflow(input_bound):
    code = (
        "import sys\n"
        "from keras_pipeline_tuner.cli import main\n"
        f"status = main(['report', {str(input_bound.log_dir)!r}])\n"
        "assert status == 0, status\n"
        "assert 'tensorflow' not in sys.modules, 'tensorflow was imported'\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "highly input-bound" in done.stdout


def test_report_of_a_log_dir_without_report(tmp_path):
    (tmp_path / "train").mkdir()
    done = run("report", str(tmp_path))
    assert done.returncode == cli.NO_REPORT
    assert "no report" in done.stderr and "report.json" in done.stderr
    assert done.stdout == ""


def test_details_print_user_text_verbatim():
    import io

    from keras_pipeline_tuner.advice.recommendation import Evidence
    from keras_pipeline_tuner.advice.recommendation import Recommendation
    from keras_pipeline_tuner.outputs.report import Report
    from keras_pipeline_tuner.outputs.terminal import print_summary

    recommendation = Recommendation(
        id="sequential-map",
        title="Parallelise map(parse[0])",
        severity="warning",
        evidence=[Evidence("profiler", "map(parse[/b]) holds 80 % of the input time.")],
        fix="ds = ds.map(parse, num_parallel_calls=tf.data.AUTOTUNE)",
        reason="parse [red]runs[/red] one element at a time.",
    )
    out = io.StringIO()
    print_summary(Report(recommendations=[recommendation]), out, details=True)
    text = out.getvalue()
    assert "1. Parallelise map(parse[0])" in text
    assert "parse [red]runs[/red] one element at a time." in text
    assert "profiler: map(parse[/b]) holds 80 % of the input time." in text
    assert "num_parallel_calls=tf.data.AUTOTUNE" in text
