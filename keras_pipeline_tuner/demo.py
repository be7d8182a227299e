"""`keras-pipeline-tuner demo`: a slow image pipeline diagnosed, tuned and measured.

Everything is made locally: a few hundred synthetic JPEG files of coloured shapes,
and the input pipeline a newcomer writes (a Python decode map run one image at a
time, a random flip, no prefetch). A small CNN trains on it with `PipelineTuner`,
which says how much of each step waits for input and what to change; `kpt.tune`
then rewrites that pipeline, checks it yields the same images, and the CNN trains
again on the tuned pipeline, so the speed-up is measured, not promised.
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
        tuned_report: the tuner's `Report` for the pipeline `kpt.tune` returned.
        tune_result: the `TuneResult` of `kpt.tune`.
        speedup: mean training step time on the naive pipeline over that on
            the tuned one (every step after the first, input wait included).
    """

    log_dir: str
    naive_report: object
    tuned_report: object
    tune_result: object
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


def load_image(path):
    """Decodes one file with Pillow inside `tf.py_function`: opaque to tf.data."""
    import tensorflow as tf

    image, label = tf.py_function(_load_with_pillow, [path], (tf.float32, tf.int32))
    image.set_shape((IMAGE_SIZE, IMAGE_SIZE, 3))
    label.set_shape(())
    return image, label


def random_flip(image, label):
    """A random augmentation: it must never be cached."""
    import tensorflow as tf

    return tf.image.random_flip_left_right(image, seed=0), label


def naive_pipeline(pattern: str, batch_size: int):
    """The pipeline as first written: sequential Python decode, no prefetch.

    Args:
        pattern: glob of the image files (from `write_images`).
        batch_size: images per batch.

    Returns:
        A `tf.data.Dataset` of `(images, labels)` batches.
    """
    import tensorflow as tf

    files = tf.data.Dataset.list_files(pattern, shuffle=False)
    return files.map(load_image).map(random_flip).batch(batch_size)


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


def run_demo(
    log_dir: Optional[str] = None, quick: bool = False, console: Optional[Console] = None
) -> DemoResult:
    """Runs the demo end to end and prints what it finds.

    Args:
        log_dir: where to write logs; a new temporary directory by default.
        quick: fewer images, epochs and tuning time (a smoke test, ~20 s).
        console: a `rich.console.Console` to print to; standard output by default.

    Returns:
        A `DemoResult`.

    Example:

    ```python
    result = run_demo(quick=True)
    print(f"{result.speedup:.2f}x")
    ```
    """
    from keras_pipeline_tuner._util.tf_import import tensorflow

    tensorflow()
    import keras

    from keras_pipeline_tuner.run.tuner import PipelineTuner
    from keras_pipeline_tuner.pipeline.tuning import tune
    from keras_pipeline_tuner.outputs.dashboard.summaries import write_tune_result
    from keras_pipeline_tuner.outputs.terminal import verdict_line

    console = console or Console(highlight=False, soft_wrap=True)
    log_dir = log_dir or tempfile.mkdtemp(prefix="kpt-demo-")
    images, epochs, batch_size, budget_s = (80, 2, 16, 12) if quick else (384, 3, 16, 40)
    data_dir = os.path.join(log_dir, "images")
    with console.status(f"Writing {images} synthetic JPEG files to {data_dir} ..."):
        pattern = write_images(data_dir, images)

    console.rule("1/3  Training on the pipeline as first written")
    naive = naive_pipeline(pattern, batch_size)
    naive_tuner = PipelineTuner(log_dir=os.path.join(log_dir, "naive"), verbose=1)
    keras.utils.set_random_seed(0)
    small_cnn().fit(naive, epochs=epochs, callbacks=[naive_tuner], verbose=2, shuffle=False)
    naive_report = naive_tuner.report

    console.rule("2/3  kpt.tune: rewriting the pipeline and timing each rewrite")
    compute_s = (naive_report.train.compute.median_ms or 0.0) / 1e3
    # The loader runs Python (Pillow) and keeps no state: running it on several
    # threads is safe, which tune cannot prove by itself.
    tuned, tune_result = tune(
        naive, consumer_step_s=compute_s, budget_s=budget_s, allow_unverified=True
    )
    console.print(f"Original: {tune_result.pipeline}")
    console.print(f"Tuned:    {tune_result.tuned_pipeline}")
    for outcome in tune_result.rewrites:
        if outcome.status != "not applicable":
            console.print(f"  {outcome.kind}: {outcome.status} ({outcome.reason})")

    console.rule("3/3  Training on the tuned pipeline")
    tuned_tuner = PipelineTuner(log_dir=os.path.join(log_dir, "tuned"), verbose=1)
    keras.utils.set_random_seed(0)
    small_cnn().fit(tuned, epochs=epochs, callbacks=[tuned_tuner], verbose=2, shuffle=False)
    tuned_report = tuned_tuner.report
    # Beside the tuned run, for the Input pipeline tab.
    write_tune_result(os.path.join(log_dir, "tuned"), tune_result)

    before, after = naive_report.train.step.mean_ms, tuned_report.train.step.mean_ms
    speedup = before / after
    console.rule("Result")
    console.print(f"Naive pipeline: {verdict_line(naive_report)}")
    console.print(f"Tuned pipeline: {verdict_line(tuned_report)}")
    console.print(
        f"[bold]Speed-up: {speedup:.2f}x[/bold] (mean training step {before:.1f} ms -> "
        f"{after:.1f} ms, measured in the two fits above)"
    )
    console.print(
        f"View the logs: tensorboard --logdir {log_dir}  (the Input pipeline tab puts the "
        "two runs side by side)"
    )
    naive_dir, tuned_dir = os.path.join(log_dir, "naive"), os.path.join(log_dir, "tuned")
    console.print(f"Print a report again: keras-pipeline-tuner report {naive_dir}")
    console.print(f"Compare the runs: keras-pipeline-tuner compare {naive_dir} {tuned_dir}")
    return DemoResult(log_dir, naive_report, tuned_report, tune_result, speedup)
