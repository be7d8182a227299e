"""`benchmark`: how fast a dataset produces batches on its own, with no model.

The first question about a slow training job is whether the input pipeline
alone keeps up: if the dataset alone delivers fewer batches per second than
the model consumes, the pipeline is the bottleneck whatever the model does.
"""

import array
import dataclasses
import logging
import time
from typing import List
from typing import Optional

import numpy as np

from keras_pipeline_tuner._util.argument_checks import checked_dataset
from keras_pipeline_tuner._util.argument_checks import positive_int
from keras_pipeline_tuner._util.argument_checks import verbosity
from keras_pipeline_tuner._util.tf_import import tensorflow
from keras_pipeline_tuner.pipeline.graph import kinds
from keras_pipeline_tuner.pipeline.graph.reader import graph_def_of
from keras_pipeline_tuner.pipeline.graph.reader import pipeline_from_graph_def
from keras_pipeline_tuner.timing.step_stats import Distribution

logger = logging.getLogger("keras_pipeline_tuner")

_BATCH_KINDS = (kinds.BATCH, kinds.PADDED_BATCH, kinds.MAP_AND_BATCH, kinds.REBATCH)
_PROGRESS_INTERVAL_S = 0.1
# Batches timed (after the warm-up) when the dataset's length is unknown and no
# `num_batches` is given: such a dataset may never end.
UNKNOWN_LENGTH_BATCHES = 500


@dataclasses.dataclass
class BenchmarkResult:
    """How fast a dataset alone produced its batches.

    The first `warmup_batches` batches (iterator creation, tracing, buffers
    filling) are reported apart and left out of the rates and percentiles.

    Attributes:
        batches: batches timed after the warm-up.
        examples: examples in those batches (each batch's leading dimension
            when the pipeline batches, else one per element).
        elapsed_s: wall time of those batches.
        batches_per_s: `batches / elapsed_s`.
        examples_per_s: `examples / elapsed_s`.
        batch_ms: mean, median and 90th percentile of the time per batch.
        p99_batch_ms: 99th percentile of the time per batch.
        first_batch_ms: from creating the iterator to the first batch.
        warmup_batches: batches left out at the start, the first included.
        warmup_s: wall time of those, iterator creation included.
        complete: whether the epoch ended (as opposed to `num_batches`, or
            the default for a dataset of unknown length, stopping it).
        notes: caveats, e.g. where a dataset of unknown length was stopped.

    Example:

    >>> result = kpt.benchmark(tf.data.Dataset.range(100).batch(10), verbose=0)
    >>> result.batches
    9
    """

    batches: int = 0
    examples: int = 0
    elapsed_s: float = 0.0
    batches_per_s: Optional[float] = None
    examples_per_s: Optional[float] = None
    batch_ms: Distribution = dataclasses.field(default_factory=Distribution)
    p99_batch_ms: Optional[float] = None
    first_batch_ms: Optional[float] = None
    warmup_batches: int = 0
    warmup_s: float = 0.0
    complete: bool = True
    notes: List[str] = dataclasses.field(default_factory=list)


def benchmark(
    dataset,
    num_batches: Optional[int] = None,
    warmup: int = 1,
    batch_size: Optional[int] = None,
    verbose: int = 1,
) -> BenchmarkResult:
    """Times a dataset alone, like `tfds.benchmark`: batches/s, examples/s, latency.

    Iterates the dataset with nothing else running (no model), as fast as it
    produces elements. Compare `batches_per_s` with the rate your model
    consumes batches: if the dataset alone is slower, input is the bottleneck.

    Args:
        dataset: the `tf.data.Dataset`, as given to `model.fit`.
        num_batches: batches to time after the warm-up; `None` for one epoch.
            Required for infinite datasets. A dataset whose length TensorFlow
            cannot know (`from_generator`, `filter`, files) may never end: without
            `num_batches` it is stopped after `UNKNOWN_LENGTH_BATCHES` (500)
            batches, and the result's notes say so.
        warmup: batches at the start left out of the rates (the first one
            includes the iterator's creation); its time is reported apart.
        batch_size: examples per batch, to count examples; `None` reads each
            batch's leading dimension when the pipeline batches, else counts
            one example per element.
        verbose: 1 shows a progress bar, 0 is silent.

    Returns:
        A `BenchmarkResult`.

    Raises:
        TypeError: if `dataset` is not a `tf.data.Dataset`.
        ValueError: for arguments out of range, an infinite dataset without
            `num_batches`, or a dataset with no more than `warmup` batches.

    Example:

    ```python
    result = kpt.benchmark(train_ds, num_batches=200)
    print(f"{result.batches_per_s:.1f} batches/s, first batch {result.first_batch_ms:.0f} ms")
    ```
    """
    cardinality = _checked_cardinality(dataset, num_batches, warmup, batch_size, verbose)
    batched = batch_size is None and _batches(dataset)
    capped = num_batches is None and cardinality == tensorflow().data.UNKNOWN_CARDINALITY
    if capped:
        num_batches = UNKNOWN_LENGTH_BATCHES
    total = _batches_to_read(num_batches, warmup, cardinality)
    progress = _progress_bar(total) if verbose else None
    began, ends, examples, complete = _read(dataset, total, batch_size, batched, progress)
    if total is not None and len(ends) == cardinality:
        complete = True
    if progress is not None:
        progress.update(len(ends), finalize=True)
    if len(ends) <= warmup:
        raise ValueError(
            f"The dataset gave {len(ends)} batch{'es' if len(ends) != 1 else ''}, no more "
            f"than warmup={warmup}: nothing left to time. Pass a smaller warmup or a "
            "longer dataset."
        )
    result = _summarise(
        began, np.frombuffer(ends), np.frombuffer(examples, np.int64), warmup, complete
    )
    if capped and not complete:
        note = (
            f"The dataset's length is unknown (it may never end), so timing stopped after "
            f"{num_batches} batches (and {warmup} warm-up); pass num_batches to time more "
            "or fewer."
        )
        result.notes.append(note)
        if verbose:
            logger.info("keras-pipeline-tuner: %s", note)
    return result


def _checked_cardinality(dataset, num_batches, warmup, batch_size, verbose) -> int:
    """Checks `benchmark`'s arguments (raising as it says); the dataset's cardinality."""
    tf = tensorflow()
    checked_dataset(dataset, "benchmark")
    positive_int(num_batches, "num_batches", optional=True)
    # The first batch also creates the iterator: it is always set apart.
    positive_int(warmup, "warmup")
    positive_int(batch_size, "batch_size", optional=True)
    verbosity(verbose)
    cardinality = int(dataset.cardinality())
    if num_batches is None and cardinality == tf.data.INFINITE_CARDINALITY:
        raise ValueError(
            "The dataset is infinite (it repeats forever), so an epoch never ends: pass "
            "num_batches=<how many batches to time>, e.g. num_batches=200."
        )
    return cardinality


def _batches_to_read(num_batches: Optional[int], warmup: int, cardinality: int) -> Optional[int]:
    """How many batches to read, warm-up included; `None` for the whole (unknown) epoch."""
    total = None
    if num_batches is not None:
        total = num_batches + warmup
    elif cardinality >= 0:
        total = cardinality
    if total is not None and cardinality >= 0:
        total = min(total, cardinality)
    return total


def _read(dataset, total: Optional[int], batch_size, batched: bool, progress):
    """Reads `total` batches (or the epoch): `(began, ends, examples, complete)`.

    `ends` holds when each batch came, `examples` how many examples it held;
    `complete` is whether the epoch ended.
    """
    ends = array.array("d")
    examples = array.array("q")
    began = time.perf_counter()
    iterator = iter(dataset)
    last_shown = began
    complete = False
    while total is None or len(ends) < total:
        try:
            element = next(iterator)
        except StopIteration:
            complete = True
            break
        now = time.perf_counter()
        ends.append(now)
        examples.append(batch_size or (_leading_dimension(element) if batched else 1))
        if progress is not None and now - last_shown >= _PROGRESS_INTERVAL_S:
            progress.update(len(ends))
            last_shown = now
    return began, ends, examples, complete


def _summarise(began, ends, examples, warmup, complete) -> BenchmarkResult:
    warm_end = ends[warmup - 1]
    durations = np.diff(ends[warmup - 1:])
    elapsed = float(ends[-1] - warm_end)
    counted = int(examples[warmup:].sum())
    batches = int(durations.size)
    return BenchmarkResult(
        batches=batches,
        examples=counted,
        elapsed_s=elapsed,
        batches_per_s=batches / elapsed if elapsed > 0 else None,
        examples_per_s=counted / elapsed if elapsed > 0 else None,
        batch_ms=Distribution.of_seconds(durations),
        p99_batch_ms=float(np.percentile(durations, 99) * 1e3),
        first_batch_ms=float((ends[0] - began) * 1e3),
        warmup_batches=warmup,
        warmup_s=float(warm_end - began),
        complete=complete,
    )


def _batches(dataset) -> bool:
    """Whether the dataset's elements are batches (the last batch-like stage is not undone)."""
    try:
        stages = pipeline_from_graph_def(graph_def_of(dataset)).stages
    except Exception as error:  # noqa: BLE001 - counting examples is a nicety.
        logger.info("keras-pipeline-tuner: counting one example per element (%s).", error)
        return False
    batched = False
    for stage in stages:
        if stage.kind in _BATCH_KINDS:
            batched = True
        elif stage.kind == kinds.UNBATCH:
            batched = False
    return batched


def _leading_dimension(element) -> int:
    tf = tensorflow()
    for tensor in tf.nest.flatten(element, expand_composites=False):
        shape = getattr(tensor, "shape", None)
        if shape is not None and shape.rank:
            # A final partial batch (or an unknown static size) has its own length.
            return int(shape[0]) if shape[0] is not None else int(tf.shape(tensor)[0])
    return 1


def _progress_bar(total: Optional[int]):
    import keras

    return keras.utils.Progbar(total, unit_name="batch")
