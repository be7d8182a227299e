"""The end of fit does not wait for the profile's conversion: its evidence joins the report later.

While any callback's `on_train_end` runs, Keras' fit iterator is still alive and
tf.data's prefetch keeps reading the source: a tuner that waited there for xprof
took elements from a live feed that no step ever saw. Real TensorFlow, Keras and
xprof throughout; where a test needs a conversion that lasts, its process sleeps
a known time first (`slow_conversions`), which no load can shorten.
"""

import itertools
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import keras
import numpy as np
import psutil
import pytest
import tensorflow as tf
from tensorboard.backend.event_processing import event_accumulator

import keras_pipeline_tuner as kpt
from keras_pipeline_tuner.outputs import tensorboard as tensorboard_sink
from keras_pipeline_tuner.outputs.report import PROFILE_PENDING
from keras_pipeline_tuner.profiling import window as profiler_window
from keras_pipeline_tuner.profiling.fit_profile import FitProfile
from keras_pipeline_tuner.run import lifecycle
from tests.helpers.fault_injection import raise_injected
from tests.helpers.fault_injection import tuner_warnings
from tests.helpers.fault_injection import turned_off
from tests.helpers.late_profile import CONVERSION_DELAY_S
from tests.helpers.late_profile import slow_conversions  # noqa: F401 - a fixture
from tests.helpers.paths import REPO_ROOT
from tests.helpers.training_data import FEATURES
from tests.helpers.training_data import cached_source
from tests.helpers.training_data import tiny_model

# A live feed: one element every 50 ms, 8 to a batch, 8 steps a fit. The fit is
# input-bound (a step computes in a millisecond), so the window's steps wait.
FEED_DELAY_S = 0.050
FEED_BATCH = 8
FEED_STEPS = 8
# Elements a fit with the tuner may take from the feed beyond what plain Keras
# takes: one batch, 400 ms of the end of fit's own work (some 10-25 ms quiet;
# beside three busy loops it once took 10 elements of 25 ms). Waiting there for
# the conversion (3 s, with `slow_conversions`) let the prefetch fill its
# buffer: two batches, 16 elements, 0.8 s of this feed.
FEED_TOLERANCE = 8


def live_feed() -> tf.data.Dataset:
    """Consecutive integers from one counter, forever, as a queue-fed source gives them.

    Every iterator over the dataset reads the same counter: what one iterator
    took and dropped, the next never sees.
    """
    counter = itertools.count()

    def generate():
        while True:
            time.sleep(FEED_DELAY_S)
            value = next(counter)
            yield np.full((FEATURES,), value, np.float32), np.float32(value % 2)

    dataset = tf.data.Dataset.from_generator(
        generate,
        output_signature=(
            tf.TensorSpec((FEATURES,), tf.float32),
            tf.TensorSpec((), tf.float32),
        ),
    )
    return dataset.batch(FEED_BATCH)


def next_element_after_fit(callback) -> int:
    """Fits on a live feed with `callback`, then reads the feed's next element."""
    feed = live_feed()
    tiny_model().fit(
        feed, epochs=1, steps_per_epoch=FEED_STEPS, callbacks=[callback], verbose=0
    )
    return int(next(iter(feed))[0].numpy()[0, 0])


class TimedTuner(kpt.PipelineTuner):
    """A tuner whose `on_train_end` is timed."""

    end_s = None

    def on_train_end(self, logs=None):
        began = time.perf_counter()
        super().on_train_end(logs)
        self.end_s = time.perf_counter() - began


@pytest.mark.usefixtures("slow_conversions")
def test_a_live_feed_loses_no_more_to_the_tuner_than_to_plain_keras():
    plain = next_element_after_fit(keras.callbacks.Callback())
    # The window closes at the fit's last step: its conversion runs past fit's end.
    tuner = kpt.PipelineTuner(verbose=0, profile=(2, FEED_STEPS))
    with_tuner = next_element_after_fit(tuner)
    assert with_tuner - plain <= FEED_TOLERANCE, (plain, with_tuner)
    # A window was captured (and its conversion was what fit's end used to wait for).
    report = tuner.wait_for_profile()
    assert report.profile is not None and report.profile.steps, report.notes
    _remove_temporary_capture(report.profile)


def _remove_temporary_capture(profile) -> None:
    # Without a log dir the capture went to a temporary directory of its own.
    if profile.temporary:
        shutil.rmtree(os.path.dirname(os.path.dirname(os.path.dirname(profile.run_dir))))


def read_report(folder) -> dict:
    with open(os.path.join(folder, "report.json"), encoding="utf-8") as file:
        return json.load(file)


def report_texts(run_dir) -> list:
    """The Text tab's reports in a TensorBoard run folder, oldest first."""
    events = event_accumulator.EventAccumulator(
        str(run_dir), size_guidance={event_accumulator.TENSORS: 0}
    )
    events.Reload()
    return [
        tf.make_ndarray(event.tensor_proto).item().decode()
        for event in events.Tensors(tensorboard_sink.REPORT_TAG)
    ]


def eventually(condition, timeout_s: float = 30.0) -> bool:
    """Whether `condition()` holds within `timeout_s` (polled)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def short_fit(tuner, steps: int = 10) -> None:
    tiny_model().fit(
        cached_source(64).batch(4).repeat(), epochs=1, steps_per_epoch=steps,
        callbacks=[tuner], verbose=0,
    )


@pytest.mark.usefixtures("slow_conversions")
def test_the_end_of_fit_does_not_wait_and_the_evidence_joins_every_output(tmp_path):
    # The window closes at the fit's last step; its conversion lasts seconds. No
    # probe after training (a replay of cached batches, timed within a budget of
    # its own): the end of fit is then the window's close and the outputs.
    tuner = TimedTuner(
        log_dir=tmp_path, verbose=0, profile=(2, 10), check_contention=False,
        measure_fixes=False,
    )
    # The timeline image's matplotlib, imported once per process (0.8 s quiet,
    # 4 s beside three busy loops), would otherwise be this short fit's end.
    from matplotlib import figure  # noqa: F401
    from matplotlib.backends import backend_agg  # noqa: F401

    short_fit(tuner)
    returned_at = time.time()
    report = tuner.report
    assert report.profile_pending and report.profile is None, report.notes
    written = read_report(tmp_path)
    assert written["profile_pending"] and written["profile"] is None
    assert PROFILE_PENDING in report_texts(tmp_path / tensorboard_sink.RUN)[-1]

    joined = tuner.wait_for_profile()
    assert not joined.profile_pending and not tuner.report.profile_pending
    profile = joined.profile
    assert profile is not None and profile.steps, joined.notes
    assert profile.first_step == 2 and profile.cost.steps == 8
    # The conversion's own time, from its process's start to its result.
    assert profile.cost.conversion_s >= CONVERSION_DELAY_S
    # The fit returned before the conversion ended: the end's own work (the
    # outputs, matplotlib imported before the fit) waited for none of it. (Its
    # length is no proof: beside three busy loops it once took 4.2 s, longer
    # than the conversion's sleep.)
    assert returned_at < profile.cost.conversion_ended_at, (tuner.end_s, profile.cost)
    assert profile.cost.conversion_wait_s == 0  # nothing on the training thread waited
    # Every output has been written again, with the evidence.
    for folder in (tmp_path, tmp_path / tensorboard_sink.RUN):
        written = read_report(folder)
        assert not written["profile_pending"]
        assert written["profile"]["xplane_path"] == profile.xplane_path
    text = report_texts(tmp_path / tensorboard_sink.RUN)[-1]
    assert "### Profiler window: " in text and PROFILE_PENDING not in text
    # The tuner's cost is that of the end of fit: the late write is not in it.
    assert written["tuner_cost"] == json.loads(report.to_json())["tuner_cost"]


@pytest.mark.usefixtures("slow_conversions")
def test_a_fit_started_meanwhile_is_not_mixed_with_the_late_evidence(tmp_path):
    tuner = kpt.PipelineTuner(log_dir=tmp_path, verbose=0, profile=(2, 8))
    short_fit(tuner)
    assert tuner.report.profile_pending
    # The next fit begins at once; it is too short for a window of its own.
    short_fit(tuner, steps=1)
    second = tuner.report
    assert second.run == "pipeline_tuner/fit-2"
    assert second.profile is None and not second.profile_pending
    first_folder = tmp_path / tensorboard_sink.RUN
    assert eventually(lambda: read_report(first_folder)["profile"] is not None)
    first = read_report(first_folder)
    assert first["run"] == "pipeline_tuner" and not first["profile_pending"]
    assert first["profile"]["trigger"] == "requested: profile=(2, 8)"
    # The log dir's own report stays the second fit's, which has no profile.
    root = read_report(tmp_path)
    assert root["run"] == "pipeline_tuner/fit-2" and root["profile"] is None
    assert read_report(first_folder / "fit-2")["profile"] is None
    assert tuner.report.profile is None and not tuner.report.profile_pending


@pytest.mark.usefixtures("slow_conversions")
def test_an_evaluate_after_fit_neither_hides_nor_loses_the_fits_profile(tmp_path):
    tuner = kpt.PipelineTuner(log_dir=tmp_path, verbose=0, profile=(2, 8))
    model = tiny_model()
    model.fit(cached_source(64).batch(4).repeat(), epochs=1, steps_per_epoch=10,
              callbacks=[tuner], verbose=0)
    model.evaluate(cached_source(16).batch(4), callbacks=[tuner], verbose=0)
    assert tuner.report.run == "pipeline_tuner/evaluate-2"
    # The latest run is the evaluate(); the wait covers the fit's profile too.
    tuner.wait_for_profile()
    root = read_report(tmp_path)
    assert root["run"] == "pipeline_tuner" and not root["profile_pending"]
    assert root["profile"]["steps"], root["notes"]
    # Written after the evaluate() began: it is listed.
    assert [entry["run"] for entry in root["runs"]] == [
        "pipeline_tuner", "pipeline_tuner/evaluate-2"
    ]


@pytest.mark.usefixtures("slow_conversions")
def test_an_evaluate_begun_as_the_profile_joins_still_waits_for_its_outputs(
    tmp_path, monkeypatch
):
    # The evidence joins (no longer pending) a moment before the outputs are
    # written with it. An evaluate() begun in that moment used to drop the fit
    # from what a wait covers: the wait returned with the files still pending
    # (once in CI, under load). Here that moment is held open for 5 s.
    take = FitProfile.take

    def take_then_hold(profile, *args, **kwargs):
        take(profile, *args, **kwargs)
        if threading.current_thread() is not threading.main_thread():
            time.sleep(5.0)

    monkeypatch.setattr(FitProfile, "take", take_then_hold)
    tuner = kpt.PipelineTuner(log_dir=tmp_path, verbose=0, profile=(2, 8))
    model = tiny_model()
    model.fit(cached_source(64).batch(4).repeat(), epochs=1, steps_per_epoch=10,
              callbacks=[tuner], verbose=0)
    assert eventually(lambda: not tuner.report.profile_pending)
    assert read_report(tmp_path)["profile_pending"]  # joined, not yet written
    model.evaluate(cached_source(16).batch(4), callbacks=[tuner], verbose=0)
    tuner.wait_for_profile()
    root = read_report(tmp_path)
    assert root["run"] == "pipeline_tuner" and not root["profile_pending"]
    assert root["profile"]["steps"], root["notes"]


@pytest.mark.usefixtures("slow_conversions")
def test_a_wait_with_a_timeout_returns_the_report_still_pending(tmp_path):
    tuner = kpt.PipelineTuner(log_dir=tmp_path, verbose=0, profile=(2, 8))
    short_fit(tuner)
    began = time.monotonic()
    assert tuner.wait_for_profile(timeout_s=0.2).profile_pending
    assert time.monotonic() - began < CONVERSION_DELAY_S
    assert not tuner.wait_for_profile().profile_pending


@pytest.mark.usefixtures("slow_conversions")
def test_a_custom_loops_close_waits_for_the_profile_and_says_so(tmp_path, caplog):
    tuner = kpt.PipelineTuner(log_dir=tmp_path, verbose=0, profile=(2, 10))

    @tuner.instrument
    def train_step(x, y):
        return tf.reduce_sum(x) + tf.reduce_sum(y)

    for x, y in tuner.iterate(cached_source(40).batch(4)):
        train_step(x, y)
    with caplog.at_level(logging.INFO, logger="keras_pipeline_tuner"):
        report = tuner.close()
    # The loop has ended and close() asked for the final report: it waited.
    assert not report.profile_pending and report.profile.steps, report.notes
    assert report.profile.cost.conversion_wait_s > 0
    said = [r for r in caplog.records if "converting the profile (xprof)" in r.getMessage()]
    assert len(said) == 1
    assert not read_report(tmp_path)["profile_pending"]


@pytest.mark.usefixtures("slow_conversions")
def test_a_late_profile_that_cannot_start_turns_the_window_off_only(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(lifecycle, "LateProfile", raise_injected)
    tuner = kpt.PipelineTuner(log_dir=tmp_path, verbose=0, profile=(2, 8))
    with caplog.at_level(logging.WARNING, logger="keras_pipeline_tuner"):
        short_fit(tuner)
    assert turned_off(tuner_warnings(caplog)) == [profiler_window.FEATURE]
    report = tuner.report
    assert report.train.steps == 9 and not report.profile_pending and report.profile is None
    turned_off_note = f"{profiler_window.FEATURE} was turned off"
    assert any(note.startswith(turned_off_note) for note in report.notes)
    # The conversion was stopped, not left running.
    assert eventually(lambda: not [
        child for child in psutil.Process().children()
        if "keras_pipeline_tuner.profiling.conversion" in " ".join(child.cmdline())
    ], timeout_s=10)


@pytest.mark.parametrize("timeout_s", [-1, "10", True, float("nan")])
def test_a_wait_takes_seconds_or_none(timeout_s):
    with pytest.raises(ValueError, match="timeout_s"):
        kpt.PipelineTuner(verbose=0).wait_for_profile(timeout_s)


# A training script that fits with a window whose conversion lasts `delay_s`
# more, says what runs, then exits ("exit") or waits to be killed ("killed").
_SCRIPT = r"""
import json, os, sys, time
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
import psutil
import keras_pipeline_tuner as kpt
from keras_pipeline_tuner.run import late_profile
from tests.helpers.late_profile import delay_conversions
from tests.helpers.training_data import cached_source, tiny_model

mode, log_dir, delay_s, exit_wait_s = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
delay_conversions(delay_s)
late_profile.EXIT_WAIT_S = float(exit_wait_s)
tuner = kpt.PipelineTuner(log_dir=log_dir, verbose=1, profile=(2, 8))
tiny_model().fit(cached_source(64).batch(4).repeat(), epochs=1, steps_per_epoch=8,
                 callbacks=[tuner], verbose=0)
conversions = [
    child.pid for child in psutil.Process().children()
    if "keras_pipeline_tuner.profiling.conversion" in " ".join(child.cmdline())
]
state = {"pending": tuner.report.profile_pending, "conversions": conversions}
print("STATE " + json.dumps(state), flush=True)
if mode == "killed":
    time.sleep(600)
"""


def start_script(tmp_path, mode: str, delay_s: float, exit_wait_s: float = 10.0):
    stderr = open(tmp_path / "stderr.txt", "w")
    return subprocess.Popen(
        [sys.executable, "-c", _SCRIPT, mode, str(tmp_path / "logs"), str(delay_s),
         str(exit_wait_s)],
        cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=stderr, text=True,
    )


def script_state(lines, tmp_path) -> dict:
    for line in lines:
        if line.startswith("STATE "):
            return json.loads(line[len("STATE "):])
    raise AssertionError((tmp_path / "stderr.txt").read_text()[-3000:])


def gone(pid: int) -> bool:
    # An orphan that has exited may wait a while for its new parent to reap it.
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.multiprocess
@pytest.mark.parametrize("signal_number", [signal.SIGKILL, signal.SIGTERM])
def test_the_conversion_ends_with_a_killed_training_process(tmp_path, signal_number):
    script = start_script(tmp_path, "killed", delay_s=600)
    try:
        state = script_state(iter(script.stdout.readline, ""), tmp_path)
        assert state["pending"] and len(state["conversions"]) == 1, state
        conversion = psutil.Process(state["conversions"][0])
        directory = conversion.cmdline()[-2]
        assert os.path.isdir(directory)
        script.send_signal(signal_number)
        assert script.wait(30) == -signal_number
    finally:
        script.kill()
        script.wait()
    # A conversion left running would sleep for ten minutes, then convert.
    assert eventually(lambda: gone(conversion.pid), timeout_s=10)
    assert not os.path.exists(directory)


@pytest.mark.multiprocess
def test_at_exit_a_running_conversion_joins_the_report_first(tmp_path):
    # Long enough that the exit waits over a second for it, however busy the machine.
    script = start_script(tmp_path, "exit", delay_s=5.0)
    output = script.communicate(timeout=180)[0]
    assert script.returncode == 0, (tmp_path / "stderr.txt").read_text()[-3000:]
    state = script_state(output.splitlines(), tmp_path)
    assert state["pending"], state
    # Said before the wait, as anything the tuner does for over a second is.
    assert "still running at exit: waiting up to 10 s" in output
    written = read_report(tmp_path / "logs")
    assert not written["profile_pending"] and written["profile"]["steps"], written["notes"]
    assert all(gone(pid) for pid in state["conversions"])


@pytest.mark.multiprocess
def test_at_exit_a_conversion_over_the_bound_is_stopped_and_noted(tmp_path):
    script = start_script(tmp_path, "exit", delay_s=600, exit_wait_s=2.0)
    output = script.communicate(timeout=180)[0]
    assert script.returncode == 0, (tmp_path / "stderr.txt").read_text()[-3000:]
    state = script_state(output.splitlines(), tmp_path)
    assert state["pending"] and state["conversions"], state
    written = read_report(tmp_path / "logs")
    profile = written["profile"]
    assert not written["profile_pending"] and not profile["steps"]
    assert any("still running at interpreter exit" in note for note in profile["notes"])
    assert os.path.isfile(profile["xplane_path"])  # kept for the Profile tab
    assert eventually(lambda: all(gone(pid) for pid in state["conversions"]), timeout_s=10)
