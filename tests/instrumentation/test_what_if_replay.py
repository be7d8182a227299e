"""What-if replay: the step with free input, measured without changing training."""

import keras
import numpy as np
import pytest

import keras_pipeline_tuner as kpt

from tests.helpers.training_data import FEATURES
from tests.helpers.training_data import slow_source
from tests.helpers.training_data import tiny_model

# Each batch of 2 takes 2 x 10 ms to produce; the step computes in about 1 ms.
ELEMENT_S = 0.01


def model_with_dropout():
    model = keras.Sequential(
        [keras.Input((FEATURES,)), keras.layers.Dense(4), keras.layers.Dropout(0.5),
         keras.layers.Dense(1)]
    )
    model.compile(optimizer="adam", loss="mse", metrics=["mae"])
    return model


def state(model):
    return [np.array(v.numpy()) for v in model.variables + model.optimizer.variables]


def test_replay_does_not_change_training():
    dataset = slow_source(16, 0.0).batch(2)
    first, second = model_with_dropout(), model_with_dropout()
    second.set_weights(first.get_weights())
    for variable, value in zip(second.variables, first.variables):
        variable.assign(value)  # seed generator state included
    replaying = kpt.PipelineTuner(what_if=5, verbose=0, profile="off")
    plain = kpt.PipelineTuner(verbose=0, profile="off")
    first.fit(dataset, epochs=2, verbose=0, callbacks=[replaying])
    second.fit(dataset, epochs=2, verbose=0, callbacks=[plain])

    assert replaying.report.what_if is not None and plain.report.what_if is None
    assert replaying.report.what_if.replay_steps == 5
    for after_replay, without in zip(state(first), state(second)):
        np.testing.assert_array_equal(after_replay, without)
    # And training goes on identically after it.
    first.fit(dataset, epochs=1, verbose=0)
    second.fit(dataset, epochs=1, verbose=0)
    for after_replay, without in zip(state(first), state(second)):
        np.testing.assert_array_equal(after_replay, without)


def test_input_bound_fit_reports_a_large_ceiling():
    tuner = kpt.PipelineTuner(what_if=True, verbose=0, profile="off")
    model = tiny_model()
    model.fit(slow_source(24, ELEMENT_S).batch(2), epochs=1, verbose=0, callbacks=[tuner])
    result = tuner.report.what_if
    assert result.pipeline_source == "training"
    assert result.replay_steps == 20 and result.cached_batches == 8
    # Input is ~20 ms a step and compute ~1 ms: free input is several times faster.
    assert result.speedup_if_input_free > 3
    assert result.replay_input_wait.median_ms < result.pipeline_step.median_ms / 5
    assert result.pipeline_step == tuner.report.train.step
    assert "after training" in result.method
    again = kpt.Report.from_json(tuner.report.to_json())
    assert again.what_if == result
    assert isinstance(again.what_if, kpt.WhatIfResult)


def test_standalone_replay_measures_the_pipeline_too():
    model = tiny_model()
    dataset = slow_source(12, ELEMENT_S).batch(2)
    model.fit(dataset, epochs=1, verbose=0)
    before = state(model)
    result = kpt.what_if(model, dataset, steps=10, cached_batches=3)
    assert result.pipeline_source == "measured"
    assert result.cached_batches == 3 and result.replay_steps == 10
    assert result.speedup_if_input_free > 3
    for value, now in zip(before, state(model)):
        np.testing.assert_array_equal(value, now)


def test_fit_on_arrays_keeps_training_and_says_why_there_is_no_replay():
    tuner = kpt.PipelineTuner(what_if=True, verbose=0, profile="off")
    model = tiny_model()
    x = np.zeros((16, FEATURES), np.float32)
    history = model.fit(x, x[:, 0], batch_size=4, epochs=1, verbose=0, callbacks=[tuner])
    assert len(history.history["loss"]) == 1
    assert tuner.report.what_if is None
    assert any("what-if replay" in note and "tf.data" in note for note in tuner.report.notes)


@pytest.mark.parametrize("what_if", [0, -3, 2.5, "yes", None])
def test_bad_what_if_argument(what_if):
    with pytest.raises(ValueError, match="what_if"):
        kpt.PipelineTuner(what_if=what_if)


def test_standalone_arguments():
    model = tiny_model()
    with pytest.raises(TypeError, match="tf.data.Dataset"):
        kpt.what_if(model, np.zeros((4, FEATURES)))
    with pytest.raises(ValueError, match="steps"):
        kpt.what_if(model, slow_source(4, 0.0).batch(2), steps=0)
    with pytest.raises(ValueError, match="empty"):
        kpt.what_if(model, slow_source(4, 0.0).batch(2).take(0))
