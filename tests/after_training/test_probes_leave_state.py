"""The probes after training never touch the user's data or state.

Every probe is on (the contention check, `what_if=True`, `measure_fixes=True`):
each re-runs the pipeline or the step only where that leaves what a later fit
reads and draws as it would have been. Each test trains twice, tuner then plain
Keras, and compares with plain Keras twice, bit for bit.
"""

import itertools
import queue
import time

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_pipeline_tuner as kpt

FEATURES = 4
ELEMENTS = 64
BATCH = 4


def every_probe():
    # 30 s for the fix timing, which takes what it needs (about 3 s here): with
    # `True`'s 5 s, a busy machine's slower set-up once left too little to time any.
    return kpt.PipelineTuner(verbose=0, profile="off", what_if=True, measure_fixes=30)


def in_memory():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(ELEMENTS, FEATURES)).astype(np.float32)
    y = rng.normal(size=(ELEMENTS,)).astype(np.float32)
    return tf.data.Dataset.from_tensor_slices((x, y))


def small_model(*layers):
    model = keras.Sequential([keras.Input((FEATURES,)), *layers, keras.layers.Dense(1)])
    model.compile(keras.optimizers.Adam(0.01), "mse")
    return model


def two_fits(make, tuned, tuner=every_probe):
    """Fit 1 (with every probe when `tuned`), then a plain fit 2 of the same model.

    Returns fit 2's history, the weights after it, and what `make` says of the
    state it built once both fits ended.
    """
    keras.utils.set_random_seed(5)
    model, dataset, state = make()
    callbacks = [tuner()] if tuned else []
    model.fit(dataset, epochs=2, callbacks=callbacks, verbose=0)
    history = model.fit(dataset, epochs=1, verbose=0).history
    return history, model.get_weights(), state()


def assert_same(make, tuner=every_probe):
    plain = two_fits(make, tuned=False)
    tuned = two_fits(make, tuned=True, tuner=tuner)
    assert tuned[0] == plain[0]
    for a, b in zip(plain[1], tuned[1]):
        np.testing.assert_array_equal(a, b)
    assert tuned[2] == plain[2]


def test_a_random_generator_in_map_is_not_drawn_from_by_the_probes():
    # The augmentation guide's own pattern: a tf.random.Generator drawn in map.
    def make():
        generator = tf.random.Generator.from_seed(1)

        def jitter(x, y):
            return x + generator.normal((FEATURES,)) * 0.01, y

        dataset = in_memory().map(jitter).batch(BATCH)
        return small_model(), dataset, lambda: generator.state.numpy().tolist()

    assert_same(make)


def counted_python():
    counter = itertools.count()

    def tag(x):
        time.sleep(0.002)
        return x + np.float32(next(counter) % 3)

    def tagged(x, y):
        x = tf.py_function(tag, [x], tf.float32)
        x.set_shape((FEATURES,))
        return x, y

    dataset = in_memory().map(tagged).batch(BATCH)
    return small_model(), dataset, lambda: next(counter)


def test_a_counter_in_a_py_function_counts_only_what_training_read():
    assert_same(counted_python)


def test_a_pipeline_that_runs_python_gets_no_floor_replay_and_keeps_its_counter():
    # The contention check, run for the timed fixes' floor, would read the
    # pipeline again: its Python is not run again, and the report says so.
    floors = []

    def floor_and_fixes():
        tuner = kpt.PipelineTuner(verbose=0, profile="off", measure_fixes=True)
        floors.append(tuner)
        return tuner

    assert_same(counted_python, floor_and_fixes)
    report = floors[0].report
    assert report.what_if is None, report.what_if
    assert any("the pipeline is not run again" in note for note in report.notes), report.notes


def test_a_numpy_generator_in_a_py_function_moves_only_with_training():
    def make():
        rng = np.random.default_rng(7)

        def noise(x):
            time.sleep(0.002)
            return x + rng.normal(size=x.shape).astype(np.float32) * 0.01

        def noisy(x, y):
            x = tf.numpy_function(noise, [x], tf.float32)
            x.set_shape((FEATURES,))
            return x, y

        dataset = in_memory().map(noisy).batch(BATCH)
        return small_model(), dataset, lambda: float(rng.random())

    assert_same(make)


def slow_random(x, y):
    # A stateless wait (the probes may run it again) and a random op that
    # tf.data does not parallelise: an input-bound fit whose fixes get timed.
    def wait(value):
        time.sleep(0.004)
        return value

    x = tf.numpy_function(wait, [x], tf.float32, stateful=False)
    x.set_shape((FEATURES,))
    return x + tf.random.uniform((FEATURES,)) * 0.01, y


def shuffled_random():
    dataset = in_memory().shuffle(ELEMENTS).map(slow_random).batch(BATCH)
    return small_model(), dataset, lambda: None


def _timed(recommendation) -> bool:
    """Whether the recommendation's fix, or one folded into it, was timed."""
    gain = recommendation.expected_gain
    if gain is not None and gain.likely_speedup is not None:
        return True
    # Timed under 1.25x (a parallel map beside a load), a change is no clear
    # gain and joins the evidence of its stage's other finding.
    return any("(measured: the change timed" in item.detail for item in recommendation.evidence)


def test_a_shuffled_random_pipeline_is_timed_on_a_copy_and_left_as_it_was():
    keras.utils.set_random_seed(5)
    model, dataset, _ = shuffled_random()
    tuner = every_probe()
    model.fit(dataset, epochs=2, callbacks=[tuner], verbose=0)
    # Its fixes were timed (passes of the pipeline after training) ...
    recs = tuner.report.recommendations
    statements = [r.expected_gain and r.expected_gain.statement for r in recs]
    assert any(map(_timed, recs)), "\n".join(map(str, statements + tuner.report.notes))
    # ... and a later fit on it shuffles and draws as it would have.
    assert_same(shuffled_random)


class UnseededNoise(keras.layers.Layer):
    """Adds `tf.random.normal` noise with no seed: legacy state in the step's kernels."""

    def call(self, inputs):
        return inputs + tf.random.normal(tf.shape(inputs)) * 0.01


def test_an_unseeded_random_op_in_the_model_continues_into_the_next_fit():
    def make():
        return small_model(UnseededNoise()), in_memory().batch(BATCH), lambda: None

    assert_same(make)


def test_a_plain_fit_before_the_tuned_one_keeps_training_on_keras_function():
    # Keras' own function already ran the legacy random ops: the tuner times
    # whole steps rather than start their numbers over, and says why.
    def fits(tuned):
        keras.utils.set_random_seed(5)
        model = small_model(UnseededNoise())
        dataset = in_memory().batch(BATCH)
        model.fit(dataset, epochs=1, verbose=0)
        tuner = every_probe()
        history = model.fit(dataset, epochs=1, callbacks=[tuner] if tuned else [], verbose=0)
        later = model.fit(dataset, epochs=1, verbose=0)
        return history.history, later.history, model.get_weights(), tuner.report

    plain, tuned = fits(False), fits(True)
    assert tuned[:2] == plain[:2]
    for a, b in zip(plain[2], tuned[2]):
        np.testing.assert_array_equal(a, b)
    report = tuned[3]
    assert report.measurement == "whole-step"
    assert any("legacy random ops (RandomStandardNormal)" in note for note in report.notes)


class TakenFromTheFeed(keras.callbacks.Callback):
    """Records how many elements the feed had given when training ended."""

    def __init__(self, feed):
        super().__init__()
        self.feed = feed
        self.at_train_end = None

    def on_train_end(self, logs=None):
        self.at_train_end = self.feed.taken


class LiveFeed:
    """A queue that a producer keeps full, read by a `from_generator` source."""

    def __init__(self):
        self.queue = queue.Queue()
        self.taken = 0
        for i in range(10_000):
            self.queue.put(i)

    def elements(self):
        while True:
            value = self.queue.get()
            self.taken += 1
            yield np.full((FEATURES,), value % 5, np.float32), np.float32(value % 2)


@pytest.mark.parametrize("tuned", [False, True], ids=["plain", "every probe"])
def test_a_queue_fed_generator_loses_no_element_to_the_tuner(tuned):
    feed = LiveFeed()
    dataset = tf.data.Dataset.from_generator(
        feed.elements,
        output_signature=(
            tf.TensorSpec((FEATURES,), tf.float32),
            tf.TensorSpec((), tf.float32),
        ),
    ).batch(BATCH)
    # No prefetch: only the training steps read the feed, so what it gave is
    # exact (a prefetch would refill its buffer for as long as fit lasts).
    options = tf.data.Options()
    options.experimental_optimization.inject_prefetch = False
    dataset = dataset.with_options(options)
    # Listed first: its end-of-training hook runs before the tuner's probes.
    taken = TakenFromTheFeed(feed)
    callbacks = [taken, every_probe()] if tuned else [taken]
    small_model().fit(dataset, epochs=2, steps_per_epoch=15, callbacks=callbacks, verbose=0)
    # Nothing read the feed once training had ended: the 30 batches trained on.
    assert feed.taken == taken.at_train_end == 2 * 15 * BATCH
