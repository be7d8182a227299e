"""xprof converts the profiler window's capture in a process of its own: training goes on.

Real TensorFlow and xprof throughout. Steps sleep a known 25 ms in the model
(a `tf.numpy_function`), so that a step count over the conversion's time says
whether training ran meanwhile; a conversion on the training thread would
leave no step inside it.
"""

import gc
import logging
import os
import time

import keras
import pytest

import keras_pipeline_tuner as kpt
from keras_pipeline_tuner.profiling import evidence as profile_evidence
from keras_pipeline_tuner.profiling.conversion import Conversion
from keras_pipeline_tuner.profiling.conversion import ConversionFailed
from tests.helpers.late_profile import slow_conversions  # noqa: F401 - a fixture
from tests.helpers.training_data import cached_source
from tests.helpers.training_data import failing_source
from tests.helpers.training_data import tiny_model

STEP_S = 0.025
STEPS_PER_EPOCH = 30
EPOCHS = 3
# Closes at the end of step 21 of the first epoch: the next ones run meanwhile.
WINDOW = (2, 22)
CONVERSION_MODULE = b"keras_pipeline_tuner.profiling.conversion"


def eventually(condition, timeout_s: float = 15.0) -> bool:
    """Whether `condition()` holds within `timeout_s` (polled): a start or a stop, under load."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def conversion_processes() -> list:
    """The ids of this process's children running a conversion (read from /proc)."""
    if not os.path.isdir("/proc"):
        pytest.skip("reads child processes from /proc")
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8") as file:
                parent = int(file.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as file:
                command = file.read()
        except (OSError, ValueError, IndexError):
            continue
        if parent == os.getpid() and CONVERSION_MODULE in command:
            found.append(int(entry))
    return found


class StepStarts(keras.callbacks.Callback):
    """Records when each training step begins (`time.time()`)."""

    def __init__(self):
        super().__init__()
        self.times = []

    def on_train_batch_begin(self, batch, logs=None):
        self.times.append(time.time())


class EpochProfiles(keras.callbacks.Callback):
    """Reads the tuner's report at each epoch end, after the tuner's own hook."""

    def __init__(self, tuner):
        super().__init__()
        self.tuner = tuner
        self.profiles = []

    def on_epoch_end(self, epoch, logs=None):
        self.profiles.append(self.tuner.report.profile)


@pytest.fixture(scope="module")
def sleeping_fit(tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("conversion")
    tuner = kpt.PipelineTuner(log_dir=log_dir, verbose=0, profile=WINDOW)
    starts, epochs = StepStarts(), EpochProfiles(tuner)
    history = tiny_model(compute_delay_s=STEP_S).fit(
        cached_source(64).batch(4).repeat(),
        epochs=EPOCHS,
        steps_per_epoch=STEPS_PER_EPOCH,
        callbacks=[starts, tuner, epochs],
        verbose=0,
    )
    # Converted while training goes on; on a busy machine it may end after fit.
    return tuner.wait_for_profile(), starts.times, epochs.profiles, history


def test_training_steps_run_while_the_capture_is_converted(sleeping_fit):
    report, starts, _, history = sleeping_fit
    assert len(history.history["loss"]) == EPOCHS
    cost = report.profile.cost
    # Started when the window closed, after its last step's end.
    assert starts[WINDOW[1] - 1] < cost.conversion_began_at < starts[WINDOW[1]]
    during = [t for t in starts if cost.conversion_began_at < t < cost.conversion_ended_at]
    # On the training thread none would begin; meanwhile a process start alone
    # takes a few tenths of a second, several 25 ms steps.
    assert len(during) >= 3, (len(during), cost)
    assert cost.conversion_s == pytest.approx(
        cost.conversion_ended_at - cost.conversion_began_at
    )


def test_the_final_report_has_the_profile_evidence(sleeping_fit):
    report = sleeping_fit[0]
    evidence = report.profile
    assert evidence.source == profile_evidence.ANALYZER
    assert evidence.first_step == WINDOW[0] and evidence.cost.steps == WINDOW[1] - WINDOW[0]
    assert len(evidence.steps) >= 10
    assert evidence.input_fraction is not None
    assert evidence.cost.conversion_wait_s >= 0
    assert not conversion_processes()


def test_epoch_reports_show_the_evidence_whole_or_not_at_all(sleeping_fit):
    report, _, profiles, _ = sleeping_fit
    assert len(profiles) == EPOCHS
    for profile in profiles:
        assert profile is None or (
            profile.steps and profile.cost.conversion_ended_at is not None
        ), profile
    shown = [profile for profile in profiles if profile is not None]
    assert all(profile == report.profile for profile in shown)


def test_the_outputs_draw_the_window_from_what_the_conversion_handed_back(sleeping_fit):
    path = sleeping_fit[0].profile.xplane_path
    converted_here = profile_evidence.first_steps(profile_evidence.trace_events(path))
    assert int(converted_here[0]["args"]["step_num"]) == WINDOW[0]
    # Without the capture on disk: nothing converts it again on the training thread.
    os.rename(path, path + ".aside")
    try:
        assert profile_evidence.first_steps_trace(path) == converted_here
    finally:
        os.rename(path + ".aside", path)


@pytest.mark.usefixtures("slow_conversions")
def test_a_wait_for_a_conversion_still_running_is_said_first(tmp_path, caplog):
    tuner = kpt.PipelineTuner(log_dir=tmp_path, verbose=0, profile=(2, 20))
    # The window closes at the fit's last step; its conversion lasts seconds more.
    tiny_model(compute_delay_s=STEP_S).fit(
        cached_source(64).batch(4).repeat(), epochs=1, steps_per_epoch=20, verbose=0,
        callbacks=[tuner],
    )
    assert tuner.report.profile_pending
    with caplog.at_level(logging.INFO, logger="keras_pipeline_tuner"):
        report = tuner.wait_for_profile()
    assert report.profile.steps
    # The end of fit did not wait: the training thread's wait is none.
    assert report.profile.cost.conversion_wait_s == 0
    said = [r for r in caplog.records if "waiting for the profile's conversion" in r.getMessage()]
    assert len(said) == 1
    assert not conversion_processes()


def test_a_fit_ended_by_a_failing_step_leaves_no_conversion_running(tmp_path):
    tuner = kpt.PipelineTuner(log_dir=tmp_path, verbose=0, profile=(1, 4))
    # Each element is a batch: the fetch of step 6 raises, just after the window.
    dataset = failing_source(100, fail_at=6, message="the data ran dry")
    with pytest.raises(Exception, match="the data ran dry"):
        tiny_model().fit(dataset.batch(1), epochs=1, steps_per_epoch=20, verbose=0,
                         callbacks=[tuner])
    assert not conversion_processes()
    # The evidence, if the conversion had ended by then, is whole.
    profile = tuner.report.profile
    assert profile is None or profile.steps


class StopAfterWindow(keras.callbacks.Callback):
    """Raises between steps once the window closed, as a user's callback might."""

    def on_train_batch_begin(self, batch, logs=None):
        if batch == 5:
            raise RuntimeError("stopped by a callback")


def test_a_conversion_of_an_interrupted_fit_does_not_reach_the_next_fit(tmp_path):
    tuner = kpt.PipelineTuner(log_dir=tmp_path, verbose=0, profile=(1, 4))
    data = cached_source(64).batch(4).repeat()
    with pytest.raises(RuntimeError, match="stopped by a callback"):
        tiny_model().fit(data, epochs=1, steps_per_epoch=20, verbose=0,
                         callbacks=[StopAfterWindow(), tuner])
    # The window's conversion may still run: the next fit, too short for a
    # window of its own, starts without it and ends with none running.
    tiny_model().fit(data, epochs=1, steps_per_epoch=1, verbose=0, callbacks=[tuner])
    report = tuner.report
    assert report.profile is None
    assert any("starts after the last step of this fit (1 steps)" in n for n in report.notes)
    assert not conversion_processes()


def test_a_conversion_dropped_unjoined_stops_its_process(tmp_path):
    capture = tmp_path / "host.xplane.pb"
    capture.write_bytes(b"not read: the process is stopped first")
    conversion = Conversion(str(capture))
    # Its start takes a few tenths of a second (Python, then xprof's import),
    # and its stop a signal's delivery: seconds on a busy machine.
    assert eventually(lambda: conversion_processes())
    del conversion
    gc.collect()
    assert eventually(lambda: not conversion_processes())


def test_a_conversion_failing_in_its_process_raises_its_error_here(tmp_path):
    conversion = Conversion(str(tmp_path / "missing.xplane.pb"))
    with pytest.raises(ConversionFailed, match="FileNotFoundError"):
        conversion.result()
    assert eventually(lambda: not conversion_processes())
