"""Profiled stages are named as the user wrote them: in custom loops, and for input Keras wraps."""

import time

import keras
import numpy as np
import tensorflow as tf

import keras_pipeline_tuner as kpt
from tests.helpers.training_data import FEATURES
from tests.helpers.training_data import cached_source
from tests.helpers.training_data import tiny_model

DELAY_S = 0.02


def load_image(x, y):
    """A sequential py_function map that sleeps `DELAY_S` per element."""

    def slow_identity(value):
        time.sleep(DELAY_S)
        return value

    x = tf.py_function(slow_identity, [x], tf.float32)
    x.set_shape((FEATURES,))
    return x, y


class SlowImages(keras.utils.PyDataset):
    """A PyDataset whose `__getitem__` sleeps `DELAY_S` a batch, read by one worker."""

    def __init__(self, batches, **kwargs):
        super().__init__(**kwargs)
        self.batches = batches

    def __len__(self):
        return self.batches

    def __getitem__(self, index):
        time.sleep(DELAY_S)
        x = np.full((2, FEATURES), index % 5, np.float32)
        return x, np.zeros((2, 1), np.float32)


def test_custom_loop_names_the_map_as_fit_does(tmp_path):
    model = tiny_model()
    optimizer = keras.optimizers.SGD()

    tuner = kpt.PipelineTuner(log_dir=tmp_path, verbose=0, profile=(2, 10))

    @tuner.instrument
    @tf.function
    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((model(x) - y[:, None]) ** 2)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    for x, y in tuner.iterate(cached_source(28).map(load_image).batch(2)):
        train_step(x, y)
    report = tuner.close()
    assert report.profile is not None, report.notes
    assert report.profile.bottleneck == "map(load_image)", report.profile.iterators
    assert not any("named by kind only" in note for note in report.profile.notes)
    # One stage, one recommendation.
    stages = [r.stage_node or r.stage for r in report.recommendations if r.stage]
    assert len(stages) == len(set(stages)), [(r.id, r.stage) for r in report.recommendations]
    top = report.recommendations[0]
    assert top.stage == "map(load_image)"
    assert "num_parallel_calls=tf.data.AUTOTUNE" in top.fix


def test_py_dataset_with_one_worker_gets_worker_advice_first(tmp_path):
    tuner = kpt.PipelineTuner(log_dir=tmp_path, verbose=0, profile=(2, 10))
    tiny_model().fit(SlowImages(14, workers=1), epochs=1, callbacks=[tuner], verbose=0)
    report = tuner.wait_for_profile()
    assert report.verdict != kpt.Verdict.NOT_INPUT_BOUND
    assert report.profile is not None, report.notes
    # Keras' from_generator wrapper is the user's PyDataset.
    assert report.profile.bottleneck.startswith("PyDataset(SlowImages.__getitem__")
    assert not any("from_generator" in (r.title + (r.stage or "")) for r in report.recommendations)
    top = report.recommendations[0]
    assert top.id == "py-dataset-workers"
    assert "workers=4" in top.fix and "class SlowImages(keras.utils.PyDataset)" in top.fix
    assert any(e.source == "profiler" and "bottleneck" in e.detail for e in top.evidence)


def test_datasets_an_interleave_opens_are_the_interleave():
    from keras_pipeline_tuner.pipeline.graph.model import Stage
    from keras_pipeline_tuner.pipeline.graph.model import StageFunction
    from keras_pipeline_tuner.profiling.evidence import rank_iterators

    interleave = Stage(
        node="InterleaveDataset/_3",
        op="InterleaveDataset",
        kind="interleave",
        function=StageFunction(name="read_file", graph_name="read_file_12"),
    )
    table = {
        "cols": [{"id": "opName"}, {"id": "count"}, {"id": "timeInMs"}, {"id": "selfTimeInMs"}],
        "rows": [
            {"c": [{"v": name}, {"v": 10}, {"v": ms}, {"v": ms}]}
            for name, ms in (
                ("Iterator::Root::Interleave", 5.0),
                ("Iterator::Root::Interleave[0]::Map", 60.0),
                ("Iterator::Root::Interleave[0]::Map::TFRecord", 2.0),
            )
        ],
    }
    ranked = rank_iterators(
        table,
        {"Iterator::Root::Interleave": "InterleaveDataset:3"},
        {"InterleaveDataset:3": interleave},
    )
    assert [it.stage for it in ranked] == [interleave.label] * 3
    assert {it.stage_node for it in ranked} == {"InterleaveDataset/_3"}


def test_a_custom_loop_over_large_arrays_names_its_map(tmp_path):
    # 21 MB of arrays: inspected and named over stand-ins, not copied.
    x = np.zeros((2600, 2048), np.float32)
    model = keras.Sequential([keras.Input((2048,)), keras.layers.Dense(1)])
    tuner = kpt.PipelineTuner(log_dir=tmp_path, verbose=0, profile=(2, 10))

    def load_rows(x):
        def slow_identity(value):
            time.sleep(DELAY_S)
            return value

        x = tf.py_function(slow_identity, [x], tf.float32)
        x.set_shape((2048,))
        return x

    @tuner.instrument
    @tf.function
    def train_step(batch):
        return tf.reduce_sum(model(batch))

    for batch in tuner.iterate(
        tf.data.Dataset.from_tensor_slices(x).map(load_rows).batch(2).take(14)
    ):
        train_step(batch)
    report = tuner.close()
    assert "cache-missing" in [finding.id for finding in report.findings]
    assert not any("not inspected" in note for note in report.notes)
    assert report.profile is not None, report.notes
    assert report.profile.bottleneck == "map(load_rows)", report.profile.iterators
