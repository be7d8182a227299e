"""Input wait and compute of `model.fit` steps on the TensorFlow backend.

The batch is fetched inside `model.train_function`, so the source replaces it
with an equivalent compiled function that takes timestamps around the fetch
and after the step (`timing.timed_step_function`). The replacement is on the
model from the batch-begin hook (which TensorFlow runs on the training thread)
to the start of its call, which puts Keras' own back: however fit is
interrupted, Keras' own function is left in place, except where the step holds
TensorFlow's legacy random ops (see `TensorFlowFitTiming`).

On every step the source only keeps the call's tensor of stamps (a list
append): reading each back and handing it on cost some ten microseconds a
step, a per cent of a small model's step. They are read back together, the
steps that have ended at a time, when the run asks for them (`flush_rows`,
about once a second and at the end of each epoch); a kind's first call, which
traces the step, is handed over at once, with its wall time.
"""

import functools
import time
from typing import Dict
from typing import List
from typing import Optional

from keras_pipeline_tuner.instrumentation.timing_source import ATTRIBUTE
from keras_pipeline_tuner.instrumentation.timing_source import FitTiming
from keras_pipeline_tuner.instrumentation.timing_source import OnError
from keras_pipeline_tuner.instrumentation.timing_source import OnFallback
from keras_pipeline_tuner.instrumentation.timing_source import OnRows
from keras_pipeline_tuner.timing import timed_step_function
from keras_pipeline_tuner.timing.step_clock import TRAIN
from keras_pipeline_tuner.timing.step_clock import VALIDATION


class TensorFlowFitTiming(FitTiming):
    """Times the fetch and the step inside the compiled function (TensorFlow backend).

    Each call's stamps are kept and handed to the run in blocks (see the module
    docstring). The timed function is on the model from the batch-begin hook to
    the start of its call, unless its step holds legacy random ops (see
    `timing.timed_step_function`): it then stays on the model, carrying their
    state into later fits as Keras' own function would, and a later tuner
    reuses it. When Keras' own function has already run such a step, it keeps
    training and only whole steps are timed. Any other timed function is kept
    beside Keras' own at the end of the fit (`TimedFunction.remember`): a
    later fit's tuner reuses its trace rather than trace the step again.

    Args: as `FitTiming`.
    """

    def __init__(self, model, on_rows: OnRows, on_error: OnError, on_fallback: OnFallback):
        super().__init__(model, on_rows, on_error, on_fallback)
        self._swapped: Dict[str, timed_step_function.TimedFunction] = {}
        self._whole_step = False
        # Per kind, the stamps of the calls since the last hand-over (tensors,
        # read back in `flush_rows`); `None` until the kind's first call.
        self._held: Dict[str, Optional[list]] = {TRAIN: None, VALIDATION: None}

    def begin(self, kind: str) -> None:
        model = self.model
        current = getattr(model, ATTRIBUTE[kind], None)
        kept = current if isinstance(current, timed_step_function.TimedFunction) else None
        if kept is not None and not kept.kept:
            kept = None
        if kept is None:
            current = self.keras_function(kind, timed_step_function.TimedFunction)
        if current is None:
            return
        reason = timed_step_function.unsupported_reason(model)
        if reason is None and model.run_eagerly:
            reason = "the model runs eagerly (run_eagerly=True)"
        if reason is None and kept is None and not _is_keras_own(model, kind, current):
            reason = (
                f"the model overrides make_{'train' if kind == TRAIN else 'test'}_function, "
                "so its own function runs as it is"
            )
        if reason is not None:
            self._whole_step = True
            self._on_fallback(reason)
            return
        previous = self._swapped.get(kind)
        if previous is not None and (previous is kept or previous.original is current):
            return
        on_rows = functools.partial(self._hold_rows, kind)
        if kept is None:
            # An earlier fit's function for this very Keras function: traced already.
            kept = timed_step_function.remembered(current, model)
        if kept is not None:
            # An earlier fit's function (one kept carries the step's random state).
            kept.attach(on_rows, self._failed)
            self._swapped[kind] = kept
            return
        ran_before = _has_run(current)
        self._swapped[kind] = timed_step_function.TimedFunction(
            model,
            model.train_step if kind == TRAIN else model.test_step,
            current,
            on_rows=on_rows,
            on_error=self._failed,
            on_first_call=functools.partial(self._first_call, kind, ran_before),
        )

    def before_step(self, kind: str) -> None:
        if self._whole_step:
            super().before_step(kind)
            return
        timed = self._swapped.get(kind)
        if timed is None:
            return
        timed.armed = True
        if not timed.kept:
            # In place from here to the start of its call only (which puts
            # Keras' own back): fit interrupted between steps (Ctrl-C, another
            # callback raising) leaves Keras' own function on the model. A
            # kept function is on the model for good (see the class docstring).
            timed.install(ATTRIBUTE[kind])

    def after_step(self, kind: str) -> None:
        # The timed function put Keras' own back as its call began; one that
        # Keras did not call stays for the next call, or until `end`.
        if self._whole_step:
            super().after_step(kind)

    def end(self, kind: str) -> None:
        self.flush_rows()
        timed = self._swapped.pop(kind, None)
        model = self.model
        if timed is None or model is None:
            return
        if timed.kept:
            # Stays, untimed, with the random state it carries.
            timed.detach()
            object.__setattr__(model, ATTRIBUTE[kind], timed)
            return
        if getattr(model, ATTRIBUTE[kind], None) is timed:
            setattr(model, ATTRIBUTE[kind], timed.original)
        if timed.called:
            # Its step holds no legacy random ops (it would be kept): the
            # next fit reuses its trace rather than trace the step again.
            timed.remember()

    def traced_train_step(self):
        # A kept function carries the step's legacy random state into later
        # fits: a replay through it would draw their numbers.
        timed = self._swapped.get(TRAIN)
        if self._whole_step or timed is None or timed.kept:
            return None
        return timed

    def step_marker_target(self, kind: str):
        return None if self._whole_step else self._swapped.get(kind)

    def flush_rows(self, wait: bool = False) -> None:
        """Reads back the stamps kept since the last call and hands them to the run."""
        for kind, held in self._held.items():
            if not held:
                continue
            count = len(held)
            taken = held[:count]
            del held[:count]
            rows = timed_step_function.stamp_rows(taken)
            if len(rows):
                # From the first call's fetch to the last step's end, as the
                # calls' own stamps give it.
                called_at = float(rows[0, 0])
                self._on_rows(kind, rows, float(rows[-1, 2]) - called_at, called_at)

    def _hold_rows(self, kind: str, rows, wall_s: float, called_at: float) -> None:
        held = self._held[kind]
        if held is not None:
            # Every call but the first: the tensor only, read back later.
            held.append(rows)
            return
        # The kind's first call (it traces the step): at once, with its wall time.
        self._held[kind] = []
        self._on_rows(kind, timed_step_function.stamp_rows([rows]), wall_s, called_at)

    def _first_call(self, kind: str, ran_before: bool, random_ops: List[str]) -> bool:
        """Decides, from the step's legacy random ops, which function trains."""
        if not random_ops:
            return True
        timed = self._swapped[kind]
        if not ran_before:
            # Keras' own never ran: this one trains from here on, in its place.
            timed.kept = True
            object.__setattr__(self.model, ATTRIBUTE[kind], timed)
            return True
        # Keras' own function already ran this step: its random ops carry on
        # where they are only if it keeps training.
        self._whole_step = True
        del self._swapped[kind]
        object.__setattr__(self.model, ATTRIBUTE[kind], timed.original)
        self._step_started[kind] = time.time()
        self._on_fallback(
            f"the model's step draws from TensorFlow's legacy random ops "
            f"({', '.join(random_ops)}), whose state lives in Keras' compiled function, "
            "which an earlier fit already ran: a function of the tuner's own would draw "
            "their numbers again from the start"
        )
        return False

    def _failed(self, error: Optional[BaseException]) -> None:
        self.end(TRAIN)
        self.end(VALIDATION)
        self._on_error(error)


def _has_run(function) -> bool:
    """Whether Keras' function has been traced, and so run, before.

    Keras' `train_function` is a Python function around the `tf.function`s it
    calls (see `keras/src/backend/tensorflow/trainer.py`, `_make_function`):
    they are looked for among the values it closes over.
    """
    candidates = [function]
    for cell in getattr(function, "__closure__", None) or ():
        try:
            candidates.append(cell.cell_contents)
        except ValueError:  # An empty cell.
            continue
    for candidate in candidates:
        count = getattr(candidate, "experimental_get_tracing_count", None)
        if callable(count) and count():
            return True
    return False


def _is_keras_own(model, kind: str, function) -> bool:
    """Whether `function` was made by Keras' own `make_train_function` (or test).

    A model that overrides it runs code of its own around the step (clipping
    weights after every call, say); replacing the function would drop that code.
    """
    import keras

    name = "make_train_function" if kind == TRAIN else "make_test_function"
    override = getattr(type(model), name, None)
    own = getattr(keras.Model, name, None)
    if override is None or own is None:
        return True
    defining = next(
        (klass for klass in type(model).__mro__ if name in vars(klass)), None
    )
    return defining is None or defining.__module__.startswith("keras.")
