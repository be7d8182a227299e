"""Reads tf.data's live model of the iterator a fit reads, a few times per fit.

The iterator is the fit's own, found where Keras keeps it on each backend:

- TensorFlow: Keras' epoch iterator holds it (`_current_iterator`, or a local
  variable of its epoch generator when the data's length is unknown);
- JAX and torch: Keras' `TFDatasetAdapter` iterates the dataset in a Python
  `for` loop inside a generator (JAX) or an `IterableDataset` (torch), where no
  reference to the iterator is kept. From `begin` to `end` the adapter holds
  the same dataset in a stand-in whose `iter()` makes the same iterator, and
  hands Keras a thin iterator over it (`PassEnd`: the same elements, the same
  threads) that reads the model once more as the pass reports its end. The
  reader holds the iterator weakly: it is let go (its threads stopped, its
  buffers freed, which can take seconds on a busy machine) where Keras lets it
  go, never later in the tuner's hooks, and no pass's buffers outlive it
  beside the next one's.

`read` reads the model (`profiling.live_model`) at each epoch's end, and
`steady_step` between two steps in the middle of each pass whose length Keras
knows (an unknown length is counted in the first pass), or at the fit's
`STEADY_STEP`-th step while no length is known, never on other steps. A read takes
about a millisecond (see `bench/live_model_cost.py`); its time is kept in the
table (`StageTable.read_ms`).

A pass that ended has let go of the iterators above a `batch()` tf.data did
not fuse with a map (a batch drops its input at the input's end, and the
final prefetch reads that far ahead), and tf.data's model drops their nodes
with them: a read there lacks those stages. Such a read never replaces a
read that had them (its time is still counted). A read in the middle of a
pass does: it sees every iterator the pass runs, and stages behind a filled
`cache()` no longer run there (counting the fill's time for every batch had
made a cached map "10.45 cores" of CPU use).
"""

import dataclasses
import logging
import time
import weakref
from typing import Callable
from typing import List
from typing import Optional

from keras_pipeline_tuner._util.running_fit import running_call_local
from keras_pipeline_tuner.instrumentation.made_iterators import IteratorsMade
from keras_pipeline_tuner.profiling import live_model
from keras_pipeline_tuner.profiling.live_model import StageTable

logger = logging.getLogger("keras_pipeline_tuner")

# The training step (from the fit's first) of the one read between epochs' ends.
STEADY_STEP = 50
# Reads kept for TensorBoard's scalars over time.
MAX_HISTORY = 200
_MISSING = object()


class LiveModelReader:
    """Reads tf.data's model of the iterator one fit reads, from `begin` to `end`.

    Args:
        pipeline: gives the graph reader's `Pipeline` of the fit's dataset
            (to name stages as the user wrote them), or `None`.
        on_failure: called once with the reason when a read fails (the
            tuner's feature guard); the fit goes on.

    Attributes:
        table: the latest `StageTable`, or `None` before the first read.
        history: every table read, oldest first (at most `MAX_HISTORY`).
        notes: why no table could be read (plain sentences).

    Example:

    ```python
    reader = LiveModelReader(lambda: findings.pipeline)
    reader.begin(model, "torch")   # on_train_begin; a custom loop calls
                                   # reader.track(iterator) at each pass instead
    reader.read(step)              # on_epoch_end
    table = reader.end()           # on_train_end
    ```
    """

    def __init__(
        self,
        pipeline: Callable[[], object] = lambda: None,
        on_failure: Optional[Callable[[str], None]] = None,
    ):
        self.table: Optional[StageTable] = None
        self.history: List[StageTable] = []
        self.notes: List[str] = []
        self._pipeline = pipeline
        self._on_failure = on_failure or _log_failure
        self._epoch_iterator = None
        self._holder = None
        self._name = ""
        self._stand_in = None
        self._latest = None
        self._steady_left = STEADY_STEP
        # Keras' epoch iterator (for a pass's length), the step in the pass,
        # and the step of the pass's middle read (`None`: length unknown).
        self._steps_of = None
        self._pass_step = 0
        self._middle: Optional[int] = None
        # What every read took, on the thread that made it.
        self._spent_ms = 0.0
        self._failed = False
        self._autotune_off = False

    def begin(self, model, backend: str) -> bool:
        """Finds where the running fit of `model` keeps its tf.data iterator.

        Args:
            model: the model being fitted (its `fit` frame on the stack).
            backend: the Keras backend.

        Returns:
            Whether the fit reads a tf.data dataset whose model can be read.
        """
        epoch_iterator = running_call_local(model, "fit", "epoch_iterator")
        adapter = getattr(epoch_iterator, "data_adapter", None)
        if type(adapter).__name__ != "TFDatasetAdapter":
            return False
        self._steps_of = weakref.ref(epoch_iterator)
        self._middle = self._pass_middle()
        # Where Keras calls `iter()` on the dataset: the epoch iterator on
        # TensorFlow (a distributed dataset is looked up instead), the adapter
        # on JAX and torch.
        holder, name = (epoch_iterator, "_distributed_dataset") if backend == "tensorflow" else (
            adapter,
            "_dataset",
        )
        dataset = getattr(holder, name, None)
        if backend == "tensorflow" and not _is_dataset(dataset):
            self._epoch_iterator = weakref.ref(epoch_iterator)
            return True
        if dataset is None:
            return False
        # TensorFlow's train function takes the iterator itself; JAX's and
        # torch's adapters only iterate it, and let it go as the pass ends.
        made = self.track if backend == "tensorflow" else self._fit_pass
        self._stand_in = IteratorsMade(dataset, made)
        self._holder, self._name = holder, name
        setattr(holder, name, self._stand_in)
        return True

    def steady_step(self) -> None:
        """Counts one training step; reads the model in the middle of a pass (see above)."""
        self._steady_left -= 1
        self._pass_step += 1
        middle = self._middle
        if self._pass_step == middle or (middle is None and self._steady_left == 0):
            self.read(mid_pass=True)

    def pass_ended(self) -> None:
        """A fit's pass over the data (an epoch) ended: the next one's steps count from 0."""
        self._pass_step = 0
        self._middle = self._pass_middle()

    def _pass_middle(self) -> Optional[int]:
        # Keras knows a pass's length from the data's cardinality or
        # `steps_per_epoch`, else once it counted the first pass.
        epoch_iterator = self._steps_of() if self._steps_of is not None else None
        steps = getattr(epoch_iterator, "steps_per_epoch", None) or getattr(
            epoch_iterator, "num_batches", None
        )
        return max(1, steps // 2) if isinstance(steps, int) and steps > 0 else None

    def read(self, at_step: Optional[int] = None, mid_pass: bool = False) -> Optional[StageTable]:
        """Reads the model of the fit's current iterator (never raises).

        Args:
            at_step: the training step the read is at, for the time series;
                the batches the iterator gave by default.
            mid_pass: the read is between two steps of a pass over the data,
                where the final prefetch's fullness says whether steps wait
                (at a pass's end its buffer drains whatever the step).

        Returns:
            The new `StageTable`, or `None` (no iterator, autotuning off,
            or a failure).
        """
        if self._failed or self._autotune_off:
            return None
        try:
            iterator = self._iterator()
            if iterator is None:
                return None
            if not _is_tf_data_iterator(iterator):
                # A distributed iterator's per-device one: tf.data hands out no model of it.
                self._autotune_off = True
                self.notes.append(
                    "tf.data's live model was not read: the fit reads a distributed iterator "
                    f"({type(iterator).__name__}), of which tf.data gives no model."
                )
                return None
            began = time.perf_counter()
            proto = live_model.read_model(iterator)
            if proto is None:
                self._autotune_off = True
                self.notes.append(
                    "tf.data's live model was not read: autotuning is off for this pipeline "
                    "(options.autotune.enabled = False), so tf.data keeps no model of it."
                )
                return None
            table = live_model.stage_table(
                proto, self._pipeline(), previous=self.table, mid_pass=mid_pass
            )
            self._spent_ms += (time.perf_counter() - began) * 1e3
            # Every read's time, those of iterators that gave nothing yet too;
            # the time series' step: the batches the iterator gave by default.
            table = dataclasses.replace(
                table,
                read_ms=self._spent_ms,
                at_step=int(at_step if at_step is not None else table.batches),
            )
        except Exception as error:  # noqa: BLE001 - the fit goes on.
            self._fail(f"{type(error).__name__}: {error}")
            return None
        if not table.rows or not table.batches:
            # A new iterator that gave nothing yet (Keras makes the next
            # epoch's at an epoch's end): the last table stands.
            return None
        if self.table is not None and not mid_pass and _lost_stages(self.table, table):
            # An ended pass whose iterators above a batch() are gone: the
            # read that measured them stands, this one's time counted.
            self.table = dataclasses.replace(self.table, reads=table.reads, read_ms=table.read_ms)
            return self.table
        self.table = table
        self.history.append(table)
        del self.history[:-MAX_HISTORY]
        return table

    def end(self) -> Optional[StageTable]:
        """Reads a last time and puts back what `begin` replaced. Safe to call twice.

        Returns:
            The latest `StageTable`, or `None`.
        """
        try:
            if self._epoch_iterator is not None or self._latest is not None:
                self.read()
        finally:
            self._put_back()
        return self.table

    def _iterator(self):
        if self._latest is not None:
            return self._latest()
        holder = self._epoch_iterator() if self._epoch_iterator is not None else None
        if holder is None:
            return None
        current = getattr(holder, "_current_iterator", None)
        if current is None:
            # Unknown length: the iterator is a local of Keras' epoch generator.
            generator = getattr(holder, "_epoch_iterator", None)
            frame = getattr(generator, "gi_frame", None)
            current = frame.f_locals.get("iterator") if frame is not None else None
        return _per_replica(current)

    def track(self, iterator) -> None:
        """Reads the model of `iterator` from now on: a new pass over the data made it.

        Fit's passes are found by `begin`; a custom loop hands its own
        (`tuner.iterate`). On the training thread, once per pass: the pass
        that ends is read first, if its iterator is still in use. The
        reader holds `iterator` weakly: it lives as long as its user keeps it.

        Args:
            iterator: the pass's `tf.data` iterator.
        """
        latest = self._latest() if self._latest is not None else None
        if latest is not None and latest is not iterator:
            self.read()
        self._latest = weakref.ref(iterator)

    def _fit_pass(self, iterator) -> "PassEnd":
        self.track(iterator)
        return PassEnd(iterator, self._pass_ends)

    def _pass_ends(self, iterator) -> None:
        # Its last read, on the training thread, before Keras lets it go.
        if self._latest is not None and self._latest() is iterator:
            self.read()

    def _put_back(self) -> None:
        holder, self._holder = self._holder, None
        stand_in, self._stand_in = self._stand_in, None
        if holder is not None and vars(holder).get(self._name, _MISSING) is stand_in:
            setattr(holder, self._name, stand_in.iterable)
        self._latest = None
        self._epoch_iterator = None

    def _fail(self, reason: str) -> None:
        # Once: the first failure turns the reads off.
        if not self._failed:
            self._failed = True
            self._on_failure(reason)


class PassEnd:
    """An iterator over a pass's tf.data iterator that calls `ended` as the pass ends.

    The elements are the iterator's own, one Python call more each (about
    60 ns); `ended(iterator)` is called once, when the iterator raises
    `StopIteration`, before it is raised on.

    Args:
        iterator: the pass's iterator.
        ended: called with `iterator` at the end of the pass.

    Example:

    >>> ends = []
    >>> list(PassEnd(iter([1, 2]), ends.append)), len(ends)
    ([1, 2], 1)
    """

    __slots__ = ("_iterator", "_ended")

    def __init__(self, iterator, ended: Callable[[object], None]):
        self._iterator = iterator
        self._ended = ended

    def __iter__(self) -> "PassEnd":
        return self

    def __next__(self):
        try:
            return next(self._iterator)
        except StopIteration:
            ended, self._ended = self._ended, None
            if ended is not None:
                ended(self._iterator)
            raise

    def __getattr__(self, name):
        return getattr(self._iterator, name)


def _lost_stages(earlier: StageTable, later: StageTable) -> bool:
    """Whether `later` lacks a stage of the user's that `earlier` measured working."""

    def key(row):
        return row.node or row.stage

    worked = {key(row) for row in earlier.rows if row.ms_per_batch > 0 and not row.added_by_tf}
    return bool(worked - {key(row) for row in later.rows})


def _is_tf_data_iterator(value) -> bool:
    import tensorflow as tf

    return isinstance(value, tf.data.Iterator)


def _is_dataset(value) -> bool:
    import tensorflow as tf

    return isinstance(value, tf.data.Dataset)


def _per_replica(iterator):
    """The tf.data iterator of a distributed iterator's first replica, or `iterator` itself."""
    inner = getattr(iterator, "_iterators", None)
    if inner:
        first = inner[0]
        return getattr(first, "_iterator", first)
    return iterator


def _log_failure(reason: str) -> None:
    logger.warning("keras-pipeline-tuner: reading tf.data's live model failed: %s", reason)
