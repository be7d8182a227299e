"""The fetch floor: what fetching a batch that is already in memory costs, measured.

Even a batch that waits ready in a buffer takes a little time to fetch: the
fetch op in TensorFlow's step, and on JAX and torch Keras' own iterator
around the dataset (a tf.data iterator's `next()`, its conversion to NumPy, a
DataLoader's machinery). That part of the step clock's wait is no pipeline's
fault, and on a sub-millisecond step on a busy machine it can be most of the
wait. Rather than a constant, the floor is measured on each backend by
fetching in-memory batches through the same code the fit's fetch runs:

- TensorFlow: a compiled function takes `tf.timestamp()` around `next()` on an
  iterator of in-memory batches, as the step clock's function does around the
  fit's fetch;
- a custom loop's `tuner.iterate(dataset)`: `next()` on a tf.data iterator
  over in-memory batches, in Python, as the loop's;
- JAX and torch: Keras' tf.data adapter over in-memory batches
  (`get_jax_iterator`, `get_torch_dataloader`), or for a torch `DataLoader` a
  loader over a list of in-memory batches (in this process: `num_workers=0`),
  timed around `next()` as the step clock times the fit's.

The batches are zeros of the fit's element structure (a tf.data pipeline's
`element_spec`, an unknown batch size as 1); none of the user's code runs.

Fetches are not timed back to back: in training a step's compute lies
between two, and the fetch then costs two to four times as much as in a tight
loop (a prefetch thread woken, caches gone cold: 0.17 against 0.34-0.57 ms
for Keras' torch iterator here). So the thread sleeps for the step's compute
(at most `MAX_GAP_S`) between fetches. It takes about 0.3 s after training,
and stops timing at `DEADLINE_S` (once `LEAST_FETCHES` are timed): beside other
work one fit's floor took 5.2 s, 20 times its usual time.
Where the input is a `PyDataset`, a Python generator or Grain, no floor is
measured and the verdict keeps its bound.
"""

import dataclasses
import statistics
import time
from typing import Callable
from typing import Iterator
from typing import Optional
from typing import Tuple

from keras_pipeline_tuner._util.tf_import import tensorflow

# Fetches timed, after as many untimed ones (first calls build iterators and
# trace functions).
FETCHES = 40
WARM_UP = 5
# The most the thread sleeps between two fetches, as a step's compute would take.
MAX_GAP_S = 0.005
# The timed fetches stop here, in seconds from the first timed one, once at
# least `LEAST_FETCHES` are timed: the floor's cost stays bounded on a busy machine.
DEADLINE_S = 0.3
LEAST_FETCHES = 10
# How the floor was measured, per kind of fetch, as the verdict line says.
GRAPH_FETCH = "TensorFlow's fetch op, in a compiled function"
KERAS_ITERATOR = "Keras' iterator over a tf.data pipeline"
TORCH_LOADER = "a torch DataLoader in this process"
PYTHON_ITERATOR = "a tf.data iterator, as a custom loop's"
# The kind of input a custom loop's `tuner.iterate` fetches from.
LOOP = "loop"


@dataclasses.dataclass(frozen=True)
class FetchFloor:
    """The measured time to fetch a batch that is already in memory.

    Attributes:
        ms: the mean fetch, in milliseconds.
        fetches: how many fetches were timed.
        how: the fetch that was timed (e.g. "Keras' iterator over a tf.data
            pipeline").

    Example:

    >>> FetchFloor(0.18, 40, KERAS_ITERATOR).describe().split(", a step")[0]
    '0.18 ms (mean of 40 fetches'
    """

    ms: float
    fetches: int
    how: str

    def describe(self) -> str:
        """The floor in one phrase, with how it was measured."""
        return (
            f"{self.ms:.2f} ms (mean of {self.fetches} fetches, a step's compute apart, "
            f"through {self.how})"
        )


def time_fetches(
    iterator: Iterator, fetches: int = FETCHES, warm_up: int = WARM_UP, gap_s: float = 0.0
) -> Tuple[float, int]:
    """The mean time of `next(iterator)` in ms, after `warm_up` untimed calls.

    The mean, as the verdict weighs the wait in training: a share of the
    steps' total, scheduling delays included. Timing stops at `DEADLINE_S`
    once `LEAST_FETCHES` calls are timed.

    Args:
        iterator: an iterator with at least `fetches + warm_up` items.
        fetches: calls timed at most.
        warm_up: calls first, untimed.
        gap_s: seconds slept after each call, as a step's compute would take.

    Returns:
        `(mean in milliseconds, calls timed)`.

    Example:

    >>> mean_ms, timed = time_fetches(iter(range(10)), fetches=5, warm_up=1)
    >>> mean_ms < 1.0, timed
    (True, 5)
    """

    def fetch() -> float:
        start = time.perf_counter()
        next(iterator)
        return time.perf_counter() - start

    return _mean_ms(fetch, fetches, warm_up, gap_s)


def _mean_ms(
    fetch: Callable[[], float], fetches: int, warm_up: int, gap_s: float
) -> Tuple[float, int]:
    """`(mean ms, count)` of the seconds `fetch()` reports, `gap_s` apart, the first
    `warm_up` out, until `fetches` or, past `LEAST_FETCHES`, `DEADLINE_S`."""
    for _ in range(warm_up):
        fetch()
        if gap_s > 0:
            time.sleep(gap_s)
    seconds = []
    began = time.monotonic()
    while len(seconds) < fetches:
        seconds.append(fetch())
        if gap_s > 0:
            time.sleep(gap_s)
        if len(seconds) >= LEAST_FETCHES and time.monotonic() - began > DEADLINE_S:
            break
    return statistics.fmean(seconds) * 1e3, len(seconds)


def zero_batches(element_spec, count: int):
    """A tf.data dataset of `count` all-zero elements of `element_spec` (unknown sizes as 1).

    Args:
        element_spec: a tf.data `element_spec` (a nest of `tf.TensorSpec`).
        count: elements.

    Returns:
        The `tf.data.Dataset`, cached in memory.

    Example:

    >>> import tensorflow as tf
    >>> spec = (tf.TensorSpec((None, 3), tf.float32), tf.TensorSpec((None,), tf.int64))
    >>> [tuple(part.shape) for part in next(iter(zero_batches(spec, 2)))]
    [(1, 3), (1,)]
    """
    tf = tensorflow()

    def zeros(spec):
        shape = [1 if size is None else size for size in spec.shape.as_list()]
        return tf.zeros(shape, spec.dtype)

    element = tf.nest.map_structure(zeros, element_spec)
    return tf.data.Dataset.from_tensors(element).repeat(count).cache()


def measure_graph_fetch(element_spec, fetches: int = FETCHES, gap_s: float = 0.0) -> FetchFloor:
    """The fetch floor on TensorFlow: `next()` inside a compiled function, stamped.

    Args:
        element_spec: the fit's dataset's `element_spec`.
        fetches: fetches timed.
        gap_s: seconds slept between fetches.

    Returns:
        The `FetchFloor`.

    Example:

    >>> import tensorflow as tf
    >>> floor = measure_graph_fetch(tf.TensorSpec((None, 4), tf.float32), fetches=5)
    >>> floor.ms >= 0, floor.how == GRAPH_FETCH
    (True, True)
    """
    tf = tensorflow()
    data = zero_batches(element_spec, fetches + WARM_UP).prefetch(1)
    iterator = iter(data)

    @tf.function
    def fetch():
        start = tf.timestamp()
        with tf.control_dependencies([start]):
            element = next(iterator)
        with tf.control_dependencies(tf.nest.flatten(element)):
            return tf.timestamp() - start

    mean_ms, timed = _mean_ms(lambda: float(fetch()), fetches, WARM_UP, gap_s)
    return FetchFloor(mean_ms, timed, GRAPH_FETCH)


def measure_keras_iterator(
    element_spec,
    iterator_of: Callable[[object], Iterator],
    fetches: int = FETCHES,
    gap_s: float = 0.0,
) -> FetchFloor:
    """The fetch floor on JAX or torch: Keras' tf.data adapter over in-memory batches.

    Args:
        element_spec: the fit's dataset's `element_spec`.
        iterator_of: makes the iterator the fit's fetch runs from a Keras data
            adapter, e.g. `lambda adapter: iter(adapter.get_torch_dataloader())`.
        fetches: fetches timed.
        gap_s: seconds slept between fetches.

    Returns:
        The `FetchFloor`.

    Example:

    >>> import tensorflow as tf
    >>> floor = measure_keras_iterator(
    ...     tf.TensorSpec((None, 4), tf.float32),
    ...     lambda adapter: iter(adapter.get_numpy_iterator()), fetches=5)
    >>> floor.how == KERAS_ITERATOR
    True
    """
    from keras.src.trainers.data_adapters.tf_dataset_adapter import TFDatasetAdapter

    adapter = TFDatasetAdapter(zero_batches(element_spec, fetches + WARM_UP).prefetch(1))
    return FetchFloor(*time_fetches(iterator_of(adapter), fetches, gap_s=gap_s), KERAS_ITERATOR)


def measure_torch_loader(fetches: int = FETCHES, gap_s: float = 0.0) -> FetchFloor:
    """The fetch floor of a torch `DataLoader`: one over in-memory batches, in this process.

    Args:
        fetches: fetches timed.
        gap_s: seconds slept between fetches.

    Returns:
        The `FetchFloor`.
    """
    import torch

    batches = [(torch.zeros(1), torch.zeros(1)) for _ in range(fetches + WARM_UP)]
    loader = torch.utils.data.DataLoader(batches, batch_size=None)
    return FetchFloor(*time_fetches(iter(loader), fetches, gap_s=gap_s), TORCH_LOADER)


def _known_ranks(element_spec) -> bool:
    """Whether every tensor of `element_spec` has a known rank (zeros can be made of it)."""
    tf = tensorflow()
    specs = tf.nest.flatten(element_spec)
    return all(getattr(spec, "shape", None) is not None and spec.shape.rank is not None
               for spec in specs)


def measure_fetch_floor(
    backend: str, kind: str, element_spec=None, compute_ms: Optional[float] = None
) -> Optional[FetchFloor]:
    """The fetch floor of a fit on `backend` whose input is of `kind`, or `None`.

    Args:
        backend: Keras' backend, "tensorflow", "jax" or "torch".
        kind: the fit's input (`instrumentation.fit_input`: "tf.data",
            "arrays", "DataLoader", ...).
        element_spec: the tf.data `element_spec` of the fit's dataset, where it
            has one.
        compute_ms: the steady steps' mean compute: the thread sleeps that long
            (at most `MAX_GAP_S`) between fetches.

    Returns:
        The `FetchFloor`, or `None` where none is measured for this input
        (a PyDataset, a generator, Grain, or tf.data without its spec).

    Example:

    >>> measure_fetch_floor("jax", "PyDataset") is None
    True
    """
    if element_spec is not None and not _known_ranks(element_spec):
        return None
    gap_s = min((compute_ms or 0.0) / 1e3, MAX_GAP_S)
    if kind == "DataLoader" and backend == "torch":
        return measure_torch_loader(gap_s=gap_s)
    if kind == LOOP and element_spec is not None:
        data = zero_batches(element_spec, FETCHES + WARM_UP).prefetch(1)
        return FetchFloor(*time_fetches(iter(data), gap_s=gap_s), PYTHON_ITERATOR)
    if element_spec is None or kind not in ("tf.data", "arrays"):
        return None
    if backend == "tensorflow":
        return measure_graph_fetch(element_spec, gap_s=gap_s)
    if backend == "jax":
        return measure_keras_iterator(
            element_spec, lambda adapter: adapter.get_jax_iterator(), gap_s=gap_s
        )
    if backend == "torch":
        return measure_keras_iterator(
            element_spec, lambda adapter: iter(adapter.get_torch_dataloader()), gap_s=gap_s
        )
    return None
