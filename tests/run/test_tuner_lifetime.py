"""What the tuner keeps, and what it leaves alone: user overrides, models, copies."""

import copy
import gc
import weakref

import keras
import numpy as np
import tensorflow as tf

import keras_pipeline_tuner as kpt
from tests.helpers.training_data import FEATURES
from tests.helpers.training_data import cached_source


class ClippedModel(keras.Sequential):
    """Clips its weights after every call of its train function, as a user might."""

    def make_train_function(self, force=False):
        super().make_train_function(force)
        train_function = self.train_function
        if getattr(train_function, "clipped", False):
            return train_function

        def clipped(iterator):
            logs = train_function(iterator)
            for weight in self.trainable_weights:
                weight.assign(tf.clip_by_value(weight, -0.05, 0.05))
            return logs

        clipped.clipped = True
        self.train_function = clipped
        return clipped


def clipped_model():
    keras.utils.set_random_seed(3)
    model = ClippedModel([keras.Input((FEATURES,)), keras.layers.Dense(8), keras.layers.Dense(1)])
    model.compile(keras.optimizers.Adam(0.05), "mse")
    return model


def test_a_custom_make_train_function_runs_and_is_timed_whole(caplog):
    data = cached_source(64).batch(8)
    plain = clipped_model()
    plain_history = plain.fit(data, epochs=3, verbose=0).history
    tuned = clipped_model()
    tuner = kpt.PipelineTuner(verbose=0, profile="off")
    with caplog.at_level("WARNING", logger="keras_pipeline_tuner"):
        tuned_history = tuned.fit(data, epochs=3, verbose=0, callbacks=[tuner]).history
    assert tuned_history == plain_history
    for a, b in zip(plain.get_weights(), tuned.get_weights()):
        np.testing.assert_array_equal(a, b)
    # The user's clipping ran: no weight left the range.
    assert max(float(np.abs(w).max()) for w in tuned.get_weights()) <= np.float32(0.05)
    report = tuner.report
    assert report.measurement == "whole-step"
    assert any("make_train_function" in note for note in report.notes)
    assert report.train.steps == 3 * 8 - 1


def small_model():
    model = keras.Sequential(
        [keras.Input((FEATURES,)), keras.layers.Dense(256), keras.layers.Dense(1)]
    )
    model.compile("adam", "mse")
    return model


def test_one_tuner_over_ten_fits_keeps_no_model_alive():
    tuner = kpt.PipelineTuner(verbose=0, profile="off")
    alive = []
    for _ in range(10):
        model = small_model()
        model.fit(cached_source(16).batch(4), epochs=1, verbose=0, callbacks=[tuner])
        alive.append(weakref.ref(model))
        del model
    gc.collect()
    assert [ref() for ref in alive] == [None] * 10
    # And the tuner still reports the last fit.
    assert tuner.report.train.steps == 3


def test_a_used_tuner_can_be_deep_copied_as_keras_tuner_does():
    tuner = kpt.PipelineTuner(verbose=0, profile="off", buffer_steps=500)
    small_model().fit(cached_source(16).batch(4), epochs=1, verbose=0, callbacks=[tuner])
    copied = copy.deepcopy(tuner)
    assert isinstance(copied, kpt.PipelineTuner)
    assert copied is not tuner and copied.buffer_steps == 500
    # A fresh tuner with the same arguments: it measures a fit of its own.
    small_model().fit(cached_source(24).batch(4), epochs=1, verbose=0, callbacks=[copied])
    assert copied.report.train.steps == 5
    assert tuner.report.train.steps == 3
