"""One figure per quantity: a real run, through every output, shows each quantity alike.

Small fits with known injected delays (a `py_function` map that sleeps 30 ms, one
of 5 ms, and the first of them cached, whose first epoch fills the cache), each
with a profiler window, are read back from each output a user sees: the terminal
summary, `report.json`, the Text tab's markdown, the dashboard's data routes
(through TensorBoard's own WSGI app) and the `report` and `check` commands. The
step (the steady state's median), the input share, the input-free ceiling, the
profiler window's range and the verdict must be the same figure, in the same
words, in all of them: they are built once (`Report.figures`) and only read.
"""

import io
import json
import os
import re
import subprocess
import sys
import time

import pytest
import tensorflow as tf

import keras_pipeline_tuner as kpt
from keras_pipeline_tuner.advice.recommendation import CPU_USE
from keras_pipeline_tuner.advice.recommendation import describe_gain
from keras_pipeline_tuner.outputs.dashboard import summaries
from keras_pipeline_tuner.outputs.markdown import escape
from keras_pipeline_tuner.outputs.markdown import render_markdown
from keras_pipeline_tuner.outputs.report import REPORT_FILENAME
from keras_pipeline_tuner.outputs.terminal import print_summary
from tests.helpers.advised_fits import load_slowly
from tests.helpers.paths import REPO_ROOT
from tests.helpers.tensorboard_app import wsgi_client
from tests.helpers.training_data import FEATURES
from tests.helpers.training_data import cached_source
from tests.helpers.training_data import tiny_model

STEPS = 30
EPOCHS = 2
WINDOW = (3, 15)
ROUTE = f"/data/plugin/{summaries.PLUGIN_NAME}"
RUN = summaries.RUN
# "12.3 %": every share the outputs print.
PERCENT = re.compile(r"(\d+\.\d) %")


def sleep_5_ms(x, y):
    """A `py_function` map of 5 ms an element."""

    def work(value):
        time.sleep(0.005)
        return value

    x = tf.py_function(work, [x], tf.float32)
    x.set_shape((FEATURES,))
    return x, y


# Each a pipeline a user writes, with the epochs that show its steady state.
PIPELINES = {
    # 30 ms of Python a batch against a step of about a millisecond: input-bound
    # whatever the machine's load.
    "sleeping map": (lambda: cached_source(STEPS).map(load_slowly).batch(1), EPOCHS),
    "5 ms py_function map": (
        lambda: cached_source(STEPS * 4).map(sleep_5_ms).batch(4), EPOCHS
    ),
    # The first epoch fills the cache, in which the window falls; later epochs decide.
    "cached pipeline": (
        lambda: cached_source(STEPS).map(load_slowly).cache().batch(1), 3
    ),
}
# A step that computes 40 ms (sleeping): beside other work, a cached batch's fetch
# on a step of about a millisecond waited 20-60 % of it in one epoch and none in
# the next (the cache read once, the delays the scheduler's), so the steady
# epochs' classes followed the machine's load. The fill still waits 30 ms a step.
COMPUTE_S = {"cached pipeline": 0.04}


@pytest.fixture(scope="module", params=sorted(PIPELINES))
def run(request, tmp_path_factory):
    build, epochs = PIPELINES[request.param]
    log_dir = tmp_path_factory.mktemp("one_figure")
    tuner = kpt.PipelineTuner(log_dir=log_dir, verbose=0, profile=WINDOW)
    model = tiny_model(COMPUTE_S.get(request.param, 0.0))
    model.fit(build(), epochs=epochs, callbacks=[tuner], verbose=2)
    # The window's conversion may still run after fit: its evidence, and every
    # output written again with it.
    report = tuner.wait_for_profile()
    assert report.figures is not None and report.figures.window is not None, report.notes
    return log_dir, report


def shared(report):
    """Each shared quantity as every output words it."""
    figures = report.figures
    window = figures.window
    return {
        "verdict": figures.verdict.value,
        "share": f"{figures.input_fraction * 100:.1f} %",
        "step": f"{figures.step_ms:.2f}",
        "input free": describe_gain(figures.input_free),
        "window": f"steps {window.first_step}-{window.last_step} ({window.steps} steps)",
        "window share": f"{window.input_fraction * 100:.1f} % input",
    }


def terminal_text(report) -> str:
    out = io.StringIO()
    print_summary(report, file=out)
    return out.getvalue()


def cli(*args):
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), NO_COLOR="1")
    command = [sys.executable, "-m", "keras_pipeline_tuner.cli", *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
    return done


def assert_all_shown(text: str, report, where: str) -> None:
    for name, figure in shared(report).items():
        assert figure in text, f"{where}: the {name} {figure!r} is not shown"


def assert_one_share(text: str, report, where: str) -> None:
    """The only input shares are the verdict's, its wait at the fetch (where a
    replay or the input's CPU use decided, the verdict names it as a part) and
    the window's (as evidence), and one-off costs' stated as such: no second
    figure for the run's share."""
    figures = report.figures
    allowed = {
        f"{figures.input_fraction * 100:.1f}",
        f"{figures.window.input_fraction * 100:.1f}",
    }
    judgement = report.judgement
    if judgement.source == CPU_USE:
        # The share is the wait plus the CPU use's prediction, each stated as such.
        allowed |= {
            f"{judgement.wait_fraction * 100:.1f}",
            f"{judgement.cpu_contention.fraction * 100:.1f}",
        }
    for line in text.splitlines():
        for found in PERCENT.findall(line):
            if found in allowed:
                continue
            # One-off costs, stage shares and the CPU use's prediction (a part
            # of the verdict's share, on a busy machine) say what they are.
            assert any(
                words in line
                for words in (
                    "of training step time",
                    "input pipeline's time",
                    "computing in",
                    f"predicted {found} % of step time (CPU use)",
                )
            ), f"{where}: a share {found} % that is not the run's: {line}"


def test_the_run_has_one_record_of_its_figures(run):
    _, report = run
    figures = report.figures
    assert report.verdict == figures.verdict != kpt.Verdict.UNKNOWN
    assert report.input_fraction == figures.input_fraction
    if not figures.verdict.input_bound:
        # No input-free figure above what the verdict's share (at least 5 %) allows.
        most = 1 / (1 - max(figures.input_fraction, 0.05))
        assert figures.input_free.speedup <= most * (1 + 1e-9), figures.input_free
        for recommendation in report.recommendations:
            gain = recommendation.expected_gain
            # steps_per_execution changes the host's loop, not the input: its
            # gain is bounded by the host's time between steps, not by input free.
            if recommendation.id == "steps-per-execution":
                continue
            if gain is not None and gain.speedup is not None:
                assert gain.speedup <= most * (1 + 1e-9), recommendation
    assert figures.input_free.step_ms == pytest.approx(figures.step_ms)
    # The window's range is the steps its figures are of.
    first, last, count = report.profile.window_range()
    assert (figures.window.first_step, figures.window.last_step, figures.window.steps) == (
        first, last, count
    )
    assert WINDOW[0] <= first <= last < WINDOW[1]
    # Each epoch is judged by the run's rule: one the verdict leaves out says so
    # (a cache's fill read "highly" under "not"). An epoch of the steady state
    # may alone read the next class beside its pooled steps (steps under a
    # millisecond beside other work: "moderately" under "not"), never two away.
    classes = [kpt.Verdict.NOT_INPUT_BOUND, kpt.Verdict.MODERATELY_INPUT_BOUND,
               kpt.Verdict.HIGHLY_INPUT_BOUND]
    for epoch in figures.epochs:
        if epoch.kind == "train" and epoch.verdict not in (figures.verdict, kpt.Verdict.UNKNOWN):
            apart = abs(classes.index(epoch.verdict) - classes.index(figures.verdict))
            assert epoch.left_out or apart == 1, epoch
    # The advice's ceilings are the record's, and a change's figure never beats it
    # (an input change's: steps_per_execution changes the host's loop).
    for recommendation in report.recommendations:
        gain = recommendation.expected_gain
        if recommendation.id == "steps-per-execution":
            continue
        if gain is not None and gain.speedup is not None:
            assert gain.speedup <= figures.input_free.speedup * (1 + 1e-9), recommendation.id


def test_the_terminal_shows_each_figure_once(run):
    _, report = run
    text = terminal_text(report)
    assert_all_shown(text, report, "terminal")
    assert_one_share(text.split("\n1. ")[0], report, "terminal")
    assert text.startswith(f"Input pipeline: {report.figures.line}")
    # The window's share is evidence beside the verdict, not a verdict of its own.
    assert f"The profiler window, {shared(report)['window']}, measured" in text
    assert "TF Profiler" not in text and report.profile.conclusion not in text


def test_report_json_holds_the_same_figures(run):
    log_dir, report = run
    stored = json.loads((log_dir / REPORT_FILENAME).read_text())
    figures = stored["figures"]
    assert stored["verdict"] == figures["verdict"] == report.figures.verdict.value
    assert stored["input_fraction"] == figures["input_fraction"] == report.figures.input_fraction
    assert figures["step"]["median_ms"] == report.figures.step_ms
    assert figures["input_free"]["speedup"] == report.figures.input_free.speedup
    assert figures["window"]["first_step"] == report.figures.window.first_step
    assert figures["window"]["last_step"] == report.figures.window.last_step
    assert figures["window"]["steps"] == report.figures.window.steps
    assert "input_free" not in stored  # one place only
    assert kpt.Report.from_json(json.dumps(stored)).figures == report.figures


def test_the_text_tab_shows_the_same_figures(run):
    _, report = run
    text = render_markdown(report)
    for name, figure in shared(report).items():
        assert escape(figure) in text, f"markdown: the {name} {figure!r} is not shown"
    assert_one_share(text.split("### Recommendations")[0], report, "markdown")
    assert report.profile.conclusion not in text


def test_the_dashboard_routes_serve_the_same_figures(run):
    log_dir, report = run
    client = wsgi_client(log_dir)
    figures = report.figures
    (listed,) = json.loads(client.get(f"{ROUTE}/runs").get_data())["runs"]
    assert listed["verdict"] == figures.verdict.value
    assert listed["input_fraction"] == figures.input_fraction
    assert listed["step_ms"] == figures.step_ms
    detail = json.loads(client.get(f"{ROUTE}/run?run={RUN}").get_data())
    served = detail["report"]["figures"]
    assert served["verdict"] == figures.verdict.value
    assert served["input_fraction"] == figures.input_fraction
    assert served["step"]["median_ms"] == figures.step_ms
    assert served["input_free"]["described"] == shared(report)["input free"]
    assert (served["window"]["first_step"], served["window"]["last_step"]) == (
        figures.window.first_step, figures.window.last_step
    )
    assert served["line"] == figures.line
    # The profiler panel's title (the timeline image's too) names the one range.
    title = detail["profile"]["title"]
    assert title.startswith(f"Profiler window, {shared(report)['window']}, "), title
    assert shared(report)["window share"] in title


def test_the_report_and_check_commands_show_the_same_figures(run):
    log_dir, report = run
    done = cli("report", str(log_dir))
    assert done.returncode == 0, done.stderr
    assert_all_shown(done.stdout, report, "report command")
    assert_one_share(done.stdout.split("Recommendations")[0], report, "report command")
    checked = cli("check", str(log_dir), "--max-input-fraction", "1.0")
    assert checked.returncode == 0, checked.stderr
    assert f"input {shared(report)['share']} of training step time" in checked.stdout
    assert f"({report.figures.verdict.value})" in checked.stdout
