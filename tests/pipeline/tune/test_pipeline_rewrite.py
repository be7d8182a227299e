"""Graph rewrites of real tf.data pipelines: where they apply, and what they build."""

import dataclasses
import gc
import time

import numpy as np
import pytest
import tensorflow as tf

from keras_pipeline_tuner.pipeline.graph.model import AUTOTUNE
from keras_pipeline_tuner.pipeline.graph.reader import graph_def_of
from keras_pipeline_tuner.pipeline.graph.reader import read_pipeline
from keras_pipeline_tuner.pipeline.tune import rewrites as rewrite
from keras_pipeline_tuner.pipeline.tune.cache_point import cache_point
from keras_pipeline_tuner.pipeline.tune.graph_editing import apply_rewrites
from keras_pipeline_tuner.pipeline.tune.graph_editing import cut_at
from keras_pipeline_tuner.pipeline.tune.planning import plan_rewrites
from keras_pipeline_tuner.pipeline.tune.rebuild import rebuild
from keras_pipeline_tuner.pipeline.tune.vectorize import vectorized_trace_problem
from tests.helpers.training_data import slow_source


def py_double(x):
    """A `tf.py_function` map: Python work TensorFlow cannot parallelise on its own."""

    def double(value):
        time.sleep(0.001)
        return value * 2

    result = tf.py_function(double, [x], tf.int64)
    result.set_shape(())
    return result


def random_shift(x):
    return x + tf.random.uniform((), maxval=3, dtype=tf.int64)


def elements(dataset):
    return [tf.nest.map_structure(lambda t: t.numpy().tolist(), e) for e in dataset]


def planned(dataset, **kwargs):
    rewrites, skipped = plan_rewrites(read_pipeline(dataset), **kwargs)
    return {r.kind: r for r in rewrites}, {s.kind: s for s in skipped}, rewrites


def rebuilt(dataset, rewrites):
    graph_def = apply_rewrites(graph_def_of(dataset), rewrites)
    return rebuild(graph_def, dataset.element_spec, dataset)


def ops(dataset):
    return [stage.op for stage in read_pipeline(dataset).stages]


def test_sequential_py_function_map_becomes_parallel_with_the_same_elements():
    dataset = tf.data.Dataset.range(20).map(py_double)
    candidates, _, _ = planned(dataset)
    parallel = candidates[rewrite.PARALLEL_MAP]
    assert parallel.change == "map(py_double, num_parallel_calls=AUTOTUNE)"
    assert not parallel.changes_order and not parallel.changes_determinism
    assert "threads" in parallel.caveat

    tuned = rebuilt(dataset, [parallel])
    stage = next(s for s in read_pipeline(tuned).stages if s.kind == "map")
    assert stage.op == "ParallelMapDatasetV2"
    assert stage.params["num_parallel_calls"] == AUTOTUNE
    assert elements(tuned) == elements(dataset) == [2 * i for i in range(20)]


def test_sequential_interleave_becomes_parallel_in_the_same_order():
    dataset = tf.data.Dataset.range(3).interleave(
        lambda i: tf.data.Dataset.range(4).map(lambda x: x + 10 * i),
        cycle_length=2,
        block_length=1,
    )
    candidates, _, _ = planned(dataset)
    tuned = rebuilt(dataset, [candidates[rewrite.PARALLEL_INTERLEAVE]])
    assert "ParallelInterleaveDatasetV4" in ops(tuned)
    assert elements(tuned) == elements(dataset)


def test_random_map_is_not_parallelised_unless_allowed():
    dataset = tf.data.Dataset.range(8).map(random_shift)
    candidates, skipped, _ = planned(dataset)
    assert rewrite.PARALLEL_MAP not in candidates
    assert "random" in skipped[rewrite.PARALLEL_MAP].reason
    candidates, _, _ = planned(dataset, allow_nondeterministic=True)
    assert candidates[rewrite.PARALLEL_MAP].changes_determinism


def test_map_with_side_effects_is_neither_parallelised_nor_cached_after():
    counter = tf.Variable(0, dtype=tf.int64)

    def count(x):
        counter.assign_add(1)
        return x + counter.read_value()

    dataset = slow_source(4, 0.0).map(lambda x, y: (count(tf.cast(y, tf.int64)), x))
    candidates, skipped, _ = planned(dataset)
    assert rewrite.PARALLEL_MAP not in candidates
    assert "changes state" in skipped[rewrite.PARALLEL_MAP].reason
    point, _ = cache_point(read_pipeline(dataset))
    assert point.kind == "from_generator"
    # One call at a time, asked for explicitly, stays one at a time.
    one_at_a_time = slow_source(4, 0.0).map(
        lambda x, y: (count(tf.cast(y, tf.int64)), x), num_parallel_calls=1
    )
    candidates, skipped, _ = planned(one_at_a_time)
    assert rewrite.AUTOTUNE_PARALLELISM not in candidates
    assert "changes state" in skipped[rewrite.AUTOTUNE_PARALLELISM].reason


def test_map_tensorflow_already_parallelises_is_left_alone():
    dataset = tf.data.Dataset.range(8).map(lambda x: x + 1)
    candidates, skipped, _ = planned(dataset)
    assert rewrite.PARALLEL_MAP not in candidates
    assert "map_parallelization" in skipped[rewrite.PARALLEL_MAP].reason


def py_identity(x):
    """A `tf.py_function` map that keeps the element: expensive for TensorFlow to judge."""
    result = tf.py_function(lambda value: value, [x], x.dtype)
    result.set_shape(x.shape)
    return result


def noisy_keras_map():
    """An expensive map with a Keras random layer (random through its seed variable)."""
    import keras

    noise = keras.layers.GaussianNoise(0.5, seed=1)

    def add_noise(x):
        return noise(tf.cast(py_identity(x), tf.float32), training=True)

    return add_noise


@pytest.mark.parametrize(
    "build, cached_kind",
    [
        # An expensive random augmentation after an expensive map: cache between them.
        (lambda: tf.data.Dataset.range(6).map(py_double).map(
            lambda x: random_shift(py_identity(x))), "map"),
        # The same with a Keras random layer (random through its seed variable).
        (lambda: tf.data.Dataset.range(6).map(py_double).map(noisy_keras_map()), "map"),
        # A shuffle between expensive stages: cache before it.
        (lambda: tf.data.Dataset.range(6).map(py_double).shuffle(6).map(py_identity).batch(2),
         "map"),
        # A random augmentation right after the source: cache the source.
        (lambda: slow_source(6, 0.0).map(lambda x, y: (x + tf.random.uniform(()), y)).batch(2),
         "from_generator"),
        # Everything deterministic: cache after the batch that follows the expensive map.
        (lambda: tf.data.Dataset.range(6).map(py_double).batch(2).prefetch(1), "batch"),
    ],
)
def test_cache_goes_after_the_last_expensive_stage_and_before_anything_random(build, cached_kind):
    dataset = build()
    pipeline = read_pipeline(dataset)
    point, reason = cache_point(pipeline)
    assert reason is None
    assert point.kind == cached_kind
    cached = {s.node for s in pipeline.upstream(point)} | {point.node}
    random_stages = {
        s.node for s in pipeline.stages
        if s.kind == "shuffle" or (s.function is not None and s.function.random)
    }
    assert not cached & random_stages
    expensive_after = [
        s for s in pipeline.downstream(point)
        if s.function is not None and s.function.expensive
    ]
    # The cache keeps as much expensive work as it can: any left after it
    # comes after something random.
    for stage in expensive_after:
        assert ({s.node for s in pipeline.upstream(stage)} | {stage.node}) & random_stages


def test_no_cache_when_nothing_is_expensive_or_the_pipeline_caches():
    cheap = tf.data.Dataset.range(8).map(lambda x: x * 3).batch(2)
    assert cache_point(read_pipeline(cheap))[0] is None
    cached = tf.data.Dataset.range(8).map(py_double).cache()
    point, reason = cache_point(read_pipeline(cached))
    assert point is None and "already caches" in reason


def test_random_first_means_no_cache():
    dataset = tf.data.Dataset.range(8).shuffle(8).map(py_double)
    point, reason = cache_point(read_pipeline(dataset))
    assert point is None and "freeze" in reason


def counted_source(count: int, calls: list):
    """`range(count)` from a generator that notes each element it makes, then doubled."""

    def generate():
        for i in range(count):
            calls.append(i)
            yield i

    return tf.data.Dataset.from_generator(
        generate, output_signature=tf.TensorSpec((), tf.int64)
    ).map(py_double)


def test_inserted_cache_serves_the_second_epoch_from_memory_and_rebuilds_start_empty():
    calls = []
    dataset = counted_source(4, calls)
    candidates, _, _ = planned(dataset)
    graph_def = apply_rewrites(graph_def_of(dataset), [candidates[rewrite.CACHE]])
    first = rebuild(graph_def, dataset.element_spec, dataset)
    assert elements(first) == elements(first) == [0, 2, 4, 6]
    assert len(calls) == 4
    second = rebuild(graph_def, dataset.element_spec, dataset)
    assert elements(second) == [0, 2, 4, 6]
    assert len(calls) == 8


def test_a_timed_pass_s_cache_of_its_first_elements_is_filled_by_reading_those_only():
    calls = []
    dataset = counted_source(10, calls)
    candidates, _, _ = planned(dataset)
    partial = dataclasses.replace(candidates[rewrite.CACHE], fill_elements=3)
    timed = rebuilt(dataset, [partial])
    assert elements(timed) == [0, 2, 4]
    assert len(calls) == 3
    # Read back from memory: the source is not read again.
    assert elements(timed) == [0, 2, 4]
    assert len(calls) == 3


def test_cache_on_a_file(tmp_path):
    dataset = tf.data.Dataset.range(5).map(py_double)
    candidates, _, _ = planned(dataset)
    cache = candidates[rewrite.CACHE]
    cache.filename = str(tmp_path / "cache")
    tuned = rebuilt(dataset, [cache])
    assert elements(tuned) == [0, 2, 4, 6, 8]
    assert any(path.name.startswith("cache") for path in tmp_path.iterdir())


def test_prefetch_and_autotune_rewrites():
    dataset = tf.data.Dataset.range(12).map(py_double, num_parallel_calls=2).batch(3).prefetch(1)
    candidates, _, rewrites = planned(dataset)
    autotuned = [r for r in rewrites if r.kind == rewrite.AUTOTUNE_PARALLELISM]
    assert {r.change for r in autotuned} == {
        "map(py_double, num_parallel_calls=AUTOTUNE)",
        "prefetch(AUTOTUNE)",
    }
    tuned = rebuilt(dataset, autotuned)
    params = [s.params for s in read_pipeline(tuned).stages]
    assert {"num_parallel_calls": "AUTOTUNE", "deterministic": "default"} in params
    assert {"buffer_size": "AUTOTUNE"} in params
    assert elements(tuned) == elements(dataset)

    unprefetched = tf.data.Dataset.range(12).map(py_double).batch(3)
    candidates, skipped, _ = planned(unprefetched)
    prefetch = candidates.get(rewrite.PREFETCH)
    if prefetch is None:
        # TensorFlow injects one itself at run time; the rewrite says so.
        assert "inject_prefetch" in skipped[rewrite.PREFETCH].reason
    else:
        tuned = rebuilt(unprefetched, [prefetch])
        assert ops(tuned)[-1] == "PrefetchDataset"
        assert elements(tuned) == elements(unprefetched)


def test_rebuilt_dataset_outlives_the_original_python_objects():
    dataset = tf.data.Dataset.range(6).map(py_double)
    candidates, _, _ = planned(dataset)
    tuned = rebuilt(dataset, [candidates[rewrite.PARALLEL_MAP]])
    del dataset, candidates
    gc.collect()
    assert elements(tuned) == [0, 2, 4, 6, 8, 10]


def test_a_rewrite_for_another_op_is_refused():
    dataset = tf.data.Dataset.range(4).map(py_double)
    graph_def = graph_def_of(dataset)
    final = read_pipeline(dataset).final
    wrong = rewrite.Rewrite(kind=rewrite.PARALLEL_INTERLEAVE, node=final.node, stage="", change="")
    with pytest.raises(ValueError, match="InterleaveDataset"):
        apply_rewrites(graph_def, [wrong])
    missing = rewrite.Rewrite(kind=rewrite.CACHE, node="no/such/node", stage="", change="")
    with pytest.raises(ValueError, match="no node 'no/such/node'"):
        apply_rewrites(graph_def, [missing])
    # The original graph is untouched by the attempts.
    assert elements(rebuild(graph_def, tf.TensorSpec((), tf.int64), None)) == [0, 2, 4, 6]


def test_cut_at_a_stage_gives_its_elements():
    dataset = tf.data.Dataset.range(6).map(py_double).batch(4)
    pipeline = read_pipeline(dataset)
    mapped = next(s for s in pipeline.stages if s.kind == "map")
    graph_def, spec = cut_at(graph_def_of(dataset), mapped.node)
    prefix = rebuild(graph_def, spec, dataset)
    assert [int(np.asarray(e[0])) for e in prefix] == [0, 2, 4, 6, 8, 10]


@tf.autograph.experimental.do_not_convert
def halve(x):
    return tf.cast(x, tf.float32) / 2.0


@tf.autograph.experimental.do_not_convert
def plus_vector(x):
    # Element-wise ops, but a scalar element becomes a vector: on a batch of
    # scalars the same ops give one vector, not a batch of them.
    return tf.cast(x, tf.float32) + tf.constant([1.0, 2.0, 3.0])


def test_vectorised_map_runs_after_the_batch_with_the_same_elements():
    dataset = tf.data.Dataset.range(21).map(halve).batch(4)
    candidates, _, _ = planned(dataset)
    vectorize = candidates[rewrite.VECTORIZE]
    assert vectorize.change == "batch(4).map(halve)"
    assert vectorized_trace_problem(graph_def_of(dataset), vectorize) is None
    tuned = rebuilt(dataset, [vectorize])
    assert [stage.label for stage in read_pipeline(tuned).stages] == [
        "range(0, 21, 1)",
        "batch(4)",
        "map(halve)",
    ]
    assert elements(tuned) == elements(dataset)
    # With a prefetch on top, the prefetch still ends the pipeline.
    prefetch = rewrite.Rewrite(rewrite.PREFETCH, vectorize.batch_node, "batch(4)", "")
    assert ops(rebuilt(dataset, [vectorize, prefetch]))[-1] == "PrefetchDataset"


def test_a_map_whose_batched_trace_has_other_shapes_is_not_vectorised():
    dataset = tf.data.Dataset.range(8).map(plus_vector).batch(4, drop_remainder=True)
    candidates, _, _ = planned(dataset)
    problem = vectorized_trace_problem(
        graph_def_of(dataset), candidates[rewrite.VECTORIZE]
    )
    assert problem is not None


def test_map_fusion_parallel_batch_and_thread_pool_keep_the_elements():
    dataset = tf.data.Dataset.range(30).map(halve).map(lambda x: x * 3.0).batch(4)
    candidates, _, _ = planned(dataset)
    assert candidates[rewrite.MAP_FUSION].options == {"experimental_optimization.map_fusion": True}
    assert candidates[rewrite.PARALLEL_BATCH].change == "batch(4, num_parallel_calls=AUTOTUNE)"
    kinds = (rewrite.MAP_FUSION, rewrite.PARALLEL_BATCH, rewrite.THREADPOOL)
    chosen = [candidates[kind] for kind in kinds]
    tuned = rebuilt(dataset, chosen)
    pipeline = read_pipeline(tuned)
    assert pipeline.options["optimization_options.map_fusion"] is True
    assert "threading_options.private_threadpool_size" in pipeline.options
    assert "ParallelBatchDataset" in ops(tuned)
    assert elements(tuned) == elements(dataset)


def test_reordering_is_planned_only_when_allowed():
    dataset = tf.data.Dataset.range(8).map(halve, num_parallel_calls=2)
    candidates, skipped, _ = planned(dataset)
    assert rewrite.REORDER not in candidates
    assert "allow_reordering=True" in skipped[rewrite.REORDER].reason
    candidates, _, _ = planned(dataset, allow_reordering=True)
    reorder = candidates[rewrite.REORDER]
    assert reorder.changes_order
    tuned = rebuilt(dataset, [reorder])
    stage = next(s for s in read_pipeline(tuned).stages if s.kind == "map")
    assert stage.params["deterministic"] == "false"
    assert sorted(elements(tuned)) == sorted(elements(dataset))


def test_parallel_python_map_is_marked_unproven():
    candidates, _, _ = planned(tf.data.Dataset.range(4).map(py_double))
    assert "Python" in candidates[rewrite.PARALLEL_MAP].unverified
    candidates, _, _ = planned(tf.data.Dataset.range(4).map(halve).batch(2))
    assert all(r.unverified is None for r in candidates.values())


def large_strings(count=24, each=1 << 20):
    """`count` distinct strings of `each` bytes: 24 MB, over the rebuild's light limit."""
    return [bytes([index]) * each for index in range(count)]


def first_byte(x):
    return tf.cast(tf.io.decode_raw(tf.strings.substr(x, 0, 1), tf.uint8)[0], tf.int64)


def test_a_large_source_is_rebuilt_over_the_real_data_without_copying_it():
    from keras_pipeline_tuner.pipeline.tune.rebuild import LIGHT_OVER_BYTES
    from keras_pipeline_tuner.pipeline.tune.rebuild import graph_for_rebuild
    from keras_pipeline_tuner.pipeline.tune.rebuild import pipeline_for_rebuild

    def pipeline():
        source = tf.data.Dataset.from_tensor_slices(large_strings())
        pairs = tf.data.Dataset.zip((source, tf.data.Dataset.range(24)))
        return pairs.map(lambda x, y: (first_byte(x), y)).shuffle(24, seed=3).batch(4)

    dataset, twin, new = pipeline(), pipeline(), pipeline()
    graph_def = graph_for_rebuild(dataset)
    # The graph holds a one-element stand-in, not the 24 MB.
    assert graph_def.ByteSize() < LIGHT_OVER_BYTES // 100
    candidates, _ = plan_rewrites(pipeline_for_rebuild(dataset), allow_nondeterministic=True)
    assert {item.kind for item in candidates} >= {rewrite.CACHE, rewrite.PARALLEL_BATCH}
    def pairs_of(dataset):
        return [pair for batch in elements(dataset) for pair in zip(*batch)]

    first = pairs_of(new)
    assert sorted(first) == [(index, index) for index in range(24)]
    for _ in range(2):
        tuned = rebuild(apply_rewrites(graph_def, candidates), dataset.element_spec, dataset)
        # Over the real strings: every element's first byte, each once, in the
        # order a new dataset's first pass gives (the shuffle keeps its seeds).
        assert pairs_of(tuned) == first
    # The original's orders are those of a twin no rebuild touched.
    assert [elements(dataset) for _ in range(2)] == [elements(twin) for _ in range(2)]


def test_a_reshuffling_large_source_gets_a_copy_over_the_real_data():
    from keras_pipeline_tuner.pipeline.tune.rebuild import independent_copy

    def pipeline(cached=False):
        source = tf.data.Dataset.from_tensor_slices(large_strings())
        pairs = tf.data.Dataset.zip((source, tf.data.Dataset.range(24)))
        mapped = pairs.map(lambda x, y: (first_byte(x), y))
        return (mapped.cache() if cached else mapped).shuffle(24, seed=3).batch(4)

    dataset, twin, new = pipeline(), pipeline(), pipeline()
    copy = independent_copy(dataset)
    assert copy is not None and copy is not dataset
    # It reads the real strings, shuffled as a new dataset is, and leaves
    # the original's orders as a twin's.
    assert elements(copy) == elements(new)
    assert [elements(dataset) for _ in range(2)] == [elements(twin) for _ in range(2)]
    # A copy over stand-ins would fill a cache of its own, not read training's.
    assert independent_copy(pipeline(cached=True)) is None


def test_generator_copies_read_as_many_generators_at_once():
    # A replay for the fix timing, never a tuned pipeline: every copy starts
    # from the generator's first element, and they run side by side.
    def generate():
        for i in range(10):
            time.sleep(0.03)
            yield i

    dataset = tf.data.Dataset.from_generator(
        generate, output_signature=tf.TensorSpec((), tf.int64)
    )
    (source,) = read_pipeline(dataset).stages
    copies = rewrite.Rewrite(
        kind=rewrite.GENERATOR_COPIES, node=source.node, stage=source.label,
        change="", copies=2,
    )
    found, stamps = [], []
    for element in rebuilt(dataset, [copies]):
        found.append(int(element))
        stamps.append(time.perf_counter())
    assert sorted(found) == sorted(list(range(10)) * 2)
    # From the first element on (the start is the iterator's, not the copies'):
    # 19 more elements of 30 ms each, 0.57 s one after another, 0.27 s side by side.
    took = stamps[-1] - stamps[0]
    assert took < 0.45, took
    # The rewrite is the fix timing's alone: kpt.tune never plans it.
    candidates, _, _ = planned(dataset)
    assert rewrite.GENERATOR_COPIES not in candidates
