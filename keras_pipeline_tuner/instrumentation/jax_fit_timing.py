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

With one step per call, Keras' own function runs as is, handed the stamping
iterator. On the CPU (where Keras fetches no batch ahead) the data adapter of
the running loop hands out that iterator itself, for the fit only (as on
torch): after a kind's first call, which runs through a stand-in that times it
whole, nothing of the tuner's stands between Keras and its function, and a
step costs the tuner the stamps around `next()` and in the batch-end hook. Where
the profiler window may mark calls (a tf.data input), and elsewhere, a stand-in
hands Keras' function the stamping iterator on every call. To see each step's
outputs with `steps_per_execution > 1`, Keras itself builds the timed function
(`make_train_function(force=True)`) around a step that hands its outputs to
the background thread: same jitted step, same shardings, same weights. It is
built once per model and kind and reused by later fits, so a second fit
compiles nothing extra; Keras' own function is put back at the end.

On every step the tuner does no more than take three time stamps and append
them to lists (`_StepStamps`). The rows are made from them with NumPy, the
steps that have ended at a time, when the caller asks for them (`flush_rows`,
about once a second and at the end of each epoch): each hand-over to the run
has a fixed cost of some hundred microseconds on the training thread, which
handed over every few steps would cost steps of a fraction of a millisecond
several per cent. The first call of each kind is timed whole and handed over
on its own: it traces the step.

When fit is given a tf.data dataset, the TF Profiler window can mark each
training call (`trace_step`): the marker spans the whole call, that is the
batch fetch and the step's dispatch, on the training thread.
"""

import collections
import logging
import math
import threading
import time
from typing import Callable
from typing import Dict
from typing import List
from typing import Optional

import numpy as np

from keras_pipeline_tuner._util.backend_import import backend_module
from keras_pipeline_tuner._util.running_fit import running_call_local
from keras_pipeline_tuner.instrumentation import fit_input
from keras_pipeline_tuner.instrumentation.timing_source import ATTRIBUTE
from keras_pipeline_tuner.instrumentation.timing_source import FitTiming
from keras_pipeline_tuner.instrumentation.timing_source import OnRows
from keras_pipeline_tuner.instrumentation.timing_source import StampedIterator
from keras_pipeline_tuner.instrumentation.timing_source import StandIn
from keras_pipeline_tuner.timing.device_stall import stall_rows
from keras_pipeline_tuner.timing.step_clock import TRAIN
from keras_pipeline_tuner.timing.step_clock import VALIDATION

logger = logging.getLogger("keras_pipeline_tuner")

_MAKE = {TRAIN: "make_train_function", VALIDATION: "make_test_function"}
# The Keras method that runs each kind's loop, and holds its epoch iterator.
_LOOP_METHOD = {TRAIN: "fit", VALIDATION: "evaluate"}
# Where the timed functions of a model are kept between fits.
_CACHE_ATTRIBUTE = "_pipeline_tuner_jax_functions"
# The longest the end of a fit waits for the last step's outputs to be stamped.
_FLUSH_TIMEOUT_S = 300.0
# Stamps are taken on every step: looked up once.
_now = time.time


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


class _StepStamps:
    """One kind's raw stamps in one fit, in step order, until handed to the run.

    `fetches` gets a `(start, ready)` pair per batch, on the training thread;
    `ends` each step's end, from Keras' batch-end hook or the waiter thread.
    A list append holds the GIL, so the training thread sees whole entries;
    it counts the ends first and reads no further.
    """

    __slots__ = ("fetches", "ends", "previous_end", "first_call", "fetch_s", "fetched")

    def __init__(self):
        self.fetches: List[tuple] = []
        self.ends: List[float] = []
        self.previous_end = math.nan
        # (seconds the call took, called at, steps, seconds in its fetches) of
        # the kind's first call, which the run keeps apart (it traces and
        # compiles the step), until it is handed over.
        self.first_call: Optional[tuple] = None
        # The fetch time of the steps handed over, for the report's note.
        self.fetch_s = 0.0
        self.fetched = 0

    def take_ended(self, limit: Optional[int] = None):
        """Removes and returns the stamps of the steps that have ended.

        Args:
            limit: take at most this many steps.

        Returns:
            `(fetches, ends)` as arrays, the fetches as (n, 2).
        """
        count = len(self.ends)
        if limit is not None:
            count = min(count, limit)
        fetches = np.array(self.fetches[:count], dtype=np.float64).reshape(-1, 2)
        ends = np.array(self.ends[:count], dtype=np.float64)
        # Entries appended meanwhile (by the other thread) stay, after these.
        del self.fetches[:count]
        del self.ends[:count]
        self.fetch_s += float(np.sum(fetches[:, 1] - fetches[:, 0]))
        self.fetched += count
        return fetches, ends


class _TimedJaxFunction(StandIn):
    """Stands in for `model.train_function` (or `test_function`) during a fit.

    Args:
        model: the compiled model.
        kind: "train" or "validation".
        original: Keras' own function, put back at the end of the fit.
    """

    def __init__(self, model, kind: str, original: Callable):
        super().__init__(model, kind, original)
        # Set by the profiler window while it is open: called with the fit's
        # tf.data dataset, returns a step marker to enter around the call.
        self.trace_step: Optional[Callable[[object], object]] = None
        # What the running fit calls: Keras' own, or the rebuilt one below.
        self.function: Callable = original
        self._handing_outputs: Optional[Callable] = None

    def use(self, step_ends_from_hook: bool) -> None:
        """Chooses the function the fit calls.

        Args:
            step_ends_from_hook: whether each step's end is stamped by the
                batch-end hook (one step per call). Then Keras' own function
                runs as is; else one rebuilt by Keras around a step that hands
                its outputs to the waiter thread, made once per model and kind.
        """
        if step_ends_from_hook:
            self.function = self.original
            return
        if self._handing_outputs is None:
            self._handing_outputs = self._build(self._model(), self.kind)
        self.function = self._handing_outputs

    def _build(self, model, kind: str) -> Callable:
        attribute = ATTRIBUTE[kind]
        keras_make = model._make_function  # pylint: disable=protected-access

        def timed_make(step_function, concatenate_outputs=False):
            def timed_step(state, data):
                outputs, state = step_function(state, data)
                timing = self.timing
                if timing is not None:
                    timing.step_dispatched(kind, outputs)
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

    def timed_call(self, timing: "JaxFitTiming", state, iterator):
        return timing.run(self.kind, self.function, state, iterator, self.trace_step)


class _FunctionCache:
    """The timed functions of one model, kept on it between fits."""

    def __init__(self):
        self.functions: Dict[str, _TimedJaxFunction] = {}


class JaxFitTiming(FitTiming):
    """Times `model.fit` / `evaluate` steps on the JAX backend.

    One object per fit. Keras may run batch-end hooks on its callback thread on
    this backend, so `after_step` does nothing; the steps' rows are kept back
    and handed over in `flush_rows` and `end`, on the training thread, once
    each step's outputs are ready.

    Args:
        model: the compiled `keras.Model`.
        on_rows: called with (kind, rows of (start, ready, end) seconds, wall
            time in seconds up to the last step's end, when the first call
            began) for the steps of a kind that have ended; a kind's first call
            comes alone, with its tracing as a fifth argument (the call's time
            beyond its fetches: it traces, compiles and dispatches the step).
        on_error: called with the exception when the user's step raises.
        on_fallback: called with a reason when the steps cannot be split.
        first_batch_end_hook: whether `logs_ready` is called before any other
            callback's batch-end hook. If not, another callback's work would
            delay the stamps, so a thread of the tuner's own stamps each step.

    Example:

    ```python
    timing = JaxFitTiming(model, on_rows, on_error, on_fallback)
    timing.begin("train")      # on_train_begin
    timing.flush_rows()        # about once a second, between steps
    timing.end("train")        # on_train_end
    ```
    """

    def __init__(
        self,
        model,
        on_rows: OnRows,
        on_error: Callable[[Optional[BaseException]], None],
        on_fallback: Callable[[str], None],
        first_batch_end_hook: bool = True,
    ):
        self._jax = backend_module("jax")
        self._first_batch_end_hook = first_batch_end_hook
        super().__init__(model, on_rows, on_error, on_fallback)
        self._stamps = {TRAIN: _StepStamps(), VALIDATION: _StepStamps()}
        # The kinds whose first call has run (it is timed whole, apart).
        self._past_first = set()
        # Dispatched steps (and control items) for the waiter thread; it is
        # woken through `_wakeup` only when it has said it is idle.
        self._pending = collections.deque()
        self._wakeup = threading.Event()
        self._idle = False
        self._thread: Optional[threading.Thread] = None
        # One step per call: ends stamped by the batch-end hooks.
        self._hooked = False
        # The tf.data dataset fit was given, for the profiler's step markers.
        self._dataset = None
        self._marked_calls = 0
        # Per kind, the stamping wrapper of the iterator Keras hands the calls.
        self._stamped: Dict[str, StampedIterator] = {}
        # Per kind, the data adapter that hands out stamping iterators itself
        # (`_stamp_at_the_adapter`), until `restore` puts its own method back.
        self._adapters: Dict[str, object] = {}

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
        self._hooked = self._first_batch_end_hook and _steps_per_execution(model) == 1
        timed.use(step_ends_from_hook=self._hooked)
        timed.timing = self
        timed.trace_step = None
        self._stand_ins[kind] = timed
        if kind == TRAIN:
            self._dataset = _fit_dataset(model)
        if not self._hooked:
            self._start_waiter()
        elif kind != TRAIN or self._dataset is None:
            # No step marker to set on a call: the adapter can stamp the fetches.
            self._stamp_at_the_adapter(model, kind)

    def before_step(self, kind: str) -> None:
        """The stand-in for the call about to run, unless the adapter stamps the fetches."""
        if kind in self._adapters and kind in self._past_first:
            if kind == TRAIN:
                # Nothing more to do before a training call in this fit.
                self.train_calls_need_before_step = False
            return
        super().before_step(kind)

    def after_step(self, kind: str) -> None:
        """Nothing: this hook may run on Keras' callback thread on JAX."""

    def logs_ready(self, kind: str, logs) -> None:
        """Stamps the end of the call whose batch-end hook this is.

        Keras has waited for the call's logs before calling the hook (on its
        callback thread, or on the training thread when a callback is not
        `async_safe`), so the step has ended. Hooks of consecutive calls may
        run on different threads; the stamps are given to the calls in the
        order they come, each no earlier than the one before.

        Args:
            kind: "train" or "validation".
            logs: the logs Keras passed to the hook; without any, Keras waited
                for nothing and the step's end is not known.
        """
        if self._hooked:
            self._stamps[kind].ends.append(_now() if logs else math.nan)

    def end(self, kind: str) -> None:
        """Waits for the last steps' outputs, hands over their rows, restores Keras'."""
        super().end(kind)
        # Nothing of the fit's data outlives it.
        self._stamped.pop(kind, None)
        if not self._stand_ins:
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
        return self._stand_ins.get(TRAIN)

    def restore(self, kind: str) -> None:
        """Puts Keras' own function (and adapter) back for `kind` (safe to call twice)."""
        timed = self._stand_ins.get(kind)
        if timed is not None:
            timed.trace_step = None
        adapter = self._adapters.pop(kind, None)
        if adapter is not None and "get_jax_iterator" in vars(adapter):
            del adapter.get_jax_iterator
        super().restore(kind)

    def notes(self) -> List[str]:
        """Sentences for the report: the fetch time, apart from the input wait."""
        notes = []
        for kind in (TRAIN, VALIDATION):
            stamps = self._stamps[kind]
            if stamps.fetched:
                mean_ms = stamps.fetch_s / stamps.fetched * 1e3
                notes.append(
                    f"JAX backend, {kind} steps: fetch time (inside next()) {mean_ms:.2f} ms "
                    f"per batch on average over {stamps.fetched} batches. JAX "
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
            function: the function to call: Keras' own or the one it rebuilt.
            state: the JAX state Keras passes.
            iterator: Keras' batch iterator.
            trace_step: the profiler window's marker maker, or `None`.

        Returns:
            What Keras' function returns: `(logs, state)`.
        """
        if kind in self._adapters:
            # The adapter's iterator stamps its fetches itself.
            stamped = iterator
        else:
            stamped = self._stamped.get(kind)
            if stamped is None or stamped.iterator is not iterator:
                stamped = self._stamped[kind] = StampedIterator(
                    iterator, self._stamps[kind].fetches.append
                )
        try:
            if trace_step is None and kind in self._past_first:
                # Every step but the first: as little as can be.
                return function(state, stamped)
            return self._run_apart(kind, function, state, stamped, trace_step)
        except StopIteration:
            raise
        except BaseException as error:
            self._on_error(error)
            raise

    def _run_apart(self, kind: str, function: Callable, state, stamped, trace_step):
        # The first call of a kind (timed whole: it traces the step), and calls
        # the profiler window marks.
        stamps = self._stamps[kind]
        first = kind not in self._past_first
        if first:
            self._past_first.add(kind)
            steps_before = len(stamps.fetches)
            called_at = _now()
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
        finally:
            if first:
                call_s = time.perf_counter() - began
                fetches = stamps.fetches[steps_before:]
                if fetches:
                    fetch_s = sum(ready - start for start, ready in fetches)
                    stamps.first_call = (call_s, called_at, len(fetches), fetch_s)
                else:
                    # No batch (the data had ended): the next call is the first.
                    self._past_first.discard(kind)

    def _stamp_at_the_adapter(self, model, kind: str) -> None:
        """Has the running loop's data adapter hand out stamping iterators, for this fit.

        Only where Keras hands the train function the adapter's iterator as it
        is: on the CPU (elsewhere it fetches one batch ahead, and the stamps
        would belong to the next step) and without a JAX distribution.
        """
        if self._jax.default_backend() != "cpu":
            return
        try:
            from keras.src.distribution import distribution_lib

            if distribution_lib.distribution() is not None:
                return
        except ImportError:
            return
        epoch_iterator = running_call_local(model, _LOOP_METHOD[kind], "epoch_iterator")
        adapter = getattr(epoch_iterator, "data_adapter", None)
        keras_iterator = getattr(adapter, "get_jax_iterator", None)
        if not callable(keras_iterator) or "get_jax_iterator" in vars(adapter):
            return
        record = self._stamps[kind].fetches.append
        on_error = self._on_error

        def stamped_iterator():
            # A fetch raises inside Keras' function, with no stand-in around
            # it: the iterator tells the tuner itself.
            return StampedIterator(iter(keras_iterator()), record, on_error)

        # An instance attribute: this adapter only, for this fit (see `restore`).
        adapter.get_jax_iterator = stamped_iterator
        self._adapters[kind] = adapter

    def step_dispatched(self, kind: str, outputs) -> None:
        """Hands a dispatched step's outputs to the thread that stamps its end."""
        self._hand_over((self._stamps[kind].ends, outputs))

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
            ends, outputs = item
            del item
            try:
                self._jax.block_until_ready(outputs)
                end = _now()
            except Exception:  # noqa: BLE001 - the step's error reaches the user in fit.
                end = math.nan
            del outputs
            ends.append(end)

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
        # Each kind's ended steps go to the run as one batch of rows (NumPy work
        # with a fixed cost per hand-over), the kind's first call on its own.
        for kind, stamps in self._stamps.items():
            first_call = stamps.first_call
            if first_call is not None:
                call_s, called_at, steps, fetch_s = first_call
                if len(stamps.ends) < steps:
                    continue
                stamps.first_call = None
                # The call returns once the step is traced, compiled and
                # dispatched: its time beyond the fetches is the tracing.
                self._hand_rows(
                    kind, stamps, stamps.take_ended(steps), called_at, max(call_s - fetch_s, 0.0)
                )
            if stamps.ends:
                self._hand_rows(kind, stamps, stamps.take_ended())

    def _hand_rows(self, kind, stamps, taken, called_at=None, tracing_s=None) -> None:
        fetches, ends = taken
        rows, stamps.previous_end = stall_rows(fetches, ends, stamps.previous_end)
        if not rows.size:
            return
        if called_at is None:
            # Later calls: from the first fetch, which begins the call.
            called_at = float(fetches[0, 0])
        # Up to the end of the last step: the call itself returns before it.
        wall_s = float(rows[-1, 2]) - called_at
        if tracing_s is None:
            self._on_rows(kind, rows, wall_s, called_at)
        else:
            self._on_rows(kind, rows, wall_s, called_at, tracing_s)


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
