"""The advice followed on real fits: a cache only where data repeats; a top fix that delivers.

The pipeline's map is a Python function that sleeps 4 ms an element, eight to a
batch, so that input is nearly all of the step, whatever the load beside it.
"""

import os
import statistics
import time

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_pipeline_tuner as kpt

ELEMENT_S = 0.004
BATCH = 8


def decode_python(index):
    time.sleep(ELEMENT_S)
    return np.full((4,), float(index), np.float32)


def decode(index):
    x = tf.py_function(decode_python, [index], tf.float32)
    x.set_shape((4,))
    return x, tf.reduce_sum(x, keepdims=True)


def pipeline(elements: int, parallel: bool = False):
    calls = tf.data.AUTOTUNE if parallel else None
    return tf.data.Dataset.range(elements).map(decode, num_parallel_calls=calls).batch(BATCH)


def model():
    built = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8), keras.layers.Dense(1)])
    built.compile("sgd", "mse")
    return built


def advice_text(recommendation) -> str:
    return " ".join(
        [recommendation.expected_gain.statement if recommendation.expected_gain else ""]
        + [evidence.detail for evidence in recommendation.evidence]
    ).lower()


def step_ms(dataset, steps: int) -> float:
    """The median step of a plain fit (no tuner), after its first."""
    times = []

    class Stamps(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            times.append(time.perf_counter())

    model().fit(dataset, steps_per_epoch=steps, epochs=1, verbose=0, callbacks=[Stamps()])
    return statistics.median(np.diff(times)[1:]) * 1e3


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="parallel calls need two cores")
def test_a_fit_that_never_reads_back_gets_no_cache_and_its_top_fix_delivers():
    # fit(steps_per_epoch=30, epochs=2) on 12 500 batches: Keras 3 goes on with
    # one iterator, so 60 batches are read and none twice.
    tuner = kpt.PipelineTuner(verbose=0)
    model().fit(pipeline(100_000), steps_per_epoch=30, epochs=2, verbose=0, callbacks=[tuner])
    report = tuner.report
    assert report.verdict == kpt.Verdict.HIGHLY_INPUT_BOUND, report.judgement
    assert report.reuse.batches_read == 60 and report.reuse.repeats is False
    top = report.recommendations[0]
    assert "num_parallel_calls=tf.data.AUTOTUNE" in top.fix and ".cache(" not in top.fix
    # A cache is never a speed fix here, and the report says why.
    caches = [r for r in report.recommendations if r.id == "cache-missing"]
    assert all(not r.expected_gain.speeds_up for r in caches)
    said = " ".join(advice_text(r) for r in report.recommendations)
    assert "this fit read 60 of the dataset's 12500 batches: a cache is never read back" in said
    # Follow the top fix: plain fits, alternated, the step's median.
    rounds = {False: [], True: []}
    for _ in range(3):
        for parallel in (False, True):
            rounds[parallel].append(step_ms(pipeline(100_000, parallel), steps=20))
    measured = statistics.median(rounds[False]) / statistics.median(rounds[True])
    # Two sleeping calls at a time: about 2x; the bound (AUTOTUNE's one call
    # per core) is not beaten beyond noise.
    assert measured >= 1.3, rounds
    assert measured <= top.expected_gain.speedup * 1.25, (measured, top.expected_gain)


def test_a_cache_read_back_counts_its_filling_pass():
    # Ten batches, three epochs: every element is read three times.
    tuner = kpt.PipelineTuner(verbose=0, profile="off")
    model().fit(pipeline(10 * BATCH), epochs=3, verbose=0, callbacks=[tuner])
    report = tuner.report
    assert report.reuse.batches_per_pass == 10 and report.reuse.repeats is True
    assert report.reuse.passes == pytest.approx(3.0, abs=0.15)
    said = " ".join(advice_text(r) for r in report.recommendations)
    assert "a cache is filled in the first pass and read back after it" in said
    assert "over the fit's 3.0 passes, the first at today's speed to fill it" in said
