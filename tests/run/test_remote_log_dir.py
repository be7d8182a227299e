"""A log dir on a TensorFlow file system (`ram://`, TensorFlow's in-memory one, stands in
for `gs://`): every file the tuner writes goes there, and reads back from there."""

import os

import tensorflow as tf

import keras_pipeline_tuner as kpt
from keras_pipeline_tuner import cli
from keras_pipeline_tuner.outputs.report import REPORT_FILENAME
from keras_pipeline_tuner.outputs.trace import TRACE_FILENAME
from keras_pipeline_tuner.profiling.capture import PROFILE_RUN
from keras_pipeline_tuner.workers import exchange
from tests.helpers.training_data import slow_source
from tests.helpers.training_data import tiny_model


def _files_under(root):
    found = []
    for directory, _, names in tf.io.gfile.walk(root):
        found += [os.path.join(directory, name) for name in names]
    return found


def test_everything_goes_to_the_remote_log_dir(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    log_dir = "ram://remote_log_dir/run1"
    tuner = kpt.PipelineTuner(log_dir=log_dir, verbose=0, profile=(2, 6))
    tiny_model().fit(slow_source(24, 0.01).batch(2), epochs=1, callbacks=[tuner], verbose=0)
    # The outputs are written again when the profile joins.
    report = tuner.wait_for_profile()

    # Nothing lands in a local folder named after the URL.
    assert os.listdir(tmp_path) == []
    written = _files_under(log_dir)
    report_path = os.path.join(log_dir, REPORT_FILENAME)
    assert report_path in written
    assert os.path.join(log_dir, TRACE_FILENAME) in written
    assert not [path for path in written if path.endswith(".partial")]
    stored = kpt.Report.from_json(tf.io.gfile.GFile(report_path).read())
    assert stored.train.steps == report.train.steps > 0
    assert stored.profile == report.profile

    # The profiler window ran, was published into the log dir and converted.
    profile = report.profile
    assert profile is not None and profile.first_step == 2 and profile.stop_step == 6
    assert len(profile.steps) >= 3, profile.notes
    assert profile.xplane_path.startswith(f"{log_dir}/{PROFILE_RUN}/plugins/profile/")
    assert profile.xplane_path in written
    assert profile.cost.file_bytes == tf.io.gfile.stat(profile.xplane_path).length > 0
    assert profile.input_fraction is not None
    assert any("tfevents" in path for path in written)

    # The report command reads it back from there.
    capsys.readouterr()
    assert cli.main(["report", log_dir]) == 0
    assert stored.verdict.value in capsys.readouterr().out


def test_worker_summaries_on_a_remote_log_dir():
    log_dir = "ram://remote_log_dir/workers"
    summary = exchange.WorkerSummary(task="worker:1")
    path = exchange.write_summary(summary, log_dir)
    assert path.startswith(log_dir) and tf.io.gfile.exists(path)
    assert exchange.read_summary(log_dir, "worker:1") == summary
    exchange.remove_summaries(log_dir, ["worker:1"])
    assert exchange.read_summary(log_dir, "worker:1") is None
