"""StepClock and StepStats: derivation of wait/compute, bounds, verdict thresholds."""

import numpy as np
import pytest

from keras_pipeline_tuner.timing.step_clock import StepClock
from keras_pipeline_tuner.timing.step_stats import StepStats
from keras_pipeline_tuner.timing.step_stats import Verdict
from keras_pipeline_tuner.timing.step_stats import verdict_for


def rows(count, wait, compute, gap=0.0, t0=1000.0):
    out, t = [], t0
    for _ in range(count):
        out.append([t, t + wait, t + wait + compute])
        t += wait + compute + gap
    return np.array(out)


@pytest.mark.parametrize(
    "fraction, verdict",
    [
        (0.0, Verdict.NOT_INPUT_BOUND),
        (0.0499, Verdict.NOT_INPUT_BOUND),
        (0.05, Verdict.MODERATELY_INPUT_BOUND),
        (0.1999, Verdict.MODERATELY_INPUT_BOUND),
        (0.20, Verdict.HIGHLY_INPUT_BOUND),
        (1.0, Verdict.HIGHLY_INPUT_BOUND),
        (None, Verdict.UNKNOWN),
    ],
)
def test_verdict_thresholds_follow_the_tf_profiler(fraction, verdict):
    assert verdict_for(fraction) is verdict


def test_wait_compute_and_gap_are_derived_from_timestamps():
    clock = StepClock()
    clock.begin_epoch(0)
    clock.record("train", rows(10, wait=0.030, compute=0.010, gap=0.002))
    stats = clock.stats("train")
    assert stats.steps == 10
    assert stats.input_wait.median_ms == pytest.approx(30, abs=1e-6)
    assert stats.compute.median_ms == pytest.approx(10, abs=1e-6)
    assert stats.step.median_ms == pytest.approx(40, abs=1e-6)
    assert stats.host_gap.median_ms == pytest.approx(2, abs=1e-6)
    assert stats.input_fraction == pytest.approx(0.75)
    assert verdict_for(stats.input_fraction) is Verdict.HIGHLY_INPUT_BOUND


def test_overlapped_fetch_counts_only_the_wait_past_the_previous_step():
    # steps_per_execution > 1: the batch was ready before the previous step ended.
    clock = StepClock()
    clock.record("train", np.array([[10.0, 9.5, 10.02], [10.02, 10.03, 10.05]]))
    steps = clock.steps("train")
    np.testing.assert_allclose(steps["wait"], [0.0, 0.01], atol=1e-9)
    np.testing.assert_allclose(steps["compute"], [0.02, 0.02], atol=1e-9)


def test_ring_is_bounded_and_totals_stay_exact():
    clock = StepClock(capacity=50)
    clock.begin_epoch(0)
    clock.record("train", rows(1000, wait=0.001, compute=0.003))
    clock.record("train", rows(1000, wait=0.003, compute=0.001, t0=5000.0))
    assert clock.retained_steps == 50
    stats = clock.stats("train")
    assert stats.steps == 2000
    assert stats.input_fraction == pytest.approx(0.5)
    # Percentiles come from the most recent steps only.
    assert stats.input_wait.median_ms == pytest.approx(3)
    assert clock._start.nbytes == 50 * 8


def test_first_step_and_epoch_setup_are_reported_apart():
    clock = StepClock()
    clock.begin_epoch(0)
    started = clock._epoch_started["train"]
    first = rows(1, wait=0.02, compute=0.5, t0=started + 0.25)
    clock.record_first_step("train", wall_s=0.9, rows=first, called_at=started + 0.1)
    clock.record("train", rows(4, wait=0.01, compute=0.01, t0=started + 1.0))
    breakdown = clock.end_epoch("train")
    assert clock.first_steps["train"].compute_ms == pytest.approx(500)
    assert clock.first_steps["train"].tracing_ms == pytest.approx(380)
    assert breakdown.setup_ms == pytest.approx(100, abs=1)
    assert breakdown.stats.steps == 4
    assert breakdown.stats.compute.median_ms == pytest.approx(10)


def test_whole_step_rows_have_no_input_fraction():
    clock = StepClock()
    clock.record("train", np.array([[0.0, np.nan, 0.02], [0.03, np.nan, 0.05]]))
    stats = clock.stats("train")
    assert stats.input_fraction is None
    assert stats.input_fraction is None
    assert stats.step.median_ms == pytest.approx(20)
    assert stats.input_wait.median_ms is None


def test_validation_is_kept_apart_from_training():
    clock = StepClock()
    clock.record("train", rows(3, wait=0.0, compute=0.01))
    clock.record("validation", rows(2, wait=0.01, compute=0.0))
    assert clock.stats("train").input_fraction == 0
    assert clock.stats("validation").input_fraction == 1
    assert clock.stats("validation").steps == 2


def test_buffer_size_is_checked():
    with pytest.raises(ValueError, match="buffer_steps"):
        StepClock(capacity=0)


def test_empty_stats():
    stats = StepStats.from_arrays(np.array([]), np.array([]))
    assert stats.steps == 0 and stats.input_fraction is None


def test_the_steady_steps_leave_out_each_epochs_first_steps_and_earlier_epochs():
    clock = StepClock()
    for epoch, wait in enumerate((0.030, 0.001)):
        clock.begin_epoch(epoch)
        clock.record("train", rows(6, wait=wait, compute=0.010, t0=1000.0 + epoch))
        clock.end_epoch("train", epoch)
    # Each epoch's first 2 steps (a new iterator, a refilling buffer) are out.
    assert clock.steady_steps("train")["wait"].size == 8
    later = clock.steady_steps("train", from_epoch=1)
    np.testing.assert_allclose(later["wait"], [0.001] * 4, atol=1e-9)
    assert clock.steady_steps("train", epoch=0)["wait"].size == 4


class _Clock:
    """`time.time()` that a test moves by hand."""

    def __init__(self, now):
        self.now = now

    def time(self):
        return self.now


@pytest.mark.parametrize("verbose, expected_ms", [(2, 1000.0 / 5), (1, (1000.0 - 300.0) / 4)])
def test_keras_ms_per_step_is_counted_as_its_progress_bar_counts_it(monkeypatch, verbose,
                                                                    expected_ms):
    from keras_pipeline_tuner.timing import step_clock

    fake = _Clock(100.0)
    monkeypatch.setattr(step_clock, "time", fake)
    clock = StepClock()
    clock.keras_verbose = verbose
    clock.begin_epoch(0)
    # Set-up 0.2 s, then five steps of 0.1 s; the first ends at 100.3 s.
    clock.record_first_step("train", 0.1, np.array([[100.2, 100.25, 100.3]]))
    clock.record("train", rows(4, wait=0.05, compute=0.05, t0=100.3))
    fake.now = 100.8
    clock.end_epoch("train", 0)
    # Keras counts to its own end of the epoch, after every callback's work there.
    fake.now = 101.0
    clock.begin_epoch(1)
    (epoch,) = clock.epochs
    assert epoch.keras_ms_per_step == pytest.approx(expected_ms)


def test_no_progress_bar_no_keras_figure():
    clock = StepClock()
    clock.begin_epoch(0)
    clock.record("train", rows(5, wait=0.01, compute=0.01))
    assert clock.end_epoch("train", 0).keras_ms_per_step is None
