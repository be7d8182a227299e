"""`kpt.benchmark` on real datasets with known costs."""

import numpy as np
import pytest
import tensorflow as tf

import keras_pipeline_tuner as kpt
from keras_pipeline_tuner.pipeline.benchmark import UNKNOWN_LENGTH_BATCHES
from tests.helpers.training_data import slow_source

ELEMENT_S = 0.02


def test_reports_the_rate_of_a_known_rate_source():
    # 2 elements per batch, each made in ELEMENT_S: 25 batches/s, 50 examples/s.
    # A sleep is never shorter than asked, and a busy machine makes it later:
    # the figures are at the source's pace, never faster, and not far slower.
    batch_s = 2 * ELEMENT_S
    result = kpt.benchmark(slow_source(34, ELEMENT_S).batch(2), verbose=0)
    assert result.batches == 16 and result.examples == 32 and result.complete
    assert batch_s * 1e3 * 0.95 <= result.batch_ms.median_ms <= batch_s * 1e3 * 1.5
    assert 1 / (1.5 * batch_s) <= result.batches_per_s <= 1.05 / batch_s
    assert result.examples_per_s == pytest.approx(2 * result.batches_per_s)
    # The first batch also opens the iterator; it is reported apart.
    assert result.first_batch_ms >= batch_s * 1e3 * 0.9
    assert result.warmup_batches == 1
    assert result.p99_batch_ms >= result.batch_ms.median_ms


def test_counts_examples_per_batch_and_per_element():
    batched = kpt.benchmark(tf.data.Dataset.range(100).batch(10), verbose=0)
    assert (batched.batches, batched.examples) == (9, 90)
    partial = kpt.benchmark(tf.data.Dataset.range(25).batch(10), verbose=0)
    assert (partial.batches, partial.examples) == (2, 15)
    unbatched = kpt.benchmark(tf.data.Dataset.range(100).batch(10).unbatch(), verbose=0)
    assert unbatched.examples == unbatched.batches == 99
    images = tf.data.Dataset.from_tensor_slices(np.zeros((6, 4, 4, 3), np.float32))
    # Unbatched images: one example each, whatever their first dimension.
    assert kpt.benchmark(images, verbose=0).examples == 5
    given = kpt.benchmark(images, batch_size=8, verbose=0)
    assert given.examples == 40


def test_num_batches_and_warmup():
    result = kpt.benchmark(tf.data.Dataset.range(10).repeat(), num_batches=50, warmup=5, verbose=0)
    assert result.batches == 50 and not result.complete
    assert result.warmup_batches == 5
    short = kpt.benchmark(tf.data.Dataset.range(10), num_batches=50, verbose=0)
    assert short.batches == 9 and short.complete


def test_progress_bar_goes_to_stdout(capsys):
    kpt.benchmark(tf.data.Dataset.range(20).batch(5), verbose=1)
    assert "4/4" in capsys.readouterr().out


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"num_batches": 0}, "num_batches"),
        ({"warmup": 0}, "warmup"),
        ({"batch_size": -2}, "batch_size"),
        ({"verbose": 3}, "verbose"),
    ],
)
def test_bad_arguments_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        kpt.benchmark(tf.data.Dataset.range(4), **kwargs)


def test_infinite_dataset_needs_num_batches():
    with pytest.raises(ValueError, match="num_batches"):
        kpt.benchmark(tf.data.Dataset.range(4).repeat(), verbose=0)


def test_too_short_for_the_warmup():
    with pytest.raises(ValueError, match="warmup"):
        kpt.benchmark(tf.data.Dataset.range(2), warmup=2, verbose=0)


def test_not_a_dataset():
    with pytest.raises(TypeError, match="from_tensor_slices"):
        kpt.benchmark([1, 2, 3])


def test_endless_dataset_of_unknown_length_stops_at_a_default_and_says_so():
    endless = tf.data.Dataset.range(10).repeat().filter(lambda x: x >= 0).batch(2)
    assert endless.cardinality() == tf.data.UNKNOWN_CARDINALITY
    result = kpt.benchmark(endless, verbose=0)
    assert result.batches == UNKNOWN_LENGTH_BATCHES and not result.complete
    assert any("length is unknown" in note and "num_batches" in note for note in result.notes)
    # A finite dataset of unknown length still runs to its end, with no note.
    finite = tf.data.Dataset.range(40).filter(lambda x: x >= 0).batch(2)
    result = kpt.benchmark(finite, verbose=0)
    assert result.batches == 19 and result.complete and result.notes == []
