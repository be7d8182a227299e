"""An image pipeline over files on disk, in the order the tf.data guide recommends.

list_files -> parallel decode map (TensorFlow ops, no Python) -> cache -> shuffle
-> batch -> random augmentation map -> prefetch. `kpt.inspect` finds nothing to
warn about, and the tuner prints how much of each epoch's step time still went to
input: after the first epoch the decoded images come from the cache, so what is
left is the cost of shuffling, batching and augmenting. The images are synthetic
JPEG files of circles and squares written to a temporary directory first; point
`pattern` at your own files instead.

Run it as is:

    python examples/image_pipeline.py

Set KPT_EXAMPLE_QUICK=1 for a run of a few seconds.
"""

import os
import tempfile

import keras
import tensorflow as tf

import keras_pipeline_tuner as kpt
from keras_pipeline_tuner.demo import write_images

QUICK = os.environ.get("KPT_EXAMPLE_QUICK") == "1"
IMAGES = 512 if QUICK else 1024
EPOCHS = 3 if QUICK else 5
SIZE = 64
CLASSES = ["circle", "square"]


def decode(path):
    # TensorFlow ops only: tf.data runs them in parallel, outside the GIL.
    image = tf.io.decode_jpeg(tf.io.read_file(path), channels=3)
    image = tf.image.resize(image, (SIZE, SIZE)) / 255.0
    folder = tf.strings.split(path, os.sep)[-2]
    label = tf.cast(tf.equal(folder, CLASSES[1]), tf.int32)
    return image, label


def augment(images, labels):
    # Random, so after the cache: every epoch sees fresh flips.
    return tf.image.random_flip_left_right(images), labels


pattern = write_images(tempfile.mkdtemp(prefix="kpt-images-"), IMAGES)
dataset = (
    tf.data.Dataset.list_files(pattern, shuffle=False)
    .map(decode, num_parallel_calls=tf.data.AUTOTUNE)
    .cache()
    .shuffle(IMAGES, seed=0)
    .batch(32)
    .map(augment, num_parallel_calls=tf.data.AUTOTUNE)
    .prefetch(tf.data.AUTOTUNE)
)

findings = kpt.inspect(dataset)
print(findings)

model = keras.Sequential(
    [
        keras.Input((SIZE, SIZE, 3)),
        # A model that computes for about 100 ms a step on two cores: next to
        # it, the cached pipeline's shuffling, batching and flipping cost about
        # 1-2 % of the step, well clear of the 5 % line between classes. (With
        # 64 filters it computes 40 ms and the input's share sits on that line.)
        keras.layers.Conv2D(32, 3, activation="relu"),
        keras.layers.Conv2D(128, 3, strides=2, activation="relu"),
        keras.layers.Conv2D(128, 3, activation="relu"),
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(len(CLASSES), activation="softmax"),
    ]
)
model.compile("adam", "sparse_categorical_crossentropy", metrics=["accuracy"])
tuner = kpt.PipelineTuner(log_dir="logs/image_pipeline")
model.fit(dataset, epochs=EPOCHS, callbacks=[tuner], verbose=2)
# The profiler window's evidence may still be converting when fit returns.
report = tuner.wait_for_profile()
print(
    "Warnings or errors:", len(findings.of_severity("warning")) + len(findings.of_severity("error"))
)
# Each epoch judged by the run's rule (its first steps out, the wait a fetch
# of a ready batch takes out); the run's verdict may leave one out (a first
# epoch that fills a cache), and says why.
for epoch in report.figures.epochs:
    if epoch.kind == "train":
        left_out = f"; {epoch.left_out}" if epoch.left_out else ""
        print(
            f"Epoch {epoch.epoch + 1}: {epoch.input_fraction:.0%} of step time is input "
            f"({epoch.verdict.value}{left_out}), step {epoch.step.median_ms:.1f} ms (median)"
        )
