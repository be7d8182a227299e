"""Reading tf.data pipelines from their graphs, on real datasets."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_pipeline_tuner.pipeline.graph.model import AUTOTUNE
from keras_pipeline_tuner.pipeline.graph.reader import pipeline_from_graph_def
from keras_pipeline_tuner.pipeline.graph.reader import read_pipeline
from tests.helpers import guide_pipelines as guide

no_autograph = tf.autograph.experimental.do_not_convert


def by_kind(pipeline, kind):
    return [stage for stage in pipeline.stages if stage.kind == kind]


def test_chain_in_order_with_autotune_as_a_word():
    @no_autograph
    def parse(x):
        return x * 2

    ds = (
        tf.data.Dataset.range(100)
        .map(parse, num_parallel_calls=tf.data.AUTOTUNE)
        .batch(8, drop_remainder=True)
        .prefetch(tf.data.AUTOTUNE)
    )
    pipeline = read_pipeline(ds)
    assert [stage.kind for stage in pipeline.stages] == ["range", "map", "batch", "prefetch"]
    assert str(pipeline) == (
        "range(0, 100, 1) -> map(parse, num_parallel_calls=AUTOTUNE) -> "
        "batch(8, drop_remainder=True) -> prefetch(AUTOTUNE)"
    )
    map_stage = by_kind(pipeline, "map")[0]
    assert map_stage.params["num_parallel_calls"] == AUTOTUNE
    assert map_stage.function.name == "parse"
    assert map_stage.parallel
    assert pipeline.final.kind == "prefetch"
    # Every stage reads from the one before it.
    for before, after in zip(pipeline.stages, pipeline.stages[1:]):
        assert after.inputs == [before.node]
    assert [s.kind for s in pipeline.upstream(pipeline.final)] == ["batch", "map", "range"]
    assert [s.kind for s in pipeline.downstream(pipeline.stages[0])] == [
        "map",
        "batch",
        "prefetch",
    ]


def test_function_contents():
    @no_autograph
    def load(path):
        image = tf.io.decode_png(tf.io.read_file(path), channels=3)
        return tf.image.resize(image, (8, 8))

    @no_autograph
    def call_python(x):
        return tf.py_function(lambda a: a, [x], tf.int64)

    @no_autograph
    def jitter(x):
        return x + tf.random.uniform([], maxval=3, dtype=tf.int64)

    @no_autograph
    def seeded(x):
        # Same seed every epoch: deterministic, safe to cache.
        return tf.image.stateless_random_flip_left_right(x, seed=(1, 2))

    flip = keras.layers.RandomFlip("horizontal", seed=1)

    @tf.function
    def nested_random(x):
        return tf.image.random_flip_left_right(x)

    images = tf.data.Dataset.from_tensor_slices(np.zeros((4, 8, 8, 3), np.float32))
    paths = tf.data.Dataset.from_tensor_slices(["a.png", "b.png"])
    numbers = tf.data.Dataset.range(4)
    cases = {
        "load": (paths.map(load), dict(heavy=True, io=True, random=False)),
        "call_python": (numbers.map(call_python), dict(python=True, random=False)),
        "jitter": (numbers.map(jitter), dict(random=True)),
        "seeded": (images.map(seeded), dict(random=False)),
        "RandomFlip": (images.map(flip), dict(random=True)),
        "<lambda>": (images.map(lambda x: nested_random(x)), dict(random=True)),
    }
    for name, (ds, expected) in cases.items():
        function = by_kind(read_pipeline(ds), "map")[0].function
        assert function.name == name
        assert function.random == expected["random"], name
        assert bool(function.heavy_ops) == expected.get("heavy", False), name
        assert bool(function.io_ops) == expected.get("io", False), name
        assert bool(function.py_function_ops) == expected.get("python", False), name
    load_function = by_kind(read_pipeline(cases["load"][0]), "map")[0].function
    assert {"DecodePng", "ResizeBilinear"} <= set(load_function.heavy_ops)
    assert load_function.expensive and not load_function.cheap


def test_sources(tmp_path):
    files = guide.write_tfrecords(tmp_path, count=3)

    sequential = read_pipeline(tf.data.TFRecordDataset(files))
    assert [s.kind for s in sequential.stages] == ["TFRecordDataset"]
    assert sequential.final.files == 3 and not sequential.final.parallel
    assert sequential.final.label == "TFRecordDataset(3 files)"

    parallel = read_pipeline(tf.data.TFRecordDataset(files, num_parallel_reads=tf.data.AUTOTUNE))
    assert parallel.final.kind == "TFRecordDataset" and parallel.final.parallel
    assert parallel.final.params["num_parallel_reads"] == AUTOTUNE

    listed = read_pipeline(
        tf.data.Dataset.list_files(str(tmp_path / "*.tfrecord"), shuffle=False).interleave(
            tf.data.TFRecordDataset, cycle_length=2, num_parallel_calls=tf.data.AUTOTUNE
        )
    )
    assert [s.kind for s in listed.stages] == ["list_files", "interleave"]
    assert listed.stages[0].files == 3
    assert listed.final.function.name == "TFRecordDataset"

    generated = read_pipeline(guide.artificial_source())
    assert [s.kind for s in generated.stages] == ["from_generator"]
    assert generated.final.inputs == []

    lines = read_pipeline(tf.data.TextLineDataset(files[:1]))
    assert lines.final.kind == "TextLineDataset" and lines.final.files == 1


def test_runtime_view_shows_what_tensorflow_rewrites():
    stateless = read_pipeline(tf.data.Dataset.range(10).map(no_autograph(guide.increment)))
    assert stateless.runtime is not None
    stage = by_kind(stateless, "map")[0]
    assert not stage.parallel and stage.parallel_at_runtime is True
    assert stage.runs_as == "map(increment, num_parallel_calls=AUTOTUNE)"

    @no_autograph
    def jitter(x):
        return x + tf.random.uniform([], maxval=3, dtype=tf.int64)

    stateful = read_pipeline(tf.data.Dataset.range(10).map(jitter))
    assert by_kind(stateful, "map")[0].parallel_at_runtime is False

    # The naive pipeline ends synchronously: TensorFlow injects a prefetch.
    naive = read_pipeline(guide.naive())
    assert naive.final.kind == "from_generator"
    assert naive.runtime.final.kind == "prefetch"

    options = tf.data.Options()
    options.autotune.enabled = False
    tuned_off = read_pipeline(tf.data.Dataset.range(10).batch(2).with_options(options))
    assert tuned_off.options["autotune_options.enabled"] is False
    assert "prefetch" not in [s.kind for s in tuned_off.runtime.stages]


def test_trees_and_opaque_stages():
    left = tf.data.Dataset.range(3)
    right = tf.data.Dataset.range(3).map(no_autograph(guide.increment))
    zipped_ds = tf.data.Dataset.zip((left, right)).map(no_autograph(lambda a, b: a + b))
    pipeline = read_pipeline(zipped_ds.unique())
    zipped = by_kind(pipeline, "zip")[0]
    assert len(zipped.inputs) == 2
    assert pipeline.stages.index(zipped) > max(
        pipeline.stages.index(pipeline.stage(node)) for node in zipped.inputs
    )
    # `unique()` is an op this module does not know: shown, not dropped.
    assert pipeline.final.opaque and pipeline.final.label == "UniqueDataset (opaque)"
    assert pipeline.final.inputs == [by_kind(pipeline, "map")[-1].node]


def test_element_sizes():
    ds = tf.data.Dataset.from_tensor_slices(np.zeros((4, 8, 8, 3), np.float32)).batch(
        2, drop_remainder=True
    )
    pipeline = read_pipeline(ds)
    assert pipeline.stages[0].element_bytes == 8 * 8 * 3 * 4
    assert pipeline.final.element_bytes == 2 * 8 * 8 * 3 * 4
    strings = read_pipeline(tf.data.Dataset.from_tensor_slices(["a", "b"]))
    assert strings.final.element_bytes is None


def test_bad_input():
    with pytest.raises(TypeError, match="tf.data.Dataset"):
        read_pipeline([1, 2, 3])
    with pytest.raises(ValueError, match="_Retval"):
        pipeline_from_graph_def(tf.compat.v1.GraphDef())
    with pytest.raises(KeyError, match="No stage"):
        read_pipeline(tf.data.Dataset.range(2)).stage("missing")


def test_worker_processes_are_read_from_the_loaders_own_settings():
    from keras_pipeline_tuner.pipeline.graph import kinds
    from keras_pipeline_tuner.pipeline.graph.model import Pipeline
    from keras_pipeline_tuner.pipeline.graph.model import Stage

    def one(kind, **params):
        return Pipeline(stages=[Stage(node="input", op="Loader", kind=kind, params=params)])

    assert one(kinds.DATA_LOADER, num_workers=2).worker_processes is True
    assert one(kinds.DATA_LOADER, num_workers=0).worker_processes is False
    assert one(kinds.PY_DATASET, workers=4, use_multiprocessing=True).worker_processes is True
    assert one(kinds.PY_DATASET, workers=4, use_multiprocessing=False).worker_processes is False
    assert one(kinds.ARRAYS).worker_processes is False
    # The user's Python may start processes of its own: unknown.
    assert one(kinds.GENERATOR).worker_processes is None
    assert Pipeline().worker_processes is None
    calls_python = read_pipeline(
        tf.data.Dataset.range(4).map(lambda x: tf.py_function(lambda v: v, [x], tf.int64))
    )
    assert calls_python.worker_processes is None
    assert read_pipeline(tf.data.Dataset.range(4).map(lambda x: x + 1)).worker_processes is False
