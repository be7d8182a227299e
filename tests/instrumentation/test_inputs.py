"""Every kind of input Keras accepts is measured, or the report says why not; never an exception."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_pipeline_tuner as kpt

X = np.ones((32, 8), np.float32)
Y = np.ones((32, 1), np.float32)


def dense_model(shape=(8,), **input_kwargs):
    model = keras.Sequential([keras.Input(shape, **input_kwargs), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    return model


def fit(model, *args, **kwargs):
    tuner = kpt.PipelineTuner(verbose=0, profile="off")
    history = model.fit(*args, callbacks=[tuner], verbose=0, **kwargs)
    return tuner.report, history


class FourBatches(keras.utils.PyDataset):
    def __len__(self):
        return 4

    def __getitem__(self, index):
        return X[:4], Y[:4]


def batches():
    for _ in range(4):
        yield X[:4], Y[:4]


@pytest.mark.parametrize(
    "name, make_args, kwargs, steps",
    [
        ("numpy arrays", lambda: (X, Y), {"batch_size": 4}, 7),
        ("PyDataset", lambda: (FourBatches(),), {}, 3),
        ("generator", lambda: (batches(),), {}, 3),
        (
            "dict elements",
            lambda: (
                tf.data.Dataset.from_tensor_slices(({"a": X[:, :4], "b": X[:, 4:]}, Y)).batch(4),
            ),
            {},
            7,
        ),
        (
            "infinite dataset with steps_per_epoch",
            lambda: (tf.data.Dataset.from_tensor_slices((X, Y)).batch(4).repeat(),),
            {"steps_per_epoch": 5, "epochs": 2},
            9,
        ),
    ],
)
def test_inputs_are_measured_in_step(name, make_args, kwargs, steps):
    if name == "dict elements":
        inputs = {"a": keras.Input((4,), name="a"), "b": keras.Input((4,), name="b")}
        merged = keras.layers.Concatenate()([inputs["a"], inputs["b"]])
        model = keras.Model(inputs, keras.layers.Dense(1)(merged))
        model.compile("sgd", "mse")
    else:
        model = dense_model()
    kwargs.setdefault("epochs", 1)
    report, history = fit(model, *make_args(), **kwargs)
    assert report.measurement == "in-step", name
    assert report.train.steps == steps, name
    assert report.input_fraction is not None
    assert len(history.history["loss"]) == kwargs["epochs"]


def test_sparse_elements():
    sparse = tf.sparse.from_dense(X)
    dataset = tf.data.Dataset.from_tensor_slices((sparse, Y)).batch(4)
    report, _ = fit(dense_model(sparse=True), dataset, epochs=1)
    assert report.measurement == "in-step"
    assert report.train.steps == 7


class RaggedSum(keras.Model):
    """Sums each ragged row, then a Dense layer: a custom train_step on ragged batches."""

    def __init__(self):
        super().__init__()
        self.dense = keras.layers.Dense(1)

    def call(self, inputs):
        return self.dense(inputs)

    def train_step(self, data):
        ragged, target = data
        summed = tf.reduce_sum(ragged, axis=1, keepdims=True)
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((self(summed) - target) ** 2)
        gradients = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply(gradients, self.trainable_variables)
        return {"loss": loss}


def test_ragged_nested_elements_with_a_custom_train_step():
    ragged = tf.ragged.constant([[1.0, 2.0], [3.0], [4.0, 5.0, 6.0], [7.0]] * 8)
    dataset = (
        tf.data.Dataset.from_tensor_slices(((ragged,), Y))
        .map(lambda nested, target: (nested[0], target))
        .ragged_batch(4)
    )
    model = RaggedSum()
    model.compile("sgd")
    report, history = fit(model, dataset, epochs=1)
    assert report.measurement == "in-step"
    assert report.train.steps == 7
    assert np.isfinite(history.history["loss"][0])


def test_zero_length_dataset_is_stated_not_raised():
    empty = tf.data.Dataset.from_tensor_slices((X, Y)).take(0).batch(4)
    report, _ = fit(dense_model(), empty, epochs=1)
    assert report.train.steps == 0
    assert report.verdict is kpt.Verdict.UNKNOWN
    assert any("No training step was measured" in note for note in report.notes)
    kpt.Report.from_json(report.to_json())


# Pipelines with ops the lint has no rule for, built as users build them.
def _ignore_errors():
    x = X.copy()
    x[::5] = np.inf  # every fifth element fails check_numerics and is dropped
    checked = tf.data.Dataset.from_tensor_slices((x, Y)).map(
        lambda x, y: (tf.debugging.check_numerics(x, "bad record"), y)
    )
    return checked.ignore_errors().batch(4)


def _choose_from_datasets():
    plain = tf.data.Dataset.from_tensor_slices((X, Y)).batch(4)
    doubled = tf.data.Dataset.from_tensor_slices((X * 2, Y)).batch(4)
    choice = tf.data.Dataset.range(2).repeat(4)
    return tf.data.Dataset.choose_from_datasets([plain, doubled], choice)


def _snapshot(tmp_path):
    return tf.data.Dataset.from_tensor_slices((X, Y)).batch(4).snapshot(str(tmp_path / "snap"))


def _raw_ops_stage():
    # A stage made with tf.raw_ops, which no tf.data method builds.
    batched = tf.data.Dataset.from_tensor_slices((X, Y)).batch(4)
    variant = tf.raw_ops.SleepDataset(
        input_dataset=batched._variant_tensor,  # pylint: disable=protected-access
        sleep_microseconds=tf.constant(100, tf.int64),
        output_types=[tf.float32, tf.float32],
        output_shapes=[[None, 8], [None, 1]],
    )
    return tf.data.experimental.from_variant(variant, batched.element_spec)


def _py_function_source_of_unknown_shape():
    def load(index):
        return np.full(8, float(index.numpy()), np.float32), np.ones(1, np.float32)

    indices = tf.data.Dataset.range(32)
    return indices.map(lambda i: tf.py_function(load, [i], [tf.float32, tf.float32])).batch(4)


class EnsuresShapes(RaggedSum):
    """The Dense model above; its train_step gives the batches the shapes the pipeline does not."""

    def train_step(self, data):
        x, y = data
        shaped = (tf.ensure_shape(x, (None, 8)), tf.ensure_shape(y, (None, 1)))
        return keras.Model.train_step(self, shaped)  # Keras' own, not RaggedSum's


@pytest.mark.parametrize(
    "make, steps",
    [
        (lambda tmp_path: _ignore_errors(), 13),
        (lambda tmp_path: _choose_from_datasets(), 15),
        (_snapshot, 15),
        (lambda tmp_path: _raw_ops_stage(), 15),
        (lambda tmp_path: _py_function_source_of_unknown_shape(), 15),
    ],
    ids=["ignore_errors", "choose_from_datasets", "snapshot", "raw_ops", "py_function-shape"],
)
def test_pipelines_with_ops_the_lint_does_not_know(make, steps, tmp_path, caplog):
    dataset = make(tmp_path)
    kpt.inspect(dataset)
    model = EnsuresShapes()
    model.compile("sgd", "mse")
    tuner = kpt.PipelineTuner(log_dir=tmp_path / "logs", verbose=0, profile=(1, 4))
    with caplog.at_level("WARNING", logger="keras_pipeline_tuner"):
        history = model.fit(dataset, epochs=2, callbacks=[tuner], verbose=0)
        report = tuner.wait_for_profile()
    assert len(history.history["loss"]) == 2
    assert not [r for r in caplog.records if r.name == "keras_pipeline_tuner"], caplog.text
    assert report.measurement == "in-step"
    assert report.train.steps == steps
    assert report.input_fraction is not None
    assert report.profile is not None and report.profile.steps, report.notes
    stored = kpt.Report.from_json((tmp_path / "logs" / "report.json").read_text())
    assert stored.train.steps == steps
