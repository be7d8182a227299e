"""keras.io's data-augmentation recipe, small: Keras random layers in a tf.data map, a small CNN."""

import keras
import numpy as np
import tensorflow as tf

from tests.helpers.training_data import Sleep

SIZE = 16
BATCH = 32


def augmentation_recipe(
    images: int = 512,
    parallel: bool = True,
    check: bool = False,
    shuffle: bool = True,
    compute_s: float = 0.0,
):
    """`(model, dataset, seed_state)` as in keras.io's recipe, on random images.

    `RandomFlip` and `RandomRotation` applied in the dataset's `map` (each
    keeps its seed in a variable every call moves on), a shuffle (unless
    `shuffle=False`), a prefetch, and a small CNN; `compute_s` adds a
    sleep to each step (a known compute cost). `check` adds `tf.debugging`
    assertions to the map (ops that change no state). `seed_state()` reads
    the layers' seed variables.
    Call `keras.utils.set_random_seed` first for the same draws every time.
    """
    rng = np.random.default_rng(0)
    x = rng.random((images, SIZE, SIZE, 3), dtype=np.float32)
    y = rng.integers(0, 2, images).astype(np.float32)
    augmentation = [keras.layers.RandomFlip("horizontal"), keras.layers.RandomRotation(0.1)]

    def augment(batch, labels):
        if check:
            batch = tf.debugging.assert_all_finite(batch, "images must be finite")
            tf.debugging.assert_greater_equal(tf.reduce_min(batch), 0.0)
        for layer in augmentation:
            batch = layer(batch)
        return batch, labels

    dataset = tf.data.Dataset.from_tensor_slices((x, y))
    if shuffle:
        dataset = dataset.shuffle(images, seed=1)
    dataset = dataset.batch(BATCH)
    calls = tf.data.AUTOTUNE if parallel else None
    dataset = dataset.map(augment, num_parallel_calls=calls).prefetch(tf.data.AUTOTUNE)
    sleep = [Sleep(compute_s)] if compute_s else []
    model = keras.Sequential(
        [
            keras.Input((SIZE, SIZE, 3)),
            *sleep,
            keras.layers.Conv2D(16, 3, activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Conv2D(32, 3, activation="relu"),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(1),
        ]
    )
    model.compile("adam", keras.losses.BinaryCrossentropy(from_logits=True))

    def seed_state():
        return [variable.numpy().tolist() for layer in augmentation for variable in layer.variables]

    return model, dataset, seed_state
