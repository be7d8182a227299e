"""Training with the tuner equals training without it, bit for bit, on unknown-length data.

On a dataset whose length TensorFlow cannot know (`from_generator`, `filter`, TFRecord
files), every epoch ends with a failing fetch. With one step per call Keras' own loop
counts one more optimizer iteration per epoch there (the step's counter update races the
failing fetch), which moves Adam's bias correction, learning-rate schedules and gradient
accumulation: the tuner's timed step has to do exactly the same.
"""

import random
import time

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_pipeline_tuner as kpt
from tests.helpers.training_data import Sleep

FEATURES = 8
ELEMENTS = 20


def _elements():
    for i in range(ELEMENTS):
        yield np.full((FEATURES,), i % 7, np.float32) / 7, np.float32(i % 2)


def _from_generator(tmp_path):
    return tf.data.Dataset.from_generator(
        _elements,
        output_signature=(
            tf.TensorSpec((FEATURES,), tf.float32),
            tf.TensorSpec((), tf.float32),
        ),
    )


def _filtered(tmp_path):
    x = np.arange(ELEMENTS * 2 * FEATURES, dtype=np.float32).reshape(-1, FEATURES) / 100
    y = np.arange(ELEMENTS * 2, dtype=np.float32) % 2
    # Every other element: 20 of 40, a length TensorFlow cannot know in advance.
    return tf.data.Dataset.from_tensor_slices((x, y)).filter(lambda x, y: y > 0.5)


def _tfrecord(tmp_path):
    path = str(tmp_path / "data.tfrecord")
    with tf.io.TFRecordWriter(path) as writer:
        for x, y in _elements():
            example = tf.train.Example(
                features=tf.train.Features(
                    feature={
                        "x": tf.train.Feature(float_list=tf.train.FloatList(value=x)),
                        "y": tf.train.Feature(float_list=tf.train.FloatList(value=[y])),
                    }
                )
            )
            writer.write(example.SerializeToString())
    spec = {
        "x": tf.io.FixedLenFeature([FEATURES], tf.float32),
        "y": tf.io.FixedLenFeature([], tf.float32),
    }

    def parse(record):
        parsed = tf.io.parse_single_example(record, spec)
        return parsed["x"], parsed["y"]

    return tf.data.TFRecordDataset(path).map(parse)


def _adam():
    return keras.optimizers.Adam(0.01)


def _schedule():
    return keras.optimizers.SGD(
        keras.optimizers.schedules.ExponentialDecay(0.05, decay_steps=2, decay_rate=0.5)
    )


def _accumulation():
    return keras.optimizers.Adam(0.01, gradient_accumulation_steps=4)


def _train(source, optimizer, steps_per_execution, with_tuner, tmp_path):
    keras.utils.set_random_seed(3)
    model = keras.Sequential(
        [keras.Input((FEATURES,)), keras.layers.Dense(4), keras.layers.Dense(1)]
    )
    model.compile(optimizer=optimizer(), loss="mse", steps_per_execution=steps_per_execution)
    callbacks = [kpt.PipelineTuner(verbose=0, profile="off")] if with_tuner else []
    dataset = source(tmp_path).batch(8)
    assert dataset.cardinality() == tf.data.UNKNOWN_CARDINALITY
    history = model.fit(dataset, epochs=3, callbacks=callbacks, verbose=0)
    return int(model.optimizer.iterations.numpy()), history.history, model.get_weights()


@pytest.mark.filterwarnings("ignore:Your input ran out of data")
@pytest.mark.parametrize("steps_per_execution", [1, 3])
@pytest.mark.parametrize(
    "source, optimizer",
    [
        (_from_generator, _adam),
        (_filtered, _schedule),
        (_tfrecord, _accumulation),
    ],
    ids=["from_generator-adam", "filter-lr_schedule", "tfrecord-accumulation"],
)
def test_unknown_length_trains_as_plain_keras(source, optimizer, steps_per_execution, tmp_path):
    plain_iterations, plain_history, plain_weights = _train(
        source, optimizer, steps_per_execution, False, tmp_path
    )
    tuned_iterations, tuned_history, tuned_weights = _train(
        source, optimizer, steps_per_execution, True, tmp_path
    )
    assert tuned_iterations == plain_iterations
    assert tuned_history == plain_history
    for plain, tuned in zip(plain_weights, tuned_weights):
        np.testing.assert_array_equal(plain, tuned)


def _fits_in_a_row(with_tuner, tmp_path):
    keras.utils.set_random_seed(3)
    model = keras.Sequential(
        [keras.Input((FEATURES,)), keras.layers.Dense(4), keras.layers.Dense(1)]
    )
    model.compile(optimizer=_schedule(), loss="mse")
    dataset = _from_generator(tmp_path).batch(8)
    histories = []
    for index in range(3):
        # The middle fit has no tuner: Keras' own function trains between
        # the two that reuse one timed function.
        tuned = with_tuner and index != 1
        callbacks = [kpt.PipelineTuner(verbose=0, profile="off")] if tuned else []
        histories.append(model.fit(dataset, epochs=2, callbacks=callbacks, verbose=0).history)
    return int(model.optimizer.iterations.numpy()), histories, model.get_weights()


@pytest.mark.filterwarnings("ignore:Your input ran out of data")
def test_fits_in_a_row_train_as_plain_keras_with_the_timed_step_reused(tmp_path):
    plain_iterations, plain_histories, plain_weights = _fits_in_a_row(False, tmp_path)
    tuned_iterations, tuned_histories, tuned_weights = _fits_in_a_row(True, tmp_path)
    assert tuned_iterations == plain_iterations
    assert tuned_histories == plain_histories
    for plain, tuned in zip(plain_weights, tuned_weights):
        np.testing.assert_array_equal(plain, tuned)


def _two_fits(with_tuner, **tuner_kwargs):
    """Two fits on one shuffled dataset object: the second sees the order the first left."""
    keras.utils.set_random_seed(5)
    x = np.linspace(0, 1, 64 * FEATURES, dtype=np.float32).reshape(64, FEATURES)
    y = (x.sum(axis=1) > FEATURES / 2).astype(np.float32)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(64, seed=0).batch(4)
    # A few ms of compute a step: a healthy job, which gets the contention check.
    model = keras.Sequential([keras.Input((FEATURES,)), Sleep(0.004), keras.layers.Dense(1)])
    model.compile(optimizer=_adam(), loss="mse")
    # A budget a busy machine cannot exhaust: the check must run to be tested.
    tuner = kpt.PipelineTuner(verbose=0, profile="off", cost_budget_s=30, **tuner_kwargs)
    callbacks = [tuner] if with_tuner else []
    model.fit(dataset, epochs=2, callbacks=callbacks, verbose=0)
    ran = callbacks[0].report.what_if if callbacks else None
    history = model.fit(dataset, epochs=2, verbose=0)
    return history.history, model.get_weights(), ran


@pytest.mark.parametrize(
    "tuner_kwargs", [{}, {"what_if": True}], ids=["contention-check", "what-if"]
)
def test_a_replay_after_fit_leaves_the_next_fits_shuffle_order_alone(
    tuner_kwargs, contention_cap_raised
):
    # The replay after fit passes over the training data: on the dataset itself
    # it would move the shuffle's seed on, and the next fit would train on
    # another order.
    plain_history, plain_weights, _ = _two_fits(False)
    history, weights, replay = _two_fits(True, **tuner_kwargs)
    assert replay is not None, "no replay ran: the test checks nothing"
    assert history == plain_history
    for got, expected in zip(weights, plain_weights):
        np.testing.assert_array_equal(got, expected)


def _load_drawing(x, y):
    def load(value):
        # Python that draws from the global generators, as user code may.
        np.random.random()
        random.random()
        time.sleep(0.004)
        return value

    x = tf.py_function(load, [x], tf.float32)
    x.set_shape((FEATURES,))
    return x, y


def _train_then_draw(with_tuner):
    keras.utils.set_random_seed(5)
    x = np.arange(48 * FEATURES, dtype=np.float32).reshape(-1, FEATURES) / 400
    y = np.arange(48, dtype=np.float32) % 2
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).map(_load_drawing).batch(4)
    model = keras.Sequential(
        [keras.Input((FEATURES,)), keras.layers.Dense(4), keras.layers.Dense(1)]
    )
    model.compile(optimizer=_adam(), loss="mse")
    tuner = None
    if with_tuner:
        tuner = kpt.PipelineTuner(
            verbose=0, profile="off", measure_fixes=3.0, allow_unverified=True
        )
    history = model.fit(dataset, epochs=2, callbacks=[tuner] if tuner else [], verbose=0)
    draws = (
        random.random(),
        float(np.random.random()),
        float(tf.random.uniform(())),
        float(keras.random.uniform(())),
    )
    state = (int(model.optimizer.iterations.numpy()), history.history, model.get_weights())
    return state, draws, tuner


def test_timing_the_fixes_after_fit_changes_nothing_of_the_training():
    (plain_iterations, plain_history, plain_weights), plain_draws, _ = _train_then_draw(False)
    (iterations, history, weights), draws, tuner = _train_then_draw(True)
    # The pipeline ran again after fit to time the fixes (or the test would
    # prove nothing): timed, or run and then out of budget on a busy machine.
    statements = [
        r.expected_gain.statement for r in tuner.report.recommendations if r.expected_gain
    ]
    assert any(
        "Timed after training" in text or "The change was not timed (not measured" in text
        for text in statements
    ), (statements, tuner.report.judgement.line, tuner.report.notes)
    # ... and the model, its optimizer and every random generator are as without it.
    assert iterations == plain_iterations
    assert history == plain_history
    for plain, tuned in zip(plain_weights, weights):
        np.testing.assert_array_equal(plain, tuned)
    assert draws == plain_draws


# Bytes of each element's padding in the large pipeline: 72 MB in all, over
# what a rebuild or a copy of the pipeline would serialise.
_PADDING = 3 * 2**18


def _train_on_shuffled_arrays(with_tuner, large=False):
    keras.utils.set_random_seed(7)
    x = np.linspace(0, 1, 96 * FEATURES, dtype=np.float32).reshape(96, FEATURES)
    y = (x.sum(axis=1) > FEATURES / 2).astype(np.float32)
    # Keras' own dataset over the arrays, or the user's over a large source.
    data = dict(x=x, y=y, batch_size=4, shuffle=True)
    if large:
        padding = np.zeros((96, _PADDING), np.uint8)
        source = tf.data.Dataset.from_tensor_slices((x, y, padding))
        dataset = source.shuffle(96).map(lambda x, y, padding: (x, y)).batch(4)
        data = dict(x=dataset)
    # 20 ms of compute a step: a healthy job even where a busy machine makes
    # the fetch take milliseconds, so the wait never decides and the check runs.
    model = keras.Sequential(
        [
            keras.Input((FEATURES,)),
            Sleep(0.02),
            keras.layers.Dense(8),
            keras.layers.Dropout(0.3),
            keras.layers.Dense(1),
        ]
    )
    model.compile(optimizer=_adam(), loss="mse")
    tuner = kpt.PipelineTuner(verbose=0, profile="off", cost_budget_s=30) if with_tuner else None
    # Two fits: the second shuffles and drops out as it would have after the first.
    histories = [
        model.fit(**data, epochs=2, verbose=0, callbacks=[tuner] if tuner else []).history
        for _ in range(2)
    ]
    draws = (
        random.random(),
        float(np.random.random()),
        float(tf.random.uniform(())),
        float(keras.random.uniform(())),
    )
    state = (int(model.optimizer.iterations.numpy()), histories, model.get_weights())
    return state, draws, tuner


@pytest.mark.parametrize("large", [False, True], ids=["arrays", "large-source"])
def test_the_contention_check_on_shuffled_arrays_changes_nothing_of_the_training(
    contention_cap_raised, large
):
    # The check runs whatever the load, and what it might change is what is
    # checked. The large source (72 MB) is read over stand-ins, and the
    # check's copy of the reshuffling pipeline is rebuilt over the real
    # arrays, not copied.
    (plain_iterations, plain_histories, plain_weights), plain_draws, _ = _train_on_shuffled_arrays(
        False, large
    )
    (iterations, histories, weights), draws, tuner = _train_on_shuffled_arrays(True, large)
    # The check ran, on the dataset Keras built from the arrays: its replay
    # measured the fetch of a batch already in memory.
    what_if = tuner.report.what_if
    assert what_if is not None and what_if.rounds, tuner.report.notes
    assert tuner.report.judgement.fetch_floor_ms == what_if.replay_input_wait.mean_ms
    assert iterations == plain_iterations
    assert histories == plain_histories
    for plain, tuned in zip(plain_weights, weights):
        np.testing.assert_array_equal(plain, tuned)
    assert draws == plain_draws


def _train_timing_python(with_tuner):
    """A fit whose input is the user's Python: a generator and a py_function map."""
    counted = {"generator": 0, "map": 0}

    def elements():
        for x, y in _elements():
            counted["generator"] += 1
            yield x, y

    def scale(x):
        counted["map"] += 1
        return x * np.float32(0.5)

    def load(x, y):
        x = tf.py_function(scale, [x], tf.float32)
        x.set_shape((FEATURES,))
        return x, y

    dataset = tf.data.Dataset.from_generator(
        elements,
        output_signature=(
            tf.TensorSpec((FEATURES,), tf.float32),
            tf.TensorSpec((), tf.float32),
        ),
    ).map(load).batch(4)
    keras.utils.set_random_seed(11)
    model = keras.Sequential(
        [keras.Input((FEATURES,)), keras.layers.Dense(4), keras.layers.Dense(1)]
    )
    model.compile(optimizer=_adam(), loss="mse")
    tuner = kpt.PipelineTuner(verbose=0, profile="off") if with_tuner else None
    history = model.fit(dataset, epochs=2, callbacks=[tuner] if tuner else [], verbose=0)
    state = (int(model.optimizer.iterations.numpy()), history.history, model.get_weights())
    return state, counted, tuner


@pytest.mark.filterwarnings("ignore:Your input ran out of data")
def test_timing_the_users_python_changes_nothing_of_the_training():
    (plain_iterations, plain_history, plain_weights), plain_counted, _ = _train_timing_python(
        False
    )
    (iterations, history, weights), counted, tuner = _train_timing_python(True)
    # The calls were timed (or the test would prove nothing) ...
    timed = {t.source: t.calls for t in tuner.report.user_calls if t.per_element}
    assert timed == {"generator next": 2 * ELEMENTS, "tf.py_function": 2 * ELEMENTS}
    # ... each made once, as without the tuner, and training is the same.
    assert counted == plain_counted
    assert iterations == plain_iterations
    assert history == plain_history
    for plain, tuned in zip(plain_weights, weights):
        np.testing.assert_array_equal(plain, tuned)
