"""`keras-pipeline-tuner demo`: a slow image pipeline diagnosed, tuned and measured.

Everything is made locally: a few hundred synthetic JPEG files of coloured shapes,
read with the latency of network storage, and the input pipeline a newcomer
writes (shuffled file names, a Python decode map run one image at a time, a
random flip, no prefetch). A small CNN learns to tell
circles from squares on it with `PipelineTuner`, which says how much of each step
waits for input and what to change; `kpt.tune` then rewrites that pipeline, timing
each rewrite and keeping only those that are faster, and the CNN trains again on
the tuned pipeline. The speed-up printed is the steady-state step time of the two
fits, and it is credited only to the rewrites `kpt.tune` kept.
"""

import dataclasses
import os
import tempfile
import time
from typing import Optional

import numpy as np
from rich.console import Console
from rich.text import Text

IMAGE_SIZE = 64
SOURCE_SIZE = 192
CLASSES = ("circle", "square")
# What reading one file from network storage (a bucket, a network file system)
# costs before any decoding: latency, not CPU, so the naive pipeline waits for
# it on any machine however fast its model computes, and threads overlap it.
READ_LATENCY_S = 0.008


@dataclasses.dataclass
class DemoResult:
    """What the demo measured.

    Attributes:
        log_dir: where the TensorBoard logs and reports were written.
        naive_report: the tuner's `Report` for the naive pipeline.
        tuned_report: the tuner's `Report` for the pipeline `kpt.tune` returned,
            or `None` when it kept no rewrite (that pipeline is the naive one,
            which is not trained on twice).
        tune_result: the `TuneResult` of `kpt.tune`.
        speedup: steady-state training step time (the median step of the last
            epoch, input wait included) on the naive pipeline over that on the
            tuned one; `None` when `kpt.tune` kept no rewrite (the two fits ran
            the same pipeline, so any difference is not the tuning's).
        accuracy: training accuracy of the last epoch of the tuned fit (of the
            naive one when there is no tuned fit).
    """

    log_dir: str
    naive_report: object
    tuned_report: object
    tune_result: object
    speedup: Optional[float]
    accuracy: Optional[float] = None


def write_images(directory: str, count: int, seed: int = 0) -> str:
    """Writes `count` JPEG files of circles and squares, labelled by name.

    Args:
        directory: where to write; `<directory>/<n>-<class>.jpg`, so that the
            files listed in order alternate between the classes.
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
        os.makedirs(directory, exist_ok=True)
        image = rng.integers(0, 60, size=(SOURCE_SIZE, SOURCE_SIZE, 3), dtype=np.uint8)
        cy, cx = rng.integers(SOURCE_SIZE // 4, 3 * SOURCE_SIZE // 4, size=2)
        radius = rng.integers(SOURCE_SIZE // 8, SOURCE_SIZE // 4)
        if label == "circle":
            mask = (yy - cy) ** 2 + (xx - cx) ** 2 < radius**2
        else:
            mask = (abs(yy - cy) < radius) & (abs(xx - cx) < radius)
        image[mask] = rng.integers(120, 256, size=3, dtype=np.uint8)
        Image.fromarray(image).save(
            os.path.join(directory, f"{index:05d}-{label}.jpg"), quality=90
        )
    return os.path.join(directory, "*.jpg")


def _load_with_pillow(path):
    # What many newcomers write: Python image code, so tf.data cannot run it in
    # parallel unless asked (it holds the GIL and is opaque to TF).
    from PIL import Image
    from PIL import ImageFilter

    path = path.numpy().decode()
    time.sleep(READ_LATENCY_S)
    image = Image.open(path).convert("RGB").filter(ImageFilter.GaussianBlur(1))
    image = image.resize((IMAGE_SIZE, IMAGE_SIZE))
    label = CLASSES.index(os.path.splitext(os.path.basename(path))[0].split("-")[-1])
    # Pixels stay bytes, as decoders give them: a quarter of the memory to
    # cache, shuffle and batch; the model rescales them.
    return np.asarray(image, np.uint8), np.int32(label)


def load_image(path):
    """Decodes one file with Pillow inside `tf.py_function`: opaque to tf.data."""
    import tensorflow as tf

    image, label = tf.py_function(_load_with_pillow, [path], (tf.uint8, tf.int32))
    image.set_shape((IMAGE_SIZE, IMAGE_SIZE, 3))
    label.set_shape(())
    return image, label


# Examples the shuffle mixes: a few batches' worth.
SHUFFLE_BUFFER = 32


def random_flip(images, labels):
    """A random augmentation of a batch, each image flipped or not: never to be cached."""
    import tensorflow as tf

    return tf.image.random_flip_left_right(images, seed=0), labels


def naive_pipeline(pattern: str, batch_size: int):
    """The pipeline as first written: sequential Python decode, no prefetch.

    Args:
        pattern: glob of the image files (from `write_images`).
        batch_size: images per batch.

    Returns:
        A `tf.data.Dataset` of `(images, labels)` batches.
    """
    import tensorflow as tf

    # The guide's order: decode, shuffle the examples every epoch, augment,
    # batch. Listed in order the files alternate between the classes, and the
    # shuffle mixes them further.
    files = tf.data.Dataset.list_files(pattern, shuffle=False)
    # The flip runs on whole batches: one op a batch, not one an image.
    images = files.map(load_image).shuffle(SHUFFLE_BUFFER, seed=0)
    return images.batch(batch_size).map(random_flip)


def small_cnn():
    """A small CNN for 64x64 RGB images and two classes."""
    import keras

    # Max pooling keeps where the edges are (corners or none), which averaging
    # blurs away: with it the shapes are told apart within two epochs. The
    # first convolution runs at full resolution so that a step computes for
    # tens of milliseconds, as real models do: then a tuned pipeline keeps
    # ahead of the model, and the few tenths of a millisecond any fetch costs
    # are not most of the step.
    model = keras.Sequential(
        [
            keras.Input((IMAGE_SIZE, IMAGE_SIZE, 3)),
            keras.layers.Rescaling(1 / 255),
            keras.layers.Conv2D(64, 5, activation="relu"),
            keras.layers.MaxPooling2D(2),
            keras.layers.Conv2D(32, 3, activation="relu"),
            keras.layers.GlobalMaxPooling2D(),
            keras.layers.Dense(len(CLASSES), activation="softmax"),
        ]
    )
    model.compile(
        keras.optimizers.Adam(0.01), "sparse_categorical_crossentropy", metrics=["accuracy"]
    )
    return model


def run_demo(
    log_dir: Optional[str] = None, quick: bool = False, console: Optional[Console] = None
) -> DemoResult:
    """Runs the demo end to end and prints what it finds.

    Args:
        log_dir: where to write logs; a new temporary directory by default.
        quick: fewer images, epochs and tuning time (a smoke test, ~30 s).
        console: a `rich.console.Console` to print to; standard output by default.

    Returns:
        A `DemoResult`.

    Example:

    ```python
    result = run_demo(quick=True)
    print(result.speedup, result.accuracy)
    ```
    """
    from keras_pipeline_tuner._util.tf_import import tensorflow

    tensorflow()
    from keras_pipeline_tuner.outputs.dashboard.summaries import write_tune_result

    console = console or Console(highlight=False, soft_wrap=True)
    log_dir = log_dir or tempfile.mkdtemp(prefix="kpt-demo-")
    images, epochs, batch_size, budget_s = (160, 3, 16, 20) if quick else (384, 3, 16, 40)
    tune_batches = 3 if quick else 6
    data_dir = os.path.join(log_dir, "images")
    with console.status(f"Writing {images} synthetic JPEG files to {data_dir} ..."):
        pattern = write_images(data_dir, images)

    console.rule("1/3  Training on the pipeline as first written")
    naive = naive_pipeline(pattern, batch_size)
    naive_history, naive_report = _train(naive, os.path.join(log_dir, "naive"), epochs, console)

    console.rule("2/3  kpt.tune: rewriting the pipeline and timing each rewrite")
    compute_s = (naive_report.train.compute.median_ms or 0.0) / 1e3
    tuned, tune_result = _tune(naive, compute_s, budget_s, tune_batches, console)

    if not tune_result.applied:
        # The same pipeline again: a second fit could only tell noise apart
        # from nothing (and, near a class boundary, read another class).
        from keras_pipeline_tuner.outputs.terminal import verdict_line

        console.rule("3/3  Skipped: kpt.tune kept no rewrite")
        console.print(f"Naive pipeline: {verdict_line(naive_report)}")
        console.print(
            "[bold]No speed-up to report:[/bold] kpt.tune kept no rewrite (none was measured "
            "faster), so the tuned pipeline is the one trained on above; training on it "
            "again would measure the same pipeline twice."
        )
        accuracy = _last(naive_history.history.get("accuracy"))
        console.print(f"View the logs: tensorboard --logdir {log_dir}")
        return DemoResult(log_dir, naive_report, None, tune_result, None, accuracy)

    console.print(_top_against_tune(naive_report, tune_result, epochs))

    console.rule("3/3  Training on the tuned pipeline")
    tuned_history, tuned_report = _train(tuned, os.path.join(log_dir, "tuned"), epochs, console)
    # Beside the tuned run, for the Input pipeline tab.
    write_tune_result(os.path.join(log_dir, "tuned"), tune_result)

    console.rule("Result")
    speedup = _print_speedup(naive_report, tuned_report, tune_result, console)
    accuracy = _last(tuned_history.history.get("accuracy"))
    console.print(
        f"Accuracy (training, last epoch): naive pipeline "
        f"{_format(_last(naive_history.history.get('accuracy')))}, tuned pipeline "
        f"{_format(accuracy)} (chance: {1 / len(CLASSES):.2f})"
    )
    console.print(
        f"View the logs: tensorboard --logdir {log_dir}  (the Input pipeline tab puts the "
        "two runs side by side)"
    )
    naive_dir, tuned_dir = os.path.join(log_dir, "naive"), os.path.join(log_dir, "tuned")
    console.print(f"Print the reports again: keras-pipeline-tuner report {log_dir}")
    console.print(f"Compare the runs: keras-pipeline-tuner compare {naive_dir} {tuned_dir}")
    return DemoResult(log_dir, naive_report, tuned_report, tune_result, speedup, accuracy)


def _train(dataset, log_dir: str, epochs: int, console: Optional[Console] = None):
    """Fits a fresh model on `dataset` with a tuner: `(history, report)`, its profile joined."""
    import keras

    from keras_pipeline_tuner.run.tuner import PipelineTuner

    tuner = PipelineTuner(log_dir=log_dir, verbose=1)
    keras.utils.set_random_seed(0)
    # shuffle=False: the pipeline shuffles its files itself (Keras only warns).
    history = small_cnn().fit(dataset, epochs=epochs, callbacks=[tuner], verbose=2, shuffle=False)
    # Fit does not wait for the profiler window's conversion: when the summary
    # above could not show it, the evidence is shown once it has joined.
    pending = tuner.report.profile_pending
    report = tuner.wait_for_profile()
    if pending and report.profile is not None and console is not None:
        console.print(Text(report.profile.summary()))
    return history, report


def _tune(naive, compute_s: float, budget_s: float, batches: int, console: Console):
    """Runs `kpt.tune` on the naive pipeline and prints what it did: `(tuned, result)`."""
    from keras_pipeline_tuner.pipeline.tune.tuning import tune

    # Passes of one epoch of a few batches, not whole epochs: every rewrite
    # gets measured side by side within the budget instead of the budget
    # running out (a cache is filled first by one untimed epoch). The loader
    # runs Python (Pillow) and keeps no state: running it on several threads
    # is safe, which tune cannot prove by itself.
    tuned, result = tune(
        naive,
        consumer_step_s=compute_s,
        budget_s=budget_s,
        epochs=1,
        num_batches=batches,
        allow_unverified=True,
    )
    console.print(f"Original: {result.pipeline}")
    console.print(f"Tuned:    {result.tuned_pipeline}")
    for outcome in result.rewrites:
        if outcome.status != "not applicable":
            console.print(f"  {outcome.kind}: {outcome.status} ({outcome.reason})")
    return tuned, result


def _print_speedup(naive_report, tuned_report, tune_result, console: Console) -> Optional[float]:
    """Prints the verdicts and the measured speed-up of the two fits; returns it."""
    from keras_pipeline_tuner.outputs.terminal import verdict_line

    console.print(f"Naive pipeline: {verdict_line(naive_report)}")
    console.print(f"Tuned pipeline: {verdict_line(tuned_report)}")
    before, after = steady_step_ms(naive_report), steady_step_ms(tuned_report)
    kept = tune_result.applied
    if before is None or after is None or after <= 0:
        return None
    speedup = before / after
    changes = "; ".join(f"{outcome.kind}: {outcome.change}" for outcome in kept)
    console.print(
        f"[bold]Speed-up: {speedup:.2f}x[/bold] (the step, the steady state's median: "
        f"{before:.2f} ms -> {after:.2f} ms, measured in the two fits above), from the "
        f"rewrites kpt.tune kept: {changes}"
    )
    return speedup


# The rewrite of `kpt.tune` that makes each recommendation's change.
_REWRITE_OF = {
    "sequential-map": "parallel-map",
    "sequential-interleave": "parallel-interleave",
    "fixed-parallelism": "autotune",
    "cache-missing": "cache",
    "missing-prefetch": "prefetch",
    "vectorize-map": "vectorize",
}


def _rewrite_of(recommendation) -> Optional[str]:
    """The `kpt.tune` rewrite that makes `recommendation`'s change, or `None`."""
    kind = _REWRITE_OF.get(recommendation.id)
    if kind is not None or recommendation.id != "bottleneck-stage":
        return kind
    if ".cache()" in recommendation.fix:
        return "cache"
    if "num_parallel_calls" in recommendation.fix and (recommendation.stage or "").startswith(
        "map("
    ):
        return "parallel-map"
    return None


def _top_against_tune(report, tune_result, epochs: int) -> str:
    """One line: the fit's top recommendation against the rewrite `kpt.tune` measured largest.

    The advice ranks changes by their figure over the fit (a cache's counts
    its filling epoch); `kpt.tune` times each rewrite on passes of its own.
    Said as the same change, or why the two differ.
    """
    from keras_pipeline_tuner.advice.recommendation import describe_gain

    speed = [r for r in report.recommendations if r.expected_gain is not None]
    measured = [o for o in tune_result.rewrites if o.speedup is not None and o.speedup > 1.0]
    if not speed or not measured:
        return "The fit's advice and kpt.tune's measurements name no common change to compare."
    top = speed[0]
    largest = max(measured, key=lambda outcome: outcome.speedup)
    figure = describe_gain(top.expected_gain)
    kinds = {_rewrite_of(top), *(_REWRITE_OF.get(also) for also in top.also)}
    tuned = f"{largest.kind} at {largest.stage}, {largest.speedup:.2f}x on its own passes"
    if largest.kind in kinds:
        counted = (
            f" (its figure is over this fit's {epochs} epochs, the first filling the cache at "
            "today's speed)"
            if largest.kind == "cache"
            else ""
        )
        return (
            f"The fit's top recommendation, {top.title} [{figure}]{counted}, is the change "
            f"kpt.tune measured largest: {tuned}."
        )
    return (
        f"The fit's top recommendation, {top.title} [{figure}], is not the change kpt.tune "
        f"measured largest ({tuned}): the advice ranks each change by its figure over this "
        f"fit's {epochs} epochs, kpt.tune by its own side-by-side passes."
    )


def steady_step_ms(report) -> Optional[float]:
    """The step of a fit, as every output shows it: the steady state's median.

    The first epoch holds one-off costs (tracing, a cache being filled), and
    each epoch's first steps a new iterator's: the steady state leaves them
    out (see `advice.figures`).

    Args:
        report: the tuner's `Report` of the fit.

    Returns:
        The median step time in ms, or `None` when no step was timed.
    """
    from keras_pipeline_tuner.outputs.report import figures_of

    return figures_of(report).step_ms


def _last(values):
    return float(values[-1]) if values else None


def _format(value) -> str:
    return "n/a" if value is None else f"{value:.2f}"
