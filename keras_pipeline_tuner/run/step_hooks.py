"""What the tuner does in Keras' batch hooks: chosen once per fit, as Keras chooses its dispatch.

On TensorFlow Keras runs every callback hook on the training thread, one step at
a time (`SyncSteps`): each step is handed to the run as it ends, and the
profiler window marks it from the hooks around it. On JAX and torch Keras may
run batch-end hooks on a callback thread of its own (`AsyncSteps`): there the
tuner only stamps the step's end, and does the rest at the next batch begin, on
the training thread, about once a second. Keras' `CallbackList` decides its
dispatch once per fit the same way.
"""

from typing import Optional

from keras_pipeline_tuner._util import features
from keras_pipeline_tuner.timing.step_clock import TRAIN
from keras_pipeline_tuner.timing.step_clock import VALIDATION


def epoch_length(steps) -> Optional[int]:
    """The epoch's length from Keras' `params["steps"]`, when Keras knows it, else `None`.

    Example:

    >>> epoch_length(100), epoch_length(None), epoch_length(0)
    (100, None, None)
    """
    if not isinstance(steps, int) or isinstance(steps, bool) or steps <= 0:
        return None
    return steps


class SyncSteps:
    """Batch hooks on the training thread: each step handed to the run as it ends.

    Args:
        run: the fit's `Run`.
        timing: the fit's timing source, or `None` when the step clock is off.
        fit_steps: the epoch's length, when Keras knows it (`epoch_length`).

    Example:

    ```python
    steps = SyncSteps(run, timing, fit_steps)
    steps.train_begin(batch)       # on_train_batch_begin
    steps.train_end(batch, logs)   # on_train_batch_end
    ```
    """

    def __init__(self, run, timing, fit_steps: Optional[int]):
        self._run = run
        self._timing = timing
        self._fit_steps = fit_steps
        self._window = run.window
        self._steps_per_call = run.steps_per_execution

    def train_begin(self, batch: int) -> None:
        """Before a training call: the window when it has work, the stand-in.

        The rows kept back go to the run in the batch-end hook when due
        (`Run.steps_ended`), and here before the window's check reads them.
        """
        run, timing, window = self._run, self._timing, self._window
        if window.call_begins(batch):
            if window.consults_clock:
                run.flush_rows()
            marker = timing.step_marker_target(TRAIN) if timing is not None else None
            steps_left = self._fit_steps - batch if self._fit_steps else None
            window.act(marker, run.clock, steps_left)
        if timing is not None:
            timing.before_step(TRAIN)

    def train_end(self, batch: int, logs) -> None:
        """After a training call: the window's step counted, the run's outputs when due."""
        if self._timing is not None:
            self._timing.after_step(TRAIN)
        self._window.after_step(batch)
        self._run.steps_ended(self._steps_per_call)

    def test_begin(self) -> None:
        """Before a validation call."""
        if self._run.rows_due():
            self._run.flush_rows()
        if self._timing is not None:
            self._timing.before_step(VALIDATION)

    def test_end(self, logs) -> None:
        """After a validation call."""
        if self._timing is not None:
            self._timing.after_step(VALIDATION)

    def call_ended(self) -> None:
        """Nothing: each call's end was seen in its batch-end hook."""


class AsyncSteps:
    """Batch-end hooks maybe off the training thread: only stamps there, the rest at batch begin.

    The profiler window marks whole train function calls through the timing
    source's stand-in (when it can be marked: a tf.data input on JAX); a call's
    steps are counted when the next begins, its batch-end hook running where
    Keras chooses.

    Args:
        run: the fit's `Run`.
        timing: the fit's timing source, or `None` when the step clock is off.
        fit_steps: the epoch's length, when Keras knows it (`epoch_length`).
    """

    def __init__(self, run, timing, fit_steps: Optional[int]):
        self._run = run
        self._timing = timing
        self._fit_steps = fit_steps
        self._steps = 0
        self._steps_per_call = run.steps_per_execution
        # The first batch of the call the window last saw begin, until counted.
        self._window_call: Optional[int] = None
        # Whether a window can mark this fit's calls at all (a tf.data input on
        # JAX), decided once: otherwise no step looks again.
        self._markable = (
            timing is not None and run.window.profile != "off" and self.marker is not None
        )

    @property
    def marker(self):
        """What the window marks calls through, or `None` (then no window opens)."""
        if self._timing is None or not self._run.guard.enabled(features.STEP_CLOCK):
            return None
        return self._timing.step_marker_target(TRAIN)

    def train_begin(self, batch: int) -> None:
        """On every step only a count and a clock reading; the rest about once a second."""
        timing = self._timing
        if timing is not None and timing.train_calls_need_before_step:
            timing.before_step(TRAIN)
        if batch:
            self._steps += self._steps_per_call
        if self._run.rows_due():
            self._between_steps()
        if self._markable:
            self._mark_call(batch)

    def train_end(self, batch: int, logs) -> None:
        """Only a time stamp here (JAX: the call's end, its logs are ready)."""
        if self._timing is not None:
            self._timing.logs_ready(TRAIN, logs)

    def test_begin(self) -> None:
        """Before a validation call: its stand-in, and the run's work when due."""
        if self._timing is not None:
            self._timing.before_step(VALIDATION)
        if self._run.rows_due():
            self._between_steps()

    def test_end(self, logs) -> None:
        """Only a time stamp here."""
        if self._timing is not None:
            self._timing.logs_ready(VALIDATION, logs)

    def call_ended(self, last_batch: Optional[int] = None) -> None:
        """Counts the steps of the last call the window saw begin.

        Args:
            last_batch: the call's last batch; `None` for the epoch's last call
                (as many steps as one call runs, at most to the epoch's end).
        """
        first, self._window_call = self._window_call, None
        if first is None:
            return
        if last_batch is None or last_batch < first:
            last_batch = first + self._run.steps_per_execution - 1
            if self._fit_steps:
                last_batch = min(last_batch, self._fit_steps - 1)
        self._run.window.after_step(last_batch)

    def _between_steps(self) -> None:
        # Rows to the run, then the steps to what counts them (TensorBoard's
        # scalars, the early verdict, checkpoints).
        self._run.flush_rows()
        steps, self._steps = self._steps, 0
        self._run.steps_ended(steps)

    def _mark_call(self, batch: int) -> None:
        marker = self.marker
        if marker is None:
            return
        # The previous call ended before this one begins; its batch-end hook
        # may run on Keras' callback thread, so it is counted here.
        self.call_ended(batch - 1)
        window = self._run.window
        if window.consults_clock:
            # Rows are handed over in batches: the check needs them all.
            self._run.flush_rows()
        steps_left = self._fit_steps - batch if self._fit_steps else None
        window.before_step(batch, marker, self._run.clock, steps_left)
        self._window_call = batch
