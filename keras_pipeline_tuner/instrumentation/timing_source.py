"""The timing source interface for `model.fit`, and its whole-step fallback.

A timing source times the steps of one fit and hands the run rows of
`(start, ready, end)` timestamps (see `timing.step_clock`) through the narrow
callables it is given; it knows nothing of reports or outputs. One source per
Keras backend subclasses `FitTiming` (`fit_timing`, `jax_fit_timing`,
`torch_fit_timing`).
"""

import time
import weakref
from typing import Callable, Dict, List, Optional

import numpy as np

from keras_pipeline_tuner.timing.step_clock import TRAIN
from keras_pipeline_tuner.timing.step_clock import VALIDATION

# The model attribute Keras calls for each kind of step.
ATTRIBUTE = {TRAIN: "train_function", VALIDATION: "test_function"}

# (kind, rows, wall_s, called_at[, tracing_s]): see `FitTiming`.
OnRows = Callable[..., None]
OnError = Callable[[Optional[BaseException]], None]
OnFallback = Callable[[str], None]


# How often a source that keeps rows back hands them over, at the least.
HAND_OVER_S = 1.0


class HeldRows:
    """Steps' rows kept back on the training thread and handed to the run together.

    Making the run's rows from one step costs some tens of microseconds of
    NumPy work, whatever the number of rows: as much as a fast step itself. A
    timing source keeps each call's rows here instead and hands them over in
    `flush`, which its caller calls about every `HAND_OVER_S` seconds and at
    the end of each epoch. A kind's first call goes through at once, with its
    own wall time: the run keeps it apart (it traces the step).

    Args:
        on_rows: as for `FitTiming`.

    Example:

    >>> handed = []
    >>> held = HeldRows(lambda kind, rows, wall_s, called_at: handed.append(len(rows)))
    >>> held.add("train", (0.0, 0.1, 0.3), wall_s=0.5, called_at=0.0)  # the first: at once
    >>> held.add("train", (0.3, 0.3, 0.4), wall_s=0.1, called_at=0.3)
    >>> held.add("train", (0.4, 0.4, 0.5), wall_s=0.1, called_at=0.4)
    >>> handed
    [1]
    >>> held.flush()
    >>> handed
    [1, 2]
    """

    def __init__(self, on_rows: "OnRows"):
        self._on_rows = on_rows
        self._held: Dict[str, list] = {TRAIN: [], VALIDATION: []}
        self._called_at: Dict[str, float] = {}
        self._seen = set()

    def add(self, kind: str, rows, wall_s: float, called_at: float) -> None:
        """Keeps one call's rows: one `(start, ready, end)` row, or an (n, 3) array."""
        if kind not in self._seen:
            self._seen.add(kind)
            rows = np.asarray(rows, dtype=np.float64).reshape(-1, 3)
            self._on_rows(kind, rows, wall_s, called_at)
            return
        held = self._held[kind]
        if not held:
            self._called_at[kind] = called_at
        held.append(rows)

    def flush(self) -> None:
        """Hands over every kind's rows kept back, a kind at a time."""
        for kind, held in self._held.items():
            count = len(held)
            if not count:
                continue
            taken = held[:count]
            del held[:count]
            try:
                rows = np.array(taken, dtype=np.float64).reshape(-1, 3)
            except ValueError:
                # Calls of several steps, the last one shorter.
                rows = np.concatenate([np.reshape(part, (-1, 3)) for part in taken])
            called_at = self._called_at.pop(kind)
            if len(rows):
                self._on_rows(kind, rows, float(rows[-1, 2]) - called_at, called_at)


class FitTiming:
    """Times one fit's steps with whole-step wall time (the fallback every backend has).

    Used as is when the step cannot be split into input wait and compute; the
    backend sources subclass it.

    Args:
        model: the `keras.Model` being fit.
        on_rows: called with `(kind, rows, wall_s, called_at)` after each call of
            Keras' function: `rows` is an (n, 3) array of (start, ready, end)
            seconds, `ready` NaN when not observed; `wall_s` the call's wall
            time; `called_at` when it began (`time.time()`). A source that
            measures a first call's tracing apart passes it as a fifth
            argument, `tracing_s`.
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
        """Called just before Keras runs one call of its function for `kind`."""
        self._step_started[kind] = time.time()

    def after_step(self, kind: str) -> None:
        """Called just after that call; hands its row to the run."""
        start = self._step_started.pop(kind, None)
        if start is None:
            return
        end = time.time()
        self._on_rows(kind, np.array([[start, np.nan, end]]), end - start, start)

    def logs_ready(self, kind: str, logs) -> None:
        """Called from the batch-end hook on JAX and torch, maybe off the training thread.

        Keras has converted the call's logs to Python numbers by then, so
        the step has ended.
        """

    def end(self, kind: str) -> None:
        """Puts Keras' own functions for `kind` back."""

    def flush_rows(self, wait: bool = False) -> None:
        """Hands the run the rows of steps that have ended, if any are kept back.

        Args:
            wait: first wait for the steps still running (at the end of an epoch).
        """

    def notes(self) -> List[str]:
        """Sentences for the report about how this backend was measured."""
        return []

    def step_marker_target(self, kind: str):
        """The object the profiler window marks steps through, or `None`.

        A timed compiled function takes a `trace_step` callable; without one the
        window marks whole calls from the callback hooks.
        """
        return None
