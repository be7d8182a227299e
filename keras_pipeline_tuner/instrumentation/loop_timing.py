"""Timing of custom training loops: the step decorator and the timed iterator.

Users who write their own loop (a Python `for` over a dataset that calls a train
step, usually a `tf.function`) get the same step clock as `model.fit` users:

- `@tuner.instrument` times each call of the step. Compute is the time inside the
  call, up to when its outputs are ready; input wait is estimated as the time
  since the previous call returned, which also holds the loop's own Python work.
- `tuner.iterate(dataset)` times each `next()` exactly. With the decorator, the
  exact fetch replaces the estimate, and the loop's own work between the end of a
  step and the next `next()` is reported apart (the clock's host gap).

Both hand the run the same `(start, ready, end)` rows as fit's timing sources,
through the same verbs (`Run.begin_epoch`, `add_rows`, `end_epoch`): the first
call kept apart, the rows recorded together, the statistics, verdict, probes
and outputs all from the same code as for `model.fit`.

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
from keras_pipeline_tuner._util.thread_owner import refuse_another_live_thread
from keras_pipeline_tuner.instrumentation import traced_steps
from keras_pipeline_tuner.instrumentation.grain_stage_timing import GrainStageTimer
from keras_pipeline_tuner.instrumentation.loop_record import KINDS
from keras_pipeline_tuner.instrumentation.loop_record import LoopRecord
from keras_pipeline_tuner.pipeline.lint import keras_inputs as pipeline_lint
from keras_pipeline_tuner.profiling import grain_stages
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


class LoopTimer:
    """Turns the calls of a custom training loop into step-clock rows.

    One per `PipelineTuner`, created at its first custom-loop use;
    `PipelineTuner.instrument`, `iterate`, `end_epoch`, `close` and the context
    manager delegate to it. A run starts at the first measured call (a new run,
    as `fit` starts one) and ends at `close()`.

    Args:
        begin_run: begins a run for the loop, given the callable that says how
            the loop measured it (`describe`); returns the `Run`.
        is_current: whether a run is still the tuner's latest (a fit with the
            same tuner starts a run of its own, which ends the loop's).
        finish_run: ends a run, given the tf.data dataset the loop iterated
            (for the probes), or `None`; returns the final `Report`.
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

    def __init__(
        self,
        begin_run: Callable[[Callable[[], Optional[tuple]]], Any],
        is_current: Callable[[Any], bool],
        finish_run: Callable[[Any, Any], Any],
        guard,
    ):
        self._begin_run = begin_run
        # A fit with the same tuner starts a run of its own: the loop's is over.
        self._is_current_run = is_current
        self._finish_run = finish_run
        self._guard = guard
        # The py_function callback runs on a TensorFlow thread.
        self._lock = threading.Lock()
        # The run the loop feeds (see `run.lifecycle.Run`), once it began, and
        # what its calls and fetches added up to.
        self._run = None
        self._record: Optional[LoopRecord] = None
        # The tf.data dataset iterated for training, for the probes at the end.
        self._dataset = None
        # Grain's stage timing of the training passes over a Grain dataset.
        self._grain: Optional[GrainStageTimer] = None
        self._grain_dataset = None
        self._closed = False
        self._finished = False
        self._depth = 0
        self._warned_closed = False
        self._inspected = False
        self._fetching_types: Tuple[type, ...] = ()
        # The thread whose loop the run times (see `refuse_other_threads`).
        self._owner: Optional[int] = None

    # Public operations, reached through `PipelineTuner` and `TimedIterator`.

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
            step = _Step(fn, kind, None, wait_for=wait_for)

            @functools.wraps(fn, updated=())
            def instrumented_step(*args, **kwargs):
                timer.refuse_other_threads()
                if not timer._measuring():
                    return fn(*args, **kwargs)
                return timer._framework_call(step, args, kwargs)

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
            timer.refuse_other_threads()
            if not timer._measuring():
                return fn(*args, **kwargs)
            if not tf.executing_eagerly():
                return timer._graph_call(fn, kind, args, kwargs)
            return timer._eager_call(step, args, kwargs)

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

    def end_epoch(self) -> None:
        """Closes the current epoch (training and validation) and starts the next."""
        self._in_run(lambda record: record.end_epoch())
        self._read_grain_stages(final=False)
        self.after_steps()

    def open(self) -> None:
        """Lets a closed timer measure a new run (entering `with tuner:`)."""
        with self._lock:
            if self._closed:
                self._closed = False
                self._run = None

    def close(self):
        """Ends the run: closes open epochs, then the probes, the report, the outputs.

        Returns:
            The final `Report`, or `None` when no loop's run was going.
        """
        running = self._in_run(lambda record: record.close_epochs() or True)
        self._closed = True
        if self._record is not None:
            # `finish` writes everything measured.
            self._record.take_unreported()
        self._read_grain_stages(final=True)
        if running and not self._finished:
            self._finished = True
            return self._finish_run(self._run, self._dataset)
        return None

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
            if self._run is None or not self._is_current_run(self._run):
                return None
            return self._record.measurement(), self._record.notes()

    def pass_started(self, iterable, kind: str) -> bool:
        """A pass of a `TimedIterator` begins: lints the dataset, opens an epoch.

        Returns:
            Whether the pass's fetches are to be timed.
        """
        # Before the epoch starts: the lint is not the epoch's setup.
        self._inspect(iterable, kind)
        timed = self._measuring() and self._in_run(
            lambda record: record.pass_started(kind) or True
        )
        self.after_steps()
        return bool(timed)

    def iterator_made(self, iterable, iterator, kind: str) -> None:
        """A `TimedIterator`'s pass made its iterator: Grain times a training pass's stages."""
        grain = self._grain
        if grain is not None and kind == TRAIN and iterable is self._grain_dataset:
            grain.track(iterator)

    def fetch_done(self, kind: str, called: float, returned: float) -> None:
        """A `TimedIterator` handed over a batch, fetched from `called` to `returned`."""
        self._in_run(lambda record: record.fetch_done(kind, called, returned))
        self.after_steps()

    def fetch_exhausted(self, kind: str, called: float) -> None:
        """A `TimedIterator`'s pass ran out of data at the fetch begun at `called`."""
        self._in_run(lambda record: record.fetch_exhausted(kind, called))
        self.after_steps()

    def after_steps(self) -> None:
        """Hands finished steps and epochs to the tuner's outputs, as `fit` does."""
        if self._run is None or self._closed or not self._guard.enabled(FEATURE):
            return
        # The outputs build the report, which takes the lock: never held here.
        with self._guard(FEATURE):
            with self._lock:
                steps, epochs = self._record.take_unreported()
            if epochs:
                # Writes the epoch's outputs (and converts a profiler window
                # closed this epoch), between steps.
                self._run.epoch_ended()
            self._run.steps_ended(steps)

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
            self._run.mark_loop_step()
        traced = tracing_count is not None and tracing_count() != traces
        if traced and not step.fetches_inside:
            self._read_trace(step, args, kwargs)
        whole_step = step.fetches_inside or self._fetches_inside(args, kwargs)
        # Reading a trace is the tuner's work, not the next step's input wait.
        returned = time.time() if traced else end
        self._step_done(kind, called_at, end, whole_step, traced, returned)
        self.after_steps()
        return outputs

    def _framework_call(self, step: _Step, args, kwargs):
        """A JAX or torch step: compute ends when its outputs are ready."""
        if self._depth:
            return step.fn(*args, **kwargs)
        # JAX dispatches asynchronously: the step ends when its outputs are
        # computed, not when the call returns.
        called_at, outputs, end = self._timed(step, args, kwargs)
        # The first call compiles (jax.jit): reported apart, as a traced step.
        first = not step.called
        step.called = True
        self._step_done(step.kind, called_at, end, False, first, end)
        self.after_steps()
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
        except BaseException:
            self._in_run(lambda record: record.step_failed(step.kind))
            raise
        finally:
            self._depth -= 1
        return called_at, outputs, time.time()

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
            with self._lock:
                note = self._record.note_untimed(reason)
            if note is not None:
                logger.warning("keras-pipeline-tuner: %s", note)
            return None
        return traced_steps.begin(self._fetches_inside(args, kwargs), args, kwargs)

    def _graph_step_done(self, kind: str, whole_step: bool, start, end) -> None:
        # Runs inside the user's graph: it must never raise.
        if not self._guard.enabled(FEATURE):
            return
        with self._guard(FEATURE):
            if self._measuring():
                end = float(end)
                self._step_done(kind, float(start), end, whole_step, False, end)

    def _fetches_inside(self, args, kwargs) -> bool:
        # A step given a dataset or iterator fetches its batches itself.
        types = self._fetching_types
        return any(isinstance(value, types) for value in (*args, *kwargs.values()))

    def _inspect(self, iterable, kind: str) -> None:
        """Lints the training dataset once per run, before its first batch, as `fit` does."""
        if kind != TRAIN or not self._measuring() or self._inspected:
            return
        self._inspected = True
        if grain_stages.is_grain_dataset(iterable):
            self._run.grain_dataset = iterable
            self._begin_grain_stages(iterable)
            return
        if sys.modules.get("tensorflow") is None:
            # Not a tf.data dataset: without TensorFlow imported, there is none.
            return
        tf = tensorflow()
        if not isinstance(iterable, (tf.data.Dataset, tf.distribute.DistributedDataset)):
            return
        if isinstance(iterable, tf.data.Dataset):
            self._run.window.use_dataset(iterable)
            self._dataset = iterable
        self._run.inspect(lambda: pipeline_lint.inspect(iterable))

    def _begin_grain_stages(self, dataset) -> None:
        if not self._guard.enabled(features.GRAIN_STAGES):
            return
        with self._guard(features.GRAIN_STAGES):
            timer = GrainStageTimer(
                on_failure=lambda reason: self._guard.disable(features.GRAIN_STAGES, reason)
            )
            timer.begin_tracking()
            self._grain, self._grain_dataset = timer, dataset

    def _read_grain_stages(self, final: bool) -> None:
        """Hands Grain's timing so far to the run; `final` ends the timing."""
        timer, run = self._grain, self._run
        if timer is None:
            return
        if final:
            self._grain = self._grain_dataset = None
        # Ended even when the feature failed meanwhile: `end` puts back first.
        with self._guard(features.GRAIN_STAGES):
            evidence = timer.end() if final else timer.so_far()
            if evidence is not None and run is not None:
                if self._guard.enabled(features.GRAIN_STAGES):
                    run.stage_timing = evidence

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
            if self._run is None or not self._is_current_run(self._run):
                self._start_run()
            return True
        return False

    def _in_run(self, change: Callable[[LoopRecord], Any]) -> Any:
        """Applies `change` to the record of the loop's current, open run, if any.

        Returns:
            What `change` returned, or `None` when no run was going.
        """
        if not self._guard.enabled(FEATURE):
            return None
        with self._guard(FEATURE), self._lock:
            if self._run is None or not self._is_current_run(self._run) or self._closed:
                return None
            return change(self._record)
        return None

    def _start_run(self) -> None:
        # A run left open (its loop not closed) ends its Grain timing here.
        self._read_grain_stages(final=True)
        self._owner = threading.get_ident()
        self._run = self._begin_run(self.describe)
        self._record = LoopRecord(self._run)
        self._dataset = None
        self._finished = False
        self._inspected = False

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
