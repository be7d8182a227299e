"""Two real fits whose advice is known, run once per test session and shared.

- Input-bound: a sequential map whose `tf.py_function` sleeps `MAP_DELAY_S` per
  element feeds a model that computes in well under a millisecond; the profiler
  window names that map as the bottleneck, the lint flags it as sequential.
- Compute-bound: cached, prefetched data with a random augmentation cached after
  it (a wrong-data error) feeds a model whose step sleeps `COMPUTE_DELAY_S`.

Both run with `log_dir` set and keras.callbacks.TensorBoard writing to the same
directory, as users run them.
"""

import dataclasses
import pathlib
import time

import keras
import tensorflow as tf

import keras_pipeline_tuner as kpt
from tests.helpers.training_data import FEATURES
from tests.helpers.training_data import cached_source
from tests.helpers.training_data import tiny_model

# The input-bound fit's map sleeps this long an element (a batch): a step of the
# tiny model, even stretched by a busy machine, is far shorter.
MAP_DELAY_S = 0.03
# The compute-bound fit's step sleeps this long: a fetch of cached batches that
# a busy machine stretches to a few milliseconds stays far under 5 % of it.
COMPUTE_DELAY_S = 0.1
INPUT_BOUND_STEPS = 40
COMPUTE_BOUND_STEPS = 16

_runs = {}


@dataclasses.dataclass
class Run:
    """A finished fit: its tuner, its report and where it wrote."""

    log_dir: pathlib.Path
    tuner: object
    report: object


def load_slowly(x, y):
    """A Python map function with a known cost per element."""

    def sleep_then_pass(value):
        time.sleep(MAP_DELAY_S)
        return value

    x = tf.py_function(sleep_then_pass, [x], tf.float32)
    x.set_shape((FEATURES,))
    return x, y


def jitter(x, y):
    """A random augmentation: cached after it, every epoch sees the same noise."""
    return x + tf.random.uniform((FEATURES,), maxval=0.1), y


def input_bound_run(tmp_path_factory) -> Run:
    """The input-bound fit (sequential py_function map), run once."""
    if "input" not in _runs:
        log_dir = tmp_path_factory.mktemp("input_bound")
        dataset = cached_source(INPUT_BOUND_STEPS).map(load_slowly).batch(1)
        _runs["input"] = _fit(log_dir, dataset, tiny_model(), epochs=1)
    return _runs["input"]


def compute_bound_run(tmp_path_factory) -> Run:
    """The compute-bound fit (cache after a random map), run once."""
    if "compute" not in _runs:
        log_dir = tmp_path_factory.mktemp("compute_bound")
        dataset = (
            cached_source(COMPUTE_BOUND_STEPS * 2)
            .map(jitter)
            .cache()
            .batch(2)
            .prefetch(tf.data.AUTOTUNE)
        )
        _runs["compute"] = _fit(log_dir, dataset, tiny_model(COMPUTE_DELAY_S), epochs=2)
    return _runs["compute"]


def _fit(log_dir, dataset, model, epochs) -> Run:
    tuner = kpt.PipelineTuner(log_dir=log_dir, verbose=0)
    model.fit(
        dataset,
        epochs=epochs,
        callbacks=[keras.callbacks.TensorBoard(log_dir=str(log_dir)), tuner],
        verbose=0,
    )
    # The profiler window's evidence and the files written with it.
    return Run(log_dir, tuner, tuner.wait_for_profile())
