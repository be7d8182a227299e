"""Tiny models and tf.data pipelines with known, injected delays, for the tests."""

import time

import keras
import numpy as np
import tensorflow as tf

FEATURES = 8


def slow_source(elements: int, delay_s: float, features: int = FEATURES) -> tf.data.Dataset:
    """A `from_generator` source that sleeps `delay_s` before each (x, y) element."""

    def generate():
        for i in range(elements):
            time.sleep(delay_s)
            yield np.full((features,), i % 7, np.float32), np.float32(i % 2)

    return tf.data.Dataset.from_generator(
        generate,
        output_signature=(
            tf.TensorSpec((features,), tf.float32),
            tf.TensorSpec((), tf.float32),
        ),
    )


def replayable_source(elements: int, delay_s: float, features: int = FEATURES) -> tf.data.Dataset:
    """As `slow_source`, but one the tuner's probes may run again after training.

    In-memory elements, each delayed by `delay_s` in a `tf.numpy_function`
    declared stateless (no generator, no Python state to move on). TensorFlow
    is told not to parallelise the map, so the elements wait in turn, as a
    generator's do.
    """
    values = np.stack([np.full((features,), i % 7, np.float32) for i in range(elements)])
    labels = np.array([i % 2 for i in range(elements)], np.float32)

    def sleep(x):
        time.sleep(delay_s)
        return x

    def delayed(x, y):
        x = tf.numpy_function(sleep, [x], tf.float32, stateful=False)
        x.set_shape((features,))
        return x, y

    options = tf.data.Options()
    options.experimental_optimization.map_parallelization = False
    dataset = tf.data.Dataset.from_tensor_slices((values, labels)).map(delayed)
    return dataset.with_options(options)


def failing_source(elements: int, fail_at: int, message: str) -> tf.data.Dataset:
    """A `from_generator` source of (x, y) whose element `fail_at` raises ValueError(message)."""

    def generate():
        for i in range(elements):
            if i == fail_at:
                raise ValueError(message)
            yield np.ones(FEATURES, np.float32), np.float32(1)

    return tf.data.Dataset.from_generator(
        generate,
        output_signature=(
            tf.TensorSpec((FEATURES,), tf.float32),
            tf.TensorSpec((), tf.float32),
        ),
    )


def cached_source(elements: int, features: int = FEATURES) -> tf.data.Dataset:
    """In-memory, cached (x, y) elements: fetching a batch costs microseconds."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(elements, features)).astype(np.float32)
    y = (x.sum(axis=1) > 0).astype(np.float32)
    return tf.data.Dataset.from_tensor_slices((x, y)).cache()


def spinning_map(
    batches: int, batch: int, cpu_s: float, features: int = FEATURES, parallel_calls=2
) -> tf.data.Dataset:
    """Batches whose `py_function` map burns `cpu_s` of CPU each on its thread's clock.

    Load stretches its wall time, never its CPU time. Prefetched.
    """

    def spin(x):
        end = time.thread_time() + cpu_s
        while time.thread_time() < end:
            pass
        return x

    def mapped(x, y):
        x = tf.py_function(spin, [x], tf.float32)
        x.set_shape((None, features))
        return x, y

    x = np.random.default_rng(0).random((batch * batches, features), dtype=np.float32)
    data = tf.data.Dataset.from_tensor_slices((x, x[:, :1])).batch(batch)
    return data.map(mapped, num_parallel_calls=parallel_calls).prefetch(4)


class Sleep(keras.layers.Layer):
    """Identity layer whose forward pass takes at least `delay_s` (a known compute cost)."""

    def __init__(self, delay_s: float, **kwargs):
        super().__init__(**kwargs)
        self.delay_s = delay_s

    def call(self, inputs):
        def sleep(_):
            time.sleep(self.delay_s)
            return np.float32(0.0)

        # Fed the batch, as real compute is: work that needs no data may start
        # while the batch is still being fetched (Keras' own loop lets it), and
        # would then hide in the input wait instead of being compute.
        zero = tf.numpy_function(sleep, [inputs], tf.float32, stateful=True)
        zero.set_shape(())
        return inputs + tf.stop_gradient(zero)

    def compute_output_shape(self, input_shape):
        return input_shape


def tiny_model(compute_delay_s: float = 0.0, steps_per_execution: int = 1, **compile_kwargs):
    """A two-layer regression model; `compute_delay_s` adds a known compute time per step."""
    layers = [keras.Input((FEATURES,)), keras.layers.Dense(4)]
    if compute_delay_s:
        layers.append(Sleep(compute_delay_s))
    layers.append(keras.layers.Dense(1))
    model = keras.Sequential(layers)
    model.compile(
        optimizer="sgd", loss="mse", steps_per_execution=steps_per_execution, **compile_kwargs
    )
    return model


def busy_map(batch: int, features: int = FEATURES):
    """A map of TensorFlow ops over (x, y) batches of `batch` that keeps about 10 ms of CPU a batch.

    Its CPU is the input's, timed by tf.data's live model: enough to change
    the class of a step of tens of ms through contention alone.
    """

    def busy(x, y):
        grid = tf.tile(tf.reshape(x, (1, -1)), (256, 256 // (batch * features)))
        for _ in range(8):
            grid = tf.tanh(tf.matmul(grid, grid, transpose_b=True) / 256.0)
        return x + tf.reduce_mean(grid) * 0.0, y

    return busy
