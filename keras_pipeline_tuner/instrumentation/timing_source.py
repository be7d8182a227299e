"""The timing source interface for `model.fit`, its whole-step fallback, shared parts.

A timing source times the steps of one fit and hands the run rows of
`(start, ready, end)` timestamps (see `timing.step_clock`) through the narrow
callables it is given; it knows nothing of reports or outputs. One source per
Keras backend subclasses `FitTiming` (`tf_fit_timing`, `jax_fit_timing`,
`torch_fit_timing`); `backend_timing.fit_timing_for` picks it. What they share is here: the
stand-in for Keras' function (`StandIn`: on the model for one call at a time,
and harmless when a fit left it behind) and the iterator that stamps each
fetch (`StampedIterator`). A source hands each call's rows to the run as they
come; the run keeps them back and records them together (see
`run.lifecycle.Run.add_rows`).
"""

import time
import weakref
from typing import Callable
from typing import Dict
from typing import List
from typing import Optional

import numpy as np

from keras_pipeline_tuner.timing.step_clock import TRAIN
from keras_pipeline_tuner.timing.step_clock import VALIDATION

# The model attribute Keras calls for each kind of step.
ATTRIBUTE = {TRAIN: "train_function", VALIDATION: "test_function"}

# (kind, rows, wall_s, called_at[, tracing_s]): see `FitTiming`.
OnRows = Callable[..., None]
OnError = Callable[[Optional[BaseException]], None]
OnFallback = Callable[[str], None]


# Stamps are taken on every step: looked up once.
_now = time.time


class StandIn:
    """Stands in for `model.train_function` (or `test_function`) for one call at a time.

    The source puts it on the model in the batch-begin hook (`install`, on the
    training thread); its call puts Keras' own back as it begins, Keras having
    looked it up for that call. So whatever interrupts fit (Ctrl-C, an error,
    another callback raising) leaves Keras' own function on the model. A
    stand-in that a fit left behind anyway (interrupted between the hook and
    the call) runs Keras' own function.

    Args:
        model: the compiled model.
        kind: "train" or "validation".
        original: Keras' own function.

    Attributes:
        original: Keras' own function.
        timing: the `FitTiming` that times this fit's calls; `None` between fits.
    """

    def __init__(self, model, kind: str, original: Callable):
        self.original = original
        self.kind = kind
        self.timing: Optional["FitTiming"] = None
        self._model = weakref.ref(model)

    def install(self) -> None:
        """Puts this stand-in on the model for the call about to run."""
        model = self._model()
        if model is not None:
            # Past Keras' attribute tracking: there is nothing to track.
            object.__setattr__(model, ATTRIBUTE[self.kind], self)

    def uninstall(self) -> None:
        """Puts Keras' own function back, if this stand-in is on the model."""
        model = self._model()
        if model is not None and getattr(model, ATTRIBUTE[self.kind], None) is self:
            object.__setattr__(model, ATTRIBUTE[self.kind], self.original)

    def __call__(self, *args):
        self.uninstall()
        timing = self.timing
        if timing is None:
            # Left by a fit that ended without its end hook: Keras' own runs.
            return self.original(*args)
        return self.timed_call(timing, *args)

    def timed_call(self, timing: "FitTiming", *args):
        """Runs one call for `timing`; each backend's stand-in says how."""
        raise NotImplementedError


class StampedIterator:
    """An iterator whose every `next()` is stamped: `record((start, ready))`.

    Runs on every step: two clock readings and a call, nothing more. The end of
    the data (`StopIteration`) goes through untouched; any other error is
    handed to `on_error` first (a fetch outside Keras' function, on torch,
    ends fit without its end hooks).

    Args:
        iterator: the iterator to stamp.
        record: called with `(start, ready)` of each fetch.
        on_error: called with an error a fetch raised, or `None`.

    Example:

    >>> stamps = []
    >>> list(StampedIterator(iter("ab"), stamps.append))
    ['a', 'b']
    >>> len(stamps)
    2
    """

    __slots__ = ("iterator", "_record", "_on_error")

    def __init__(self, iterator, record: Callable[[tuple], None], on_error=None):
        self.iterator = iterator
        self._record = record
        self._on_error = on_error

    def __iter__(self):
        return self

    def __next__(self):
        start = _now()
        try:
            item = next(self.iterator)
        except StopIteration:
            raise
        except BaseException as error:
            if self._on_error is not None:
                self._on_error(error)
            raise
        self._record((start, _now()))
        return item


class FitTiming:
    """Times one fit's steps with whole-step wall time (the fallback every backend has).

    Used as is when the step cannot be split into input wait and compute; the
    backend sources subclass it.

    Args:
        model: the `keras.Model` being fit.
        on_rows: called with `(kind, rows, wall_s, called_at)` after each call of
            Keras' function: `rows` one `(start, ready, end)` row of seconds or
            an (n, 3) array of them, `ready` NaN when not observed; `wall_s`
            the call's wall time; `called_at` when it began (`time.time()`). A
            source that measures a first call's tracing apart passes it as a
            fifth argument, `tracing_s`. Called on every step: cheap (the run
            keeps the rows back).
        on_error: called with the exception when the user's step raises (or
            `None` when a call comes from a fit that no longer uses the tuner).
        on_fallback: called with a sentence when only whole steps can be timed.

    Example:

    ```python
    timing = fit_timing_for(model, on_rows, on_error, on_fallback)
    timing.begin("train")       # on_train_begin
    timing.before_step("train") # on_train_batch_begin
    timing.after_step("train")  # on_train_batch_end
    timing.end("train")         # on_train_end
    ```
    """

    def __init__(self, model, on_rows: OnRows, on_error: OnError, on_fallback: OnFallback):
        # Weakly: nothing the tuner keeps may keep a model alive after its fit.
        self._model = weakref.ref(model)
        self._on_rows = on_rows
        self._on_error = on_error
        self._on_fallback = on_fallback
        self._step_started: Dict[str, float] = {}
        # Per kind, the stand-in timing this fit's calls (JAX, torch).
        self._stand_ins: Dict[str, StandIn] = {}
        # Whether `before_step("train")` has anything to do on the next calls:
        # a source that no longer needs it says so, and the batch-begin hook
        # skips the call (it runs on every step).
        self.train_calls_need_before_step = True

    @property
    def model(self):
        """The model being fit, or `None` once it is gone."""
        return self._model()

    def keras_function(self, kind: str, timed_type: type):
        """Keras' own function for `kind` on the model, the source's stand-in unwrapped.

        A stand-in of `timed_type` left on the model by a fit interrupted
        between steps is replaced with the function it stands for.

        Args:
            kind: "train" or "validation".
            timed_type: the class of the source's stand-in functions, whose
                `original` is the function they replace.

        Returns:
            The function, or `None` when the model has none yet.
        """
        model = self.model
        attribute = ATTRIBUTE[kind]
        current = getattr(model, attribute, None)
        if isinstance(current, timed_type):
            current = current.original
            setattr(model, attribute, current)
        return current

    def begin(self, kind: str) -> None:
        """Prepares to time the steps of `kind` ("train" or "validation")."""

    def before_step(self, kind: str) -> None:
        """Called just before Keras runs one call of its function for `kind`.

        Puts the stand-in for that call on the model, or (whole steps) notes
        when the call began.
        """
        stand_in = self._stand_ins.get(kind)
        if stand_in is not None:
            stand_in.install()
            return
        self._step_started[kind] = time.time()

    def after_step(self, kind: str) -> None:
        """Called just after that call; hands its row to the run."""
        start = self._step_started.pop(kind, None)
        if start is None:
            return
        end = time.time()
        self._on_rows(kind, (start, np.nan, end), end - start, start)

    def logs_ready(self, kind: str, logs) -> None:
        """Called from the batch-end hook on JAX and torch, maybe off the training thread.

        Keras has converted the call's logs to Python numbers by then, so
        the step has ended.
        """

    def end(self, kind: str) -> None:
        """Hands over the rows kept back and puts Keras' own function for `kind` back."""
        self.flush_rows(wait=True)
        self.restore(kind)

    def restore(self, kind: str) -> None:
        """Puts Keras' own function back for `kind` (safe to call twice)."""
        stand_in = self._stand_ins.pop(kind, None)
        if stand_in is not None:
            stand_in.timing = None
            stand_in.uninstall()

    def flush_rows(self, wait: bool = False) -> None:
        """Hands the run the rows of steps that have ended, if any are kept back.

        Args:
            wait: first wait for the steps still running (at the end of an epoch).
        """

    def notes(self) -> List[str]:
        """Sentences for the report about how this backend was measured."""
        return []

    def traced_train_step(self):
        """The fit's timed training function, traced already, for a replay after fit.

        Call it before `end`. A replay that reuses it pays no second tracing of
        the step (which on a busy machine takes seconds). `None` where the
        source times whole steps, or its function must not run again (see
        `TensorFlowFitTiming`).
        """
        return None

    def step_marker_target(self, kind: str):
        """The object the profiler window marks steps through, or `None`.

        A timed compiled function takes a `trace_step` callable; without one the
        window marks whole calls from the callback hooks.
        """
        return None
