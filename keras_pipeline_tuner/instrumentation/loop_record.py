"""What a custom loop's calls and fetches add up to: rows, epochs and notes.

`LoopTiming` sees calls of the decorated step and `next()`s of the timed
iterator; this module turns them into the verbs every timing source hands the
run (rows, as fit's sources do, and the epochs a loop's passes make) and
keeps the counts the report's notes are made of. It knows nothing of
TensorFlow, threads or the tuner's guard: the timing source holds those and
calls in under its lock.
"""

import dataclasses
import math
from typing import Callable
from typing import Dict
from typing import List
from typing import Optional
from typing import Tuple

from keras_pipeline_tuner.timing import measurement as measured_by
from keras_pipeline_tuner.timing.step_clock import TRAIN
from keras_pipeline_tuner.timing.step_clock import VALIDATION

KINDS = (TRAIN, VALIDATION)


@dataclasses.dataclass
class _KindState:
    """Per kind (train or validation): where the loop stands between calls."""

    calls: int = 0
    epoch_open: bool = False
    epoch_steps: int = 0
    previous_end: Optional[float] = None
    fetch_called: Optional[float] = None
    fetch_returned: Optional[float] = None
    decorated_steps: int = 0
    fetches: int = 0
    whole_steps: int = 0


class LoopRecord:
    """One run of a custom loop: its calls and fetches, as the run's rows and epochs.

    Args:
        on_rows: takes each step's row, as from fit's timing sources:
            `(kind, row, wall_s, called_at, tracing_s)`.
        begin_epoch: an epoch begins: `(kind, epoch)`.
        end_epoch: the epoch of `kind` ended: `(kind,)`.
        on_measurement: told what times the training steps (a value of
            `timing.measurement`) whenever that changes.
        on_fallback: told why, once the loop's steps can be timed only whole
            (the step fetches its batches itself), as fit's sources say it.

    Example:

    >>> rows, measured = [], []
    >>> record = LoopRecord(
    ...     lambda kind, row, *timing: rows.append(row),
    ...     begin_epoch=lambda kind, epoch: None,
    ...     end_epoch=lambda kind: None,
    ...     on_measurement=measured.append,
    ...     on_fallback=measured.append,
    ... )
    >>> record.fetch_done("train", 0.0, 0.25)
    >>> record.step_done("train", 0.25, 1.0, whole_step=False, retraced=False, returned=1.0)
    >>> rows
    [(0.0, 0.25, 1.0)]
    >>> measured
    ['decorator', 'iterator', 'decorator+iterator']
    """

    def __init__(
        self,
        on_rows: Callable[..., None],
        begin_epoch: Callable[[str, int], None],
        end_epoch: Callable[[str], None],
        on_measurement: Callable[[str], None],
        on_fallback: Callable[[str], None],
    ):
        self._on_rows = on_rows
        self._begin_epoch = begin_epoch
        self._end_epoch = end_epoch
        self._on_measurement = on_measurement
        self._on_fallback = on_fallback
        self._measurement: Optional[str] = None
        self._states: Dict[str, _KindState] = {kind: _KindState() for kind in KINDS}
        self._epochs_done = 0
        # The training epoch last begun: a validation epoch is numbered after it.
        self._train_epoch = 0
        self._failed_calls = 0
        self._retraces = 0
        self._untimed: Dict[str, str] = {}
        # Recorded but not yet handed to the tuner's outputs (TensorBoard, the
        # report file), which is done between steps, never inside one.
        self._unreported_steps = 0
        self._unreported_epochs = 0
        self._measured()

    def step_done(
        self,
        kind: str,
        call_start: float,
        end: float,
        whole_step: bool,
        retraced: bool,
        returned: float,
    ) -> None:
        """A call of the decorated step ended: records its row.

        Args:
            kind: "train" or "validation".
            call_start: when the call began.
            end: when its outputs were ready.
            whole_step: the step fetched its batch itself (wait not separable).
            retraced: the call traced (or compiled) the step.
            returned: when the call handed back to the loop (after the tuner's
                own work on it), where the next step's wait begins.
        """
        state = self._state(kind)
        if whole_step:
            row = (call_start, math.nan, end)
            state.whole_steps += 1
        elif state.fetch_called is not None:
            row = (state.fetch_called, state.fetch_returned, end)
        elif state.previous_end is not None:
            row = (state.previous_end, call_start, end)
        else:
            # The first step of an epoch: nothing says when its wait began.
            row = (call_start, math.nan, end)
        state.fetch_called = state.fetch_returned = None
        if retraced and state.calls:
            self._retraces += 1
        state.decorated_steps += 1
        self._record(kind, state, row)
        state.previous_end = returned
        self._measured()

    def step_failed(self, kind: str) -> None:
        """A call of the step raised: it is not a step, and breaks the wait's chain."""
        state = self._states[kind]
        # The failed call used the fetched batch; the next step's wait
        # starts from nothing known.
        state.fetch_called = state.fetch_returned = None
        state.previous_end = None
        self._failed_calls += 1

    def pass_started(self, kind: str) -> None:
        """A new pass of the timed iterator: a new epoch of `kind`."""
        state = self._states[kind]
        if state.epoch_open and state.epoch_steps:
            self._close_epoch(kind)
        # (Re)started here, so the epoch's setup is its iterator's creation.
        self._open_epoch(kind)
        state.fetch_called = state.fetch_returned = None

    def fetch_done(self, kind: str, called: float, returned: float) -> None:
        """The timed iterator handed over a batch."""
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
        self._measured()

    def fetch_exhausted(self, kind: str, called: float) -> None:
        """The timed iterator ran out of data: the end of `kind`'s epoch."""
        state = self._states[kind]
        if state.decorated_steps == 0 and state.fetch_called is not None:
            self._record(kind, state, (state.fetch_called, state.fetch_returned, called))
        self._close_epoch(kind)

    def end_epoch(self) -> None:
        """Closes the open epochs and opens the next training epoch."""
        self.close_epochs()
        # The next epoch starts now, so its setup (a new iterator, the
        # first fetch) is measured up to its first step.
        self._open_epoch(TRAIN)

    def close_epochs(self) -> None:
        """Closes the open epochs of both kinds (the loop ended)."""
        for kind in KINDS:
            self._close_epoch(kind)

    def note_untimed(self, reason: str) -> Optional[str]:
        """Keeps why steps could not be timed one by one.

        Returns:
            The note, the first time this reason is given; else `None`.
        """
        if reason in self._untimed:
            return None
        note = f"Steps are not timed one by one because {reason}. {WHAT_STILL_WORKS}"
        self._untimed[reason] = note
        self._measured()
        return note

    def take_unreported(self) -> Tuple[int, int]:
        """`(steps, epochs)` recorded since the last call, for the outputs."""
        taken = self._unreported_steps, self._unreported_epochs
        self._unreported_steps = self._unreported_epochs = 0
        return taken

    def measurement(self) -> str:
        """What timed the loop's training steps (`Report.measurement`)."""
        state = self._states[TRAIN]
        if state.whole_steps:
            return measured_by.WHOLE_STEP
        if state.decorated_steps and state.fetches:
            return measured_by.DECORATOR_AND_ITERATOR
        if state.decorated_steps:
            return measured_by.DECORATOR
        if state.fetches:
            return measured_by.ITERATOR
        return measured_by.NOT_TIMED if self._untimed else measured_by.DECORATOR

    def _measured(self) -> None:
        # Said when it changes: a few times a run, not on every step.
        measurement = self.measurement()
        if measurement != self._measurement:
            self._measurement = measurement
            if measurement == measured_by.WHOLE_STEP:
                self._on_fallback(WHOLE_STEP_REASON)
            else:
                self._on_measurement(measurement)

    def notes(self) -> List[str]:
        """What the report says about how the loop was timed."""
        notes = list(self._untimed.values())
        train = self._states[TRAIN]
        if train.decorated_steps or train.fetches:
            notes.extend(_HOW_MEASURED.get(self.measurement(), ()))
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

    def _record(self, kind: str, state: _KindState, row: Tuple[float, float, float]) -> None:
        # Seen from Python, a first call's tracing cannot be told apart from
        # its compute (NaN: not reported).
        self._on_rows(kind, row, row[2] - row[0], row[0], math.nan)
        if state.calls and kind == TRAIN:
            self._unreported_steps += 1
        state.calls += 1
        state.previous_end = row[2]
        state.epoch_steps += 1

    def _state(self, kind: str) -> _KindState:
        state = self._states[kind]
        if not state.epoch_open:
            self._open_epoch(kind)
        return state

    def _open_epoch(self, kind: str) -> None:
        state = self._states[kind]
        if kind == TRAIN:
            self._train_epoch = self._epochs_done
        self._begin_epoch(kind, self._train_epoch)
        state.epoch_open = True
        state.epoch_steps = 0
        state.previous_end = None

    def _close_epoch(self, kind: str) -> None:
        state = self._states[kind]
        # A batch whose step never ended (the loop broke out) is not a step.
        state.fetch_called = state.fetch_returned = None
        if not state.epoch_open:
            return
        state.epoch_open = False
        if state.epoch_steps:
            self._end_epoch(kind)
            if kind == TRAIN:
                self._epochs_done += 1
                self._unreported_epochs += 1


WHAT_STILL_WORKS = (
    "What still works: a TF Profiler capture around a few calls "
    "(tf.profiler.experimental.start/stop, then TensorBoard's Profile tab) and the "
    "dataset alone with kpt.benchmark(dataset). For per-step timings, iterate in "
    "Python: `for batch in tuner.iterate(dataset): train_step(batch)`."
)

_HOW_MEASURED = {
    measured_by.DECORATOR: (
        "Input wait is estimated as the time between calls of the decorated step, "
        "so it also holds the loop's own Python work. Iterate with "
        "`tuner.iterate(dataset)` to time each batch fetch exactly.",
    ),
    measured_by.ITERATOR: (
        "Compute is the time from a batch's arrival to the next fetch, so it also "
        "holds the loop's own Python work. Decorate the train step with "
        "`@tuner.instrument` to time it on its own.",
    ),
}

# Said through the run's `fall_back`, as fit's sources say theirs.
WHOLE_STEP_REASON = (
    "the decorated step fetches its batches itself (it is given a dataset or "
    "iterator, or iterates one inside its graph), and a call that runs a whole "
    "loop counts as one step; pass it the batches instead: "
    "`for x, y in tuner.iterate(dataset): train_step(x, y)`"
)
