"""The callback inspects the data model.fit iterates, once per fit, without touching training."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_pipeline_tuner as kpt
from keras_pipeline_tuner.instrumentation import fit_input
from tests.helpers.training_data import FEATURES
from tests.helpers.training_data import slow_source
from tests.helpers.training_data import tiny_model


def fit(model, data, tuner=None, **kwargs):
    callbacks = [tuner] if tuner is not None else []
    return model.fit(data, epochs=2, verbose=0, callbacks=callbacks, **kwargs)


def test_naive_pipeline_findings_reach_the_report_and_training_is_unchanged():
    keras.utils.set_random_seed(0)
    model = tiny_model()
    initial = model.get_weights()
    naive = slow_source(16, 0.001).batch(4)

    plain_history = fit(model, naive)
    plain_weights = model.get_weights()

    model.set_weights(initial)
    model.optimizer.iterations.assign(0)
    tuner = kpt.PipelineTuner(verbose=0, profile="off")
    tuned_history = fit(model, naive, tuner)

    for plain, tuned in zip(plain_weights, model.get_weights()):
        np.testing.assert_allclose(tuned, plain, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(
        tuned_history.history["loss"], plain_history.history["loss"], rtol=1e-6
    )
    report = tuner.report
    assert [(f.id, str(f.severity)) for f in report.findings] == [("missing-prefetch", "info")]
    assert report.findings[0].stage == "batch(4)"
    assert not tuner.guard.failures
    again = kpt.Report.from_json(report.to_json())
    assert again.findings == report.findings


def test_inspection_runs_once_per_fit():
    model = tiny_model()
    tuner = kpt.PipelineTuner(verbose=0, profile="off")
    fit(model, slow_source(8, 0.0).batch(4), tuner)
    assert tuner.report.findings[0].id == "missing-prefetch"
    # A second fit with another pipeline replaces the findings.
    fit(model, slow_source(8, 0.0).batch(4).prefetch(tf.data.AUTOTUNE), tuner)
    assert tuner.report.findings == []


class Batches(keras.utils.PyDataset):
    def __len__(self):
        return 2

    def __getitem__(self, index):
        return np.zeros((4, FEATURES), np.float32), np.zeros((4,), np.float32)


def batches():
    while True:
        yield np.zeros((4, FEATURES), np.float32), np.zeros((4,), np.float32)


@pytest.mark.parametrize(
    "data, kwargs, expected",
    [
        (Batches(), {}, ["py-dataset-workers"]),
        (batches(), {"steps_per_epoch": 2}, ["python-generator"]),
        (
            np.zeros((8, FEATURES), np.float32),
            {"y": np.zeros((8,)), "batch_size": 4},
            ["keras-array-input"],
        ),
    ],
    ids=["PyDataset", "generator", "arrays"],
)
def test_data_keras_adapts(data, kwargs, expected):
    tuner = kpt.PipelineTuner(verbose=0, profile="off")
    tiny_model().fit(data, epochs=1, verbose=0, callbacks=[tuner], **kwargs)
    assert [finding.id for finding in tuner.report.findings] == expected
    assert not tuner.guard.failures


def test_outside_fit_the_error_says_what_to_do():
    with pytest.raises(RuntimeError, match=r"kpt.inspect\(dataset\)"):
        fit_input.inspect_fit_input(tiny_model())
    assert fit_input.find_fit_input(tiny_model()) is None


def test_large_in_memory_data_is_inspected_without_a_warning(caplog):
    # 16 MB of arrays: the pipeline is read over stand-ins of them, not copied.
    x = np.zeros((2100, 2048), np.float32)
    y = np.zeros((2100, 1), np.float32)
    model = keras.Sequential([keras.Input((2048,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    tuner = kpt.PipelineTuner(verbose=0, profile="off")
    with caplog.at_level("WARNING", logger="keras_pipeline_tuner"):
        model.fit(
            tf.data.Dataset.from_tensor_slices((x, y)).batch(512),
            epochs=1,
            callbacks=[tuner],
            verbose=0,
        )
    report = tuner.report
    assert [finding.id for finding in report.findings] == ["missing-prefetch"]
    assert not any("not inspected" in note for note in report.notes)
    assert "pipeline inspection" not in caplog.text
    assert report.measurement == "in-step" and report.train.steps == 4


def test_a_custom_loop_treats_large_in_memory_data_as_fit_does(caplog):
    # The twin of the test above: inspected, no warning, and the inspection
    # stays on for the tuner's next run.
    x = np.zeros((2100, 2048), np.float32)
    tuner = kpt.PipelineTuner(verbose=0, profile="off")

    @tuner.instrument
    def train_step(batch):
        return tf.reduce_sum(batch)

    with caplog.at_level("WARNING", logger="keras_pipeline_tuner"):
        for batch in tuner.iterate(tf.data.Dataset.from_tensor_slices(x).batch(512)):
            train_step(batch)
        report = tuner.close()
    assert [finding.id for finding in report.findings] == ["missing-prefetch"]
    assert not any("not inspected" in note for note in report.notes)
    assert "pipeline inspection" not in caplog.text
    assert report.train.steps == 4
    with tuner:
        for batch in tuner.iterate(slow_source(8, 0.001).batch(4)):
            train_step(tf.cast(batch[0], tf.float32))
    assert tuner.report.findings, "the next run was not inspected"
