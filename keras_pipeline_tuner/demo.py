"""`keras-pipeline-tuner demo`: a slow image pipeline diagnosed, fixed and measured.

Everything is made locally: a few hundred synthetic JPEG files of coloured shapes,
the input pipeline a newcomer writes (a sequential, Python-bound decode map and no
prefetch), a small CNN trained with `PipelineTuner`, then the pipeline written the
way the tf.data performance guide recommends, trained again, and both measured.
"""

import dataclasses
import os
import tempfile
from typing import Optional

import numpy as np
from rich.console import Console

IMAGE_SIZE = 64
SOURCE_SIZE = 192
CLASSES = ("circle", "square")


@dataclasses.dataclass
class DemoResult:
    """What the demo measured.

    Attributes:
        log_dir: where the TensorBoard logs and reports were written.
        naive_report: the tuner's `Report` for the naive pipeline.
        fixed_report: the tuner's `Report` for the fixed pipeline.
        speedup: median step time of the naive run over the fixed run.
    """

    log_dir: str
    naive_report: object
    fixed_report: object
    speedup: float


def write_images(directory: str, count: int, seed: int = 0) -> str:
    """Writes `count` JPEG files of circles and squares, labelled by folder.

    Args:
        directory: where to write; `<directory>/<class>/<n>.jpg`.
        count: number of images.
        seed: random seed.

    Returns:
        A glob pattern matching the files.
    """
    from PIL import Image

    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[:SOURCE_SIZE, :SOURCE_SIZE]
    for index in range(count):
        label = CLASSES[index % 2]
        os.makedirs(os.path.join(directory, label), exist_ok=True)
        image = rng.integers(0, 60, size=(SOURCE_SIZE, SOURCE_SIZE, 3), dtype=np.uint8)
        cy, cx = rng.integers(SOURCE_SIZE // 4, 3 * SOURCE_SIZE // 4, size=2)
        radius = rng.integers(SOURCE_SIZE // 8, SOURCE_SIZE // 4)
        if label == "circle":
            mask = (yy - cy) ** 2 + (xx - cx) ** 2 < radius**2
        else:
            mask = (abs(yy - cy) < radius) & (abs(xx - cx) < radius)
        image[mask] = rng.integers(120, 256, size=3, dtype=np.uint8)
        Image.fromarray(image).save(os.path.join(directory, label, f"{index}.jpg"), quality=90)
    return os.path.join(directory, "*", "*.jpg")


def _load_with_pillow(path):
    # What many newcomers write: Python image code, so tf.data cannot run it in
    # parallel unless asked (it holds the GIL and is opaque to TF).
    from PIL import Image
    from PIL import ImageFilter

    path = path.numpy().decode()
    image = Image.open(path).convert("RGB").filter(ImageFilter.GaussianBlur(1))
    image = image.resize((IMAGE_SIZE, IMAGE_SIZE))
    label = CLASSES.index(os.path.basename(os.path.dirname(path)))
    return np.asarray(image, np.float32) / 255.0, np.int32(label)


def naive_pipeline(pattern: str, batch_size: int):
    """The pipeline as first written: sequential Python decode, no prefetch."""
    import tensorflow as tf

    def load_image(path):
        image, label = tf.py_function(_load_with_pillow, [path], (tf.float32, tf.int32))
        image.set_shape((IMAGE_SIZE, IMAGE_SIZE, 3))
        label.set_shape(())
        return image, label

    files = tf.data.Dataset.list_files(pattern, shuffle=True, seed=0)
    return files.map(load_image).batch(batch_size)


def fixed_pipeline(pattern: str, batch_size: int):
    """The same data the guide's way: parallel decode, cache, shuffle, batch, prefetch."""
    import tensorflow as tf

    def load_image(path):
        image, label = tf.py_function(_load_with_pillow, [path], (tf.float32, tf.int32))
        image.set_shape((IMAGE_SIZE, IMAGE_SIZE, 3))
        label.set_shape(())
        return image, label

    files = tf.data.Dataset.list_files(pattern, shuffle=False)
    return (
        files.map(load_image, num_parallel_calls=tf.data.AUTOTUNE)
        .cache()
        .shuffle(256, seed=0)
        .batch(batch_size)
        .prefetch(tf.data.AUTOTUNE)
    )


def small_cnn():
    """A small CNN for 64x64 RGB images and two classes."""
    import keras

    model = keras.Sequential(
        [
            keras.Input((IMAGE_SIZE, IMAGE_SIZE, 3)),
            keras.layers.Conv2D(8, 3, strides=2, activation="relu"),
            keras.layers.Conv2D(16, 3, strides=2, activation="relu"),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(len(CLASSES), activation="softmax"),
        ]
    )
    model.compile("adam", "sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def run_demo(log_dir: Optional[str] = None, quick: bool = False, console: Optional[Console] = None) -> DemoResult:
    """Runs the demo end to end and prints what it finds.

    Args:
        log_dir: where to write logs; a new temporary directory by default.
        quick: fewer images and epochs (for a smoke test, about 20 s).
        console: a `rich.console.Console` to print to; standard output by default.

    Returns:
        A `DemoResult`.

    Example:

    ```python
    result = run_demo(quick=True)
    print(result.speedup)
    ```
    """
    from keras_pipeline_tuner.tf_import import tensorflow

    tensorflow()
    import keras

    from keras_pipeline_tuner.pipeline_tuner import PipelineTuner
    from keras_pipeline_tuner.terminal_summary import verdict_line

    console = console or Console(highlight=False, soft_wrap=True)
    log_dir = log_dir or tempfile.mkdtemp(prefix="kpt-demo-")
    images, epochs, batch_size = (128, 2, 16) if quick else (384, 3, 16)
    data_dir = os.path.join(log_dir, "images")
    with console.status(f"Writing {images} synthetic JPEG files to {data_dir} ..."):
        pattern = write_images(data_dir, images)
    console.print(f"[bold]1/2[/bold] Training on the naive pipeline ({epochs} epochs) ...")
    keras.utils.set_random_seed(0)
    naive_tuner = PipelineTuner(log_dir=os.path.join(log_dir, "naive"), verbose=1)
    small_cnn().fit(
        naive_pipeline(pattern, batch_size),
        epochs=epochs,
        callbacks=[naive_tuner],
        verbose=2,
        shuffle=False,
    )
    console.print(f"[bold]2/2[/bold] Training on the fixed pipeline ({epochs} epochs) ...")
    keras.utils.set_random_seed(0)
    fixed_tuner = PipelineTuner(log_dir=os.path.join(log_dir, "fixed"), verbose=0)
    small_cnn().fit(
        fixed_pipeline(pattern, batch_size),
        epochs=epochs,
        callbacks=[fixed_tuner],
        verbose=2,
        shuffle=False,
    )
    naive, fixed = naive_tuner.report, fixed_tuner.report
    speedup = naive.train.step.median_ms / fixed.train.step.median_ms
    console.print(f"Naive pipeline: {verdict_line(naive)}")
    console.print(f"Fixed pipeline: {verdict_line(fixed)}")
    console.print(
        f"[bold]Speed-up: {speedup:.2f}x[/bold] (median step {naive.train.step.median_ms:.1f} ms "
        f"-> {fixed.train.step.median_ms:.1f} ms)"
    )
    console.print(f"View the logs: tensorboard --logdir {log_dir}")
    return DemoResult(log_dir, naive, fixed, speedup)
