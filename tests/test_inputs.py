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
            lambda: (tf.data.Dataset.from_tensor_slices(({"a": X[:, :4], "b": X[:, 4:]}, Y)).batch(4),),
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
    dataset = tf.data.Dataset.from_tensor_slices(((ragged,), Y)).map(
        lambda nested, target: (nested[0], target)
    ).ragged_batch(4)
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
