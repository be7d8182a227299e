"""Report JSON round trip and clear errors for what is not a report."""

import numpy as np
import pytest

import keras_pipeline_tuner as kpt
from keras_pipeline_tuner.timing.step_clock import StepClock
from keras_pipeline_tuner.timing.step_stats import verdict_for


def measured_report():
    clock = StepClock()
    clock.begin_epoch(0)
    clock.record_first_step("train", 0.5, np.array([[0.0, 0.01, 0.3]]))
    clock.record("train", np.array([[1.0, 1.02, 1.03], [1.03, 1.05, 1.06]]))
    clock.end_epoch("train")
    stats = clock.stats("train")
    return kpt.Report(
        verdict=verdict_for(stats.input_fraction),
        input_fraction=stats.input_fraction,
        train=stats,
        epochs=clock.epochs,
        first_steps=clock.first_steps,
        notes=["a note with <b>markup</b>"],
        environment={"keras": "3"},
    )


def test_round_trip_is_lossless():
    report = measured_report()
    again = kpt.Report.from_json(report.to_json())
    assert again == report
    assert again.verdict is kpt.Verdict.HIGHLY_INPUT_BOUND
    assert isinstance(again.epochs[0], kpt.EpochBreakdown)
    assert isinstance(again.first_steps["train"], kpt.FirstStep)


@pytest.mark.parametrize(
    "text, message",
    [
        ("not json", "invalid JSON"),
        ("[1, 2]", "not an object"),
        ('{"verdict": "very slow"}', "report.verdict"),
        ('{"input_fraction": "half"}', "report.input_fraction"),
        ('{"train": {"steps": "many"}}', "report.train.steps"),
        ('{"epochs": {}}', "report.epochs"),
    ],
)
def test_bad_reports_name_the_field(text, message):
    with pytest.raises(ValueError, match=message):
        kpt.Report.from_json(text)


def test_a_profile_still_converting_is_said_and_round_trips():
    import io

    from keras_pipeline_tuner.outputs.markdown import render_markdown
    from keras_pipeline_tuner.outputs.report import PROFILE_PENDING
    from keras_pipeline_tuner.outputs.terminal import print_summary

    report = measured_report()
    report.profile_pending = True
    again = kpt.Report.from_json(report.to_json())
    assert again.profile_pending and again == report
    terminal = io.StringIO()
    print_summary(again, file=terminal)
    assert PROFILE_PENDING in terminal.getvalue()
    assert "### Profiler window" in render_markdown(again)
    # A report written before the field existed reads as nothing pending.
    assert not kpt.Report.from_json('{"input_fraction": 0.5}').profile_pending
    with pytest.raises(ValueError, match="report.profile_pending"):
        kpt.Report.from_json('{"profile_pending": "soon"}')
