"""A custom training loop timed by keras-pipeline-tuner.

The loop is the one of TensorFlow's "Writing a training loop from scratch" guide:
a `tf.function` train step called from a Python `for` over a `tf.data` dataset.
Two lines hook the tuner in: `@tuner.instrument` on the step, and
`tuner.iterate(dataset)` around the dataset. The dataset decodes its examples
with a slow Python function, one at a time and without prefetch, so the tuner
finds the loop input-bound and says what to change.

Run it as is:

    python examples/custom_loop.py

Set KPT_EXAMPLE_QUICK=1 for a run of a few seconds. The report goes to
logs/custom_loop (`keras-pipeline-tuner report logs/custom_loop` prints it
again; `tensorboard --logdir logs/custom_loop` shows it).
"""

import os
import time

import keras
import numpy as np
import tensorflow as tf

import keras_pipeline_tuner as kpt

QUICK = os.environ.get("KPT_EXAMPLE_QUICK") == "1"
EXAMPLES = 128 if QUICK else 2048
EPOCHS = 1 if QUICK else 3
BATCH_SIZE = 16
DECODE_DELAY_S = 0.002


def decode(index):
    # Stands in for reading and decoding one image in Python (e.g. with PIL).
    time.sleep(DECODE_DELAY_S)
    rng = np.random.default_rng(int(index))
    return rng.random((28, 28), dtype=np.float32), np.int64(rng.integers(10))


def make_dataset() -> tf.data.Dataset:
    def load(index):
        image, label = tf.numpy_function(decode, [index], (tf.float32, tf.int64))
        image.set_shape((28, 28))
        label.set_shape(())
        return image, label

    return tf.data.Dataset.range(EXAMPLES).map(load).batch(BATCH_SIZE)


def main() -> None:
    model = keras.Sequential(
        [
            keras.Input((28, 28)),
            keras.layers.Flatten(),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(10),
        ]
    )
    optimizer = keras.optimizers.Adam(1e-3)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    accuracy = keras.metrics.SparseCategoricalAccuracy()
    tuner = kpt.PipelineTuner(log_dir=os.path.join("logs", "custom_loop"))

    @tuner.instrument
    @tf.function
    def train_step(x, y):
        with tf.GradientTape() as tape:
            logits = model(x, training=True)
            loss = loss_fn(y, logits)
        grads = tape.gradient(loss, model.trainable_weights)
        optimizer.apply(grads, model.trainable_weights)
        accuracy.update_state(y, logits)
        return loss

    dataset = make_dataset()
    # Leaving the block closes the tuner: the report is written and summarised.
    with tuner:
        for epoch in range(EPOCHS):
            for x, y in tuner.iterate(dataset):
                loss = train_step(x, y)
            print(f"Epoch {epoch}: loss {float(loss):.3f}, accuracy {float(accuracy.result()):.3f}")
            accuracy.reset_state()

    report = tuner.report
    print(
        f"Verdict: {report.verdict.value} "
        f"({report.input_fraction:.0%} of step time waits for input)"
    )


if __name__ == "__main__":
    main()
