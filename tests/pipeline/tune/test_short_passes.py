"""`tune` on pipelines whose epoch takes seconds: passes of a few batches, early stops, Python.

The pipelines sleep in known amounts per element (in a Python function, or in
TensorFlow's own sleep op), so that which one is faster is beyond any load.
"""

import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.data.experimental.ops import testing

import keras_pipeline_tuner as kpt
from keras_pipeline_tuner.pipeline.tune import paired_timing
from tests.helpers.slow_pipelines import slow_python_map


def test_a_slow_epoch_is_timed_in_passes_of_a_few_batches_within_the_budget():
    # 30 batches of 80 ms: an epoch of 2.4 s, for a budget of 30 s, too short
    # for whole epochs (some 70 s) and long enough for the reads before any
    # timing (three of a dozen batches at least) in a test worker that runs
    # eight times slower beside busy loops and other tests (24 s seen at 16 s).
    dataset = slow_python_map(0.010, 240)
    began = time.perf_counter()
    _, result = kpt.tune(dataset, budget_s=30, allow_unverified=True, verbose=0)
    elapsed = time.perf_counter() - began
    assert result.epochs == 1 and result.batches_per_epoch is not None
    assert any("each timed pass read" in note for note in result.notes), result.notes
    parallel = next(r for r in result.rewrites if "num_parallel_calls" in r.change)
    assert parallel.status == "kept", (parallel.reason, result.notes)
    # Two sleeping calls at once, at least: clearly faster.
    assert parallel.ratio < 0.75
    # The budget binds: its end, plus the final build, a little after.
    spent = [(r.kind, r.status, r.rounds) for r in result.rewrites]
    assert elapsed < 30 * 1.05 + 1.0, (elapsed, result.epochs_run, spent, result.notes)


def test_an_epoch_longer_than_the_budget_is_read_in_part_and_the_budget_binds():
    # 300 batches of 40 ms: an epoch of 12 s, for a budget of 10 s. Its first
    # read stops at a tenth of the budget, and every later read at the same batch.
    dataset = slow_python_map(0.020, 600, batch_size=2)
    began = time.perf_counter()
    _, result = kpt.tune(dataset, budget_s=10, allow_unverified=True, verbose=0)
    elapsed = time.perf_counter() - began
    assert any(note.startswith("The first ") for note in result.notes), result.notes
    assert result.batches_per_epoch < 300
    parallel = next(r for r in result.rewrites if "num_parallel_calls" in r.change)
    assert parallel.status == "kept", parallel.reason
    assert elapsed < 10 * 1.05 + 1.0, elapsed


def test_a_pipeline_that_slows_down_after_its_passes_were_sized_still_ends_in_budget():
    # 1 ms an element for the first 3 s (the reads that size the passes),
    # then 500 ms: a machine that got far slower. A pass sized on the first
    # reads (some twenty batches) would then take ten seconds, so a pass
    # under way at the budget's end would carry tune to 12 s or more.
    began = time.perf_counter()
    dataset = _slowing_down(began, after_s=3.0)
    try:
        _, result = kpt.tune(dataset, budget_s=6, verbose=0)
    except ValueError as error:
        # On a loaded machine the slow-down may come before the passes are
        # sized, during the first read: tune then says it cannot time anything.
        assert "Pass budget_s=" in str(error), error
        result = None
    elapsed = time.perf_counter() - began
    # Stopped at the budget's end (and 2 % more), after the element then in
    # flight (half a second) and its iterator's end, which waits for the
    # calls under way (as long again), with a margin for a test worker beside
    # busy loops (9.6 s seen); without the stop it took 52.9 s.
    assert elapsed < 12.0, (elapsed, result and result.notes)


def _slowing_down(began, after_s):
    """A pipeline of 1 ms an element until `after_s` past `began`, then 500 ms."""

    def load_python(index):
        time.sleep(0.001 if time.perf_counter() - began < after_s else 0.5)
        return np.full((4,), index, np.float32)

    def load(index):
        x = tf.py_function(load_python, [index], tf.float32)
        x.set_shape((4,))
        return x

    return tf.data.Dataset.range(100_000).map(load).batch(1)


def test_batches_too_slow_for_the_budget_are_refused_after_a_third_of_it():
    # 500 ms a batch from the start: the checks' reads alone (12 batches, three
    # times) would take 18 s of budget_s=6 (23 s seen, 40 s beside a load).
    began = time.perf_counter()
    with pytest.raises(ValueError, match=r"33% of budget_s=6: .* Pass budget_s=\d+ or more"):
        kpt.tune(_slowing_down(began, after_s=0.0), budget_s=6, verbose=0)
    # A third of the budget, the batch in flight, and a margin for a busy machine.
    assert time.perf_counter() - began < 6.0


def test_without_allow_unverified_one_note_says_what_was_not_tried_and_how():
    _, result = kpt.tune(slow_python_map(0.002, 48), budget_s=4, verbose=0)
    notes = [note for note in result.notes if note.startswith("Not tried:")]
    assert len(notes) == 1
    assert "map(load, num_parallel_calls=AUTOTUNE)" in notes[0]
    assert "allow_unverified=True" in notes[0]


def test_a_comparison_clearly_apart_stops_after_its_first_rounds():
    def sleeping(microseconds):
        return lambda: tf.data.Dataset.range(6).apply(testing.sleep(microseconds))

    # 300 ms of sleep a pass against none: apart by far more than a busy
    # machine's iterator start-up and late wake-ups (some 60 ms seen).
    times = paired_timing.side_by_side(
        {"without": sleeping(0), "with": sleeping(50_000)},
        paired_timing.PassPlan(epochs=1),
        rounds=9,
        settled=lambda found: paired_timing.clearly_apart(found["with"], found["without"]),
    )
    # Several times slower in every round: decided after three of the nine.
    assert len(times["with"]) == paired_timing.CLEAR_ROUNDS


def test_a_python_function_that_depends_on_its_calls_is_refused_even_when_allowed():
    calls = []

    def tag_python(index):
        calls.append(index)  # its output depends on how many calls came before
        time.sleep(0.002)
        return np.float32(len(calls))

    def tag(index):
        x = tf.py_function(tag_python, [index], tf.float32)
        x.set_shape(())
        return x

    dataset = tf.data.Dataset.range(48).map(tag).batch(8)
    _, result = kpt.tune(dataset, budget_s=6, allow_unverified=True, verbose=0)
    parallel = next(r for r in result.rewrites if "num_parallel_calls" in r.change)
    assert parallel.status == "not applicable"
    assert "even with allow_unverified=True" in parallel.reason
    assert "depends on the calls before it" in parallel.reason


QUIET = textwrap.dedent(
    """
    import os, sys, time
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "0"
    import tensorflow as tf
    import keras_pipeline_tuner as kpt
    from keras_pipeline_tuner._util.stderr_lines import dropped_lines
    from tests.helpers.slow_pipelines import slow_python_map

    # The user's own partial read of a cache: TensorFlow's warning stays.
    iterator = iter(tf.data.Dataset.range(10).cache())
    next(iterator)
    del iterator
    with dropped_lines(["noise"]):
        os.write(2, b"kept line\\nnoise line\\n")
        print("kept from Python", file=sys.stderr, flush=True)

    # The user's cache, read in part by tune's cut epoch, checks and passes.
    dataset = slow_python_map(0.004, 2000, batch_size=1).unbatch().cache().batch(2)
    _, result = kpt.tune(dataset, budget_s=6, verbose=0)
    assert any(note.startswith("The first ") for note in result.notes), result.notes
    print("tune done", file=sys.stderr, flush=True)
    """
)


@pytest.mark.multiprocess
def test_tensorflows_warnings_about_tunes_partial_reads_stay_out_of_the_log():
    process = subprocess.run(
        [sys.executable, "-c", QUIET], capture_output=True, text=True, timeout=240
    )
    assert process.returncode == 0, process.stderr[-3000:]
    lines = process.stderr.splitlines()
    warned = [line for line in lines if "did not fully read the dataset being cached" in line]
    # The user's own partial read only, not the tuner's dozens.
    assert len(warned) == 1, warned
    assert "kept line" in lines and "kept from Python" in lines and "tune done" in lines
    assert "noise line" not in lines
