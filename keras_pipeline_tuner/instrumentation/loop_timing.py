"""The custom loop's timing source: the step decorator and the timed iterator.

Users who write their own loop (a Python `for` over a dataset that calls a train
step, usually a `tf.function`) get the same step clock as `model.fit` users:

- `@tuner.instrument` times each call of the step. Compute is the time inside the
  call, up to when its outputs are ready; input wait is estimated as the time
  since the previous call returned, which also holds the loop's own Python work.
- `tuner.iterate(dataset)` times each `next()` exactly. With the decorator, the
  exact fetch replaces the estimate, and the loop's own work between the end of a
  step and the next `next()` is reported apart (the clock's host gap).

Both hand the run the same `(start, ready, end)` rows as fit's timing sources,
through the same verbs (`on_rows`, `on_error` when a step raises,
`on_fallback` when only whole steps can be timed; see `timing_source`), and
the epochs the loop's passes make. Its driver (`run.loop_driver`) is the
sibling of fit's callback hooks: it begins and ends the run, and does between
steps what fit's hooks do (the profiler window, the outputs).

A step placed inside `@tf.function` (the decorator below it) runs in Python only
while it is traced. It then adds two timestamps to the graph and hands them back
through a `tf.py_function` on every call. A loop compiled whole into one
`tf.function` (the dataset iterated inside the graph) is detected and left
untouched: Python never sees its steps.
"""

import dataclasses
import functools
import logging
import sys
import threading
import time
from typing import Any
from typing import Callable
from typing import Iterable
from typing import Iterator
from typing import List
from typing import Optional
from typing import Tuple

from keras_pipeline_tuner._util import features
from keras_pipeline_tuner._util.backend_import import backend_module
from keras_pipeline_tuner._util.tf_import import tensorflow
from keras_pipeline_tuner.instrumentation import traced_steps
from keras_pipeline_tuner.instrumentation.loop_record import KINDS
from keras_pipeline_tuner.instrumentation.loop_record import LoopRecord
from keras_pipeline_tuner.instrumentation.timing_source import OnError
from keras_pipeline_tuner.instrumentation.timing_source import OnFallback
from keras_pipeline_tuner.instrumentation.timing_source import OnRows
from keras_pipeline_tuner.timing.step_clock import TRAIN

logger = logging.getLogger("keras_pipeline_tuner")

FEATURE = features.LOOP_CLOCK


@dataclasses.dataclass
class _Step:
    """One decorated step function."""

    fn: Callable
    kind: str
    # `experimental_get_tracing_count` of a `tf.function`, else None.
    tracing_count: Optional[Callable[[], int]]
    # Found in its traced graph: it fetches its batches itself.
    fetches_inside: bool = False
    # A JAX or torch step has been called (its first call compiles).
    called: bool = False
    # Returns when the step's outputs are ready (given them), not merely
    # dispatched; a TensorFlow step's is made at its first call.
    wait_for: Optional[Callable[[Any], None]] = None


@dataclasses.dataclass
class LoopHooks:
    """What the loop's timing source is given by its driver: narrow callables.

    Attributes:
        measuring: whether calls are to be timed now; begins a run (and the
            source's `begin_run`) when none is going.
        running: whether the run the source feeds is going (never begins one).
        refuse_other_threads: raises when another thread than the loop's calls in.
        on_rows, on_error, on_fallback: as for fit's sources (`FitTiming`).
        on_measurement: what times the steps, when that changes (a value of
            `timing.measurement`).
        begin_epoch: `(kind, epoch)`: a pass or the first step opens an epoch.
        end_epoch: `(kind,)`: the epoch of `kind` ended.
        step_ended: after an eager training step, before its row is recorded,
            as Keras calls a callback's batch-end hook.
        between_steps: after every step, fetch and epoch end, outside the
            source's lock: the driver's work between steps (outputs).
        pass_started: `(iterable, kind)`: a timed iterator's pass begins.
        iterator_made: `(iterable, iterator, kind)`: that pass made its iterator.
    """

    measuring: Callable[[], bool]
    running: Callable[[], bool]
    refuse_other_threads: Callable[[], None]
    on_rows: OnRows
    on_error: OnError
    on_fallback: OnFallback
    on_measurement: Callable[[str], None]
    begin_epoch: Callable[[str, int], None]
    end_epoch: Callable[[str], None]
    step_ended: Callable[[str], None]
    between_steps: Callable[[], None]
    pass_started: Callable[[Any, str], None]
    iterator_made: Callable[[Any, Any, str], None]


class LoopTiming:
    """Times a custom loop's calls of its step and fetches of its batches.

    The timing source of custom loops, as `FitTiming` is fit's: it wraps the
    step (`instrument`) and the dataset (`iterate`), and hands its driver the
    rows, a failed step, and the epochs the loop's passes make, through the
    `LoopHooks` it is given. One per `PipelineTuner`; a run of the loop is
    `begin_run` to the driver's close.

    Args:
        hooks: the driver's `LoopHooks`.
        guard: the tuner's `FeatureGuard`.

    Example:

    ```python
    timing = LoopTiming(hooks, guard)
    step = timing.instrument(train_step, "train")
    for x, y in timing.iterate(train_ds, "train"):
        step(x, y)
    timing.close_epochs()
    notes = timing.notes()
    ```
    """

    def __init__(self, hooks: LoopHooks, guard):
        self._hooks = hooks
        self._guard = guard
        # The py_function callback runs on a TensorFlow thread.
        self._lock = threading.Lock()
        self._record: Optional[LoopRecord] = None
        self._depth = 0
        self._fetching_types: Tuple[type, ...] = ()

    # The driver's operations.

    def begin_run(self) -> None:
        """A new run begins: what the loop's calls add up to starts from nothing."""
        hooks = self._hooks
        self._record = LoopRecord(
            hooks.on_rows,
            hooks.begin_epoch,
            hooks.end_epoch,
            hooks.on_measurement,
            hooks.on_fallback,
        )

    def end_epoch(self) -> None:
        """Closes the current epoch (training and validation) and opens the next."""
        self._in_run(lambda record: record.end_epoch())

    def close_epochs(self) -> bool:
        """Closes the open epochs (the loop ended).

        Returns:
            Whether a run was going.
        """
        return bool(self._in_run(lambda record: record.close_epochs() or True))

    def take_unreported(self) -> Tuple[int, int]:
        """`(steps, epochs)` recorded since the last call, for the driver's outputs."""
        if self._record is None:
            return 0, 0
        with self._lock:
            return self._record.take_unreported()

    def notes(self) -> List[str]:
        """Sentences for the report about how the loop was timed."""
        if self._record is None:
            return []
        with self._lock:
            return self._record.notes()

    # Wrapping.

    def instrument(self, fn: Optional[Callable], kind: str = TRAIN) -> Callable:
        """Returns `fn` wrapped so that each call is timed as one step.

        Args:
            fn: the train (or validation) step: a Python function or a
                `tf.function`.
            kind: "train" or "validation".

        Returns:
            The wrapped function (same name, docstring, signature and return
            values).
        """
        kind = checked_kind(kind, "instrument")
        if not callable(fn):
            raise TypeError(
                f"`instrument` decorates the train-step function, got "
                f"{type(fn).__name__} {fn!r}. Write `@tuner.instrument` on the line above "
                "`def train_step(...)` (above or below `@tf.function`)."
            )
        timing, hooks = self, self._hooks
        wait_for = _output_waiter(fn)
        if wait_for is not None:
            # A JAX or torch step: no TensorFlow involved.
            step = _Step(fn, kind, None, wait_for=wait_for)

            @functools.wraps(fn, updated=())
            def instrumented_step(*args, **kwargs):
                hooks.refuse_other_threads()
                if not hooks.measuring():
                    return fn(*args, **kwargs)
                return timing._framework_call(step, args, kwargs)

            return instrumented_step
        tf = tensorflow()
        step = _Step(fn, kind, getattr(fn, "experimental_get_tracing_count", None))
        self._fetching_types = (
            tf.data.Dataset,
            tf.data.Iterator,
            tf.distribute.DistributedDataset,
            tf.distribute.DistributedIterator,
        )

        @functools.wraps(fn, updated=())
        def instrumented(*args, **kwargs):
            hooks.refuse_other_threads()
            if not hooks.measuring():
                return fn(*args, **kwargs)
            if not tf.executing_eagerly():
                return timing._graph_call(fn, kind, args, kwargs)
            return timing._eager_call(step, args, kwargs)

        return traced_steps.left_to_python(instrumented)

    def iterate(self, iterable: Iterable, kind: str = TRAIN) -> "TimedIterator":
        """Wraps the loop's dataset so that each `next()` is timed.

        Args:
            iterable: a `tf.data.Dataset`, an iterator or any iterable of batches.
            kind: "train" or "validation".

        Returns:
            A `TimedIterator`; each pass over it is one epoch.
        """
        kind = checked_kind(kind, "iterate")
        if not (hasattr(iterable, "__iter__") or hasattr(iterable, "__getitem__")):
            raise TypeError(
                f"`iterate` expects what the loop iterates over (a tf.data.Dataset, an "
                f"iterator or any iterable of batches), got {type(iterable).__name__}. "
                "Pass the object you would write after `for batch in`, e.g. "
                "`for x, y in tuner.iterate(train_ds):`."
            )
        return TimedIterator(self, iterable, kind)

    # What the timed iterator reports.

    def refuse_other_threads(self) -> None:
        """Raises when another thread than the loop's calls in (see `LoopHooks`)."""
        self._hooks.refuse_other_threads()

    def pass_started(self, iterable, kind: str) -> bool:
        """A pass of a `TimedIterator` begins: the driver sees it, an epoch opens.

        Returns:
            Whether the pass's fetches are to be timed.
        """
        # Before the epoch starts: the driver's lint is not the epoch's setup.
        self._hooks.pass_started(iterable, kind)
        timed = self._hooks.measuring() and self._in_run(
            lambda record: record.pass_started(kind) or True
        )
        self._hooks.between_steps()
        return bool(timed)

    def iterator_made(self, iterable, iterator, kind: str) -> None:
        """A `TimedIterator`'s pass made its iterator."""
        self._hooks.iterator_made(iterable, iterator, kind)

    def fetch_done(self, kind: str, called: float, returned: float) -> None:
        """A `TimedIterator` handed over a batch, fetched from `called` to `returned`."""
        self._in_run(lambda record: record.fetch_done(kind, called, returned))
        self._hooks.between_steps()

    def fetch_exhausted(self, kind: str, called: float) -> None:
        """A `TimedIterator`'s pass ran out of data at the fetch begun at `called`."""
        self._in_run(lambda record: record.fetch_exhausted(kind, called))
        self._hooks.between_steps()

    # Timed calls.

    def _eager_call(self, step: _Step, args, kwargs):
        fn, kind, tracing_count = step.fn, step.kind, step.tracing_count
        if self._depth:
            # A call nested in another instrumented call is part of that step.
            return fn(*args, **kwargs)
        if step.wait_for is None:
            step.wait_for = _tensorflow_output_waiter(self._guard)
        traces = tracing_count() if tracing_count is not None else 0
        called_at, outputs, end = self._timed(step, args, kwargs)
        if kind == TRAIN:
            self._hooks.step_ended(kind)
        traced = tracing_count is not None and tracing_count() != traces
        if traced and not step.fetches_inside:
            self._read_trace(step, args, kwargs)
        whole_step = step.fetches_inside or self._fetches_inside(args, kwargs)
        # Reading a trace is the tuner's work, not the next step's input wait.
        returned = time.time() if traced else end
        self._step_done(kind, called_at, end, whole_step, traced, returned)
        self._hooks.between_steps()
        return outputs

    def _framework_call(self, step: _Step, args, kwargs):
        """A JAX or torch step: compute ends when its outputs are ready."""
        if self._depth:
            return step.fn(*args, **kwargs)
        # JAX dispatches asynchronously: the step ends when its outputs are
        # computed, not when the call returns.
        called_at, outputs, end = self._timed(step, args, kwargs)
        if step.kind == TRAIN:
            self._hooks.step_ended(step.kind)
        # The first call compiles (jax.jit): reported apart, as a traced step.
        first = not step.called
        step.called = True
        self._step_done(step.kind, called_at, end, False, first, end)
        self._hooks.between_steps()
        return outputs

    def _timed(self, step: _Step, args, kwargs):
        """Calls the step: `(called_at, outputs, end)`, end when its outputs are ready."""
        self._depth += 1
        called_at = time.time()
        try:
            outputs = step.fn(*args, **kwargs)
            # Errors of asynchronously executed ops surface here: they are the
            # step's own and propagate.
            step.wait_for(outputs)
        except BaseException as error:
            self._depth -= 1
            self._step_failed(step.kind, error)
            raise
        self._depth -= 1
        return called_at, outputs, time.time()

    def _step_failed(self, kind: str, error: BaseException) -> None:
        # As fit's sources do: the record's chain breaks, the run is told.
        if self._in_run(lambda record: record.step_failed(kind) or True):
            if self._guard.enabled(FEATURE):
                with self._guard(FEATURE):
                    self._hooks.on_error(error)

    def _read_trace(self, step: _Step, args, kwargs) -> None:
        """Finds out whether a freshly traced step fetches its batches itself."""
        if not self._guard.enabled(FEATURE):
            return
        with self._guard(FEATURE):
            step.fetches_inside = traced_steps.fetches_inside(step.fn, args, kwargs)

    def _graph_call(self, fn, kind, args, kwargs):
        run = traced_steps.converted(fn)
        plan = None
        if self._depth == 0 and self._guard.enabled(FEATURE):
            with self._guard(FEATURE):
                plan = self._begin_graph_step(args, kwargs)
        if plan is None:
            return run(*args, **kwargs)
        self._depth += 1
        try:
            with tensorflow().control_dependencies([plan.start]):
                outputs = run(*args, **kwargs)
        finally:
            self._depth -= 1
        with self._guard(FEATURE):
            on_step = functools.partial(self._graph_step_done, kind)
            traced_steps.finish(plan, outputs, on_step)
        return outputs

    def _begin_graph_step(self, args, kwargs) -> Optional[traced_steps.GraphStep]:
        reason = traced_steps.untimeable_reason()
        if reason is not None:
            note = self._in_run(lambda record: record.note_untimed(reason))
            if note is not None:
                logger.warning("keras-pipeline-tuner: %s", note)
            return None
        return traced_steps.begin(self._fetches_inside(args, kwargs), args, kwargs)

    def _graph_step_done(self, kind: str, whole_step: bool, start, end) -> None:
        # Runs inside the user's graph: it must never raise.
        if not self._guard.enabled(FEATURE):
            return
        with self._guard(FEATURE):
            if self._hooks.measuring():
                end = float(end)
                self._step_done(kind, float(start), end, whole_step, False, end)

    def _fetches_inside(self, args, kwargs) -> bool:
        # A step given a dataset or iterator fetches its batches itself.
        types = self._fetching_types
        return any(isinstance(value, types) for value in (*args, *kwargs.values()))

    # Bookkeeping (every entry point holds the guard; the callers never raise).

    def _in_run(self, change: Callable[[LoopRecord], Any]) -> Any:
        """Applies `change` to the record of the loop's current, open run, if any.

        Returns:
            What `change` returned, or `None` when no run was going.
        """
        if not self._guard.enabled(FEATURE):
            return None
        with self._guard(FEATURE), self._lock:
            if self._record is None or not self._hooks.running():
                return None
            return change(self._record)
        return None

    def _step_done(self, kind, call_start, end, whole_step, retraced, returned) -> None:
        self._in_run(
            lambda record: record.step_done(kind, call_start, end, whole_step, retraced, returned)
        )


class TimedIterator:
    """Iterates over the loop's dataset and times each `next()` exactly.

    Made by `tuner.iterate(dataset)`. Each pass (each `iter()`) is one epoch: it
    starts when the pass starts, so the iterator's creation is the epoch's setup,
    and ends when the data runs out. A pass left early (`break`) ends at the next
    pass, `tuner.end_epoch()` or `tuner.close()`.

    Args:
        timer: the loop's `LoopTiming`.
        iterable: a `tf.data.Dataset`, an iterator or any iterable of batches.
        kind: "train" or "validation".

    Example:

    ```python
    for x, y in tuner.iterate(train_ds):
        train_step(x, y)
    ```
    """

    def __init__(self, timer: LoopTiming, iterable: Iterable, kind: str = TRAIN):
        self._timer = timer
        self._iterable = iterable
        self._kind = kind
        self._iterator: Optional[Iterator] = None
        self._timed = False

    def __iter__(self) -> "TimedIterator":
        self._timed = self._timer.pass_started(self._iterable, self._kind)
        self._iterator = iter(self._iterable)
        self._timer.iterator_made(self._iterable, self._iterator, self._kind)
        return self

    def __next__(self):
        self._timer.refuse_other_threads()
        if self._iterator is None:
            self.__iter__()
        if not self._timed:
            return next(self._iterator)
        called = time.time()
        try:
            batch = next(self._iterator)
        except StopIteration:
            self._timed = False
            self._timer.fetch_exhausted(self._kind, called)
            raise
        self._timer.fetch_done(self._kind, called, time.time())
        return batch

    def __len__(self) -> int:
        return len(self._iterable)


def _output_waiter(fn) -> Optional[Callable[[Any], None]]:
    """How to wait until a JAX or torch step's outputs are ready; None for TensorFlow.

    A `jax.jit` function, or any step under Keras' JAX backend, is waited for
    with `jax.block_until_ready` on its outputs (never on anything it donates);
    a torch step under Keras' torch backend returns when done on CPU, and is
    synchronised with the device on CUDA.
    """
    if hasattr(fn, "experimental_get_tracing_count"):
        return None  # A tf.function.
    keras = sys.modules.get("keras")
    backend = keras.backend.backend() if keras is not None else None
    module = type(fn).__module__ or ""
    if module.startswith(("jax", "jaxlib")) or backend == "jax":
        return backend_module("jax").block_until_ready
    if backend == "torch":
        torch = backend_module("torch")
        if torch.cuda.is_available():
            return lambda outputs: torch.cuda.synchronize()
        return lambda outputs: None
    return None


def _tensorflow_output_waiter(guard) -> Callable[[Any], None]:
    """How to wait until an eager TensorFlow step's outputs are ready.

    Made at the step's first call, once the user has configured the devices. On
    CPU with synchronous execution (TensorFlow's default) a call returns when
    its kernels have run; accelerators' streams and asynchronous execution do
    not, and are synchronised.
    """
    tf = tensorflow()
    accelerated = False
    if guard.enabled(FEATURE):
        with guard(FEATURE):
            devices = tf.config.list_logical_devices()
            accelerated = any(device.device_type != "CPU" for device in devices)

    def wait(outputs) -> None:
        if accelerated or not tf.config.experimental.get_synchronous_execution():
            tf.test.experimental.sync_devices()

    return wait


def checked_kind(kind: str, where: str) -> str:
    """`kind` if it is "train" or "validation", else a clear error naming `where`."""
    if kind not in KINDS:
        raise ValueError(
            f"`{where}(kind=...)` must be 'train' or 'validation', got {kind!r}. Use "
            "kind='validation' for the steps of a validation loop."
        )
    return kind
