"""Several tuners, several fits, and other callbacks that share the log dir."""

import os

import keras
import pytest

import keras_pipeline_tuner as kpt
from tests.helpers.training_data import cached_source
from tests.helpers.training_data import slow_source
from tests.helpers.training_data import tiny_model


def test_two_tuners_on_two_models_in_one_process():
    fast_model, slow_model = tiny_model(), tiny_model()
    fast_tuner = kpt.PipelineTuner(verbose=0, profile="off")
    slow_tuner = kpt.PipelineTuner(verbose=0, profile="off")
    for _ in range(2):
        fast_model.fit(cached_source(32).batch(4), epochs=1, callbacks=[fast_tuner], verbose=0)
        slow_model.fit(
            slow_source(8, 0.015).batch(1), epochs=1, callbacks=[slow_tuner], verbose=0
        )
    assert fast_tuner.report.train.steps == 7
    assert slow_tuner.report.train.steps == 7
    assert slow_tuner.report.train.input_wait.median_ms > 10
    assert fast_tuner.report.train.input_wait.median_ms < 10


def test_one_tuner_on_two_models():
    tuner = kpt.PipelineTuner(verbose=0, profile="off")
    first, second = tiny_model(), tiny_model()
    first.fit(cached_source(16).batch(4), epochs=1, callbacks=[tuner], verbose=0)
    second.fit(cached_source(32).batch(4), epochs=1, callbacks=[tuner], verbose=0)
    assert tuner.report.train.steps == 7
    first.fit(cached_source(16).batch(4), epochs=1, callbacks=[tuner], verbose=0)
    assert tuner.report.train.steps == 3


def test_alongside_keras_tensorboard_on_the_same_log_dir(tmp_path):
    tensorboard = keras.callbacks.TensorBoard(log_dir=str(tmp_path))
    tuner = kpt.PipelineTuner(log_dir=tmp_path, verbose=0, profile="off")
    history = tiny_model().fit(
        slow_source(8, 0.01).batch(1),
        validation_data=cached_source(8).batch(4),
        epochs=2,
        callbacks=[tensorboard, tuner],
        verbose=0,
    )
    assert len(history.history["loss"]) == 2
    assert (tmp_path / "report.json").is_file()
    event_files = [
        name for _, _, files in os.walk(tmp_path) for name in files if "tfevents" in name
    ]
    assert event_files
    assert tuner.report.verdict is kpt.Verdict.HIGHLY_INPUT_BOUND


class _StopAt(keras.callbacks.Callback):
    def __init__(self, epoch):
        super().__init__()
        self.epoch = epoch

    def on_epoch_begin(self, epoch, logs=None):
        if epoch == self.epoch:
            raise RuntimeError("preempted")


def test_backup_and_restore_resumes_a_run(tmp_path):
    backup = keras.callbacks.BackupAndRestore(str(tmp_path / "backup"))
    tuner = kpt.PipelineTuner(log_dir=tmp_path / "logs", verbose=0, profile="off")
    model = tiny_model()
    dataset = cached_source(16).batch(4)
    with pytest.raises(RuntimeError, match="preempted"):
        model.fit(dataset, epochs=4, callbacks=[backup, tuner, _StopAt(2)], verbose=0)
    model = tiny_model()
    history = model.fit(dataset, epochs=4, callbacks=[backup, tuner], verbose=0)
    assert len(history.history["loss"]) == 2
    assert [e.epoch for e in tuner.report.epochs] == [2, 3]
    assert tuner.report.train.steps == 7
