"""The pipelines of the tf.data performance guide, rebuilt to measure and to lint.

TensorFlow's guide "Better performance with the tf.data API" teaches with one
artificial source (a generator that sleeps like a slow file) and a simulated
training loop. This module builds each of its cases, plus an image pipeline
over small synthetic image files, so tests, benchmarks and demos use the same
pipelines with known costs.

Example:

```python
from tests.helpers import guide_pipelines as guide

for case in guide.CASES.values():
    seconds = case.run()
    print(f"{case.name}: {seconds:.3f} s (guide: {case.guide_s} s)")
```
"""

import dataclasses
import os
import time
from typing import Callable
from typing import Dict
from typing import List

import numpy as np

from keras_pipeline_tuner._util.tf_import import tensorflow

# The guide's costs, in seconds.
OPEN_S = 0.03  # opening the artificial "file", once per iteration
READ_S = 0.015  # reading one record
MAP_S = 0.03  # the time-consuming map function, per element
STEP_S = 0.01  # one simulated training step


def artificial_source(
    num_samples: int = 3, open_s: float = OPEN_S, read_s: float = READ_S
):
    """The guide's artificial dataset: a slow generator, like a file on slow storage.

    Each iteration sleeps `open_s` once ("opening the file"), then `read_s`
    before each element ("reading a record").

    Args:
        num_samples: elements per iteration.
        open_s: seconds spent once when iteration starts.
        read_s: seconds spent before each element.

    Returns:
        A `tf.data.Dataset` of `num_samples` int64 vectors of shape (1,)
        holding 0, 1, 2, ...

    Example:

    >>> [int(x[0]) for x in artificial_source(3)]
    [0, 1, 2]
    """
    tf = tensorflow()
    if num_samples < 0 or open_s < 0 or read_s < 0:
        raise ValueError(
            "num_samples, open_s and read_s must be >= 0, got "
            f"{num_samples}, {open_s}, {read_s}."
        )

    def generator():
        time.sleep(open_s)
        for sample in range(num_samples):
            time.sleep(read_s)
            yield (sample,)

    return tf.data.Dataset.from_generator(
        generator, output_signature=tf.TensorSpec(shape=(1,), dtype=tf.int64)
    )


def mapped_function(sample):
    """The guide's time-consuming map: `MAP_S` of Python work, element unchanged.

    Args:
        sample: one element.

    Returns:
        `sample`, after a `tf.py_function` that sleeps `MAP_S` seconds.
    """
    tf = tensorflow()
    tf.py_function(lambda: time.sleep(MAP_S), [], ())
    return sample


def increment(x):
    """The guide's cheap user function for the vectorisation case: `x + 1`."""
    return x + 1


def open_artificial_source(_):
    """Interleave function of the guide: opens one more artificial source."""
    return artificial_source()


def _traced(function):
    # These functions have no Python control flow on tensors; converting them
    # with AutoGraph only logs warnings (generators, os.environ).
    return tensorflow().autograph.experimental.do_not_convert(function)


def naive():
    """Case "naive": the source alone (`artificial_source()`)."""
    return artificial_source()


def prefetched():
    """Case "prefetch": `artificial_source().prefetch(AUTOTUNE)`."""
    return artificial_source().prefetch(tensorflow().data.AUTOTUNE)


def sequential_interleave():
    """Case "sequential interleave": `range(2).interleave(open_artificial_source)`."""
    return tensorflow().data.Dataset.range(2).interleave(_traced(open_artificial_source))


def parallel_interleave():
    """Case "parallel interleave": the same with `num_parallel_calls=AUTOTUNE`."""
    tf = tensorflow()
    return tf.data.Dataset.range(2).interleave(
        _traced(open_artificial_source), num_parallel_calls=tf.data.AUTOTUNE
    )


def sequential_map():
    """Case "sequential map": `artificial_source().map(mapped_function)`."""
    return artificial_source().map(_traced(mapped_function))


def parallel_map():
    """Case "parallel map": the same with `num_parallel_calls=AUTOTUNE`."""
    tf = tensorflow()
    return artificial_source().map(
        _traced(mapped_function), num_parallel_calls=tf.data.AUTOTUNE
    )


def cache_after_map():
    """Case "cache": `artificial_source().map(mapped_function).cache()`.

    The expensive map runs in the first epoch only.
    """
    return artificial_source().map(_traced(mapped_function)).cache()


def cache_before_map():
    """The cache case done wrong: `artificial_source().cache().map(mapped_function)`.

    The cache saves the source's reads, but the expensive map runs every epoch.
    """
    return artificial_source().cache().map(_traced(mapped_function))


def scalar_map(num_elements: int = 10_000, batch_size: int = 256):
    """Case "scalar map": `range(n).map(increment).batch(batch_size)`.

    Args:
        num_elements: elements of the range.
        batch_size: batch size.
    """
    tf = tensorflow()
    return tf.data.Dataset.range(num_elements).map(_traced(increment)).batch(batch_size)


def vectorized_map(num_elements: int = 10_000, batch_size: int = 256):
    """Case "vectorised map": `range(n).batch(batch_size).map(increment)`.

    Args:
        num_elements: elements of the range.
        batch_size: batch size.
    """
    tf = tensorflow()
    return tf.data.Dataset.range(num_elements).batch(batch_size).map(_traced(increment))


def benchmark(dataset, num_epochs: int = 2, step_s: float = STEP_S) -> float:
    """The guide's simulated training loop: iterate, sleep `step_s` per element.

    Args:
        dataset: the dataset to iterate.
        num_epochs: how many full passes.
        step_s: seconds of simulated training per element.

    Returns:
        Wall time in seconds.
    """
    start = time.perf_counter()
    for _ in range(num_epochs):
        for _ in dataset:
            time.sleep(step_s)
    return time.perf_counter() - start


def fast_benchmark(dataset, num_epochs: int = 2) -> float:
    """The guide's loop for the vectorisation case: iterate with no training.

    Args:
        dataset: the dataset to iterate.
        num_epochs: how many full passes.

    Returns:
        Wall time in seconds.
    """
    start = time.perf_counter()
    for _ in range(num_epochs):
        for _ in dataset:
            pass
    return time.perf_counter() - start


@dataclasses.dataclass
class GuideCase:
    """One case of the guide: how to build it, how it is timed, what the guide measured.

    Attributes:
        name: the case's name, e.g. "parallel map".
        build: returns a fresh dataset of the case.
        fast: timed with `fast_benchmark` (no simulated step) instead of `benchmark`.
        num_epochs: epochs the guide times.
        guide_s: the time the guide published, in seconds.
    """

    name: str
    build: Callable[[], object]
    fast: bool = False
    num_epochs: int = 2
    guide_s: float = 0.0

    def run(self) -> float:
        """Builds the case and times it as the guide does; returns seconds."""
        dataset = self.build()
        if self.fast:
            return fast_benchmark(dataset, self.num_epochs)
        return benchmark(dataset, self.num_epochs)


CASES: Dict[str, GuideCase] = {
    case.name: case
    for case in (
        GuideCase("naive", naive, guide_s=0.265),
        GuideCase("prefetch", prefetched, guide_s=0.217),
        GuideCase("sequential interleave", sequential_interleave, guide_s=0.499),
        GuideCase("parallel interleave", parallel_interleave, guide_s=0.284),
        GuideCase("sequential map", sequential_map, guide_s=0.451),
        GuideCase("parallel map", parallel_map, guide_s=0.284),
        GuideCase("cache", cache_after_map, num_epochs=5, guide_s=0.385),
        GuideCase("scalar map", scalar_map, fast=True, guide_s=0.271),
        GuideCase("vectorised map", vectorized_map, fast=True, guide_s=0.027),
    )
}


# Files.


def write_tfrecords(directory, count: int = 3, records: int = 4) -> List[str]:
    """Writes small TFRecord files, for the guide's file-reading (interleave) cases.

    Args:
        directory: where to write; created if missing.
        count: how many files.
        records: records per file; record `i` of file `f` is the bytes `b"f:i"`.

    Returns:
        The paths written, named `part<index>.tfrecord`.
    """
    tf = tensorflow()
    if count < 1 or records < 0:
        raise ValueError(f"count must be >= 1 and records >= 0, got {count}, {records}.")
    os.makedirs(directory, exist_ok=True)
    paths = []
    for index in range(count):
        path = os.path.join(os.fspath(directory), f"part{index}.tfrecord")
        with tf.io.TFRecordWriter(path) as writer:
            for record in range(records):
                writer.write(f"{index}:{record}".encode())
        paths.append(path)
    return paths


# The image pipeline.


def write_images(directory, count: int = 8, size: int = 16, seed: int = 0) -> List[str]:
    """Writes small random PNG images, labelled 0 / 1 in their file names.

    Args:
        directory: where to write; created if missing.
        count: how many images.
        size: height and width in pixels.
        seed: seed of the pixel values.

    Returns:
        The paths written, named `<index>_label<0|1>.png`.
    """
    tf = tensorflow()
    if count < 1 or size < 1:
        raise ValueError(f"count and size must be >= 1, got count={count}, size={size}.")
    os.makedirs(directory, exist_ok=True)
    pixels = np.random.default_rng(seed).integers(0, 256, (count, size, size, 3), np.uint8)
    paths = []
    for index in range(count):
        path = os.path.join(os.fspath(directory), f"{index:04d}_label{index % 2}.png")
        tf.io.write_file(path, tf.io.encode_png(pixels[index]))
        paths.append(path)
    return paths


def decode_image(path, size: int = 16):
    """Reads and decodes one image written by `write_images`; label from its name.

    Args:
        path: scalar string tensor, the file path.
        size: the image's height and width.

    Returns:
        `(image, label)`: float32 `(size, size, 3)` in [0, 1], int32 label.
    """
    tf = tensorflow()
    image = tf.io.decode_png(tf.io.read_file(path), channels=3)
    image = tf.ensure_shape(tf.image.convert_image_dtype(image, tf.float32), (size, size, 3))
    label = tf.cast(tf.strings.regex_full_match(path, r".*label1\.png"), tf.int32)
    return image, label


def random_flip(images, labels):
    """Random horizontal flip of a batch with `tf.image` (a stateful random op)."""
    return tensorflow().image.random_flip_left_right(images), labels


def image_pipeline(
    directory,
    batch_size: int = 4,
    size: int = 16,
    augment: str = "tf",
    cache_after_augment: bool = False,
    seed: int = 0,
):
    """The guide's recommended image pipeline over files from `write_images`.

    In the recommended order: list_files -> parallel decode map -> cache ->
    shuffle -> batch -> random-flip map -> prefetch. With
    `cache_after_augment=True` the cache moves after the flip (list_files ->
    decode -> shuffle -> batch -> flip -> cache -> prefetch), which freezes one
    set of flips for every epoch: the mistake the lint reports as an error.

    Args:
        directory: the directory holding the PNG files.
        batch_size: images per batch.
        size: the images' height and width, as written.
        augment: "tf" (`tf.image.random_flip_left_right`) or "keras" (a
            `keras.layers.RandomFlip("horizontal")` layer).
        cache_after_augment: put the cache after the flip (wrong on purpose).
        seed: seed of the shuffles.

    Returns:
        A `tf.data.Dataset` of `(images, labels)` batches.

    Example:

    ```python
    guide_pipelines.write_images(tmp_dir)
    ds = guide_pipelines.image_pipeline(tmp_dir)
    model.fit(ds, epochs=2)
    ```
    """
    tf = tensorflow()
    if augment == "tf":
        flip = random_flip
    elif augment == "keras":
        import keras

        layer = keras.layers.RandomFlip("horizontal", seed=seed)

        def random_flip_layer(images, labels):
            return layer(images), labels

        flip = random_flip_layer
    else:
        raise ValueError(f"`augment` must be 'tf' or 'keras', got {augment!r}.")
    pattern = os.path.join(os.fspath(directory), "*.png")
    count = len(tf.io.gfile.glob(pattern))
    if count < 1:
        raise ValueError(
            f"No PNG files in {os.fspath(directory)!r}: write them first with "
            "write_images(directory)."
        )
    files = tf.data.Dataset.list_files(pattern, shuffle=True, seed=seed)

    def decode(path):
        return decode_image(path, size)

    ds = files.map(_traced(decode), num_parallel_calls=tf.data.AUTOTUNE)
    if not cache_after_augment:
        ds = ds.cache()
    ds = ds.shuffle(count, seed=seed).batch(batch_size)
    ds = ds.map(_traced(flip), num_parallel_calls=tf.data.AUTOTUNE)
    if cache_after_augment:
        ds = ds.cache()
    return ds.prefetch(tf.data.AUTOTUNE)
