"""`kpt.tune` never claims what it did not deliver: the four failures a new user met.

A shuffled slow pipeline within the README's budget shortens its passes instead
of raising; a tuned pipeline not faster than the original in the final,
alternated comparison is not returned; text and CSV pipelines tune; a result
equal only within a tolerance says so. Real pipelines with sleeping delays;
assertions on what load cannot change.
"""

import statistics
import time

import numpy as np
import pytest
import tensorflow as tf

import keras_pipeline_tuner as kpt
from keras_pipeline_tuner.pipeline.tune import session as session_module
from keras_pipeline_tuner.pipeline.tune.results import not_delivered


def _shuffled_slow_python(elements, element_s=0.005, batch_size=32):
    """`range(n).shuffle(n).map(load).batch(32)`; `load` sleeps `element_s` in Python."""

    def slow(x):
        time.sleep(element_s)
        return x * 2

    def load(x):
        y = tf.py_function(slow, [x], tf.int64)
        y.set_shape([])
        return y

    return tf.data.Dataset.range(elements).shuffle(elements).map(load).batch(batch_size)


def _epoch_s(dataset):
    began = time.perf_counter()
    for _ in dataset:
        pass
    return time.perf_counter() - began


@pytest.mark.slow
def test_the_readme_call_on_a_shuffled_slow_pipeline_shortens_its_passes_and_is_true():
    # 32 batches of 32 elements of 5 ms: an epoch of some 5 s, whose first read
    # is cut at a tenth of the budget, a dozen batches, fewer than the shuffle
    # buffer's 32: it raised "too few for a timed pass" before.
    dataset = _shuffled_slow_python(1024)
    tuned_ds, result = kpt.tune(dataset, budget_s=20)  # the README's call, as written
    assert any("each timed pass read" in note for note in result.notes), result.notes
    if not result.code:  # nothing kept: the original itself, and no gain claimed
        assert tuned_ds is dataset and result.speedup == 1.0, result
    # The speed-up printed agrees with the user's own timing of both pipelines,
    # each the fastest of two alternated epochs: load only slows a sleeping
    # pipeline down, and one busy epoch had read the same pipeline 1.8x slower.
    rounds = [(_epoch_s(dataset), _epoch_s(tuned_ds)) for _ in range(2)]
    original_s, tuned_s = (min(column) for column in zip(*rounds))
    assert 0.67 <= result.speedup / (original_s / tuned_s) <= 1.5, (
        result.speedup, original_s, tuned_s, result.notes
    )


def test_a_cut_epoch_whose_shuffle_buffer_is_costly_is_timed_from_its_start():
    # The buffer (after the slow map) holds the whole epoch: no warm-up can
    # fill it within the budget, so passes time their start, fill included.
    def slow(x):
        time.sleep(0.004)
        return x

    def load(x):
        y = tf.py_function(slow, [x], tf.int64)
        y.set_shape([])
        return y

    dataset = tf.data.Dataset.range(512).map(load).shuffle(512).batch(8)
    _, result = kpt.tune(dataset, budget_s=12, verbose=0)
    assert any("timed from its start" in note for note in result.notes), result.notes


def test_a_result_not_faster_than_the_original_keeps_the_original_and_says_so(monkeypatch):
    # Two rewrites each kept against the pipeline before it, and a final
    # comparison that finds the whole 1.5x slower (as a zip pipeline did): the
    # final comparison's tuned passes are made slower by the test, since which
    # way a real one goes is up to the machine.
    timed = session_module.TuningSession.side_by_side

    def final_slower(self, factories, rounds, deadline, settled=None):
        times = timed(self, factories, rounds, deadline, settled)
        if "tuned" in times:
            times["tuned"] = [1.5 * seconds for seconds in times["original"]]
        return times

    monkeypatch.setattr(session_module.TuningSession, "side_by_side", final_slower)
    dataset = tf.data.Dataset.range(64).map(
        lambda x: tf.py_function(lambda v: (time.sleep(0.004), v)[1], [x], tf.int64)
    ).batch(4)
    tuned_ds, result = kpt.tune(
        dataset, budget_s=20, allow_unverified=True, min_gain=0.0, verbose=0
    )
    tried = [(o.change, o.status, o.ratio) for o in result.rewrites]
    # Kept on their own: still "kept" (before the fix), or dropped by the final comparison.
    kept_alone = [
        o for o in result.rewrites if o.status == "kept" or "final comparison" in o.reason
    ]
    if len(kept_alone) < 2:
        pytest.skip(f"fewer than two rewrites were kept on their own here: {tried}")
    # A machine busy enough to spend the budget before the final comparison
    # leaves nothing for this test to see (the kept rewrites' own ratios then
    # give the speed-up, and a note says so).
    missed = [n for n in result.notes if n.startswith("The final comparison with the original")]
    if missed:
        pytest.skip(missed[0])
    assert tuned_ds is dataset and result.ratio == 1.0 and not result.applied, tried
    assert result.code == ""
    (note,) = [n for n in result.notes if n.startswith("The original pipeline is returned")]
    assert "1.50x the original's time" in note, note


def test_the_final_rule_needs_a_median_gain_and_most_rounds_faster():
    assert not_delivered([1.0] * 5, [0.7, 0.72, 0.69, 0.71, 0.7], 0.03) is None
    assert "1.50x" in not_delivered([1.0, 1.0, 1.0], [1.5, 1.52, 1.49], 0.03)
    assert "not at least 3% faster" in not_delivered([1.0] * 3, [0.99, 0.98, 0.99], 0.03)
    assert "only 3 of 5" in not_delivered([1.0] * 5, [0.8, 0.8, 0.8, 1.1, 1.2], 0.03)


@pytest.fixture
def text_files(tmp_path):
    files = []
    for index in range(4):
        path = tmp_path / f"part-{index}.csv"
        path.write_text("".join(f"{index},{row},line {index} {row}\n" for row in range(150)))
        files.append(str(path))
    return files


def test_an_interleave_of_text_lines_then_a_map_tunes_with_equal_elements(text_files):
    # Its elements are scalar strings (`bytes` from numpy()): the cache's sizing
    # crashed on them ('bytes' object has no attribute 'dtype').
    dataset = (
        tf.data.Dataset.from_tensor_slices(text_files)
        .interleave(tf.data.TextLineDataset, cycle_length=2)
        .map(tf.strings.upper)
    )
    tuned_ds, result = kpt.tune(dataset, budget_s=8, verbose=0)
    assert result.elements_check in ("equal", "same elements, any order"), result.elements_check
    cache = [o for o in result.rewrites if o.kind == "cache"]
    assert cache and all(o.status != "failed" for o in cache), cache
    assert sorted(e.numpy() for e in tuned_ds) == sorted(e.numpy() for e in dataset)


def test_a_csv_dataset_of_strings_tunes(text_files):
    dataset = tf.data.experimental.CsvDataset(text_files, [tf.int32, tf.int32, tf.string]).map(
        lambda a, b, line: (a + b, tf.strings.upper(line))
    )
    tuned_ds, result = kpt.tune(dataset, budget_s=6, verbose=0)
    assert not any(o.status == "failed" for o in result.rewrites), result.rewrites
    assert [(a.numpy(), b.numpy()) for a, b in tuned_ds] == [
        (a.numpy(), b.numpy()) for a, b in dataset
    ]


@tf.autograph.experimental.do_not_convert
def _rsqrt(x):
    # On a batch, rsqrt takes Eigen's vectorised path: some values differ in
    # their last bit (6e-8) from the element-wise ones.
    return tf.math.rsqrt(tf.cast(x, tf.float32) + 1.5)


def test_a_result_equal_only_within_a_tolerance_says_so():
    dataset = tf.data.Dataset.range(4096).map(_rsqrt).batch(64)
    tuned_ds, result = kpt.tune(dataset, budget_s=15, verbose=0)
    vectorize = next(o for o in result.rewrites if o.kind == "vectorize")
    if not vectorize.applied:
        pytest.skip(f"the vectorised map was not kept here: {vectorize.reason}")
    original = np.concatenate([b.numpy() for b in dataset])
    tuned = np.concatenate([b.numpy() for b in tuned_ds])
    if np.array_equal(original, tuned):
        assert result.elements_check == "equal"
    else:
        assert vectorize.elements_check == "equal within rtol=1e-06"
        assert result.elements_check == "equal within rtol=1e-06", result.elements_check
        assert statistics.median(np.abs(original - tuned) / original) < 1e-6
