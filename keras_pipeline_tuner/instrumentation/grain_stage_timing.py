"""Grain's stage timing of the iterators `fit` reads, during training.

Keras makes the iterator of a Grain dataset itself, a new one each epoch
(without `steps_per_epoch`), from its `GrainDatasetAdapter`, as each backend
asks for it:

- JAX and NumPy: `iter()` on what `get_jax_iterator()` / `get_numpy_iterator()`
  returns (the user's dataset with one conversion map added);
- torch: the `DataLoader` of `get_torch_dataloader()` calls `iter()` on the
  user's dataset in its `IterableDataset`;
- TensorFlow: `tf.data.Dataset.from_generator` calls `iter()` on that dataset
  in its state object, when each pass over the data starts.

From `begin` (the fit's start) to `end` (its end), and only then, that one
place hands out the same dataset in a stand-in whose `iter()` makes the same
iterator and turns Grain's own stage timing on for it
(`grain_stages.track_stages`) before its first element: the same elements,
the same calls of the user's functions, the same threads. `so_far` reads
Grain's summary of the iterators timed so far (the tuner reads it at each
epoch's end); `end` puts back what `begin` replaced, and the stage recorders
the iterators left in the nodes of the user's `MapDataset`, which would
otherwise go on timing its random access (`ds[i]`) after training.

What training reads stays the same, but for one thing Grain does while its
timing is on: at each prefetch stage it reads an element's size through its
tree functions (`jax.tree_util` when JAX is installed), which hand the element
on rebuilt container by container: the same arrays and values, and a plain
dict with its keys in sorted order. Keras flattens a dict by its sorted keys,
so the model is fed the same.

Grain's timing costs each element of each stage while it is on: a
generator-based context manager, two reads of a clock and an append, and at
each prefetch stage (`to_iter_dataset`, `prefetch`) the element's size, read
leaf by leaf. Measured here (`bench/grain_stage_cost.py`, JAX backend, two
cores shared with other jobs, a pipeline of range, two maps and a batch of
32): 4-6 µs more an element read on Grain's 16 threads, 12-20 µs on the
reading thread; a fit step of a small model on that pipeline took 1.3-2.0
times as long while it was on (0.4-0.7 ms more a step of 0.5-2 ms). So it is
on for the first `WINDOW_BATCHES` batches the fit reads, then turned off on
the thread that reads them: some 25-45 ms a fit on that pipeline, enough
elements for each stage's time per element, and the steps after it as fast
as without it (0.99-1.06 times, within the machine's noise).
"""

import logging
import threading
import weakref
from typing import Callable
from typing import Dict
from typing import List
from typing import Optional

from keras_pipeline_tuner._util.running_fit import running_call_local
from keras_pipeline_tuner.instrumentation.made_iterators import IteratorsMade
from keras_pipeline_tuner.profiling import grain_stages
from keras_pipeline_tuner.profiling.evidence import ProfileEvidence

logger = logging.getLogger("keras_pipeline_tuner")

# The adapter method each backend's epoch iterator asks for its data.
_ITERABLE_METHODS = {"jax": "get_jax_iterator", "numpy": "get_numpy_iterator"}
_LOADER_METHOD = "get_torch_dataloader"
# Keras' generator around the Grain dataset, as `from_generator` holds it.
_KERAS_GENERATOR = "GrainDatasetAdapter.get_tf_dataset"
# Grain warns once, through absl, of each element type whose size it cannot
# read while it times the stages: a message of the timing, not of the user's.
_SIZE_WARNING = "Unsupported type for estimating memory usage"
_MISSING = object()

# Batches the stages are timed for, from the fit's first.
WINDOW_BATCHES = 64

NOTE = (
    "Stage times are Grain's own (ExecutionTrackingMode.STAGE_TIMING), recorded on the "
    f"iterators training read, as it read them, for its first {WINDOW_BATCHES} batches at "
    "most (Grain's timing costs each element of each stage microseconds, so it is turned off "
    "then); a stage read on several threads adds up the time of all of them."
)


class GrainStageTimer:
    """Turns Grain's stage timing on for the iterators one fit reads, from `begin` to `end`.

    Args:
        on_failure: called once with the reason if the timing fails on a
            thread of the fit (the tuner's feature guard); the fit's data goes
            on untimed.
        window: batches timed, from the first (`WINDOW_BATCHES` by default);
            the timing is off after them.

    Attributes:
        notes: why nothing could be timed, when the fit's data is a Grain
            dataset that this version cannot reach (plain sentences).

    Example:

    ```python
    timer = GrainStageTimer()
    timer.begin(model)           # on_train_begin
    evidence = timer.so_far()    # on_epoch_end
    evidence = timer.end()       # on_train_end
    print(evidence.bottleneck)
    ```
    """

    def __init__(
        self, on_failure: Optional[Callable[[str], None]] = None, window: Optional[int] = None
    ):
        self.notes: List[str] = []
        self._on_failure = on_failure
        self._lock = threading.Lock()
        self._active = False
        # Per iterator made: a weak reference to it and its output recorder.
        self._tracked: List[tuple] = []
        # Summaries of the iterators that are gone, merged.
        self._done = None
        # Every recorder of the tracked pipelines (what `end` may put back).
        self._recorders: Dict[int, object] = {}
        # Nodes of the user's MapDataset, and the recorder each held before.
        self._map_nodes: Dict[int, tuple] = {}
        self._restore: List[Callable[[], None]] = []
        self._evidence: Optional[ProfileEvidence] = None
        self._failed = False
        # Iterators made (one a pass over the data), and what read them.
        self._made = 0
        self._reader = "fit"
        # Batches left before the timing is turned off.
        self._left = WINDOW_BATCHES if window is None else window

    # Lifecycle.

    def begin(self, model, backend: str) -> bool:
        """Starts timing the stages of the Grain dataset the running fit of `model` reads.

        Args:
            model: the model being fitted (its `fit` frame on the stack).
            backend: the Keras backend.

        Returns:
            Whether the fit reads a Grain dataset whose iterators will be timed.
        """
        epoch_iterator = running_call_local(model, "fit", "epoch_iterator")
        adapter = getattr(epoch_iterator, "data_adapter", None)
        if type(adapter).__name__ != "GrainDatasetAdapter":
            return False
        if not grain_stages.is_grain_dataset(getattr(adapter, "_dataset", None)):
            self.notes.append(
                "Grain's stages were not timed: fit was given a grain.DataLoader; the tuner "
                "times the stages of grain.MapDataset and grain.IterDataset pipelines."
            )
            return False
        self._active = True
        if backend == "tensorflow":
            placed = self._place_in_generator(epoch_iterator)
        elif backend == "torch":
            placed = self._place_in_loader(adapter)
        elif backend in _ITERABLE_METHODS:
            placed = self._place_in_adapter(adapter, _ITERABLE_METHODS[backend])
        else:
            placed = False
        if not placed:
            self._active = False
            self.notes.append(
                "Grain's stages were not timed during training: this Keras version makes "
                "the fit's Grain iterator where the tuner does not reach it."
            )
            return False
        _quiet_size_warning(self)
        return True

    def begin_tracking(self) -> None:
        """Starts timing the iterators handed to `track` (a custom loop's: `tuner.iterate`)."""
        self._active = True
        self._reader = "the loop"
        _quiet_size_warning(self)

    def track(self, iterator) -> None:
        """Turns the timing on for `iterator`, made and not read yet (never raises)."""
        self._track(iterator)

    def so_far(self) -> Optional[ProfileEvidence]:
        """Grain's timing of the stages of every iterator the fit made so far.

        Returns:
            A `ProfileEvidence` (`source` "grain", `timed_in_training`), or
            `None` before the fit's first element (or after a failure).
        """
        if self._evidence is not None or not self._active:
            return self._evidence
        with self._lock:
            summary = self._summary()
        if summary is None or 0 not in summary.nodes:
            return None
        batches = int(summary.nodes[0].num_produced_elements)
        if not batches:
            return None
        evidence = grain_stages.stage_evidence(
            summary,
            trigger=(
                f"Grain's own stage timing of the {'first ' if self._left <= 0 else ''}"
                f"{batches} batches {self._reader} read during training "
                f"({_passes(self._made)}{', then turned off' if self._left <= 0 else ''})"
            ),
            note=NOTE,
            batches=batches,
        )
        evidence.timed_in_training = True
        return evidence

    def end(self) -> Optional[ProfileEvidence]:
        """Reads the final timing and puts back everything `begin` replaced.

        Safe to call more than once, and after a failed or partial `begin`.

        Returns:
            As `so_far`, final.
        """
        if not self._active:
            self._put_back()
            return self._evidence
        try:
            evidence = self.so_far()
        finally:
            self._active = False
            self._put_back()
        self._evidence = evidence
        self._tracked = []
        return evidence

    # Where Keras makes the iterator.

    def _place_in_adapter(self, adapter, method: str) -> bool:
        keras_method = getattr(adapter, method, None)
        if not callable(keras_method):
            return False
        # Keras' own, or the stamping iterator the JAX step clock put there
        # for the fit (kept as is, and put back as it was).
        previous = vars(adapter).get(method, _MISSING)

        def tracked_iterable():
            return IteratorsMade(keras_method(), self._track)

        # An instance attribute: this adapter only, for this fit.
        setattr(adapter, method, tracked_iterable)
        self._restore.append(_PutBackMethod(adapter, method, tracked_iterable, previous))
        return True

    def _place_in_loader(self, adapter) -> bool:
        keras_loader = getattr(adapter, _LOADER_METHOD, None)
        if not callable(keras_loader):
            return False
        # Keras' own, or the loader the torch step clock put there (kept as is).
        previous = vars(adapter).get(_LOADER_METHOD, _MISSING)

        def tracked_loader():
            loader = keras_loader()
            holder = getattr(loader, "dataset", None)
            iterable = getattr(holder, "iterable", None)
            if grain_stages.is_grain_dataset(iterable):
                # Keras' IterableDataset around the user's dataset, made for this loader.
                holder.iterable = IteratorsMade(iterable, self._track)
            else:
                self._fail("the DataLoader Keras made holds no Grain dataset where expected")
            return loader

        setattr(adapter, _LOADER_METHOD, tracked_loader)
        self._restore.append(_PutBackMethod(adapter, _LOADER_METHOD, tracked_loader, previous))
        return True

    def _place_in_generator(self, epoch_iterator) -> bool:
        from keras_pipeline_tuner.pipeline.graph.py_calls import GENERATOR_START
        from keras_pipeline_tuner.pipeline.graph.py_calls import generator_state
        from keras_pipeline_tuner.pipeline.graph.py_calls import py_calls_of
        from keras_pipeline_tuner.pipeline.graph.reader import graph_def_of

        dataset = getattr(epoch_iterator, "_distributed_dataset", None)
        dataset = getattr(dataset, "_original_dataset", dataset)
        if dataset is None:
            return False
        states = [
            generator_state(call.token)
            for call in py_calls_of(graph_def_of(dataset))
            if call.role == GENERATOR_START
        ]
        states = [
            state
            for state in states
            if _KERAS_GENERATOR in getattr(state._generator, "__qualname__", "")
        ]
        if len(states) != 1:
            return False
        state = states[0]
        keras_generator = state._generator  # pylint: disable=protected-access

        def tracked_generator(*args):
            return IteratorsMade(keras_generator(*args), self._track)

        state._generator = tracked_generator  # pylint: disable=protected-access
        self._restore.append(
            _PutBackAttribute(state, "_generator", keras_generator, tracked_generator)
        )
        return True

    # The iterators.

    def _track(self, iterator) -> None:
        """Turns the timing on for an iterator Keras just made (never raises)."""
        if not self._active or self._failed or self._left <= 0:
            return
        # The step clock's stamping stand-in (JAX) may hold Grain's iterator.
        while not hasattr(iterator, "_ctx") and hasattr(iterator, "iterator"):
            iterator = iterator.iterator
        try:
            with self._lock:
                for node in _map_nodes(iterator):
                    if id(node) not in self._map_nodes:
                        self._map_nodes[id(node)] = (node, vars(node).get("_stats", _MISSING))
                recorder = grain_stages.track_stages(iterator, keep_on=self._keep_on)
                self._tracked.append((weakref.ref(iterator), recorder))
                self._made += 1
                for stats in _recorders(recorder):
                    self._recorders[id(stats)] = stats
        except Exception as error:  # noqa: BLE001 - the fit's data must go on.
            self._fail(f"{type(error).__name__}: {error}")

    def _keep_on(self) -> bool:
        # After each batch, on the thread reading it: a subtraction and a test.
        self._left -= 1
        return self._left > 0

    def _summary(self):
        live, summaries = [], []
        for reference, recorder in self._tracked:
            summary = grain_stages.stage_summary(recorder)
            if reference() is None:
                # Gone (the epoch ended): its figures are final.
                self._done = grain_stages.merged_summary(
                    [self._done, summary] if self._done is not None else [summary]
                )
            else:
                live.append((reference, recorder))
                summaries.append(summary)
        self._tracked = live
        if self._done is not None:
            summaries.insert(0, self._done)
        return grain_stages.merged_summary(summaries)

    # Putting back.

    def _put_back(self) -> None:
        restore, self._restore = self._restore, []
        for put_back in reversed(restore):
            try:
                put_back()
            except Exception as error:  # noqa: BLE001 - the others are still put back.
                self._fail(f"putting back {put_back}: {type(error).__name__}: {error}")
        nodes, self._map_nodes = self._map_nodes, {}
        ours = self._recorders
        for node, before in nodes.values():
            current = vars(node).get("_stats", _MISSING)
            if current is _MISSING or id(current) not in ours or ours[id(current)] is not current:
                # Made anew since (another iterator over the same dataset): left as it is.
                continue
            if before is _MISSING:
                del vars(node)["_stats"]
            else:
                vars(node)["_stats"] = before
        self._recorders = {}
        _quiet_size_warning(None)

    def _fail(self, reason: str) -> None:
        if self._failed:
            return
        self._failed = True
        if self._on_failure is not None:
            self._on_failure(reason)
        else:
            logger.warning("keras-pipeline-tuner: Grain's stage timing failed: %s", reason)


class _PutBackMethod:
    """Puts back an adapter's method replaced on the instance, if the stand-in is still there."""

    __slots__ = ("holder", "name", "stand_in", "before")

    def __init__(self, holder, name, stand_in, before=_MISSING):
        self.holder, self.name, self.stand_in, self.before = holder, name, stand_in, before

    def __call__(self) -> None:
        if vars(self.holder).get(self.name) is not self.stand_in:
            return
        if self.before is _MISSING:
            delattr(self.holder, self.name)
        else:
            setattr(self.holder, self.name, self.before)

    def __repr__(self) -> str:
        return f"{type(self.holder).__name__}.{self.name}"


class _PutBackAttribute(_PutBackMethod):
    """Puts back an attribute, if the stand-in is still there."""

    __slots__ = ()

    def __init__(self, holder, name, before, stand_in):
        super().__init__(holder, name, stand_in, before)


def _passes(made: int) -> str:
    """The iterators timed, as the evidence names them.

    >>> _passes(1), _passes(3)
    ('1 iterator', '3 iterators, one a pass over the data')
    """
    return "1 iterator" if made <= 1 else f"{made} iterators, one a pass over the data"


def _map_nodes(iterator) -> list:
    """The `MapDataset` nodes a Grain iterator reads (they keep their stage recorders)."""
    import grain

    found, seen, stack = [], set(), [iterator]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, grain.MapDataset):
            found.append(node)
        stack.extend(getattr(node, "_parents", None) or ())
        parent = getattr(node, "_map_parent", None)
        if parent is not None:
            stack.append(parent)
    return found


def _recorders(recorder) -> list:
    """A stage recorder and every recorder under it."""
    found, stack = [], [recorder]
    while stack:
        stats = stack.pop()
        found.append(stats)
        stack.extend(getattr(stats, "_parents", None) or ())
    return found


class _SizeWarningFilter(logging.Filter):
    """Drops Grain's warning about element sizes while a fit's stages are timed."""

    def __init__(self):
        super().__init__()
        self.timers = weakref.WeakSet()

    def filter(self, record: logging.LogRecord) -> bool:
        if not self.timers:
            return True
        return not str(record.msg).startswith(_SIZE_WARNING)


_SIZE_FILTER = _SizeWarningFilter()
_SIZE_FILTER_LOCK = threading.Lock()


def _quiet_size_warning(timer: Optional[GrainStageTimer]) -> None:
    """Puts the filter on absl's logger while any timer times (`None`: drops ended timers)."""
    absl_logger = logging.getLogger("absl")
    with _SIZE_FILTER_LOCK:
        for ended in [each for each in _SIZE_FILTER.timers if not each._active]:
            _SIZE_FILTER.timers.discard(ended)
        if timer is not None:
            _SIZE_FILTER.timers.add(timer)
        if _SIZE_FILTER.timers:
            if _SIZE_FILTER not in absl_logger.filters:
                absl_logger.addFilter(_SIZE_FILTER)
        else:
            absl_logger.removeFilter(_SIZE_FILTER)
