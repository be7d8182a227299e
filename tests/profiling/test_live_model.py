"""tf.data's live model read into a stage table, named as the user wrote the stages."""

import pytest
import tensorflow as tf

from keras_pipeline_tuner.pipeline.graph.reader import read_pipeline
from keras_pipeline_tuner.profiling import live_model


def decode(x):
    t = tf.random.stateless_uniform([32, 32], seed=[1, 2])
    return tf.cast(x, tf.float32) + tf.reduce_mean(tf.matmul(t, t))


def double(x):
    return x * 2.0


def table_of(dataset, batches=12):
    pipeline = read_pipeline(dataset)
    iterator = iter(dataset)
    for _ in range(batches):
        next(iterator)
    proto = live_model.read_model(iterator)
    assert proto is not None
    return live_model.stage_table(proto, pipeline, mid_pass=True)


def test_stages_keep_the_users_names_through_tf_datas_rewrites():
    dataset = (
        tf.data.Dataset.range(4096)
        .shuffle(64)
        .map(decode, num_parallel_calls=tf.data.AUTOTUNE)
        .map(double)
        .batch(8)
        .cache()
        .prefetch(tf.data.AUTOTUNE)
    )
    table = table_of(dataset)
    stages = [row.stage for row in table.rows]
    assert stages == [
        "range(0, 4096, 1)",
        "shuffle(64)",
        "map(decode, num_parallel_calls=AUTOTUNE)",
        "map(double)",
        "cache()",
        "prefetch(AUTOTUNE)",
    ]
    by_stage = {row.stage: row for row in table.rows}
    # tf.data fused the second map with its batch: the map's elements are the batch's.
    fused = by_stage["map(double)"]
    assert fused.runs_as == "MapAndBatch" and fused.elements % 8 == 0
    assert fused.elements >= 8 * table.batches  # and the batches read ahead
    parallel = by_stage["map(decode, num_parallel_calls=AUTOTUNE)"]
    assert 1 <= parallel.parallelism and parallel.tuned and parallel.ms_per_element > 0
    assert by_stage["cache()"].runs_as == "MemoryCache+MemoryCacheImpl"
    assert by_stage["prefetch(AUTOTUNE)"].buffer is not None
    assert sum(row.share for row in table.rows) == pytest.approx(1.0)
    assert table.batches == 12 and table.reads == 1 and table.cpu_budget >= 1
    # The table round-trips report.json.
    from keras_pipeline_tuner.outputs.report import Report

    assert Report.from_json(Report(stage_table=table).to_json()).stage_table == table


def test_a_prefetch_tf_data_adds_and_the_work_inside_an_interleave():
    dataset = (
        tf.data.Dataset.range(4)
        .interleave(lambda i: tf.data.Dataset.range(512).map(double_int), num_parallel_calls=2)
        .batch(16)
    )
    table = table_of(dataset)
    stages = [row.stage for row in table.rows]
    assert stages[-1] == "prefetch (added by tf.data)" and table.rows[-1].added_by_tf
    (interleave,) = [row for row in table.rows if row.stage.startswith("interleave(")]
    # The datasets its function opens are its own work, not stages of the pipeline.
    assert interleave.runs_as.startswith("ParallelInterleave") and "Map" in interleave.runs_as


def double_int(x):
    return x * 2


def test_no_model_when_autotuning_is_off():
    options = tf.data.Options()
    options.autotune.enabled = False
    iterator = iter(tf.data.Dataset.range(64).map(double_int).batch(4).with_options(options))
    next(iterator)
    assert live_model.read_model(iterator) is None


def features(i):
    # TensorFlow work the live model times: the stage's only real cost.
    t = tf.random.stateless_uniform([48, 48], seed=tf.stack([i, i]))
    for _ in range(4):
        t = tf.matmul(t, t) / 48.0
    return tf.fill([8], tf.reduce_mean(t)), tf.cast(i % 2, tf.float32)[None]


def numbers():
    yield from range(64)


@pytest.mark.parametrize("length", ["known", "unknown"])
def test_a_fit_keeps_the_stages_above_a_batch_that_its_passes_end_let_go(length):
    """A batch() tf.data does not fuse drops its input at the input's end, and its nodes go."""
    import keras_pipeline_tuner as kpt
    from tests.helpers.backend_fit import tiny_model

    if length == "known":
        source = tf.data.Dataset.range(64)
    else:
        spec = tf.TensorSpec((), tf.int64)
        source = tf.data.Dataset.from_generator(numbers, output_signature=spec)
    # The shuffle keeps the map from fusing with the batch; 16 steps a pass.
    dataset = source.map(features, num_parallel_calls=tf.data.AUTOTUNE).shuffle(8).batch(4)
    tuner = kpt.PipelineTuner(verbose=0, profile="off", measure_fixes=False, check_contention=False)
    tiny_model().fit(dataset, epochs=3, callbacks=[tuner], verbose=0)
    table = tuner.report.stage_table
    assert table is not None, tuner.report.notes
    (row,) = [row for row in table.rows if row.stage.startswith("map(features")]
    assert row.ms_per_batch > 0 and row.parallelism >= 1, table
    # Every read counted (those at a pass's end too), the table one read's.
    assert table.reads >= 4 and table.read_ms > 0, table


def test_stages_behind_a_filled_cache_leave_the_table_of_later_passes():
    """The map runs in the first pass only: its time is not the later passes' CPU."""
    import keras_pipeline_tuner as kpt
    from tests.helpers.backend_fit import tiny_model

    dataset = (
        tf.data.Dataset.range(64)
        .map(features, num_parallel_calls=tf.data.AUTOTUNE)
        .cache()
        .shuffle(8)
        .batch(4)
    )
    tuner = kpt.PipelineTuner(verbose=0, profile="off", measure_fixes=False, check_contention=False)
    tiny_model().fit(dataset, epochs=3, callbacks=[tuner], verbose=0)
    report = tuner.report
    table = report.stage_table
    assert table is not None, report.notes
    # The last pass's table is of the cache's reads: the map ran in the first only.
    assert not [row for row in table.rows if row.stage.startswith("map(features")], table
    contention = report.judgement.cpu_contention
    assert contention is None or not any("map(features" in part for part in contention.parts)
