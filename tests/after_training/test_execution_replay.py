"""steps_per_execution advice where the host's work between steps bounds a tiny model's fit."""

import keras
import numpy as np
import tensorflow as tf

import keras_pipeline_tuner as kpt
from keras_pipeline_tuner.advice.recommendation import describe_gain


def dataset():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2048, 8)).astype("float32")
    y = (x.sum(axis=1, keepdims=True) > 0).astype("float32")
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(16).prefetch(tf.data.AUTOTUNE)


def tiny_model():
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    return model


def test_a_host_bound_tiny_model_is_advised_steps_per_execution_with_a_measured_gain():
    plain = tiny_model()
    plain_history = plain.fit(dataset(), epochs=2, verbose=0).history
    model = tiny_model()
    # A budget for the tuner's work that the replay fits in (2 s by default).
    tuner = kpt.PipelineTuner(verbose=0, measure_fixes=False, profile="off", cost_budget_s=10)
    history = model.fit(dataset(), epochs=2, callbacks=[tuner], verbose=0).history
    report = tuner.report
    (advice,) = [r for r in report.recommendations if r.id == "steps-per-execution"]
    gain = advice.expected_gain
    # 32 steps a call against one: the loop's work a step is gone many times over.
    assert gain.basis == "measured" and gain.likely_speedup > 1.2, gain
    assert "steps_per_execution=32" in advice.fix
    assert report.execution is not None and report.execution.steps_per_execution == 32
    # The timed fits left the model as training did.
    assert model.steps_per_execution == 1
    assert history == plain_history
    assert all(np.array_equal(a, b) for a, b in zip(plain.get_weights(), model.get_weights()))
    assert int(model.optimizer.iterations) == int(plain.optimizer.iterations)
    # And training goes on from there as a plain model's does.
    again = model.fit(dataset(), epochs=1, verbose=0).history
    assert again == plain.fit(dataset(), epochs=1, verbose=0).history
    assert kpt.Report.from_json(report.to_json()).execution == report.execution


def test_without_the_time_for_a_replay_the_gain_is_predicted_and_said_so():
    model = tiny_model()
    tuner = kpt.PipelineTuner(verbose=0, measure_fixes=False, profile="off", cost_budget_s=0)
    model.fit(dataset(), epochs=1, callbacks=[tuner], verbose=0)
    report = tuner.report
    (advice,) = [r for r in report.recommendations if r.id == "steps-per-execution"]
    gain = advice.expected_gain
    # A prediction, not a bound: the step clock's step holds per-call work too.
    assert gain.basis == "estimated" and gain.predicted_speedup > 1
    assert "Predicted" in gain.statement and "at most" not in gain.statement
    assert describe_gain(gain).endswith("(predicted)")
    assert report.execution is None
    assert any(note.startswith("steps_per_execution was not timed") for note in report.notes)
