"""When the early verdict is due: on the step clock's rows and the cache's first epoch."""

import numpy as np

from keras_pipeline_tuner._util.feature_guard import FeatureGuard
from keras_pipeline_tuner.run.early_verdict import EARLY_MIN_STEPS
from keras_pipeline_tuner.run.early_verdict import EarlyVerdict
from keras_pipeline_tuner.timing.step_clock import TRAIN
from keras_pipeline_tuner.timing.step_clock import StepClock


def _epoch_of_steps(clock, epoch, steps, step_s=0.01):
    clock.begin_epoch(epoch)
    starts = np.arange(steps) * step_s
    # Each step: its start, the end of its wait (a tenth), its end.
    clock.record(TRAIN, np.stack([starts, starts + step_s / 10, starts + step_s], axis=1))
    clock.end_epoch(TRAIN, epoch)


def test_the_verdict_is_due_once_the_cache_epoch_ends_without_new_rows():
    # The cache's epoch handed its last rows over at its last step, and the
    # next epoch hands none before the fit ends (seen beside a load): the
    # epoch's end alone must make the verdict due.
    clock = StepClock()
    early = EarlyVerdict(FeatureGuard(), verbose=0)
    _epoch_of_steps(clock, 0, EARLY_MIN_STEPS + 10)
    assert not early.due(clock, window_capturing=False, filling_a_cache=True, whole_step=False)
    # No new rows; the first epoch has ended, and no cache is filling now.
    assert early.due(clock, window_capturing=False, filling_a_cache=False, whole_step=False)


def test_the_verdict_waits_for_new_rows_and_enough_steady_steps():
    clock = StepClock()
    early = EarlyVerdict(FeatureGuard(), verbose=0)
    _epoch_of_steps(clock, 0, EARLY_MIN_STEPS // 2)
    assert not early.due(clock, window_capturing=False, filling_a_cache=False, whole_step=False)
    _epoch_of_steps(clock, 1, EARLY_MIN_STEPS)
    # A profiler window capturing holds it back (it would measure the window).
    assert not early.due(clock, window_capturing=True, filling_a_cache=False, whole_step=False)
    _epoch_of_steps(clock, 2, 4)
    assert early.due(clock, window_capturing=False, filling_a_cache=False, whole_step=False)
