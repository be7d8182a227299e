"""`keras-pipeline-tuner report` and the TensorBoard text on corrupt or hostile report.json.

A report file is data from disk: whatever it holds, the command prints a clear
error or shows the text as typed. Rich markup, terminal escape sequences,
markdown and HTML in its strings are never interpreted, rendered or executed.
"""

import json
import os
import shutil
import subprocess
import sys

import pytest
from tensorboard import plugin_util

import keras_pipeline_tuner as kpt
from keras_pipeline_tuner import cli
from keras_pipeline_tuner.advice.recommendation import Evidence
from keras_pipeline_tuner.advice.recommendation import ExpectedGain
from keras_pipeline_tuner.advice.recommendation import Recommendation
from keras_pipeline_tuner.outputs.markdown import render_markdown
from keras_pipeline_tuner.profiling.evidence import IteratorTime
from keras_pipeline_tuner.profiling.evidence import ProfileEvidence
from keras_pipeline_tuner.timing.step_stats import Distribution
from keras_pipeline_tuner.timing.step_stats import StepStats

COMMAND = shutil.which("keras-pipeline-tuner")
ESC = "\x1b"

# Each one would do something if interpreted: style or hide text, retitle or
# clear the terminal, render an image that loads a URL, run a script or a shell.
RICH_MARKUP = "[bold red]red[/bold red] [/] [link=https://example.com]link[/link]"
ESCAPES = ESC + "]0;retitled" + "\x07" + ESC + "[2J" + ESC + "[31mred"
HTML = '<script>alert(1)</script><img src="https://example.com/x.png">'
MARKDOWN = "**bold** _it_ [link](https://example.com) | cell | # heading"
SHELL = "$(touch PWNED) `touch PWNED` {0} %s {report}"
HOSTILE = [RICH_MARKUP, ESCAPES, HTML, MARKDOWN, SHELL]
VISIBLE_ESCAPES = "\\x1b]0;retitled\\x07\\x1b[2J\\x1b[31mred"


def hostile_report() -> kpt.Report:
    text = " | ".join(HOSTILE)
    stats = StepStats(
        steps=10**300,
        input_wait=Distribution(mean_ms=1e308, median_ms=1e308, p90_ms=1e308),
        step=Distribution(mean_ms=1e308, median_ms=1e308, p90_ms=1e308),
        input_fraction=1.0,
    )
    stage = "map(`x` | " + text + ")"
    return kpt.Report(
        verdict=kpt.Verdict.HIGHLY_INPUT_BOUND,
        input_fraction=1.0,
        train=stats,
        notes=list(HOSTILE) + ["x" * 1_000_000],
        recommendations=[
            Recommendation(
                id=text,
                title=text,
                severity=text,
                evidence=[Evidence(source=text, detail=text)],
                fix="ds = ds.map(f)\n```\n" + text,
                expected_gain=ExpectedGain(speedup=1e308, statement=text),
                reason=text,
            )
        ],
        profile=ProfileEvidence(
            run_dir=text,
            first_step=-(10**30),
            stop_step=10**30,
            input_fraction=0.5,
            conclusion=text,
            iterators=[IteratorTime(stage, stage, None, None, 10**30, 1e308, 1e308, 1.0, False)],
            bottleneck=stage,
            bottleneck_iterator=stage,
        ),
    )


def run(*args, env):
    command = [COMMAND] if COMMAND else [sys.executable, "-m", "keras_pipeline_tuner.cli"]
    return subprocess.run(
        command + list(args), capture_output=True, text=True, timeout=120, env=env
    )


def environment(**extra):
    colour = ("FORCE_COLOR", "NO_COLOR", "TTY_COMPATIBLE")
    return dict({k: v for k, v in os.environ.items() if k not in colour}, **extra)


@pytest.fixture(scope="module")
def hostile_log_dir(tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("hostile")
    (log_dir / "report.json").write_text(hostile_report().to_json())
    return log_dir


def test_hostile_strings_are_printed_as_typed(hostile_log_dir, tmp_path):
    done = run("report", str(hostile_log_dir), env=environment(COLUMNS="100000"))
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert ESC not in out and "\x07" not in out
    for literal in (RICH_MARKUP, VISIBLE_ESCAPES, HTML, MARKDOWN, SHELL):
        assert out.count(literal) >= 5, literal  # notes, title, reason, evidence, ...
    assert "x" * 1_000_000 in out
    assert "Input pipeline: highly input-bound" in out
    assert not (tmp_path / "PWNED").exists() and not os.path.exists("PWNED")


def test_hostile_escape_sequences_stay_text_in_colour(hostile_log_dir):
    done = run("report", str(hostile_log_dir), env=environment(FORCE_COLOR="1"))
    assert done.returncode == 0, done.stderr
    # The command's own colours, never the report's sequences.
    assert ESC + "[" in done.stdout
    assert ESC + "]0;" not in done.stdout and ESC + "[2J" not in done.stdout
    assert "\x07" not in done.stdout


def test_hostile_report_is_escaped_in_the_tensorboard_text(hostile_log_dir):
    report = kpt.Report.from_json((hostile_log_dir / "report.json").read_text())
    page = plugin_util.markdown_to_safe_html(render_markdown(report))
    # Rendered by TensorBoard's own markdown pipeline, as the Text tab shows it.
    assert "<script" not in page and "<img" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert '<a href="https://example.com"' not in page
    assert "<strong>bold</strong>" not in page
    # The fix stays one code block, the stage one code span.
    assert page.count("<pre>") == 1
    assert "ds = ds.map(f)\n```\n" in page
    assert "<code>map(`x` | " in page
    assert "<h1>" not in page


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "invalid JSON"),
        ("\x00\xff garbage", "invalid JSON"),
        ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
        ('{"notes": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested too deeply"),
        ('{"input_fraction": NaN}', "NaN"),
        ('{"input_fraction": -Infinity}', "Infinity"),
        ('{"input_fraction": 1e400}', "report.input_fraction should be a finite number"),
        ('{"train": {"steps": 1e400}}', "report.train.steps should be of type int"),
        ('{"train": {"steps": 1' + "0" * 5000 + "}}", "digits"),
        ('{"train": {"steps": true}}', "report.train.steps"),
        ('{"train": {"input_wait": {"median_ms": "12"}}}', "report.train.input_wait.median_ms"),
        ('{"notes": "one note"}', "report.notes should be a list"),
        ('{"notes": [1]}', "report.notes[0]"),
        ('{"epochs": [{}]}', "report.epochs[0].epoch is missing"),
        ('{"first_steps": {"train": []}}', "report.first_steps.train should be an object"),
        ('{"recommendations": [{"id": "x", "title": "t"}]}', "severity is missing"),
        ('{"profile": {"iterators": [{"stage": "s"}]}}', "report.profile.iterators[0]"),
        ('{"verdict": "<b>slow</b>"}', "report.verdict has unknown value"),
    ],
    ids=lambda value: value[:30],
)
def test_corrupt_reports_give_a_clear_error(text, message, tmp_path, capsys):
    (tmp_path / "report.json").write_text(text, encoding="utf-8", errors="surrogateescape")
    status = cli.main(["report", str(tmp_path)])
    out, err = capsys.readouterr()
    assert status == cli.UNREADABLE
    assert out == ""
    assert err.startswith("keras-pipeline-tuner: cannot read ")
    assert message in err
    assert "Traceback" not in err


def test_a_binary_report_file(tmp_path, capsys):
    (tmp_path / "report.json").write_bytes(os.urandom(4096) + b"\xff\xfe")
    assert cli.main(["report", str(tmp_path)]) == cli.UNREADABLE
    assert "cannot read" in capsys.readouterr().err


def test_a_report_directory_instead_of_a_file(tmp_path, capsys):
    (tmp_path / "report.json").mkdir()
    assert cli.main(["report", str(tmp_path)]) == cli.NO_REPORT
    assert "no report" in capsys.readouterr().err


def test_reading_a_report_does_not_change_it():
    report = hostile_report()
    again = kpt.Report.from_json(report.to_json())
    assert again == report
    assert json.loads(again.to_json()) == json.loads(report.to_json())
