"""The fetch floor is measured through the kind of fetch training ran, never assumed."""

import time

import numpy as np
import tensorflow as tf

import keras_pipeline_tuner as kpt
from keras_pipeline_tuner.timing import fetch_floor
from tests.helpers.training_data import cached_source
from tests.helpers.training_data import slow_source
from tests.helpers.training_data import tiny_model


def test_a_custom_loops_floor_is_its_own_kind_of_fetch():
    x = np.zeros((32 * 30, 4), np.float32)
    data = tf.data.Dataset.from_tensor_slices((x, x[:, :1])).batch(32).cache().prefetch(2)
    tuner = kpt.PipelineTuner(verbose=0, profile="off")

    @tuner.instrument
    @tf.function
    def step(x, y):
        return tf.reduce_sum(x) + tf.reduce_sum(y)

    for _ in range(3):
        for x_batch, y_batch in tuner.iterate(data):
            step(x_batch, y_batch)
    tuner.close()
    judgement = tuner.report.judgement
    assert judgement.fetch_floor_how.endswith(f"through {fetch_floor.PYTHON_ITERATOR})")
    assert judgement.fetch_floor_ms > 0
    assert "fetch floor" in tuner.report.tuner_cost.parts


def _fit_report(dataset, model):
    tuner = kpt.PipelineTuner(verbose=0, profile="off", check_contention=False)
    model.fit(dataset, epochs=3, callbacks=[tuner], verbose=0)
    return tuner.report


def test_a_fit_whose_whole_wait_is_under_the_boundary_measures_no_floor():
    # In-memory batches into 60 ms steps: the wait, the fetch of a ready batch
    # in it, stays far under the 5 % boundary whatever the load, and the floor
    # could only lower it. Its 0.3 s after training is saved.
    report = _fit_report(cached_source(40).batch(4), tiny_model(0.06))
    assert report.judgement.verdict.value == "not input-bound", report.judgement.line
    assert report.judgement.fetch_floor_ms is None
    assert "fetch floor" not in report.tuner_cost.parts


def test_a_fit_whose_wait_could_be_the_fetch_measures_its_floor():
    # 32 ms a batch late into 10 ms steps: the wait decides the class, and
    # only the wait beyond the fetch of a ready batch is the pipeline's.
    report = _fit_report(slow_source(40, 0.008).batch(4), tiny_model(0.01))
    assert report.judgement.verdict.input_bound, report.judgement.line
    assert report.judgement.fetch_floor_how.endswith(f"through {fetch_floor.GRAPH_FETCH})")
    assert "fetch floor" in report.tuner_cost.parts


def test_a_sub_millisecond_steps_floor_is_measured_before_the_contention_check():
    # The fetch of a ready batch is much of a sub-millisecond step's wait: the
    # floor could change the class, and is measured first. Where the wait
    # beyond it and the input's CPU then read one class, the check (0.3-0.8 s
    # a fit here) is skipped.
    tuner = kpt.PipelineTuner(verbose=0, profile="off")
    tiny_model().fit(cached_source(200).batch(4), epochs=3, callbacks=[tuner], verbose=0)
    parts = list(tuner.report.tuner_cost.parts)
    assert "fetch floor" in parts, tuner.report.notes
    if "contention check" in parts:
        assert parts.index("fetch floor") < parts.index("contention check"), parts


def test_the_floor_is_timed_on_zeros_of_the_fits_structure_a_steps_compute_apart():
    spec = (tf.TensorSpec((None, 3), tf.float32), tf.TensorSpec((None,), tf.int64))
    floor = fetch_floor.measure_fetch_floor("tensorflow", "tf.data", spec, compute_ms=2.0)
    assert floor.how == fetch_floor.GRAPH_FETCH
    assert fetch_floor.LEAST_FETCHES <= floor.fetches <= fetch_floor.FETCHES
    # Nothing is measured for inputs whose fetch runs the user's Python.
    assert fetch_floor.measure_fetch_floor("tensorflow", "PyDataset", spec) is None
    assert fetch_floor.measure_fetch_floor("jax", "generator", None) is None


def test_no_floor_is_measured_for_elements_of_unknown_rank():
    # A py_function map that does not set its output's shape.
    spec = (tf.TensorSpec(None, tf.float32), tf.TensorSpec((None,), tf.int64))
    assert fetch_floor.measure_fetch_floor("tensorflow", "tf.data", spec) is None


def test_the_floor_stops_timing_at_its_deadline_on_a_slow_fetch():
    def slow_batches():
        while True:
            # 50 ms a fetch: ten of them pass the deadline, whatever the load.
            time.sleep(0.05)
            yield 0

    began = time.monotonic()
    mean_ms, timed = fetch_floor.time_fetches(slow_batches(), warm_up=1)
    took_s = time.monotonic() - began
    assert timed == fetch_floor.LEAST_FETCHES < fetch_floor.FETCHES
    assert mean_ms >= 50
    # Ten timed fetches and the warm-up: not the forty the loop would time.
    assert took_s < 0.05 * (fetch_floor.FETCHES + 1)
