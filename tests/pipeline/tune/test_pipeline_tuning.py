"""`kpt.tune` on real pipelines with injected delays: which rewrites it makes, and
that the model sees the same elements. Speed itself is measured in bench/."""

import time

import numpy as np
import pytest
import tensorflow as tf

import keras_pipeline_tuner as kpt
from keras_pipeline_tuner.pipeline.graph.reader import read_pipeline
from tests.helpers.training_data import slow_source
from tests.helpers.training_data import tiny_model

ELEMENT_S = 0.004


def slow_py_function(x):
    """A per-element `tf.py_function` that sleeps: sequential unless parallelised."""

    def work(value):
        time.sleep(ELEMENT_S)
        return value * 3

    result = tf.py_function(work, [x], tf.int64)
    result.set_shape(())
    return result


def sleepy_py_function(x):
    """As `slow_py_function`, 15 ms an element: its parallel gain stands out of the
    noise of a busy machine's passes (iterator set-up, scheduling)."""

    def work(value):
        time.sleep(0.015)
        return value * 3

    result = tf.py_function(work, [x], tf.int64)
    result.set_shape(())
    return result


def elements(dataset):
    return [tf.nest.map_structure(lambda t: t.numpy().tolist(), e) for e in dataset]


def stages(dataset):
    return read_pipeline(dataset).stages


def test_sequential_py_function_map_is_parallelised_with_equal_elements():
    dataset = tf.data.Dataset.range(24).map(sleepy_py_function).batch(4)
    # A Python function's calls on several threads cannot be proven to give
    # the same elements: the caller vouches for it.
    tuned, result = kpt.tune(
        dataset, budget_s=8, epochs=1, allow_unverified=True, max_python_epochs=500, verbose=0
    )

    assert elements(tuned) == elements(dataset)
    assert result.elements_check == "equal"
    outcome = next(o for o in result.rewrites if o.kind == "parallel-map")
    assert outcome.status == "kept" and outcome.applied
    # Measured (how many rounds fit the budget depends on the machine's load).
    assert outcome.ratio < 1 and outcome.rounds >= 1
    assert not outcome.verified and outcome.elements_check == "equal"
    assert "ParallelMapDatasetV2" in [stage.op for stage in stages(tuned)]
    assert result.ratio < 1 and result.speedup > 1
    assert result.tuned_pipeline.startswith("range(0, 24, 1) -> map(sleepy_py_function, ")
    # Every considered rewrite says what became of it.
    assert all(o.status and o.reason for o in result.rewrites)


def test_deterministic_pipeline_keeps_its_elements_and_order_through_every_rewrite():
    source = slow_source(16, 0.002).map(lambda x, y: (x * 2.0, y))
    dataset = tf.data.Dataset.range(2).interleave(
        lambda i: source.map(lambda x, y: (x + tf.cast(i, tf.float32), y)),
        cycle_length=2,
        block_length=3,
    ).batch(3)
    tuned, result = kpt.tune(dataset, consumer_step_s=0.002, budget_s=8, verbose=0)
    assert result.elements_check == "equal"
    # Twice: a cache, when kept, serves the second pass.
    assert elements(tuned) == elements(dataset)
    assert elements(tuned) == elements(dataset)
    assert not result.changes_order and not result.changes_determinism


# About 20 s of timed passes: CI's slow pass.
@pytest.mark.slow
def test_passes_of_a_few_batches_time_a_cache_in_steady_state():
    # 12 batches an epoch, passes of 2 x 3 batches: without filling it first,
    # the cache would never be read in a pass (its epoch never ends there).
    dataset = (
        tf.data.Dataset.range(48)
        .map(slow_py_function)
        .shuffle(8, seed=0)
        .map(lambda x: x + tf.random.uniform((), maxval=2, dtype=tf.int64))
        .batch(4)
    )
    tuned, result = kpt.tune(
        dataset, budget_s=20, num_batches=3, max_python_epochs=500, verbose=0
    )
    cache = next(o for o in result.rewrites if o.kind == "cache")
    assert cache.status == "kept", cache.reason
    filled = "filled first, untimed, with the elements the passes read"
    assert any(filled in note for note in result.notes)
    kinds = [stage.kind for stage in stages(tuned)]
    assert kinds.index("cache") < kinds.index("shuffle")


def test_random_augmentation_never_gets_a_cache_after_it():
    dataset = slow_source(12, 0.003).map(
        lambda x, y: (x + tf.random.uniform(tf.shape(x)), y)
    ).batch(3)
    tuned, result = kpt.tune(dataset, budget_s=6, verbose=0)

    assert result.elements_check == "structure"
    tuned_stages = stages(tuned)
    random_at = next(
        i for i, s in enumerate(tuned_stages) if s.function is not None and s.function.random
    )
    assert all(s.kind != "cache" for s in tuned_stages[random_at:])
    # Augmentations still differ from one epoch to the next.
    first, second = elements(tuned), elements(tuned)
    assert first != second
    assert [np.shape(x) for x, _ in first] == [np.shape(x) for x, _ in elements(dataset)]
    skipped = next(o for o in result.rewrites if o.kind == "parallel-map")
    assert not skipped.applied and "random" in skipped.reason


def test_random_pipeline_that_caches_its_randomness_is_seen_as_random():
    # Its own cache makes two passes of the same object equal; a rebuild draws anew.
    dataset = tf.data.Dataset.range(6).map(
        lambda x: x + tf.random.uniform((), maxval=1000, dtype=tf.int64)
    ).cache()
    tuned, result = kpt.tune(dataset, budget_s=4, verbose=0)
    assert result.elements_check == "structure"
    assert not any("could not be rebuilt" in note for note in result.notes)
    assert len(elements(tuned)) == 6


def test_random_python_source_is_not_cached():
    rng = np.random.default_rng(0)

    def generate():
        for _ in range(8):
            time.sleep(0.002)
            yield rng.normal(size=2).astype(np.float32)

    dataset = tf.data.Dataset.from_generator(
        generate, output_signature=tf.TensorSpec((2,), tf.float32)
    ).batch(2)
    tuned, result = kpt.tune(dataset, budget_s=10, verbose=0)
    cache = next(o for o in result.rewrites if o.kind == "cache")
    assert not cache.applied
    assert "different elements" in cache.reason
    assert all(s.kind != "cache" for s in stages(tuned))


def test_already_optimal_pipeline_comes_back_unchanged():
    dataset = (
        tf.data.Dataset.range(16)
        .map(slow_py_function, num_parallel_calls=tf.data.AUTOTUNE)
        .cache()
        .batch(4, num_parallel_calls=tf.data.AUTOTUNE)
        .prefetch(tf.data.AUTOTUNE)
    )
    options = tf.data.Options()
    options.threading.private_threadpool_size = 2
    dataset = dataset.with_options(options)
    # Turning autotuning off is still tried; no rewrite halves the time.
    tuned, result = kpt.tune(dataset, budget_s=10, min_gain=0.5, verbose=0)
    assert [o.kind for o in result.rewrites if o.ratio is not None] == ["autotune-off"]
    assert tuned is dataset
    assert result.ratio == 1.0 and result.speedup == 1.0
    assert not result.applied
    assert result.original_s > 0 and result.tuned_s == result.original_s
    assert result.tuned_pipeline == result.pipeline


def test_cache_too_big_for_memory_needs_a_path():
    dataset = tf.data.Dataset.range(8).map(slow_py_function)
    _, result = kpt.tune(dataset, budget_s=5, cache_memory_bytes=16, verbose=0)
    cache = next(o for o in result.rewrites if o.kind == "cache")
    assert not cache.applied and "cache_path" in cache.reason


def test_tuned_dataset_trains_a_model():
    dataset = slow_source(16, 0.002).map(lambda x, y: (x * 0.5, y)).batch(4)
    tuned, _ = kpt.tune(dataset, budget_s=4, verbose=0)
    model = tiny_model()
    history = model.fit(tuned, epochs=2, verbose=0)
    assert len(history.history["loss"]) == 2


def test_infinite_dataset_needs_num_batches():
    dataset = tf.data.Dataset.range(8).map(slow_py_function).repeat()
    with pytest.raises(ValueError, match="num_batches"):
        kpt.tune(dataset, verbose=0)
    tuned, result = kpt.tune(dataset, budget_s=4, num_batches=6, verbose=0)
    assert result.batches_per_epoch == 6
    assert [int(x) for x in tuned.take(6)] == [3 * i for i in range(6)]


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"budget_s": 0}, ValueError, "budget_s"),
        ({"consumer_step_s": -1}, ValueError, "consumer_step_s"),
        ({"epochs": 0}, ValueError, "epochs"),
        ({"num_batches": 2.5}, ValueError, "num_batches"),
        ({"min_gain": 1.5}, ValueError, "min_gain"),
        ({"verbose": 2}, ValueError, "verbose"),
        ({"cache_path": 3}, TypeError, "cache_path"),
    ],
)
def test_bad_arguments_are_named(kwargs, error, message):
    with pytest.raises(error, match=message):
        kpt.tune(tf.data.Dataset.range(4), **kwargs)


def test_not_a_dataset():
    with pytest.raises(TypeError, match="a keras.utils.PyDataset, a torch DataLoader or a grain"):
        kpt.tune(np.zeros((4, 2)))


def test_cache_path_that_is_a_directory(tmp_path):
    with pytest.raises(ValueError, match="file prefix"):
        kpt.tune(tf.data.Dataset.range(4), cache_path=tmp_path)


def test_tuning_leaves_the_original_datasets_shuffle_order_alone():
    def shuffled():
        # 15 ms a sleeping element: the parallel map is kept on a busy machine too,
        # so the tuned dataset is a rebuild, not the original object.
        return tf.data.Dataset.range(24).map(sleepy_py_function).shuffle(24, seed=3).batch(4)

    untouched = shuffled()
    expected = [elements(untouched) for _ in range(2)]
    dataset = shuffled()
    tuned, result = kpt.tune(
        dataset, budget_s=12, allow_unverified=True, max_python_epochs=500, verbose=0
    )
    kept = [o.kind for o in result.rewrites if o.status == "kept"]
    # Each rewrite's status says why, should a busy machine keep it from being kept.
    assert "parallel-map" in kept, [(o.kind, o.status, o.speedup) for o in result.rewrites]
    # The next fits on the original see the orders they would have seen...
    assert [elements(dataset) for _ in range(2)] == expected
    # ...and the tuned dataset shuffles as a newly built original would.
    assert elements(tuned) == expected[0]


def test_a_random_map_run_in_parallel_is_checked_by_structure_even_when_seeded():
    from keras_pipeline_tuner.pipeline.tune.planning import plan_rewrites
    from keras_pipeline_tuner.pipeline.tune.rewrites import PARALLEL_MAP
    from keras_pipeline_tuner.pipeline.tune.tuning import time_rewrites

    # A global seed makes two passes agree; parallel calls still hand the
    # draws to other elements, which is what allow_nondeterministic accepts.
    tf.random.set_seed(3)

    def noisy(x):
        return tf.cast(x, tf.float32) + tf.random.uniform(())

    dataset = tf.data.Dataset.range(64).map(noisy).batch(4)
    candidates, _ = plan_rewrites(read_pipeline(dataset), allow_nondeterministic=True)
    parallel = [rewrite for rewrite in candidates if rewrite.kind == PARALLEL_MAP]
    assert parallel and parallel[0].changes_determinism
    (timed,) = time_rewrites(dataset, parallel[:1], budget_s=20.0, num_batches=8)
    assert timed.outcome.status == "measured", timed.outcome.reason
    assert timed.outcome.elements_check == "structure"


@pytest.mark.parametrize("stateful", [False, True], ids=["stateless", "stateful"])
def test_only_python_that_may_keep_state_is_unproven_on_several_threads(stateful):
    from keras_pipeline_tuner.pipeline.tune.planning import plan_rewrites
    from keras_pipeline_tuner.pipeline.tune.rewrites import PARALLEL_INTERLEAVE

    def read(x):
        # `stateful=False`: its author's promise that the result depends on x only.
        value = tf.numpy_function(lambda v: v, [x], tf.int64, stateful=stateful)
        return tf.data.Dataset.from_tensors(value)

    dataset = tf.data.Dataset.range(8).interleave(read, cycle_length=2)
    candidates, _ = plan_rewrites(read_pipeline(dataset))
    (parallel,) = [rewrite for rewrite in candidates if rewrite.kind == PARALLEL_INTERLEAVE]
    assert (parallel.unverified is not None) == stateful


@pytest.mark.parametrize("warmup", [0, 2])
def test_timed_passes_of_a_few_batches_leave_out_their_warm_up(warmup):
    from keras_pipeline_tuner.pipeline.tune.planning import plan_rewrites
    from keras_pipeline_tuner.pipeline.tune.rewrites import PREFETCH
    from keras_pipeline_tuner.pipeline.tune.tuning import time_rewrites

    def slow_start(i):
        # Every new iterator's first two elements wait 0.5 s (TensorFlow runs
        # this map in parallel), as a pipeline's start-up does; the rest come at once.
        time.sleep(0.5 if i < 2 else 0.0)
        return i

    def read(i):
        return tf.numpy_function(slow_start, [i], tf.int64, stateful=False)

    dataset = tf.data.Dataset.range(40).map(read)
    candidates, _ = plan_rewrites(read_pipeline(dataset))
    prefetch = [rewrite for rewrite in candidates if rewrite.kind == PREFETCH]
    (timed,) = time_rewrites(
        dataset, prefetch, budget_s=30.0, num_batches=4, warmup_batches=warmup
    )
    assert timed.outcome.status == "measured", timed.outcome.reason
    if warmup:
        # Four elements that do not sleep: far below the sleep, however busy.
        assert timed.without_s < 0.4, timed.without_s
    else:
        assert timed.without_s >= 0.5, timed.without_s


def test_a_pipeline_over_a_large_source_is_tuned_over_the_real_data():
    # 24 MB of strings: every rebuild, and the tuned pipeline's reading, hold
    # a one-element stand-in of them and read the real ones in place.
    strings = [bytes([index]) * (1 << 20) for index in range(24)]
    source = tf.data.Dataset.from_tensor_slices(strings)
    first_bytes = source.map(
        lambda x: tf.cast(tf.io.decode_raw(tf.strings.substr(x, 0, 1), tf.uint8)[0], tf.int64)
    )
    dataset = first_bytes.map(sleepy_py_function).batch(4)
    tuned, result = kpt.tune(
        dataset, budget_s=8, epochs=1, allow_unverified=True, max_python_epochs=500, verbose=0
    )
    assert elements(tuned) == elements(dataset)
    outcome = next(
        o for o in result.rewrites if o.kind == "parallel-map" and "sleepy" in o.change
    )
    assert outcome.status == "kept", outcome.reason
    assert result.tuned_pipeline.startswith(
        "from_tensor_slices() -> map(<lambda>) -> map(sleepy_py_function, "
    ), result.tuned_pipeline
    assert "num_parallel_calls=AUTOTUNE" in result.tuned_pipeline, result.tuned_pipeline
