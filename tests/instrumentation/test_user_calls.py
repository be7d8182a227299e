"""The user's own Python calls, timed during training where fit makes them (TensorFlow backend).

Each delay is a sleep that dominates its call, so the figures hold on a busy
machine; counts are compared with what the user's own function counted, with
the tuner and without it. After fit, everything the timing replaced is back.
"""

import json
import threading
import time

import keras
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.ops import script_ops

import keras_pipeline_tuner as kpt
from keras_pipeline_tuner._util import features
from keras_pipeline_tuner.instrumentation import fit_input
from keras_pipeline_tuner.instrumentation import user_calls
from keras_pipeline_tuner.instrumentation.user_calls import UserCallTimer
from keras_pipeline_tuner.instrumentation.user_calls import UserCallTiming
from keras_pipeline_tuner.outputs.markdown import render_markdown
from keras_pipeline_tuner.outputs.terminal import user_calls_line

FEATURES = 8
REGISTRY_CALL = script_ops.FuncRegistry.__dict__["__call__"]


def _model():
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    return model


def _tuner():
    # Nothing of the tuner's own after training: only the calls fit made count.
    return kpt.PipelineTuner(verbose=0, profile="off", what_if=False, check_contention=False)


def _registry_restored():
    return script_ops.FuncRegistry.__dict__["__call__"] is REGISTRY_CALL


def _sleeping_generator(elements, delay_s, counted):
    def gen():
        for i in range(elements):
            counted["calls"] += 1
            time.sleep(delay_s)
            yield np.full((FEATURES,), i % 5, np.float32), np.float32(i % 2)

    return tf.data.Dataset.from_generator(
        gen,
        output_signature=(
            tf.TensorSpec((FEATURES,), tf.float32),
            tf.TensorSpec((), tf.float32),
        ),
    )


def _fit_generator(with_tuner):
    counted = {"calls": 0}
    dataset = _sleeping_generator(12, 0.02, counted).batch(3)
    tuner = _tuner() if with_tuner else None
    history = _model().fit(dataset, epochs=1, callbacks=[tuner] if tuner else [], verbose=0)
    return counted["calls"], history.history, tuner


@pytest.mark.filterwarnings("ignore:Your input ran out of data")
def test_a_from_generator_is_timed_per_element_as_fit_reads_it():
    plain_calls, plain_history, _ = _fit_generator(False)
    calls, history, tuner = _fit_generator(True)
    assert _registry_restored()
    # The generator ran as often as without the tuner: nothing called it again.
    assert calls == plain_calls == 12
    assert history == plain_history
    timed = {t.source: t for t in tuner.report.user_calls}
    element = timed[user_calls.GENERATOR_NEXT]
    assert (element.stage, element.function) == ("from_generator()", "gen")
    assert element.calls == 12
    assert 18 <= element.wall_ms <= 60 and 18 <= element.wall_ms_median <= 60
    # Sleeping takes no CPU.
    assert element.cpu_ms < element.wall_ms / 2
    assert element.threads >= 1
    # 4 batches of 3.
    assert element.per_batch_calls == pytest.approx(3.0)
    # The generator's start and end are once per pass, apart from its elements.
    start, end = timed[user_calls.GENERATOR_START], timed[user_calls.GENERATOR_END]
    assert not start.per_element and not end.per_element
    assert start.per_batch_calls is None and start.calls == 1


def _load(counted):
    def f(x):
        counted["calls"] += 1
        time.sleep(0.01)
        return x

    def load(x, y):
        x = tf.py_function(f, [x], tf.float32)
        x.set_shape((FEATURES,))
        return x, y

    return load


def test_a_py_function_in_a_map_is_named_as_the_lint_names_its_stage():
    counted = {"calls": 0}
    x = np.zeros((16, FEATURES), np.float32)
    y = np.zeros((16,), np.float32)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).map(_load(counted)).batch(4)
    tuner = _tuner()
    _model().fit(dataset, epochs=1, callbacks=[tuner], verbose=0)
    assert _registry_restored()
    (timing,) = tuner.report.user_calls
    lint_stages = {finding.stage for finding in tuner.report.findings}
    assert timing.stage == "map(load)" and timing.stage in lint_stages
    assert (timing.function, timing.source) == ("f", user_calls.PY_FUNCTION)
    assert timing.calls == counted["calls"] == 16
    assert 9 <= timing.wall_ms_median <= 50
    assert timing.per_batch_calls == pytest.approx(4.0)


class CountingPyDataset(keras.utils.PyDataset):
    """Batches whose `__getitem__` sleeps 15 ms and counts its calls."""

    def __init__(self, batches=6, delay_s=0.015, **kwargs):
        super().__init__(**kwargs)
        self.batches, self.delay_s = batches, delay_s
        self.calls = 0
        self._lock = threading.Lock()

    def __len__(self):
        return self.batches

    def __getitem__(self, index):
        with self._lock:
            self.calls += 1
        time.sleep(self.delay_s)
        values = np.full((4, FEATURES), index, np.float32) / 10
        return values, values[:, 0]


class _AdapterSeen(keras.callbacks.Callback):
    """Keeps Keras' data adapter of the fit, and what it holds at the end of training."""

    def on_train_begin(self, logs=None):
        self.adapter = fit_input.data_adapter(self.model)

    def on_train_end(self, logs=None):
        self.held_at_end = self.adapter.py_dataset


def _fit_py_dataset(with_tuner, workers):
    data = CountingPyDataset(workers=workers)
    before = dict(vars(data))
    seen = _AdapterSeen()
    callbacks = ([_tuner()] if with_tuner else []) + [seen]
    model = _model()
    history = model.fit(data, epochs=2, callbacks=callbacks, verbose=0)
    return data, before, seen, history.history, model.get_weights(), callbacks[0]


@pytest.mark.parametrize("workers", [1, 2], ids=["inline", "threads"])
def test_a_py_dataset_is_timed_through_keras_adapter_and_left_untouched(workers):
    plain, _, _, plain_history, plain_weights, _ = _fit_py_dataset(False, workers)
    data, before, seen, history, weights, tuner = _fit_py_dataset(True, workers)
    (timing,) = tuner.report.user_calls
    assert timing.function == "CountingPyDataset.__getitem__"
    assert timing.source == user_calls.GET_ITEM
    assert timing.stage.startswith("PyDataset(")
    # Each epoch's 6 batches, timed; Keras' own reads before the fit began
    # (its element spec) are not, and happen with or without the tuner.
    assert timing.calls == 12
    assert data.calls == plain.calls
    assert 14 <= timing.wall_ms_median <= 60
    # Keras' adapter holds the user's own object again, which is as it was.
    assert seen.adapter.py_dataset is data
    assert seen.held_at_end is data
    assert type(data).__getitem__ is CountingPyDataset.__getitem__
    assert {k: v for k, v in vars(data).items() if k != "calls"} == {
        k: v for k, v in before.items() if k != "calls"
    }
    # Training is bit for bit what it is without the tuner.
    assert history == plain_history
    for got, expected in zip(weights, plain_weights):
        np.testing.assert_array_equal(got, expected)


def test_a_py_dataset_in_processes_is_not_timed_and_the_report_says_why():
    timer = UserCallTimer()
    data = CountingPyDataset(workers=2, use_multiprocessing=True)
    from keras.src.trainers.data_adapters.py_dataset_adapter import PyDatasetAdapter

    adapter = PyDatasetAdapter(data)
    timer.begin(adapter=adapter)
    assert adapter.py_dataset is data
    assert timer.end() == []
    assert any("use_multiprocessing=True" in note for note in timer.notes)


@pytest.mark.filterwarnings("ignore:Your input ran out of data")
def test_a_fit_that_fails_in_the_generator_puts_the_registry_back():
    def gen():
        for i in range(8):
            if i == 5:
                raise ValueError("a corrupt record")
            yield np.zeros((FEATURES,), np.float32), np.float32(0)

    dataset = tf.data.Dataset.from_generator(
        gen,
        output_signature=(tf.TensorSpec((FEATURES,), tf.float32), tf.TensorSpec((), tf.float32)),
    ).batch(1)
    tuner = _tuner()
    with pytest.raises(tf.errors.InvalidArgumentError):
        _model().fit(dataset, epochs=1, callbacks=[tuner], verbose=0)
    assert _registry_restored()
    (timing,) = [t for t in tuner.report.user_calls if t.per_element]
    assert timing.calls == 5


class _RaiseAtBatch(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        if batch == 2:
            raise RuntimeError("another callback")


@pytest.mark.filterwarnings("ignore:Your input ran out of data")
def test_a_fit_ended_by_another_callback_has_the_registry_put_back_soon_after():
    # No tuner hook runs when another callback raises: the timer sees that
    # its fit is gone at the next timed call a second later.
    counted = {"calls": 0}
    dataset = _sleeping_generator(40, 0.0, counted).batch(2)
    with pytest.raises(RuntimeError):
        _model().fit(dataset, epochs=1, callbacks=[_tuner(), _RaiseAtBatch()], verbose=0)
    time.sleep(1.1)
    next(iter(dataset))
    assert _registry_restored()


@pytest.mark.filterwarnings("ignore:Your input ran out of data")
def test_a_failure_while_timing_turns_the_feature_off_and_training_goes_on(monkeypatch):
    def broken():
        raise OSError("no thread id")

    monkeypatch.setattr(user_calls, "_get_ident", broken)
    counted = {"calls": 0}
    dataset = _sleeping_generator(8, 0.0, counted).batch(2)
    tuner = _tuner()
    history = _model().fit(dataset, epochs=2, callbacks=[tuner], verbose=0)
    assert len(history.history["loss"]) == 2
    assert counted["calls"] == 16
    assert _registry_restored()
    assert not tuner.guard.enabled(features.USER_CALLS)
    assert tuner.report.user_calls == []
    assert any(features.USER_CALLS in note for note in tuner.report.notes)


def test_the_timer_leaves_other_datasets_calls_alone_and_costs_microseconds():
    counted = {"calls": 0}
    timed = tf.data.Dataset.range(4).map(
        lambda x: tf.numpy_function(lambda v: v, [x], tf.int64)
    )
    untimed = tf.data.Dataset.from_tensor_slices(
        (np.zeros((4, FEATURES), np.float32), np.zeros((4,), np.float32))
    ).map(_load(counted))
    timer = UserCallTimer()
    timer.begin(dataset=timed)
    list(untimed.as_numpy_iterator())
    list(timed.as_numpy_iterator())
    (timing,) = timer.end()
    assert timing.calls == 4 and timing.source == user_calls.NUMPY_FUNCTION
    assert counted["calls"] == 4
    assert _registry_restored()
    # A stand-in's cost per call: far below a millisecond whatever the load.
    tally = user_calls._Tally("s", "f", "x", True, print)
    stand_in = user_calls._TimedIterator(iter(range(20_000)), tally)
    began = time.perf_counter()
    for _ in stand_in:
        pass
    assert (time.perf_counter() - began) / 20_000 < 50e-6
    assert tally.timing().calls == 20_000


def test_a_large_in_memory_source_is_not_copied_to_find_the_python_calls(monkeypatch):
    # 4 MB of arrays: the graph is read over a one-element stand-in, whose
    # map holds the same function, so the same token.
    from keras_pipeline_tuner.pipeline.graph import reader

    copied = []
    graph_def_of = reader.graph_def_of
    monkeypatch.setattr(
        reader, "graph_def_of", lambda ds, *a, **k: copied.append(ds) or graph_def_of(ds, *a, **k)
    )
    counted = {"calls": 0}
    x = np.zeros((2**17, FEATURES), np.float32)
    dataset = tf.data.Dataset.from_tensor_slices((x, x[:, 0])).map(_load(counted)).take(8)
    timer = UserCallTimer()
    timer.begin(dataset=dataset)
    list(dataset.as_numpy_iterator())
    (timing,) = timer.end()
    assert (timing.stage, timing.function, timing.calls) == ("map(load)", "f", 8)
    (read,) = copied
    assert read is not dataset
    # A pipeline the lint read and found no Python in is not read again.
    plain = tf.data.Dataset.from_tensor_slices(x).batch(4)
    linted = reader.read_pipeline(plain, 2**20)
    before = len(copied)
    timer = UserCallTimer()
    timer.begin(dataset=plain, pipeline=linted)
    assert timer.end() == [] and len(copied) == before


def test_the_report_keeps_the_timings_through_json_and_shows_them():
    timing = UserCallTiming(
        stage="map(load)", function="decode_jpeg", source=user_calls.PY_FUNCTION,
        calls=64, wall_ms=12.5, wall_ms_median=12.0, cpu_ms=11.0, threads=2,
        per_batch_calls=8.0,
    )
    report = kpt.Report(user_calls=[timing])
    report.train.steps = 10
    report.train.step.median_ms = 110.0
    again = kpt.Report.from_json(report.to_json())
    assert again.user_calls == [timing]
    assert json.loads(report.to_json())["user_calls"][0]["wall_ms_median"] == 12.0
    markdown = render_markdown(again)
    assert "### Your Python, timed during training" in markdown
    assert "| `map(load)` | `decode_jpeg` | tf.py\\_function | 64 | 12.50 / 12.00 |" in markdown
    line = user_calls_line(again)
    assert line is not None and "decode_jpeg" in line and "100.0 ms a batch" in line
    assert "timed during training" in line
    # A small share of the step is not worth a line.
    report.train.step.median_ms = 1000.0
    assert user_calls_line(report) is None
