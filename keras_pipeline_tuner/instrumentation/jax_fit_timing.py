"""Input wait and compute of `model.fit` steps on the JAX backend.

Since Keras 3.7 the function Keras builds for `model.train_function` on JAX calls
`next(iterator)` in Python and then the `jax.jit`-compiled step,
`steps_per_execution` times per call. The compiled call returns long before the
step is done (asynchronous dispatch, even on CPU), so:

- each batch fetch is timed around `next()`, by handing Keras' function an
  iterator that stamps it; that is the "fetch time", reported apart;
- each step ends when its outputs (the logs) are ready, stamped by a background
  thread with `jax.block_until_ready` (never on the state, which JAX donates to
  the next step), so the training thread never waits for the device;
- the input wait is the device's idle time waiting for the batch
  (`timing.device_stall`), not the time inside `next()`, much of which overlaps
  the previous step.

To see each step's outputs also with `steps_per_execution > 1`, Keras itself
builds the timed function (`make_train_function(force=True)`) around a step that
hands its outputs to the background thread: same jitted step, same shardings,
same weights. It is built once per model and kind and reused by later fits, so
a second fit compiles nothing extra; Keras' own function is put back at the end.
"""

import collections
import dataclasses
import logging
import math
import queue
import threading
import time
import weakref
from typing import Callable, Dict, List, Optional

import numpy as np

from keras_pipeline_tuner._util.backend_import import backend_module
from keras_pipeline_tuner.timing.device_stall import stall_row
from keras_pipeline_tuner.timing.step_clock import TRAIN
from keras_pipeline_tuner.timing.step_clock import VALIDATION

logger = logging.getLogger("keras_pipeline_tuner")

_ATTRIBUTE = {TRAIN: "train_function", VALIDATION: "test_function"}
_MAKE = {TRAIN: "make_train_function", VALIDATION: "make_test_function"}
# Where the timed functions of a model are kept between fits.
_CACHE_ATTRIBUTE = "_pipeline_tuner_jax_functions"
# The longest the end of a fit waits for the last step's outputs to be stamped.
_FLUSH_TIMEOUT_S = 300.0


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


@dataclasses.dataclass
class _Call:
    """One call of the train (or test) function: its steps and their stamps."""

    kind: str
    called_at: float
    wall_s: float = 0.0
    returned: bool = False
    dispatched: int = 0
    fetch: tuple = (math.nan, math.nan)
    # (start, ready, end) rows in step order, or None for a step whose outputs
    # could not be waited for; appended by the background thread.
    rows: List[Optional[tuple]] = dataclasses.field(default_factory=list)


class _StampedIterator:
    """Keras' batch iterator, with each `next()` stamped into the running call."""

    def __init__(self, iterator, call: _Call, on_fetch: Callable[[str, float], None]):
        self._iterator = iterator
        self._call = call
        self._on_fetch = on_fetch

    def __iter__(self):
        return self

    def __next__(self):
        start = time.time()
        # StopIteration (the end of the data) goes through to Keras untouched.
        item = next(self._iterator)
        ready = time.time()
        self._call.fetch = (start, ready)
        self._on_fetch(self._call.kind, ready - start)
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
        self._model = weakref.ref(model)
        self.function = self._build(model, kind)

    def _build(self, model, kind: str) -> Callable:
        attribute = _ATTRIBUTE[kind]
        keras_make = model._make_function  # pylint: disable=protected-access

        def timed_make(step_function, concatenate_outputs=False):
            def timed_step(state, data):
                outputs, state = step_function(state, data)
                self.step_dispatched(outputs)
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

    def step_dispatched(self, outputs) -> None:
        timing = self.timing
        if timing is not None:
            timing.step_dispatched(outputs)

    def __call__(self, state, iterator):
        timing = self.timing
        if timing is None:
            # Left on the model by a fit that ended without its end hook (an
            # exception between steps): put Keras' own back and run it.
            model = self._model()
            if model is not None and getattr(model, _ATTRIBUTE[self.kind], None) is self:
                setattr(model, _ATTRIBUTE[self.kind], self.original)
            return self.original(state, iterator)
        return timing.run(self.kind, self.function, state, iterator)


class _FunctionCache:
    """The timed functions of one model, kept on it between fits."""

    def __init__(self):
        self.functions: Dict[str, _TimedJaxFunction] = {}


class JaxFitTiming:
    """Times `model.fit` / `evaluate` steps on the JAX backend.

    One object per fit. Batch-begin hooks run on the training thread; Keras may
    run batch-end hooks on its callback thread on this backend, so `after_step`
    does nothing and rows are handed over in `before_step` and `end`, on the
    training thread, once each step's outputs are ready.

    Args:
        model: the compiled `keras.Model`.
        on_rows: called with (kind, rows of (start, ready, end) seconds, wall
            time of the call in seconds, when the call began) once per train or
            test function call whose steps have all ended.
        on_error: called with the exception when the user's step raises.
        on_fallback: called with a reason when the steps cannot be split.

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
    ):
        self._jax = backend_module("jax")
        # Weakly: nothing the tuner keeps may keep a model alive after its fit.
        self._model = weakref.ref(model)
        self._on_rows = on_rows
        self._on_error = on_error
        self._on_fallback = on_fallback
        self._timed: Dict[str, _TimedJaxFunction] = {}
        self._calls = collections.deque()
        self._current: Optional[_Call] = None
        self._lock = threading.Lock()
        self._queue: "queue.SimpleQueue" = queue.SimpleQueue()
        self._thread: Optional[threading.Thread] = None
        self._previous_end: Optional[float] = None
        self.fetch_s = {TRAIN: 0.0, VALIDATION: 0.0}
        self.fetches = {TRAIN: 0, VALIDATION: 0}

    @property
    def model(self):
        """The model being fit, or `None` once it is gone."""
        return self._model()

    # The FitTiming interface (see `instrumentation.fit_timing`).

    def begin(self, kind: str) -> None:
        """Puts the timed function in place of Keras' own for `kind`."""
        model = self.model
        attribute = _ATTRIBUTE[kind]
        current = getattr(model, attribute, None)
        if isinstance(current, _TimedJaxFunction):
            # Left behind by a fit that was interrupted between steps.
            current = current.original
            setattr(model, attribute, current)
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
        self._timed[kind] = timed
        self._start_waiter()
        setattr(model, attribute, timed)

    def before_step(self, kind: str) -> None:
        """Hands over the rows of steps that have ended since the last call."""
        self._deliver()

    def after_step(self, kind: str) -> None:
        """Nothing: this hook may run on Keras' callback thread on JAX."""

    def end(self, kind: str) -> None:
        """Waits for the last steps' outputs, hands over their rows, restores Keras'."""
        self.flush_rows(wait=True)
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
        """None: the TF Profiler window is not opened on this backend."""
        return None

    # Also used by the run after a failure.

    def restore(self, kind: str) -> None:
        """Puts Keras' own function back for `kind` (safe to call twice)."""
        timed = self._timed.pop(kind, None)
        if timed is None:
            return
        timed.timing = None
        model = self.model
        if model is not None and getattr(model, _ATTRIBUTE[kind], None) is timed:
            setattr(model, _ATTRIBUTE[kind], timed.original)

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
        return notes

    # Called from the timed function, on the training thread.

    def run(self, kind: str, function: Callable, state, iterator):
        """Runs one call of Keras' function with a stamping iterator.

        Args:
            kind: "train" or "validation".
            function: the timed function Keras built.
            state: the JAX state Keras passes.
            iterator: Keras' batch iterator.

        Returns:
            What Keras' function returns: `(logs, state)`.
        """
        call = _Call(kind=kind, called_at=time.time())
        self._current = call
        self._calls.append(call)
        began = time.perf_counter()
        try:
            return function(state, _StampedIterator(iterator, call, self._count_fetch))
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
        self._queue.put((call, call.fetch, outputs))

    def _count_fetch(self, kind: str, seconds: float) -> None:
        self.fetch_s[kind] += seconds
        self.fetches[kind] += 1

    # The background thread that stamps the end of each step.

    def _start_waiter(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._wait_for_steps, name="keras-pipeline-tuner-jax-steps", daemon=True
            )
            self._thread.start()

    def _stop_waiter(self) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread = None

    def _wait_for_steps(self) -> None:
        while True:
            item = self._queue.get()
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
                row = stall_row(start, ready, end, self._previous_end)
                self._previous_end = end
            del outputs
            with self._lock:
                call.rows.append(row)

    def _flush(self) -> None:
        if self._thread is None:
            return
        done = threading.Event()
        self._queue.put(done)
        if not done.wait(_FLUSH_TIMEOUT_S):
            logger.warning(
                "keras-pipeline-tuner: the last JAX steps did not end within %.0f s; "
                "their timings are left out.",
                _FLUSH_TIMEOUT_S,
            )

    def _deliver(self) -> None:
        while self._calls:
            call = self._calls[0]
            with self._lock:
                complete = call.returned and len(call.rows) >= call.dispatched
                rows = [row for row in call.rows if row is not None]
            if not complete:
                return
            self._calls.popleft()
            if rows:
                self._on_rows(call.kind, np.array(rows, dtype=np.float64), call.wall_s, call.called_at)
