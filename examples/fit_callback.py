"""model.fit with PipelineTuner: is this job waiting for its input?

A small model trained on a tf.data pipeline whose source reads one record at a
time from a slow (simulated) disk, with no prefetch. One callback measures every
step's input wait and compute and ends the fit with a verdict and advice.

Run it as is:

    python examples/fit_callback.py

Set KPT_EXAMPLE_QUICK=1 for a run of a few seconds. The report goes to
logs/fit_callback: `keras-pipeline-tuner report logs/fit_callback` prints it
again, `tensorboard --logdir logs/fit_callback` shows it.
"""

import os
import time

import keras
import numpy as np
import tensorflow as tf

import keras_pipeline_tuner as kpt

QUICK = os.environ.get("KPT_EXAMPLE_QUICK") == "1"
RECORDS = 256 if QUICK else 2048
EPOCHS = 2 if QUICK else 4
READ_DELAY_S = 0.002


def read_records():
    # Stands in for reading one record from slow storage.
    rng = np.random.default_rng(0)
    for _ in range(RECORDS):
        time.sleep(READ_DELAY_S)
        x = rng.normal(size=16).astype(np.float32)
        yield x, np.float32(x.sum() > 0)


dataset = tf.data.Dataset.from_generator(
    read_records,
    output_signature=(tf.TensorSpec((16,), tf.float32), tf.TensorSpec((), tf.float32)),
).batch(16)

model = keras.Sequential(
    [
        keras.Input((16,)),
        keras.layers.Dense(32, activation="relu"),
        keras.layers.Dense(1, activation="sigmoid"),
    ]
)
model.compile("adam", "binary_crossentropy", metrics=["accuracy"])

tuner = kpt.PipelineTuner(log_dir="logs/fit_callback")
model.fit(dataset, epochs=EPOCHS, callbacks=[tuner], verbose=2)

# The profiler window's evidence may still be converting when fit returns.
report = tuner.wait_for_profile()
print(f"Verdict: {report.verdict.value} ({report.input_fraction:.0%} of step time is input wait)")
for recommendation in report.recommendations[:3]:
    print(f"- {recommendation.title}")
