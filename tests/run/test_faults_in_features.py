"""Faults injected into each of the tuner's features during a real fit.

Whatever fails inside the tuner, training must end with the history and the
weights of a run without the tuner, with one clear warning per failed feature,
while the other features keep working. The faults are raised by the tuner's own
collaborators (our modules), or made for real (a corrupted capture); TensorFlow,
Keras, TensorBoard and xprof run unmodified.
"""

import glob
import logging
import os

import pytest

import keras_pipeline_tuner as kpt
from keras_pipeline_tuner._util import features
from keras_pipeline_tuner.after_training import what_if_replay
from keras_pipeline_tuner.instrumentation.user_calls import UserCallTimer
from keras_pipeline_tuner.outputs import markdown as report_markdown
from keras_pipeline_tuner.outputs import tensorboard as tensorboard_sink
from keras_pipeline_tuner.outputs import terminal as terminal_summary
from keras_pipeline_tuner.outputs import timeline_image
from keras_pipeline_tuner.outputs.dashboard import summaries as dashboard_summaries
from keras_pipeline_tuner.pipeline.lint import keras_inputs as pipeline_lint
from keras_pipeline_tuner.profiling import capture as profile_capture
from keras_pipeline_tuner.profiling import evidence as profile_evidence
from keras_pipeline_tuner.profiling import window as profiler_window
from keras_pipeline_tuner.run import lifecycle
from keras_pipeline_tuner.run import run_files
from keras_pipeline_tuner.run import run_report
from keras_pipeline_tuner.timing.cpu_usage import CpuMeter
from keras_pipeline_tuner.timing.step_clock import StepClock
from tests.helpers.fault_injection import EPOCHS
from tests.helpers.fault_injection import STEPS_PER_EPOCH
from tests.helpers.fault_injection import assert_training_intact
from tests.helpers.fault_injection import raise_injected
from tests.helpers.fault_injection import train
from tests.helpers.fault_injection import tuner_warnings

PROFILE = (2, 6)


@pytest.fixture(scope="module")
def plain_run():
    return train()


# Feature name in the warning: what to break (module or class, attribute).
FAULTS = {
    # At the end of the first epoch, so that steps were recorded (and scalars written).
    features.STEP_CLOCK: (StepClock, "end_epoch"),
    profiler_window.FEATURE: (profile_capture, "publish"),
    features.INSPECTION: (pipeline_lint, "inspect"),
    features.ADVICE: (run_report, "advise"),
    features.REPORT_FILE: (run_files, "write_report"),
    features.STEP_TRACE: (lifecycle, "write_trace"),
    features.SUMMARY: (terminal_summary, "print_summary"),
    features.WHAT_IF: (what_if_replay, "replay_after_fit"),
    tensorboard_sink.SCALARS: (tensorboard_sink.TensorBoardSink, "_write_scalar_rows"),
    tensorboard_sink.TEXT: (report_markdown, "render_markdown"),
    tensorboard_sink.TIMELINE: (timeline_image, "timeline_png"),
    tensorboard_sink.DASHBOARD: (dashboard_summaries, "write_step_block"),
    features.CPU_USAGE: (CpuMeter, "usage"),
    # At the start of fit, before anything is timed.
    features.USER_CALLS: (UserCallTimer, "begin"),
}


def make_tuner(log_dir):
    return kpt.PipelineTuner(log_dir=log_dir, verbose=1, profile=PROFILE, what_if=4)


def test_every_feature_failing_at_once_leaves_training_intact(
    tmp_path, monkeypatch, caplog, capsys, plain_run
):
    tuner = make_tuner(tmp_path)
    # Broken once the tuner exists: the faults happen during fit.
    for owner, attribute in FAULTS.values():
        monkeypatch.setattr(owner, attribute, raise_injected)
    monkeypatch.setattr(profile_evidence, "analyze_capture", raise_injected)
    monkeypatch.setattr(CpuMeter, "restart", raise_injected)
    with caplog.at_level(logging.WARNING, logger="keras_pipeline_tuner"):
        run = train([tuner])
        # The profile's evidence joins, and the outputs are written again with it.
        report = tuner.wait_for_profile()
    assert_training_intact(run, plain_run)
    warnings = tuner_warnings(caplog)
    # The what-if replay compares with the step clock's steps: with the clock
    # off it does not run, and says so in the report instead of failing.
    failed = [feature for feature in FAULTS if feature != features.WHAT_IF]
    for feature in failed:
        naming = [message for message in warnings if f"{feature} turned off" in message]
        assert len(naming) == 1, (feature, warnings)
    assert len(warnings) == len(failed), warnings
    assert all("InjectedFault" in message for message in warnings)
    # The report in memory still says which features were lost and why.
    for feature in failed:
        assert any(note.startswith(f"{feature} was turned off") for note in report.notes)
    assert any("what-if replay did not run" in note for note in report.notes)
    assert capsys.readouterr().out == ""


SINGLE_FAULTS = [(feature, *broken) for feature, broken in FAULTS.items()] + [
    # On every step, from the first one.
    (features.STEP_CLOCK, StepClock, "record"),
    # At the start of fit.
    (features.CPU_USAGE, CpuMeter, "restart"),
]


@pytest.mark.parametrize(
    "feature, owner, attribute",
    SINGLE_FAULTS,
    ids=[f"{feature}-{attribute}" for feature, _, attribute in SINGLE_FAULTS],
)
def test_one_feature_failing_leaves_the_rest_working(
    feature, owner, attribute, tmp_path, monkeypatch, caplog, plain_run
):
    tuner = make_tuner(tmp_path)
    monkeypatch.setattr(owner, attribute, raise_injected)
    with caplog.at_level(logging.WARNING, logger="keras_pipeline_tuner"):
        run = train([tuner])
        # The profile's evidence joins, and the outputs are written again with it.
        report = tuner.wait_for_profile()
    assert_training_intact(run, plain_run)
    warnings = tuner_warnings(caplog)
    assert len(warnings) == 1, warnings
    assert f"{feature} turned off" in warnings[0]
    assert "InjectedFault: injected for the test" in warnings[0]
    assert "Training continues" in warnings[0]

    assert any(note.startswith(f"{feature} was turned off") for note in report.notes)
    if feature != features.STEP_CLOCK:
        assert report.train.steps == EPOCHS * STEPS_PER_EPOCH - 1
        assert report.validation.steps > 0
    if feature != features.REPORT_FILE:
        stored = kpt.Report.from_json((tmp_path / "report.json").read_text())
        assert any(note.startswith(f"{feature} was turned off") for note in stored.notes)
    if feature not in (profiler_window.FEATURE, features.STEP_CLOCK):
        assert report.profile is not None and report.profile.steps, report.notes
    if feature != features.INSPECTION:
        assert report.findings
    if feature == features.STEP_CLOCK:
        assert report.what_if is None
        assert any("what-if replay did not run" in note for note in report.notes)
    elif feature != features.WHAT_IF:
        assert report.what_if is not None
    if feature != features.STEP_TRACE:
        assert (tmp_path / "step_timeline.trace.json").is_file()
    if feature not in (tensorboard_sink.SCALARS, tensorboard_sink.TEXT, tensorboard_sink.TIMELINE):
        assert glob.glob(os.path.join(tmp_path, "pipeline_tuner", "*tfevents*"))


def damage_published_captures(monkeypatch, damage):
    """Applies `damage` to each capture as soon as it is published, before its conversion.

    The tuner's own `publish` runs unchanged; xprof then converts the damaged
    file for real, in its process, while training goes on.
    """
    publish = profile_capture.publish

    def publish_then_damage(staging, log_dir):
        published = publish(staging, log_dir)
        damage(published[1])
        return published

    monkeypatch.setattr(profile_capture, "publish", publish_then_damage)


def corrupt(path):
    with open(path, "wb") as file:
        file.write(b"\x00\xffnot a profile" * 1000)


@pytest.mark.parametrize("damage", [corrupt, os.remove], ids=["corrupt", "deleted"])
def test_a_damaged_capture_turns_off_the_profile_only(
    damage, tmp_path, monkeypatch, caplog, plain_run
):
    """xprof fails on the capture in its own process: one warning, training untouched."""
    damage_published_captures(monkeypatch, damage)
    tuner = make_tuner(tmp_path)
    with caplog.at_level(logging.WARNING, logger="keras_pipeline_tuner"):
        run = train([tuner])
        # The profile's evidence joins, and the outputs are written again with it.
        report = tuner.wait_for_profile()
    assert_training_intact(run, plain_run)
    warnings = tuner_warnings(caplog)
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith(
        f"keras-pipeline-tuner: {profiler_window.FEATURE} turned off: ConversionFailed: "
    )
    assert report.train.steps == EPOCHS * STEPS_PER_EPOCH - 1
    # Where the capture is and what it cost are kept; no analysis.
    assert report.profile is not None and report.profile.first_step == PROFILE[0]
    assert report.profile.source == "" and not report.profile.steps
    turned_off = f"{profiler_window.FEATURE} was turned off"
    assert any(note.startswith(turned_off) for note in report.notes)
    kpt.Report.from_json((tmp_path / "report.json").read_text())


def test_report_building_failing_leaves_training_intact(tmp_path, monkeypatch, caplog, plain_run):
    # The report is built from the clock's statistics at every epoch end.
    monkeypatch.setattr(StepClock, "stats", raise_injected)
    tuner = kpt.PipelineTuner(log_dir=tmp_path, verbose=1, profile="off")
    with caplog.at_level(logging.WARNING, logger="keras_pipeline_tuner"):
        run = train([tuner])
    assert_training_intact(run, plain_run)
    warnings = tuner_warnings(caplog)
    assert len(warnings) == 1, warnings
    assert f"{features.REPORT} turned off: InjectedFault" in warnings[0]
