"""The log dir goes bad during fit: replaced by a file, deleted, full.

Tests run as root, for whom a read-only mode does not stop writes, so an
unwritable log dir is made by replacing it with a file; a full disk by a file
size limit (`RLIMIT_FSIZE`, in a subprocess) or by writing through `/dev/full`.
"""

import glob
import logging
import os
import shutil

import keras
import pytest
from tensorboard.backend.event_processing import event_accumulator

import keras_pipeline_tuner as kpt
from keras_pipeline_tuner._util import features
from keras_pipeline_tuner._util import files
from keras_pipeline_tuner.outputs import tensorboard as tensorboard_sink
from keras_pipeline_tuner.outputs.report import REPORT_FILENAME
from keras_pipeline_tuner.profiling import window as profiler_window
from tests.helpers.fault_injection import STEPS_PER_EPOCH
from tests.helpers.fault_injection import assert_training_intact
from tests.helpers.fault_injection import run_script
from tests.helpers.fault_injection import train
from tests.helpers.fault_injection import tuner_warnings
from tests.helpers.fault_injection import turned_off

WRITING_FEATURES = {
    features.REPORT_FILE,
    features.STEP_TRACE,
    tensorboard_sink.SCALARS,
    tensorboard_sink.TEXT,
    tensorboard_sink.TIMELINE,
    tensorboard_sink.DASHBOARD,
}


@pytest.fixture(scope="module")
def plain_run():
    return train(epochs=3)


class BreakLogDir(keras.callbacks.Callback):
    """At the end of the first epoch, before the tuner's own hook, breaks the log dir."""

    def __init__(self, log_dir, replace_with_file):
        super().__init__()
        self.log_dir = str(log_dir)
        self.replace_with_file = replace_with_file

    def on_epoch_end(self, epoch, logs=None):
        if epoch == 0:
            shutil.rmtree(self.log_dir)
            if self.replace_with_file:
                with open(self.log_dir, "w") as file:
                    file.write("not a directory")


def scalar_steps(run_dir, tag=tensorboard_sink.SCALAR_TAGS[0]):
    keep_all = {event_accumulator.TENSORS: 0}
    events = event_accumulator.EventAccumulator(str(run_dir), size_guidance=keep_all)
    events.Reload()
    if tag not in events.Tags()["tensors"]:
        return []
    return [event.step for event in events.Tensors(tag)]


def train_breaking_the_log_dir(log_dir, caplog, plain_run, replace_with_file):
    tuner = kpt.PipelineTuner(log_dir=log_dir, verbose=0, profile=(2, 6))
    with caplog.at_level(logging.WARNING, logger="keras_pipeline_tuner"):
        run = train([BreakLogDir(log_dir, replace_with_file), tuner], epochs=3)
        # A conversion still running at the end of fit joins (or fails) after it.
        tuner.wait_for_profile()
    assert_training_intact(run, plain_run)
    return tuner


def _window_lost(tuner):
    """The profiler window's feature, unless its conversion read the capture before the break.

    It converts off the training thread from the window's end (step 6); the
    break comes at the epoch's end, six short steps later, which the
    conversion, holding the GIL on a busy machine, now and then outlasts.
    Either way is right: the evidence taken, or the feature off and saying so.
    """
    converted = tuner.report.profile is not None and tuner.report.profile.source != ""
    return set() if converted else {profiler_window.FEATURE}


def test_log_dir_replaced_by_a_file_mid_run(tmp_path, caplog, plain_run):
    log_dir = tmp_path / "run"
    tuner = train_breaking_the_log_dir(log_dir, caplog, plain_run, replace_with_file=True)
    features = turned_off(tuner_warnings(caplog))
    # Each feature that writes to the log dir says so once, and only those.
    assert sorted(features) == sorted(WRITING_FEATURES | _window_lost(tuner))
    assert len(tuner_warnings(caplog)) == len(features)
    # Measuring went on: the report in memory covers the whole run.
    assert tuner.report.train.steps == 3 * STEPS_PER_EPOCH - 1
    assert [e.epoch for e in tuner.report.epochs if e.kind == "train"] == [0, 1, 2]
    assert log_dir.read_text() == "not a directory"


def test_log_dir_deleted_mid_run(tmp_path, caplog, plain_run):
    log_dir = tmp_path / "run"
    tuner = train_breaking_the_log_dir(log_dir, caplog, plain_run, replace_with_file=False)
    # The capture of epoch 0 went with the directory before xprof read it: that
    # feature says so; every other output is written again.
    warnings = tuner_warnings(caplog)
    assert turned_off(warnings) == sorted(_window_lost(tuner)), warnings
    assert len(warnings) == len(_window_lost(tuner))
    stored = kpt.Report.from_json((log_dir / REPORT_FILENAME).read_text())
    assert stored.train.steps == 3 * STEPS_PER_EPOCH - 1
    assert (log_dir / "step_timeline.trace.json").is_file()
    # The event file is written again; the steps of epochs 1 and 2 are in it.
    steps = scalar_steps(log_dir / tensorboard_sink.RUN)
    assert set(range(2 * STEPS_PER_EPOCH, 3 * STEPS_PER_EPOCH)) <= set(steps)


def test_report_file_on_a_full_disk(tmp_path, caplog, plain_run, monkeypatch):
    """The report is written through /dev/full: ENOSPC, for real."""
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full on this system")
    log_dir = tmp_path / "run"
    log_dir.mkdir()
    os.symlink("/dev/full", log_dir / (REPORT_FILENAME + ".partial"))
    # Temporary names are random; this test needs one it can point at /dev/full.
    monkeypatch.setattr(
        files,
        "temporary_name",
        lambda path: path + ".partial" if path.endswith(REPORT_FILENAME) else f"{path}.x.partial",
    )
    tuner = kpt.PipelineTuner(log_dir=log_dir, verbose=0, profile="off")
    with caplog.at_level(logging.WARNING, logger="keras_pipeline_tuner"):
        run = train([tuner], epochs=3)
    assert_training_intact(run, plain_run)
    warnings = tuner_warnings(caplog)
    assert turned_off(warnings) == [features.REPORT_FILE], warnings
    assert "No space left on device" in warnings[0]
    assert not (log_dir / REPORT_FILENAME).exists()
    # The half-written file is removed, the other outputs are there.
    assert not os.path.lexists(log_dir / (REPORT_FILENAME + ".partial"))
    assert (log_dir / "step_timeline.trace.json").is_file()
    assert len(scalar_steps(log_dir / tensorboard_sink.RUN)) == 3 * STEPS_PER_EPOCH - 1


def test_every_output_on_a_full_disk(tmp_path):
    """A file size limit makes every write past 24 KB fail (EFBIG), in a subprocess."""
    script = """
        import logging, resource, signal
        import keras_pipeline_tuner as kpt
        from tests.helpers.fault_injection import train, assert_training_intact

        logging.basicConfig(format="LOG %(message)s")
        plain = train(epochs=3)
        # Past the limit a write fails with EFBIG instead of killing the process.
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (24_000, resource.RLIM_INFINITY))
        tuner = kpt.PipelineTuner(log_dir=sys.argv[1], verbose=1, profile=(2, 6))
        assert_training_intact(train([tuner], epochs=3), plain)
        print("STEPS", tuner.report.train.steps)
        """
    done = run_script(script, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"STEPS {3 * STEPS_PER_EPOCH - 1}" in done.stdout
    warnings = [line for line in done.stderr.splitlines() if line.startswith("LOG ")]
    features = turned_off(line[len("LOG "):] for line in warnings)
    assert features, done.stderr[-3000:]
    assert len(set(features)) == len(features) == len(warnings), warnings
    assert all("File too large" in line for line in warnings), warnings
    # The summary on the terminal (not in the log dir) is still printed.
    assert "Input pipeline:" in done.stdout
    assert not glob.glob(os.path.join(tmp_path, "**", "*.partial"), recursive=True)
