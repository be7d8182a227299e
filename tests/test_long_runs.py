"""Long runs: the tuner's memory stays bounded, and the report survives a crash."""

import json

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_pipeline_tuner as kpt
from tests.training_data import tiny_model


def test_thousands_of_steps_keep_the_buffers_bounded():
    steps = 3000
    x = np.zeros((steps, 8), np.float32)
    y = np.zeros((steps, 1), np.float32)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(1)
    tuner = kpt.PipelineTuner(verbose=0, profile="off", buffer_steps=500)
    model = tiny_model()
    model.fit(dataset, epochs=1, callbacks=[tuner], verbose=0)
    sizes = [a.nbytes for a in (tuner.clock._start, tuner.clock._wait, tuner.clock._gap)]
    model.fit(dataset, epochs=1, callbacks=[tuner], verbose=0)
    assert tuner.clock.retained_steps == 500
    assert [a.nbytes for a in (tuner.clock._start, tuner.clock._wait, tuner.clock._gap)] == sizes
    assert sizes[0] == 500 * 8
    assert tuner.report.train.steps == steps - 1
    assert len(tuner.clock.steps("train")["wait"]) == 500


class _FailAtEpoch(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        if epoch == 2:
            raise RuntimeError("machine lost")


def test_report_file_is_written_every_epoch(tmp_path):
    dataset = tf.data.Dataset.from_tensor_slices(
        (np.zeros((16, 8), np.float32), np.zeros((16, 1), np.float32))
    ).batch(4)
    tuner = kpt.PipelineTuner(log_dir=tmp_path, verbose=0, profile="off")
    with pytest.raises(RuntimeError, match="machine lost"):
        tiny_model().fit(dataset, epochs=4, callbacks=[tuner, _FailAtEpoch()], verbose=0)
    stored = kpt.Report.from_json((tmp_path / "report.json").read_text())
    assert [e.epoch for e in stored.epochs] == [0, 1]
    assert stored.train.steps == 7


def test_report_file_is_written_when_a_step_fails(tmp_path):
    def records():
        for i in range(12):
            if i == 9:
                raise ValueError("corrupt record")
            yield np.zeros(8, np.float32), np.float32(0)

    dataset = tf.data.Dataset.from_generator(
        records,
        output_signature=(tf.TensorSpec((8,), tf.float32), tf.TensorSpec((), tf.float32)),
    ).batch(2)
    tuner = kpt.PipelineTuner(log_dir=tmp_path, verbose=0, profile="off")
    with pytest.raises(Exception, match="corrupt record"):
        tiny_model().fit(dataset, epochs=1, callbacks=[tuner], verbose=0)
    stored = json.loads((tmp_path / "report.json").read_text())
    assert stored["train"]["steps"] == 3
