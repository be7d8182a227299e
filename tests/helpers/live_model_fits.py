"""Fits that read tf.data's live model, on the backend of the running process.

Run by `tests.helpers.backend_fit` (its `live_model` scenario): a tf.data
pipeline whose map runs TensorFlow ops (matrix products, the pipeline's only
real work), fit with and without the tuner on the same data.
"""

import contextlib
import json
import os
import tempfile
import weakref

import numpy as np

ELEMENTS = 256
BATCH = 16


def _dataset():
    import tensorflow as tf

    def decode(i):
        # About 25 MFLOP an element: beside three busy loops, where scheduling
        # stretches every stage's clock, the map still holds most of the
        # pipeline's time (64 x 64 products held only 23 % there once).
        t = tf.random.stateless_uniform([128, 128], seed=tf.stack([i, i]))
        for _ in range(6):
            t = tf.matmul(t, t) / 128.0
        x = tf.fill([8], tf.reduce_mean(t)) + tf.cast(i % 7, tf.float32) / 7.0
        return x, tf.cast(i % 2, tf.float32)[None]

    return (
        tf.data.Dataset.range(ELEMENTS)
        .map(decode, num_parallel_calls=tf.data.AUTOTUNE)
        .batch(BATCH)
        .prefetch(tf.data.AUTOTUNE)
    )


def live_model() -> dict:
    """The stage table report.json holds, and training with and without the tuner."""
    import keras_pipeline_tuner as kpt
    from tests.helpers.backend_fit import tiny_model

    results, alive = [], []
    with tempfile.TemporaryDirectory() as log_dir:
        for tuned in (False, True):
            # No profiler window: the stage table is the live model's alone.
            tuner = kpt.PipelineTuner(log_dir=log_dir, verbose=0, profile="off") if tuned else None
            model = tiny_model()
            with _iterators_alive() as count:
                history = model.fit(
                    _dataset(), epochs=3, callbacks=([tuner] if tuner else []) + [count],
                    verbose=0,
                )
            results.append((model.get_weights(), history.history))
            alive.append(count.at_epoch_ends)
        with open(os.path.join(log_dir, "report.json"), encoding="utf-8") as file:
            report = json.load(file)
        scalars = sorted(
            name for name in _scalar_tags(log_dir) if name.startswith("input_pipeline/stages/")
        )
    # One pass of a length Keras does not know, shorter than the steady read's
    # step: read only as the pass ends (on JAX and torch, as its iterator says so).
    short = kpt.PipelineTuner(verbose=0, profile="off")
    tiny_model().fit(
        _dataset().filter(lambda x, y: True), epochs=1, callbacks=[short], verbose=0
    )
    unknown_length = short.report.stage_table
    (plain_weights, plain_history), (weights, history) = results
    return {
        "stage_table": report.get("stage_table"),
        "profiled": report.get("profile") is not None,
        "weights": all(np.array_equal(a, b) for a, b in zip(plain_weights, weights)),
        "history": plain_history == history,
        # tf.data iterators still alive at each epoch's end: the tuner keeps
        # none alive that Keras let go (a last pass's teardown can take seconds).
        "alive_plain": alive[0],
        "alive_tuned": alive[1],
        "unknown_length_stages": [row.stage for row in unknown_length.rows]
        if unknown_length is not None
        else None,
        "stage_scalars": scalars,
        "notes": report.get("notes"),
    }


@contextlib.contextmanager
def _iterators_alive():
    """A callback counting the tf.data iterators made in the fit that are still alive."""
    import keras
    import tensorflow as tf

    made = []
    make = tf.data.Dataset.__iter__

    def iter_and_note(dataset):
        iterator = make(dataset)
        made.append(weakref.ref(iterator))
        return iterator

    class Alive(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.at_epoch_ends = []

        def on_epoch_end(self, epoch, logs=None):
            self.at_epoch_ends.append(sum(ref() is not None for ref in made))

    tf.data.Dataset.__iter__ = iter_and_note
    try:
        yield Alive()
    finally:
        tf.data.Dataset.__iter__ = make


def _scalar_tags(log_dir: str) -> set:
    from tensorboard.backend.event_processing import event_accumulator

    tags = set()
    for root, _, names in os.walk(log_dir):
        if any(name.startswith("events.out.tfevents") for name in names):
            accumulator = event_accumulator.EventAccumulator(root, size_guidance={"tensors": 0})
            accumulator.Reload()
            tags |= set(accumulator.Tags().get("tensors", [])) | set(
                accumulator.Tags().get("scalars", [])
            )
    return tags
