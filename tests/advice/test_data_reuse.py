"""Whether a fit reads an element twice: the dataset's cardinality, read with its graph."""

import pytest
import tensorflow as tf

from keras_pipeline_tuner.advice.data_reuse import reuse_of
from keras_pipeline_tuner.pipeline.graph import kinds
from keras_pipeline_tuner.pipeline.graph.reader import read_pipeline


def reuse(dataset, batches_read):
    pipeline = read_pipeline(dataset)
    repeated = any(stage.kind == kinds.REPEAT for stage in pipeline.stages)
    return reuse_of(pipeline.cardinality, batches_read, repeated)


def test_a_finite_dataset_read_in_part_never_repeats():
    # steps_per_epoch=30, epochs=2 on 12 500 batches: one iterator, 60 batches.
    found = reuse(tf.data.Dataset.range(100_000).batch(8), 60)
    assert found.batches_per_pass == 12_500 and found.repeats is False
    assert "a cache is never read back" in found.line


def test_a_finite_dataset_read_whole_each_epoch_repeats_from_the_second():
    dataset = tf.data.Dataset.range(80).batch(8)
    assert reuse(dataset, 10).repeats is False  # one epoch: the cache is only filled
    three = reuse(dataset, 30)
    assert three.repeats is True and three.passes == pytest.approx(3.0)
    # The first pass fills the cache at today's speed: 1 / (1/3 + (2/3) / 4).
    assert three.fit_speedup(4.0) == pytest.approx(2.0)


def test_an_endless_or_unknown_dataset_leaves_it_open():
    endless = reuse(tf.data.Dataset.range(80).batch(8).repeat(), 60)
    assert endless.batches_per_pass == -1 and endless.repeats is None
    assert "without end" in endless.line
    unknown = reuse(tf.data.Dataset.range(80).filter(lambda x: x % 2 == 0).batch(8), 60)
    assert unknown.batches_per_pass == -2 and unknown.repeats is None
    assert unknown.fit_speedup(4.0) == 4.0


def test_a_dataset_repeated_a_known_number_of_times_is_left_open():
    # repeat(3) of 10 batches: a cardinality of 30, which counts each element
    # three times; a fit of 30 batches reads each thrice, not once.
    found = reuse(tf.data.Dataset.range(80).batch(8).repeat(3), 30)
    assert found.repeats is None and "repeat(n)" in found.line
