"""`kpt.inspect` on pipelines over large in-memory arrays: read without copying them."""

import resource

import numpy as np
import pytest
import tensorflow as tf

import keras_pipeline_tuner as kpt
from keras_pipeline_tuner.pipeline.graph.in_memory import in_memory_bytes

ROWS, FEATURES = 52_000, 1_000  # 208 MB of float32


def scale(x, y):
    return x * 2.0, y


def pipelines(x, y):
    return {
        "shuffle, map, cache, batch": lambda a, b: tf.data.Dataset.from_tensor_slices((a, b))
        .shuffle(1000)
        .map(scale)
        .cache()
        .batch(32),
        "parallel map, fixed prefetch": lambda a, b: tf.data.Dataset.from_tensor_slices((a, b))
        .map(scale, num_parallel_calls=tf.data.AUTOTUNE)
        .repeat(2)
        .batch(32, drop_remainder=True)
        .prefetch(2),
        "zipped sources": lambda a, b: tf.data.Dataset.zip(
            (tf.data.Dataset.from_tensor_slices(a), tf.data.Dataset.from_tensor_slices(b))
        )
        .map(scale)
        .batch(64),
    }


@pytest.fixture(scope="module")
def arrays():
    x = np.ones((ROWS, FEATURES), np.float32)
    return x, np.zeros(ROWS, np.int64)


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


@pytest.mark.parametrize(
    "name", ["shuffle, map, cache, batch", "parallel map, fixed prefetch", "zipped sources"]
)
def test_large_arrays_are_inspected_like_small_ones_without_a_copy(arrays, name):
    x, y = arrays
    build = pipelines(x, y)[name]
    large = build(x, y)
    assert in_memory_bytes(large) > 200e6
    expected = kpt.inspect(build(x[:100], y[:100]))
    before = peak_rss_mb()
    found = kpt.inspect(large)
    # A copy of the data (the graph, its bytes, the parsed proto) would add
    # hundreds of MB to the process's peak memory.
    assert peak_rss_mb() - before < 100
    assert str(found.pipeline) == str(expected.pipeline)
    assert [(f.id, f.stage, f.severity) for f in found] == [
        (f.id, f.stage, f.severity) for f in expected
    ]


def test_a_source_of_long_strings_counts_their_bytes():
    # Encoded images, say: 256 strings of 40 kB are 10 MB, not 256 x 64 bytes.
    images = tf.data.Dataset.from_tensor_slices([b"x" * 40_000] * 256)
    assert 10.2e6 <= in_memory_bytes(images.map(tf.strings.length).batch(8)) < 10.3e6


def test_a_pipeline_it_cannot_rebuild_is_still_refused_with_the_way_out(arrays):
    x, y = arrays
    padded = tf.data.Dataset.from_tensor_slices(x).padded_batch(4)
    with pytest.raises(ValueError, match="x\\[:1000\\]"):
        kpt.inspect(padded)
