"""Input wait and compute of `model.fit` steps on the JAX backend.

Since Keras 3.7 the function Keras builds for `model.train_function` on JAX calls
`next(iterator)` in Python and then the `jax.jit`-compiled step,
`steps_per_execution` times per call. The compiled call returns long before the
step is done (asynchronous dispatch, even on CPU), so:

- each batch fetch is timed around `next()`, by handing Keras' function an
  iterator that stamps it; that is the "fetch time", reported apart;
- each step ends when its outputs (the logs) are ready, never waited for on
  the training thread (nor on the state, which JAX donates to the next step).
  With one step per call, Keras itself already waits for each call's logs
  before its batch-end hooks (`pythonify_logs`, on its callback thread), so
  the end is stamped in the tuner's batch-end hook (`logs_ready`): no thread
  of the tuner's own wakes per step, which on steps of a fraction of a
  millisecond cost more than a tenth of the step. With several steps per call,
  whose logs Keras sees only for the last, a background thread stamps each
  step with `jax.block_until_ready` on that step's outputs; it takes them
  straight from a deque while busy and is woken only when it has run out;
- the input wait is the device's idle time waiting for the batch
  (`timing.device_stall`), not the time inside `next()`, much of which overlaps
  the previous step.

To see each step's outputs also with `steps_per_execution > 1`, Keras itself
builds the timed function (`make_train_function(force=True)`) around a step that
hands its outputs to the background thread: same jitted step, same shardings,
same weights. It is built once per model and kind and reused by later fits, so
a second fit compiles nothing extra; Keras' own function is put back at the end.

Rows are handed to the run in batches of calls (`DELIVER_EVERY` calls or
`DELIVER_AFTER_S` seconds, and whenever the run asks for them): recording them
is NumPy work with a fixed cost per hand-over of some hundred microseconds on
the training thread, which handed over every few steps would cost each step of
a fraction of a millisecond several per cent.

When fit is given a tf.data dataset, the TF Profiler window can mark each
training call (`trace_step`): the marker spans the whole call, that is the
batch fetch and the step's dispatch, on the training thread.
"""

import collections
import dataclasses
import logging
import math
import threading
import time
import weakref
from typing import Callable, Dict, List, Optional

import numpy as np

from keras_pipeline_tuner.instrumentation.timing_source import ATTRIBUTE
from keras_pipeline_tuner.instrumentation.timing_source import FitTiming
from keras_pipeline_tuner._util.backend_import import backend_module
from keras_pipeline_tuner.instrumentation import fit_input
from keras_pipeline_tuner.timing.device_stall import stall_row
from keras_pipeline_tuner.timing.step_clock import TRAIN
from keras_pipeline_tuner.timing.step_clock import VALIDATION

logger = logging.getLogger("keras_pipeline_tuner")

_MAKE = {TRAIN: "make_train_function", VALIDATION: "make_test_function"}
# Where the timed functions of a model are kept between fits.
_CACHE_ATTRIBUTE = "_pipeline_tuner_jax_functions"
# The longest the end of a fit waits for the last step's outputs to be stamped.
_FLUSH_TIMEOUT_S = 300.0
# Rows are handed to the run once this many calls have ended, or this long after
# the last hand-over, whichever comes first (and at every flush): each hand-over
# is NumPy work of a few hundred microseconds on the training thread, whatever
# its size, so on sub-millisecond steps it must be rare; on slow steps the
# time bound keeps the live outputs current.
DELIVER_EVERY = 1024
DELIVER_AFTER_S = 1.0


def unsupported_reason(model) -> Optional[str]:
    """Says why JAX steps cannot be split into input wait and compute, if they cannot.

    Args:
        model: a compiled `keras.Model` on the JAX backend.

    Returns:
        `None` when the timed function can be built, else a sentence saying what
        differs from the Keras internals it was written for.
    """
    import keras

    for name in ("_make_function", "make_train_function", "make_test_function"):
        if not callable(getattr(model, name, None)):
            return f"this Keras version ({keras.__version__}) has no model.{name}"
    try:
        major, minor = (int(part) for part in keras.__version__.split(".")[:2])
    except ValueError:
        major, minor = 3, 7  # A development version: assume a recent one.
    if (major, minor) < (3, 7):
        return (
            f"this Keras version ({keras.__version__}) fetches batches outside the "
            "train function on JAX (Keras 3.7 and later are supported)"
        )
    return None


@dataclasses.dataclass(slots=True)
class _Call:
    """One call of the train (or test) function: its steps and their stamps."""

    kind: str
    called_at: float
    wall_s: float = 0.0
    returned: bool = False
    dispatched: int = 0
    fetch: tuple = (math.nan, math.nan)
    # Its step's end comes from Keras' batch-end hook (one step per call).
    hooked: bool = False
    # (start, ready, end) rows in step order, or None for a step whose outputs
    # could not be waited for; appended by the background thread.
    rows: List[Optional[tuple]] = dataclasses.field(default_factory=list)


class _StampedIterator:
    """Keras' batch iterator, with each `next()` stamped into the running call.

    One per iterator Keras hands the train function (one an epoch), reused by
    its calls: `call` is set to the running call before each.
    """

    __slots__ = ("iterator", "call", "_on_fetch")

    def __init__(self, iterator, on_fetch: Callable[[str, float], None]):
        self.iterator = iterator
        self.call: Optional[_Call] = None
        self._on_fetch = on_fetch

    def __iter__(self):
        return self

    def __next__(self):
        start = time.time()
        # StopIteration (the end of the data) goes through to Keras untouched.
        item = next(self.iterator)
        ready = time.time()
        call = self.call
        call.fetch = (start, ready)
        self._on_fetch(call.kind, ready - start)
        return item


class _TimedJaxFunction:
    """Stands in for `model.train_function` (or `test_function`) during a fit.

    Args:
        model: the compiled model.
        kind: "train" or "validation".
        original: Keras' own function, put back at the end of the fit.
    """

    def __init__(self, model, kind: str, original: Callable):
        self.original = original
        self.kind = kind
        # The `JaxFitTiming` of the running fit; None between fits.
        self.timing: Optional["JaxFitTiming"] = None
        # Set by the profiler window while it is open: called with the fit's
        # tf.data dataset, returns a step marker to enter around the call.
        self.trace_step: Optional[Callable[[object], object]] = None
        self._model = weakref.ref(model)
        self.function = self._build(model, kind)

    def _build(self, model, kind: str) -> Callable:
        attribute = ATTRIBUTE[kind]
        keras_make = model._make_function  # pylint: disable=protected-access

        def timed_make(step_function, concatenate_outputs=False):
            def timed_step(state, data):
                outputs, state = step_function(state, data)
                timing = self.timing
                if timing is not None:
                    timing.step_dispatched(outputs)
                return outputs, state

            return keras_make(timed_step, concatenate_outputs)

        # Keras builds the function with its own jit settings and shardings;
        # only the per-step wrapper is ours. The instance attribute shadows the
        # method for this one build.
        model._make_function = timed_make  # pylint: disable=protected-access
        try:
            getattr(model, _MAKE[kind])(force=True)
            return getattr(model, attribute)
        finally:
            del model._make_function  # pylint: disable=protected-access
            setattr(model, attribute, self.original)

    def __call__(self, state, iterator):
        timing = self.timing
        if timing is None:
            # Left on the model by a fit that ended without its end hook (an
            # exception between steps): put Keras' own back and run it.
            model = self._model()
            if model is not None and getattr(model, ATTRIBUTE[self.kind], None) is self:
                setattr(model, ATTRIBUTE[self.kind], self.original)
            return self.original(state, iterator)
        return timing.run(self.kind, self.function, state, iterator, self.trace_step)


class _FunctionCache:
    """The timed functions of one model, kept on it between fits."""

    def __init__(self):
        self.functions: Dict[str, _TimedJaxFunction] = {}


class JaxFitTiming(FitTiming):
    """Times `model.fit` / `evaluate` steps on the JAX backend.

    One object per fit. Batch-begin hooks run on the training thread; Keras may
    run batch-end hooks on its callback thread on this backend, so `after_step`
    does nothing and rows are handed over in `before_step` and `end`, on the
    training thread, once each step's outputs are ready.

    Args:
        model: the compiled `keras.Model`.
        on_rows: called with (kind, rows of (start, ready, end) seconds, wall
            time of the first call in seconds, when it began) for one or more
            consecutive train or test function calls whose steps have all ended.
        on_error: called with the exception when the user's step raises.
        on_fallback: called with a reason when the steps cannot be split.
        first_batch_end_hook: whether `logs_ready` is called before any other
            callback's batch-end hook. If not, another callback's work would
            delay the stamps, so a thread of the tuner's own stamps each step.

    Attributes:
        fetch_s: per kind, total seconds spent inside `next()`.
        fetches: per kind, how many batches were fetched.

    Example:

    ```python
    timing = JaxFitTiming(model, on_rows, on_error, on_fallback)
    timing.begin("train")       # on_train_begin
    timing.before_step("train")  # on_train_batch_begin
    timing.end("train")         # on_train_end
    ```
    """

    measurement = "in-step (device idle wait)"

    def __init__(
        self,
        model,
        on_rows: Callable[[str, np.ndarray, float, float], None],
        on_error: Callable[[Optional[BaseException]], None],
        on_fallback: Callable[[str], None],
        first_batch_end_hook: bool = True,
    ):
        self._jax = backend_module("jax")
        self._first_batch_end_hook = first_batch_end_hook
        super().__init__(model, on_rows, on_error, on_fallback)
        self._timed: Dict[str, _TimedJaxFunction] = {}
        self._calls = collections.deque()
        self._current: Optional[_Call] = None
        # Dispatched steps (and control items) for the waiter thread; it is
        # woken through `_wakeup` only when it has said it is idle.
        self._pending = collections.deque()
        self._wakeup = threading.Event()
        self._idle = False
        self._thread: Optional[threading.Thread] = None
        self._previous_end: Optional[float] = None
        # One step per call: ends stamped by the batch-end hooks, per kind.
        self._hooked = False
        self._hook_ends = {TRAIN: collections.deque(), VALIDATION: collections.deque()}
        # The tf.data dataset fit was given, for the profiler's step markers.
        self._dataset = None
        self._marked_calls = 0
        # Per kind, the stamping wrapper of the iterator Keras hands the calls.
        self._stamped: Dict[str, _StampedIterator] = {}
        self._deliver_at = time.monotonic() + DELIVER_AFTER_S
        self.fetch_s = {TRAIN: 0.0, VALIDATION: 0.0}
        self.fetches = {TRAIN: 0, VALIDATION: 0}

    # The FitTiming interface (see `instrumentation.fit_timing`).

    def begin(self, kind: str) -> None:
        """Puts the timed function in place of Keras' own for `kind`."""
        model = self.model
        current = self.keras_function(kind, _TimedJaxFunction)
        if current is None:
            return
        reason = unsupported_reason(model)
        if reason is not None:
            self._on_fallback(reason)
            return
        cache = getattr(model, _CACHE_ATTRIBUTE, None)
        if not isinstance(cache, _FunctionCache):
            cache = _FunctionCache()
            setattr(model, _CACHE_ATTRIBUTE, cache)
        timed = cache.functions.get(kind)
        if timed is None or timed.original is not current:
            timed = cache.functions[kind] = _TimedJaxFunction(model, kind, current)
        timed.timing = self
        timed.trace_step = None
        self._timed[kind] = timed
        if kind == TRAIN:
            self._dataset = _fit_dataset(model)
        self._hooked = self._first_batch_end_hook and _steps_per_execution(model) == 1
        if not self._hooked:
            self._start_waiter()
        setattr(model, ATTRIBUTE[kind], timed)

    def before_step(self, kind: str) -> None:
        """Hands over the rows of steps that have ended, a batch of calls at a time."""
        calls = self._calls
        if len(calls) >= DELIVER_EVERY or (calls and time.monotonic() >= self._deliver_at):
            self._deliver()

    def after_step(self, kind: str) -> None:
        """Nothing: this hook may run on Keras' callback thread on JAX."""

    def logs_ready(self, kind: str, logs) -> None:
        """Stamps the end of the call whose batch-end hook this is.

        Keras has waited for the call's logs before calling the hook (on its
        callback thread, or on the training thread when a callback is not
        `async_safe`), so the step has ended. Hooks of consecutive calls may
        run on different threads; the stamps are given to the calls in the
        order they come, each no earlier than its call's end.

        Args:
            kind: "train" or "validation".
            logs: the logs Keras passed to the hook; without any, Keras waited
                for nothing and the step's end is not known.
        """
        if self._hooked:
            self._hook_ends[kind].append(time.time() if logs else None)

    def end(self, kind: str) -> None:
        """Waits for the last steps' outputs, hands over their rows, restores Keras'."""
        self.flush_rows(wait=True)
        # Nothing of the fit's data outlives it.
        self._stamped.pop(kind, None)
        self.restore(kind)
        if not self._timed:
            self._stop_waiter()

    def flush_rows(self, wait: bool = False) -> None:
        """Hands over the rows of the steps that have ended.

        Args:
            wait: first wait until every dispatched step has ended (at the end
                of an epoch, when Keras has synchronised the state anyway).
        """
        if wait:
            self._flush()
        self._deliver()

    def step_marker_target(self, kind: str):
        """The timed train function, when fit was given a tf.data dataset.

        The TF Profiler sees tf.data only: with other inputs a window would
        find no input stages, so none is opened.
        """
        if kind != TRAIN or self._dataset is None:
            return None
        return self._timed.get(TRAIN)

    # Also used by the run after a failure.

    def restore(self, kind: str) -> None:
        """Puts Keras' own function back for `kind` (safe to call twice)."""
        timed = self._timed.pop(kind, None)
        if timed is None:
            return
        timed.timing = None
        timed.trace_step = None
        model = self.model
        if model is not None and getattr(model, ATTRIBUTE[kind], None) is timed:
            setattr(model, ATTRIBUTE[kind], timed.original)

    def notes(self) -> List[str]:
        """Sentences for the report: the fetch time, apart from the input wait."""
        notes = []
        for kind in (TRAIN, VALIDATION):
            if self.fetches[kind]:
                mean_ms = self.fetch_s[kind] / self.fetches[kind] * 1e3
                notes.append(
                    f"JAX backend, {kind} steps: fetch time (inside next()) {mean_ms:.2f} ms "
                    f"per batch on average over {self.fetches[kind]} batches. JAX "
                    "dispatches steps asynchronously, so a fetch overlaps the previous "
                    "step: only the time the device sat idle waiting for the batch is "
                    "counted as input wait."
                )
        if self._marked_calls:
            notes.append(
                "JAX backend: the profiler window's step markers span each train function "
                "call (the batch fetch and the step's dispatch, not the device's compute, "
                "which runs asynchronously), so its input share is an upper bound; the "
                "step clock's input wait is the measure."
            )
        return notes

    # Called from the timed function, on the training thread.

    def run(self, kind: str, function: Callable, state, iterator, trace_step=None):
        """Runs one call of Keras' function with a stamping iterator.

        Args:
            kind: "train" or "validation".
            function: the timed function Keras built.
            state: the JAX state Keras passes.
            iterator: Keras' batch iterator.
            trace_step: the profiler window's marker maker, or `None`.

        Returns:
            What Keras' function returns: `(logs, state)`.
        """
        call = _Call(kind=kind, called_at=time.time())
        self._current = call
        self._calls.append(call)
        stamped = self._stamped.get(kind)
        if stamped is None or stamped.iterator is not iterator:
            stamped = self._stamped[kind] = _StampedIterator(iterator, self._count_fetch)
        stamped.call = call
        began = time.perf_counter()
        try:
            marker = None
            if trace_step is not None and self._dataset is not None:
                marker = trace_step(self._dataset)
            if marker is None:
                return function(state, stamped)
            self._marked_calls += 1
            with marker:
                return function(state, stamped)
        except StopIteration:
            raise
        except BaseException as error:
            self._on_error(error)
            raise
        finally:
            call.wall_s = time.perf_counter() - began
            call.returned = True
            self._current = None

    def step_dispatched(self, outputs) -> None:
        """Hands a dispatched step's outputs to the thread that stamps its end."""
        call = self._current
        if call is None:
            return
        call.dispatched += 1
        if self._hooked:
            call.hooked = True
            return
        self._hand_over((call, call.fetch, outputs))

    def _count_fetch(self, kind: str, seconds: float) -> None:
        self.fetch_s[kind] += seconds
        self.fetches[kind] += 1

    # The background thread that stamps the end of each step.

    def _hand_over(self, item) -> None:
        self._pending.append(item)
        if self._idle:
            self._wakeup.set()

    def _start_waiter(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._wait_for_steps, name="keras-pipeline-tuner-jax-steps", daemon=True
            )
            self._thread.start()

    def _stop_waiter(self) -> None:
        if self._thread is not None:
            self._hand_over(None)
            self._thread = None

    def _next_item(self):
        # Without waking anyone while steps queue up; when none is left, says
        # so before looking once more, so a step handed over meanwhile is seen
        # either here or through the wake-up.
        while True:
            if self._pending:
                return self._pending.popleft()
            self._idle = True
            if not self._pending:
                self._wakeup.wait()
            self._wakeup.clear()
            self._idle = False

    def _wait_for_steps(self) -> None:
        while True:
            item = self._next_item()
            if item is None:
                return
            if isinstance(item, threading.Event):
                item.set()
                continue
            call, (start, ready), outputs = item
            del item
            try:
                self._jax.block_until_ready(outputs)
                end = time.time()
            except Exception:  # noqa: BLE001 - the step's error reaches the user in fit.
                row = None
            else:
                row = self._stall_row((start, ready), end)
            del outputs
            # Appending to a list holds the GIL: the training thread sees the
            # row whole, and counts rows before reading them.
            call.rows.append(row)

    def _flush(self) -> None:
        if self._thread is None:
            return
        done = threading.Event()
        self._hand_over(done)
        if not done.wait(_FLUSH_TIMEOUT_S):
            logger.warning(
                "keras-pipeline-tuner: the last JAX steps did not end within %.0f s; "
                "their timings are left out.",
                _FLUSH_TIMEOUT_S,
            )

    def _deliver(self) -> None:
        self._deliver_at = time.monotonic() + DELIVER_AFTER_S
        # Consecutive complete calls of one kind go to the run as one batch:
        # the first call's wall time and start travel with it (the run keeps a
        # kind's first call apart by its first row).
        batch_kind, batch_rows, first = None, [], None
        calls, hook_ends = self._calls, self._hook_ends
        while calls:
            call = calls[0]
            if call.hooked and not call.rows:
                # One step per call, ended by its batch-end hook: the common case,
                # taken in as few steps as can be (it runs once per training step).
                if not call.returned:
                    break
                ends = hook_ends[call.kind]
                if not ends:
                    break
                end = ends.popleft()
                calls.popleft()
                if batch_kind is not None and call.kind != batch_kind:
                    self._hand_rows(batch_kind, batch_rows, first)
                    batch_kind, batch_rows, first = None, [], None
                if end is None:
                    continue
                if batch_kind is None:
                    batch_kind, first = call.kind, call
                batch_rows.append(self._stall_row(call.fetch, end))
                continue
            # Steps ended by the waiter thread (several per call, or hooks not first).
            count = len(call.rows)
            if not (call.returned and count >= call.dispatched):
                break
            if batch_kind is not None and call.kind != batch_kind:
                self._hand_rows(batch_kind, batch_rows, first)
                batch_kind, batch_rows, first = None, [], None
            calls.popleft()
            rows = [row for row in call.rows[:count] if row is not None]
            if rows:
                if batch_kind is None:
                    batch_kind, first = call.kind, call
                batch_rows.extend(rows)
        if batch_kind is not None:
            self._hand_rows(batch_kind, batch_rows, first)

    def _stall_row(self, fetch: tuple, end: float) -> tuple:
        # Steps end in order, stamped by one thread at a time.
        row = stall_row(fetch[0], fetch[1], end, self._previous_end)
        self._previous_end = end
        return row

    def _hand_rows(self, kind: str, rows: list, first: _Call) -> None:
        self._on_rows(kind, np.array(rows, dtype=np.float64), first.wall_s, first.called_at)


def _fit_dataset(model):
    """The tf.data dataset the running fit of `model` iterates, or `None`."""
    found = fit_input.find_fit_input(model)
    if found is None or found.kind != fit_input.TF_DATASET:
        return None
    return found.source


def _steps_per_execution(model) -> int:
    try:
        return int(getattr(model, "steps_per_execution", 1) or 1)
    except (TypeError, ValueError):
        return 1
