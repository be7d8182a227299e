"""kpt.inspect: lint a tf.data pipeline against the tf.data performance guide.

No model and no training: the pipeline's graph is read and checked in
milliseconds. The pipeline below has three classic mistakes: a Python map run
one element at a time, a cache placed after a random augmentation (every epoch
then sees the same "random" images: an error, not only a slowdown) and no
prefetch at the end. Each finding names the stage, says why it matters and gives
the code to write instead.

Run it as is:

    python examples/inspect_only.py
"""

import numpy as np
import tensorflow as tf

import keras_pipeline_tuner as kpt


def load_example(index):
    # Python code in the pipeline: TensorFlow cannot run it in parallel unless asked.
    rng = np.random.default_rng(int(index))
    return rng.random((32, 32, 3), dtype=np.float32)


def load(index):
    image = tf.py_function(load_example, [index], tf.float32)
    image.set_shape((32, 32, 3))
    return image


def augment(image):
    return tf.image.random_flip_left_right(image)


dataset = (
    tf.data.Dataset.range(256)
    .map(load)
    .map(augment)
    .cache()
    .batch(32)
)

findings = kpt.inspect(dataset)
print(findings)
ids = sorted({finding.id for finding in findings})
print("Finding ids:", ", ".join(ids))
