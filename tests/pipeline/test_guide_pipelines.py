"""The guide's pipelines yield what the guide says, with the costs it describes."""

import time

import numpy as np
import pytest
import tensorflow as tf

from tests.helpers import guide_pipelines as guide


def test_artificial_source_sleeps_as_described():
    start = time.perf_counter()
    values = [int(x[0]) for x in guide.artificial_source(3)]
    elapsed = time.perf_counter() - start
    assert values == [0, 1, 2]
    # Sleeps are lower bounds: opening once plus one read per element.
    assert elapsed >= guide.OPEN_S + 3 * guide.READ_S
    with pytest.raises(ValueError, match="num_samples"):
        guide.artificial_source(-1)


def test_cases_yield_the_same_elements_as_the_naive_source():
    naive = [int(x[0]) for x in guide.naive()]
    builders = (guide.prefetched, guide.parallel_map, guide.cache_after_map, guide.cache_before_map)
    for build in builders:
        assert [int(x[0]) for x in build()] == naive
    assert sorted(int(x[0]) for x in guide.sequential_interleave()) == sorted(naive * 2)
    scalar = np.concatenate([b.numpy() for b in guide.scalar_map(1000, 64)])
    vectorised = np.concatenate([b.numpy() for b in guide.vectorized_map(1000, 64)])
    np.testing.assert_array_equal(scalar, vectorised)
    np.testing.assert_array_equal(scalar, np.arange(1, 1001))
    assert set(guide.CASES) >= {"naive", "prefetch", "sequential map", "vectorised map"}
    assert guide.CASES["vectorised map"].run() > 0


def test_tfrecords(tmp_path):
    files = guide.write_tfrecords(tmp_path, count=3, records=4)
    records = {record.numpy() for record in tf.data.TFRecordDataset(files)}
    assert records == {f"{f}:{r}".encode() for f in range(3) for r in range(4)}


def _epoch(ds):
    return np.concatenate([images.numpy() for images, _ in ds])


def _sorted_by_content(images):
    return images[np.lexsort(images.reshape(len(images), -1).T)]


@pytest.mark.parametrize("augment", ["tf", "keras"])
def test_cache_after_the_flip_freezes_it(tmp_path, augment):
    guide.write_images(tmp_path, count=24, size=8)
    frozen = guide.image_pipeline(tmp_path, size=8, augment=augment, cache_after_augment=True)
    np.testing.assert_array_equal(_epoch(frozen), _epoch(frozen))
    fresh = guide.image_pipeline(tmp_path, size=8, augment=augment)
    first, second = _epoch(fresh), _epoch(fresh)
    assert first.shape == (24, 8, 8, 3)
    # Reshuffled and re-flipped: the epochs differ even once put in the same order.
    assert not np.array_equal(_sorted_by_content(first), _sorted_by_content(second))


def test_image_pipeline_bad_input(tmp_path):
    with pytest.raises(ValueError, match="write_images"):
        guide.image_pipeline(tmp_path)
    with pytest.raises(ValueError, match="augment"):
        guide.image_pipeline(tmp_path, augment="torch")
    paths = guide.write_images(tmp_path, count=2, size=4)
    images, labels = next(iter(guide.image_pipeline(tmp_path, size=4, batch_size=2)))
    assert sorted(labels.numpy().tolist()) == [0, 1]
    assert images.dtype == tf.float32 and len(paths) == 2
