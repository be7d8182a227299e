"""Timing of custom training loops: the step decorator and the timed iterator.

Users who write their own loop (a Python `for` over a dataset that calls a train
step, usually a `tf.function`) get the same step clock as `model.fit` users:

- `@tuner.instrument` times each call of the step. Compute is the time inside the
  call, up to when its outputs are ready; input wait is estimated as the time
  since the previous call returned, which also holds the loop's own Python work.
- `tuner.iterate(dataset)` times each `next()` exactly. With the decorator, the
  exact fetch replaces the estimate, and the loop's own work between the end of a
  step and the next `next()` is reported apart (the clock's host gap).

Both hand the tuner's `StepClock` rows of (start, ready, end), so statistics,
verdict and outputs come from the same code as for `model.fit`.

A step placed inside `@tf.function` (the decorator below it) runs in Python only
while it is traced. It then adds two timestamps to the graph and hands them back
through a `tf.py_function` on every call. A loop compiled whole into one
`tf.function` (the dataset iterated inside the graph) is detected and left
untouched: Python never sees its steps.
"""

import dataclasses
import functools
import logging
import math
import sys
import threading
import time
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Tuple

from keras_pipeline_tuner._util import features
from keras_pipeline_tuner._util.backend_import import backend_module
from keras_pipeline_tuner._util.thread_owner import refuse_another_live_thread
from keras_pipeline_tuner.timing.step_clock import TRAIN
from keras_pipeline_tuner.timing.step_clock import VALIDATION
from keras_pipeline_tuner.timing.step_clock import StepClock
from keras_pipeline_tuner._util.tf_import import tensorflow
from keras_pipeline_tuner.pipeline.lint import keras_inputs as pipeline_lint
from keras_pipeline_tuner.profiling import grain_stages

logger = logging.getLogger("keras_pipeline_tuner")

FEATURE = features.LOOP_CLOCK

# Values of `Report.measurement` for custom loops.
DECORATOR = "decorator"
ITERATOR = "iterator"
DECORATOR_AND_ITERATOR = "decorator+iterator"
WHOLE_STEP = "whole-step"
NOT_TIMED = "not timed"

_KINDS = (TRAIN, VALIDATION)
# Rows kept back and handed to the clock together: `StepClock.record` costs about
# 20 us a call, whatever the number of rows.
_ROWS_PER_RECORD = 64
_LOOP_GRAPHS = ("WhileBodyFuncGraph", "WhileCondFuncGraph")
# Ops by which a traced step takes batches from a dataset itself.
_FETCH_OPS = frozenset(
    (
        "IteratorGetNext",
        "IteratorGetNextSync",
        "IteratorGetNextAsOptional",
        "MultiDeviceIteratorGetNextFromShard",
        "ReduceDataset",
        "DatasetToSingleElement",
    )
)
_DATASET_FUNCTION_MODULES = "tensorflow.python.data."
_WHAT_STILL_WORKS = (
    "What still works: a TF Profiler capture around a few calls "
    "(tf.profiler.experimental.start/stop, then TensorBoard's Profile tab) and the "
    "dataset alone with kpt.benchmark(dataset). For per-step timings, iterate in "
    "Python: `for batch in tuner.iterate(dataset): train_step(batch)`."
)


@dataclasses.dataclass
class LoopHooks:
    """What the loop timer needs of the run it feeds: narrow callables.

    Attributes:
        begin_run: starts a new run; returns its `StepClock`.
        is_current: whether a clock's run is still the latest one (a fit with
            the same tuner starts a run of its own).
        steps_ended: called between steps with how many just finished.
        epoch_ended: called between steps when an epoch ended.
        mark_step: called after each step, for the profiler's step marks.
        inspect: runs the pipeline inspection with the callable it is given.
        finish: ends the run; returns the final `Report`.
        report: the latest `Report`.
        profile_dataset: given the dataset the loop iterates, so that the
            profiler names its stages as in `fit`.
        grain_dataset: given a Grain dataset the loop iterates, for Grain's
            stage timing when the run ends.
    """

    begin_run: Callable[[], StepClock]
    is_current: Callable[[StepClock], bool]
    steps_ended: Callable[[int], None]
    epoch_ended: Callable[[], None]
    mark_step: Callable[[], None]
    inspect: Callable[[Callable[[], Any]], None]
    finish: Callable[[], Any]
    report: Callable[[], Any]
    profile_dataset: Callable[[Any], None] = lambda dataset: None
    grain_dataset: Callable[[Any], None] = lambda dataset: None


@dataclasses.dataclass
class _KindState:
    """Per kind (train or validation): where the loop stands between calls."""

    first: bool = True
    epoch_open: bool = False
    epoch_steps: int = 0
    previous_end: Optional[float] = None
    fetch_called: Optional[float] = None
    fetch_returned: Optional[float] = None
    decorated_steps: int = 0
    fetches: int = 0
    whole_steps: int = 0


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


@dataclasses.dataclass
class _GraphStep:
    """What a traced call needs to finish its timestamps."""

    graph: Any
    start: Any
    ops_before: int
    whole_step: bool


class LoopTimer:
    """Turns the calls of a custom training loop into step-clock rows.

    One per `PipelineTuner`, created at its first custom-loop use;
    `PipelineTuner.instrument`, `iterate`, `end_epoch`, `close` and the context
    manager delegate to it. A run starts at the first measured call (a new run
    with its own `StepClock`, as `fit` starts one) and ends at `close()`.

    Args:
        hooks: the `LoopHooks` of the run it feeds.
        guard: the tuner's `FeatureGuard`.

    Example:

    ```python
    tuner = kpt.PipelineTuner(log_dir="logs/run1")

    @tuner.instrument
    @tf.function
    def train_step(x, y):
        ...

    for x, y in tuner.iterate(train_ds):
        train_step(x, y)
    tuner.close()
    ```
    """

    def __init__(self, hooks: LoopHooks, guard):
        self._hooks = hooks
        self._guard = guard
        # The py_function callback runs on a TensorFlow thread.
        self._lock = threading.Lock()
        self._clock: Optional[StepClock] = None
        self._closed = False
        self._finished = False
        self._states: Dict[str, _KindState] = {}
        self._epochs_done = 0
        self._depth = 0
        self._failed_calls = 0
        self._retraces = 0
        self._untimed: Dict[str, str] = {}
        self._warned_closed = False
        # Recorded but not yet handed to the tuner's outputs (TensorBoard, the
        # report file), which is done between steps, never inside one.
        self._unreported_steps = 0
        self._unreported_epochs = 0
        self._inspected = False
        self._rows: Dict[str, List[Tuple[float, float, float]]] = {kind: [] for kind in _KINDS}
        self._accelerated: Optional[bool] = None
        self._tf = None
        self._fetching_types: Tuple[type, ...] = ()
        # The thread whose loop the run times (see `refuse_other_threads`).
        self._owner: Optional[int] = None

    # Public operations, reached through `PipelineTuner`.

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
        timer = self
        wait_for = _output_waiter(fn)
        if wait_for is not None:
            # A JAX or torch step: no TensorFlow involved.
            step = _Step(fn, kind, None)

            @functools.wraps(fn, updated=())
            def instrumented_step(*args, **kwargs):
                timer.refuse_other_threads()
                if not timer._measuring():
                    return fn(*args, **kwargs)
                return timer._framework_call(step, wait_for, args, kwargs)

            return instrumented_step
        tf = tensorflow()
        step = _Step(fn, kind, getattr(fn, "experimental_get_tracing_count", None))
        self._tf = tf
        self._fetching_types = (
            tf.data.Dataset,
            tf.data.Iterator,
            tf.distribute.DistributedDataset,
            tf.distribute.DistributedIterator,
        )

        @functools.wraps(fn, updated=())
        def instrumented(*args, **kwargs):
            timer.refuse_other_threads()
            if not timer._measuring():
                return fn(*args, **kwargs)
            if not tf.executing_eagerly():
                return timer._graph_call(fn, kind, args, kwargs)
            return timer._eager_call(step, args, kwargs)

        return _left_to_python(instrumented)

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

    def end_epoch(self) -> None:
        """Closes the current epoch (training and validation) and starts the next."""
        if not self._guard.enabled(FEATURE):
            return
        with self._guard(FEATURE), self._lock:
            if self._clock is None or not self._is_current() or self._closed:
                return
            for kind in _KINDS:
                self._close_epoch(kind)
            # The next epoch starts now, so its setup (a new iterator, the
            # first fetch) is measured up to its first step.
            self._open_epoch(TRAIN)
        self._after_steps()

    def open(self) -> None:
        """Lets a closed timer measure a new run (entering `with tuner:`)."""
        with self._lock:
            if self._closed:
                self._closed = False
                self._clock = None

    def close(self):
        """Ends the run: closes open epochs, then builds and writes the report.

        Returns:
            The final `Report`.
        """
        running = False
        if self._guard.enabled(FEATURE):
            with self._guard(FEATURE), self._lock:
                running = self._clock is not None and self._is_current() and not self._closed
                if running:
                    for kind in _KINDS:
                        self._close_epoch(kind)
        self._closed = True
        # `finish` writes everything measured.
        self._unreported_steps = self._unreported_epochs = 0
        if running and not self._finished:
            self._finished = True
            return self._hooks.finish()
        return self._hooks.report()

    def refuse_other_threads(self) -> None:
        """Raises when a thread other than the one running the loop's run calls in.

        One tuner times one loop: the steps of two threads would be mixed in one
        report. A run whose thread has ended (or that was closed) is over.
        """
        if self._closed:
            return
        refuse_another_live_thread(
            self._owner,
            "This PipelineTuner is timing a training loop in another thread: one tuner "
            "times one loop at a time (the steps of two threads would be mixed in one "
            "report). Give each thread's loop a PipelineTuner (or kpt.instrument) of its own.",
        )

    def describe(self) -> Optional[Tuple[str, List[str]]]:
        """How the loop's run was measured, for the report.

        Returns:
            `(measurement, notes)` while the loop's run is the latest one, else
            `None`.
        """
        with self._lock:
            if self._clock is None or not self._is_current():
                return None
            return self._measurement(), self._notes()

    def flush_rows(self) -> None:
        """Hands the steps kept back (they are recorded in batches) to the clock."""
        with self._lock:
            if self._clock is not None and self._is_current():
                self._flush_rows()

    # Timed calls.

    def _eager_call(self, step: _Step, args, kwargs):
        fn, kind, tracing_count = step.fn, step.kind, step.tracing_count
        if self._depth:
            # A call nested in another instrumented call is part of that step.
            return fn(*args, **kwargs)
        if self._accelerated is None:
            self._find_accelerators()
        traces = tracing_count() if tracing_count is not None else 0
        self._depth += 1
        called_at = time.time()
        try:
            outputs = fn(*args, **kwargs)
            # Errors of asynchronously executed ops surface here: they are the
            # step's own and propagate.
            self._wait_for_outputs()
        except BaseException:
            self._depth -= 1
            self._step_failed(kind)
            raise
        end = time.time()
        self._depth -= 1
        if kind == TRAIN:
            self._hooks.mark_step()
        traced = tracing_count is not None and tracing_count() != traces
        if traced and not step.fetches_inside:
            self._read_trace(step, args, kwargs)
        whole_step = step.fetches_inside or self._fetches_inside(args, kwargs)
        # Reading a trace is the tuner's work, not the next step's input wait.
        returned = time.time() if traced else end
        self._step_done(kind, called_at, end, whole_step, traced, returned)
        self._after_steps()
        return outputs

    def _framework_call(self, step: _Step, wait_for: Callable[[Any], None], args, kwargs):
        """A JAX or torch step: compute ends when its outputs are ready."""
        fn, kind = step.fn, step.kind
        if self._depth:
            return fn(*args, **kwargs)
        self._depth += 1
        called_at = time.time()
        try:
            outputs = fn(*args, **kwargs)
            # JAX dispatches asynchronously: the step ends when its outputs
            # are computed, not when the call returns.
            wait_for(outputs)
        except BaseException:
            self._depth -= 1
            self._step_failed(kind)
            raise
        end = time.time()
        self._depth -= 1
        # The first call compiles (jax.jit): reported apart, as a traced step.
        first = not step.called
        step.called = True
        self._step_done(kind, called_at, end, False, first, end)
        self._after_steps()
        return outputs

    def _read_trace(self, step: _Step, args, kwargs) -> None:
        """Finds out whether a freshly traced step fetches its batches itself."""
        if not self._guard.enabled(FEATURE):
            return
        with self._guard(FEATURE):
            # The call just traced it: this finds the trace, it does not trace again.
            graph = step.fn.get_concrete_function(*args, **kwargs).graph.as_graph_def()
            ops = {node.op for node in graph.node}
            for function in graph.library.function:
                ops.update(node.op for node in function.node_def)
            step.fetches_inside = bool(ops & _FETCH_OPS)

    def _graph_call(self, fn, kind, args, kwargs):
        tf = tensorflow()
        autograph = tf.__internal__.autograph
        run = autograph.tf_convert(fn, autograph.control_status_ctx())
        plan = None
        if self._depth == 0 and self._guard.enabled(FEATURE):
            with self._guard(FEATURE):
                plan = self._begin_graph_step(kind, args, kwargs)
        if plan is None:
            return run(*args, **kwargs)
        self._depth += 1
        try:
            with tf.control_dependencies([plan.start]):
                outputs = run(*args, **kwargs)
        finally:
            self._depth -= 1
        with self._guard(FEATURE):
            self._finish_graph_step(kind, plan, outputs)
        return outputs

    def _begin_graph_step(self, kind, args, kwargs) -> Optional[_GraphStep]:
        tf = tensorflow()
        reason = _untimeable_reason(tf)
        if reason is not None:
            with self._lock:
                self._note_untimed(reason)
            return None
        graph = tf.compat.v1.get_default_graph()
        inputs = _graph_tensors(tf, graph, (args, kwargs))
        # The step starts when its inputs are there, so the fetch that feeds it
        # inside the same graph counts as input wait, not compute.
        with tf.control_dependencies(inputs):
            start = tf.timestamp()
        return _GraphStep(
            graph=graph,
            start=start,
            ops_before=len(graph.get_operations()),
            whole_step=self._fetches_inside(args, kwargs),
        )

    def _finish_graph_step(self, kind: str, plan: _GraphStep, outputs) -> None:
        tf = tensorflow()
        created = plan.graph.get_operations()[plan.ops_before:]
        # The weight updates and other side effects end the step too, not only
        # the returned values; ops nobody needs stay prunable.
        effects = [op for op in created if op.op_def is not None and op.op_def.is_stateful]
        with tf.control_dependencies(effects + _graph_tensors(tf, plan.graph, outputs)):
            end = tf.timestamp()
        callback = functools.partial(self._graph_step_done, kind, plan.whole_step)
        tf.py_function(callback, [plan.start, end], [])

    def _graph_step_done(self, kind: str, whole_step: bool, start, end) -> None:
        # Runs inside the user's graph: it must never raise.
        if not self._guard.enabled(FEATURE):
            return
        with self._guard(FEATURE):
            if self._measuring():
                end = float(end)
                self._step_done(kind, float(start), end, whole_step, False, end)

    def _find_accelerators(self) -> None:
        # Asked at the first call, once the user has configured the devices.
        if not self._guard.enabled(FEATURE):
            return
        with self._guard(FEATURE):
            devices = self._tf.config.list_logical_devices()
            self._accelerated = any(device.device_type != "CPU" for device in devices)

    def _wait_for_outputs(self) -> None:
        """Returns when the step's outputs are ready, not merely dispatched."""
        tf = self._tf
        # On CPU with synchronous execution (TF's default) a call returns when its
        # kernels have run; accelerators' streams and asynchronous execution do not.
        if self._accelerated or not tf.config.experimental.get_synchronous_execution():
            tf.test.experimental.sync_devices()

    def _fetches_inside(self, args, kwargs) -> bool:
        # A step given a dataset or iterator fetches its batches itself.
        types = self._fetching_types
        return any(isinstance(value, types) for value in (*args, *kwargs.values()))

    def _after_steps(self) -> None:
        """Hands finished steps and epochs to the tuner's outputs, as `fit` does."""
        if self._clock is None or self._closed or not self._guard.enabled(FEATURE):
            return
        # The outputs build the report, which takes the lock: never held here.
        with self._guard(FEATURE):
            steps, epochs = self._unreported_steps, self._unreported_epochs
            self._unreported_steps = self._unreported_epochs = 0
            if epochs:
                # Writes the epoch's outputs (and converts a profiler window
                # closed this epoch), between steps.
                self._hooks.epoch_ended()
            self._hooks.steps_ended(steps)

    def _inspect(self, iterable, kind: str) -> None:
        """Lints the training dataset once per run, before its first batch, as `fit` does."""
        if kind != TRAIN or not self._measuring() or self._inspected:
            return
        self._inspected = True
        if grain_stages.is_grain_dataset(iterable):
            self._hooks.grain_dataset(iterable)
            return
        if sys.modules.get("tensorflow") is None:
            # Not a tf.data dataset: without TensorFlow imported, there is none.
            return
        tf = tensorflow()
        if not isinstance(iterable, (tf.data.Dataset, tf.distribute.DistributedDataset)):
            return
        if isinstance(iterable, tf.data.Dataset):
            self._hooks.profile_dataset(iterable)
        self._hooks.inspect(lambda: pipeline_lint.inspect(iterable))

    # Bookkeeping (every entry point holds the guard; the callers never raise).

    def _measuring(self) -> bool:
        if not self._guard.enabled(FEATURE):
            return False
        with self._guard(FEATURE), self._lock:
            if self._closed:
                if not self._warned_closed:
                    self._warned_closed = True
                    logger.warning(
                        "keras-pipeline-tuner: the tuner was closed, so later steps are not "
                        "measured. Use a new PipelineTuner (or `with tuner:` again) for a "
                        "new run."
                    )
                return False
            if self._clock is None or not self._is_current():
                self._start_run()
            return True
        return False

    def _is_current(self) -> bool:
        # A fit with this tuner replaces its clock; the custom-loop run is over.
        return self._hooks.is_current(self._clock)

    def _start_run(self) -> None:
        self._owner = threading.get_ident()
        self._clock = self._hooks.begin_run()
        self._finished = False
        self._states = {kind: _KindState() for kind in _KINDS}
        self._epochs_done = 0
        self._failed_calls = 0
        self._retraces = 0
        self._untimed = {}
        self._unreported_steps = self._unreported_epochs = 0
        self._inspected = False
        self._rows = {kind: [] for kind in _KINDS}

    def _step_done(self, kind, call_start, end, whole_step, retraced, returned) -> None:
        if not self._guard.enabled(FEATURE):
            return
        with self._guard(FEATURE), self._lock:
            if self._clock is None or not self._is_current():
                return
            state = self._state(kind)
            if whole_step:
                row = (call_start, math.nan, end)
                state.whole_steps += 1
                state.fetch_called = state.fetch_returned = None
            elif state.fetch_called is not None:
                row = (state.fetch_called, state.fetch_returned, end)
                state.fetch_called = state.fetch_returned = None
            elif state.previous_end is not None:
                row = (state.previous_end, call_start, end)
            else:
                # The first step of an epoch: nothing says when its wait began.
                row = (call_start, math.nan, end)
            if retraced and not state.first:
                self._retraces += 1
            state.decorated_steps += 1
            self._record(kind, state, row)
            state.previous_end = returned

    def _step_failed(self, kind: str) -> None:
        if not self._guard.enabled(FEATURE):
            return
        with self._guard(FEATURE), self._lock:
            if self._clock is None or not self._is_current():
                return
            state = self._states[kind]
            # The failed call used the fetched batch; the next step's wait
            # starts from nothing known.
            state.fetch_called = state.fetch_returned = None
            state.previous_end = None
            self._failed_calls += 1

    def _fetch_started(self, kind: str) -> bool:
        """Starts an epoch of `kind` for a new pass of `iterate`."""
        if not self._measuring():
            return False
        with self._guard(FEATURE), self._lock:
            state = self._states[kind]
            if state.epoch_open and state.epoch_steps:
                self._close_epoch(kind)
            # (Re)started here, so the epoch's setup is its iterator's creation.
            self._open_epoch(kind)
            state.fetch_called = state.fetch_returned = None
            return True
        return False

    def _fetch_done(self, kind: str, called: float, returned: float) -> None:
        if not self._guard.enabled(FEATURE):
            return
        with self._guard(FEATURE), self._lock:
            if self._clock is None or not self._is_current() or self._closed:
                return
            state = self._state(kind)
            state.fetches += 1
            if state.decorated_steps == 0:
                # No decorated step: a step lasts from its batch to the next fetch.
                if state.fetch_called is not None:
                    self._record(kind, state, (state.fetch_called, state.fetch_returned, called))
                state.fetch_called = called
            elif state.fetch_called is None:
                state.fetch_called = called
            state.fetch_returned = returned

    def _fetch_exhausted(self, kind: str, called: float) -> None:
        if not self._guard.enabled(FEATURE):
            return
        with self._guard(FEATURE), self._lock:
            if self._clock is None or not self._is_current() or self._closed:
                return
            state = self._states[kind]
            if state.decorated_steps == 0 and state.fetch_called is not None:
                self._record(kind, state, (state.fetch_called, state.fetch_returned, called))
            self._close_epoch(kind)

    def _record(self, kind: str, state: _KindState, row: Tuple[float, float, float]) -> None:
        if state.first:
            state.first = False
            self._clock.record_first_step(kind, row[2] - row[0], [row])
            # Seen from Python, tracing cannot be told apart from compute.
            self._clock.first_steps[kind].tracing_ms = None
        else:
            rows = self._rows[kind]
            rows.append(row)
            if len(rows) >= _ROWS_PER_RECORD:
                self._flush_rows()
        state.previous_end = row[2]
        state.epoch_steps += 1

    def _flush_rows(self) -> None:
        # Before any epoch change: the clock files rows under the current epoch.
        for kind in _KINDS:
            rows = self._rows[kind]
            if rows:
                self._rows[kind] = []
                self._clock.record(kind, rows)
                if kind == TRAIN:
                    self._unreported_steps += len(rows)

    def _state(self, kind: str) -> _KindState:
        state = self._states[kind]
        if not state.epoch_open:
            self._open_epoch(kind)
        return state

    def _open_epoch(self, kind: str) -> None:
        self._flush_rows()
        state = self._states[kind]
        epoch = self._epochs_done if kind == TRAIN else self._clock.epoch
        self._clock.begin_epoch(epoch, kind)
        state.epoch_open = True
        state.epoch_steps = 0
        state.previous_end = None

    def _close_epoch(self, kind: str) -> None:
        self._flush_rows()
        state = self._states[kind]
        # A batch whose step never ended (the loop broke out) is not a step.
        state.fetch_called = state.fetch_returned = None
        if not state.epoch_open:
            return
        state.epoch_open = False
        if state.epoch_steps:
            self._clock.end_epoch(kind)
            if kind == TRAIN:
                self._epochs_done += 1
                self._unreported_epochs += 1

    def _note_untimed(self, reason: str) -> None:
        if reason in self._untimed:
            return
        note = f"Steps are not timed one by one because {reason}. {_WHAT_STILL_WORKS}"
        self._untimed[reason] = note
        logger.warning("keras-pipeline-tuner: %s", note)

    # Report.

    def _measurement(self) -> str:
        state = self._states[TRAIN]
        if state.whole_steps:
            return WHOLE_STEP
        if state.decorated_steps and state.fetches:
            return DECORATOR_AND_ITERATOR
        if state.decorated_steps:
            return DECORATOR
        if state.fetches:
            return ITERATOR
        return NOT_TIMED if self._untimed else DECORATOR

    def _notes(self) -> List[str]:
        notes = list(self._untimed.values())
        train = self._states[TRAIN]
        measurement = self._measurement() if train.decorated_steps or train.fetches else None
        if measurement == DECORATOR:
            notes.append(
                "Input wait is estimated as the time between calls of the decorated step, "
                "so it also holds the loop's own Python work. Iterate with "
                "`tuner.iterate(dataset)` to time each batch fetch exactly."
            )
        elif measurement == ITERATOR:
            notes.append(
                "Compute is the time from a batch's arrival to the next fetch, so it also "
                "holds the loop's own Python work. Decorate the train step with "
                "`@tuner.instrument` to time it on its own."
            )
        elif measurement == WHOLE_STEP:
            notes.append(
                "The decorated step fetches its batches itself (it is given a dataset or "
                "iterator, or iterates one inside its graph), so input wait is not "
                "separated from compute: only the time of each call is measured, and a "
                "call that runs a whole loop counts as one step. Pass it the batches "
                "instead: `for x, y in tuner.iterate(dataset): train_step(x, y)`."
            )
        if self._retraces:
            notes.append(
                f"The step was traced again {self._retraces} time(s) after its first call "
                "(new input shapes, dtypes or Python values); each retrace counts as "
                "compute of its step. Give the tf.function an `input_signature` or "
                "`reduce_retracing=True`."
            )
        if self._failed_calls:
            notes.append(
                f"{self._failed_calls} call(s) of the step raised an exception; they are "
                "not counted as steps."
            )
        return notes


class TimedIterator:
    """Iterates over the loop's dataset and times each `next()` exactly.

    Made by `tuner.iterate(dataset)`. Each pass (each `iter()`) is one epoch: it
    starts when the pass starts, so the iterator's creation is the epoch's setup,
    and ends when the data runs out. A pass left early (`break`) ends at the next
    pass, `tuner.end_epoch()` or `tuner.close()`.

    Args:
        timer: the tuner's `LoopTimer`.
        iterable: a `tf.data.Dataset`, an iterator or any iterable of batches.
        kind: "train" or "validation".

    Example:

    ```python
    for x, y in tuner.iterate(train_ds):
        train_step(x, y)
    ```
    """

    def __init__(self, timer: LoopTimer, iterable: Iterable, kind: str = TRAIN):
        self._timer = timer
        self._iterable = iterable
        self._kind = kind
        self._iterator: Optional[Iterator] = None
        self._timed = False

    def __iter__(self) -> "TimedIterator":
        # Before the epoch starts: the lint is not the epoch's setup.
        self._timer._inspect(self._iterable, self._kind)
        self._timed = self._timer._fetch_started(self._kind)
        self._timer._after_steps()
        self._iterator = iter(self._iterable)
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
            self._timer._fetch_exhausted(self._kind, called)
            self._timer._after_steps()
            raise
        self._timer._fetch_done(self._kind, called, time.time())
        self._timer._after_steps()
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


def checked_kind(kind: str, where: str) -> str:
    """`kind` if it is "train" or "validation", else a clear error naming `where`."""
    if kind not in _KINDS:
        raise ValueError(
            f"`{where}(kind=...)` must be 'train' or 'validation', got {kind!r}. Use "
            "kind='validation' for the steps of a validation loop."
        )
    return kind


def _left_to_python(wrapper: Callable) -> Callable:
    """Keeps AutoGraph out of the tuner's own code when a step is traced.

    An AutoGraph "artifact" is called as it is, under the caller's conversion
    status, so `_graph_call` can still convert the user's step exactly when the
    enclosing `tf.function` converts code; `do_not_convert` would turn conversion
    off for the user's step as well.
    """
    try:
        from tensorflow.python.autograph.impl.api import autograph_artifact
    except ImportError:
        return tensorflow().autograph.experimental.do_not_convert(wrapper)
    return autograph_artifact(wrapper)


def _untimeable_reason(tf) -> Optional[str]:
    """Why a step traced into the current graph cannot report each call, if so."""
    graph = tf.compat.v1.get_default_graph()
    try:
        from tensorflow.python.ops import control_flow_util

        in_xla = control_flow_util.GraphOrParentsInXlaContext(graph)
    except (ImportError, AttributeError):
        return (
            "this TensorFlow version does not say whether the step is XLA-compiled, "
            "and a compiled step cannot call back into Python; put @tuner.instrument "
            "above @tf.function"
        )
    if in_xla:
        return (
            "the step is compiled with XLA (jit_compile=True), which cannot call back "
            "into Python; put @tuner.instrument above @tf.function(jit_compile=True)"
        )
    outer = graph
    while outer is not None:
        if type(outer).__name__ in _LOOP_GRAPHS:
            return "the whole loop is compiled into one tf.function (a graph while loop)"
        outer = getattr(outer, "outer_graph", None)
    if _tracing_dataset_function():
        return (
            "the whole loop is compiled into one tf.function (the dataset is iterated "
            "inside the graph)"
        )
    context = tf.distribute.get_replica_context()
    if context is not None and context.num_replicas_in_sync > 1:
        return (
            "the step runs once per replica inside strategy.run; decorate the function "
            "that calls strategy.run instead"
        )
    return None


def _tracing_dataset_function() -> bool:
    # tf.data traces the functions it runs (a `for` over a dataset inside a
    # tf.function becomes one) from its own modules; no graph attribute says so.
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_globals.get("__name__", "").startswith(_DATASET_FUNCTION_MODULES):
            return True
        frame = frame.f_back
    return False


def _graph_tensors(tf, graph, structure) -> list:
    """The symbolic tensors of `graph` in a nested structure."""
    tensors = []
    for value in tf.nest.flatten(structure, expand_composites=True):
        if isinstance(value, tf.Tensor) and getattr(value, "graph", None) is graph:
            tensors.append(value)
    return tensors
