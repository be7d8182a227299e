"""`PipelineTuner`: the Keras callback that measures input wait on every step."""

import atexit
import contextlib
import logging
import os
import sys
import time
import weakref
from typing import Callable, Iterable, Optional, Tuple, Union

import keras
import numpy as np

from keras_pipeline_tuner.advisor import advise
from keras_pipeline_tuner.custom_loop import LoopTimer
from keras_pipeline_tuner.custom_loop import TimedIterator
from keras_pipeline_tuner.feature_guard import FeatureGuard
from keras_pipeline_tuner.profiler_window import EPOCH_ENDED
from keras_pipeline_tuner.profiler_window import FIT_ENDED
from keras_pipeline_tuner.profiler_window import ProfilerWindow
from keras_pipeline_tuner.report import REPORT_FILENAME
from keras_pipeline_tuner.report import Report
from keras_pipeline_tuner.step_clock import TRAIN
from keras_pipeline_tuner.step_clock import VALIDATION
from keras_pipeline_tuner.step_clock import StepClock
from keras_pipeline_tuner.tensorboard_sink import TensorBoardSink
from keras_pipeline_tuner.tf_import import tensorflow
from keras_pipeline_tuner.trace_export import write_trace
from keras_pipeline_tuner import fit_input
from keras_pipeline_tuner import timed_step_function
from keras_pipeline_tuner import what_if_replay

logger = logging.getLogger("keras_pipeline_tuner")

STEP_CLOCK = "step clock"
REPORT_FILE = "report file"
SUMMARY = "terminal summary"
ADVICE = "advice"
STEP_TRACE = "step timeline trace"
INSPECTION = "pipeline inspection"
WHAT_IF = "what-if replay"
REPORT = "report"

_PROFILE_MODES = ("auto", "off")
# Seconds between writes of report.json and the TensorBoard scalars within an
# epoch, so that a crash loses at most this much; longer if a write costs more
# than 1 % of it (about 3 ms each on 2 CPU cores).
CHECKPOINT_S = 5.0
# Tuners whose fit is running, written at interpreter exit: a script ended by an
# exception between steps (e.g. Ctrl-C) keeps the report up to that point.
_RUNNING = weakref.WeakSet()


class PipelineTuner(keras.callbacks.Callback):
    """Measures how long each training step waits for input, and why.

    Add it to `model.fit` callbacks. On the TensorFlow backend it swaps
    `model.train_function` (and `test_function` during validation) for an
    equivalent compiled function that timestamps the batch fetch and the step, so
    every step's input wait and compute are measured, with no measurable cost.
    Keras' own functions are put back at the end of fit, after an exception
    inside a step, or, for an interruption elsewhere, at their next use. At the end
    of fit it prints a verdict and writes `report.json` to `log_dir`.

    Custom training loops use `@tuner.instrument` on their train step, optionally
    `tuner.iterate(dataset)`, and `tuner.close()` (or `with tuner:`) at the end.

    Args:
        log_dir: directory for `report.json` (and TensorBoard logs); `None`
            keeps the report in memory only (`tuner.report`).
        verbose: 1 prints a short summary at the end of fit, 0 is silent.
        profile: when to capture a TF Profiler window: "auto" (when the step
            clock finds the job input-bound), "off", or a `(start_step,
            stop_step)` pair of training steps (counted over the whole fit). A
            window closes at the latest at the end of its epoch; its evidence
            is `tuner.report.profile`.
        profile_steps: training steps in an "auto" window (default 15).
        what_if: after training, time the model's step on a few cached,
            replayed batches (input free) and report the most an input
            change can gain (`tuner.report.what_if`): True for 20 replayed
            steps, or a number of steps. The model's weights, optimizer and
            metric state are restored afterwards; training is not changed.
        buffer_steps: how many recent steps keep individual timings; totals
            and the input fraction stay exact beyond it.

    Example:

    ```python
    tuner = kpt.PipelineTuner(log_dir="logs/run1")
    model.fit(train_ds, epochs=5, callbacks=[tuner])
    print(tuner.report.verdict, tuner.report.input_fraction)
    ```
    """

    def __init__(
        self,
        log_dir: Optional[Union[str, os.PathLike]] = None,
        verbose: int = 1,
        profile: Union[str, Tuple[int, int]] = "auto",
        buffer_steps: int = 10_000,
        profile_steps: Optional[int] = None,
        what_if: Union[bool, int] = False,
    ):
        super().__init__()
        self.what_if_steps = what_if_replay.checked_steps(what_if)
        self._what_if = None
        self.log_dir = _checked_log_dir(log_dir)
        if verbose not in (0, 1, 2) or isinstance(verbose, bool):
            raise ValueError(f"`verbose` must be 0, 1 or 2, got {verbose!r}.")
        self.verbose = verbose
        self.profile = _checked_profile(profile)
        self.buffer_steps = buffer_steps
        self.clock = StepClock(buffer_steps)
        self.guard = FeatureGuard()
        self._window = ProfilerWindow(self.profile, profile_steps, self.log_dir, self.guard)
        self._tensorboard = (
            TensorBoardSink(self.log_dir, self.guard) if self.log_dir is not None else None
        )
        self._notes = []
        self._measurement = "in-step"
        self._swapped = {}
        self._timed_cache = {}
        self._first_call = {}
        self._whole_step_start = None
        self._validating_epoch = 0
        self._loop_timer: Optional[LoopTimer] = None
        self._findings = []

    # Keras hooks.

    def on_train_begin(self, logs=None):
        self.clock = StepClock(self.buffer_steps)
        self._notes = []
        self._measurement = "in-step"
        self._first_call = {TRAIN: True, VALIDATION: True}
        self._what_if = None
        self._next_checkpoint = time.monotonic() + CHECKPOINT_S
        _RUNNING.add(self)
        self._window.begin_fit()
        if self.guard.enabled(STEP_CLOCK):
            with self.guard(STEP_CLOCK):
                self._swap_in(TRAIN)
        self._findings = []
        if self.guard.enabled(INSPECTION):
            with self.guard(INSPECTION):
                # Once per fit, before the first step: never inside a timed step.
                self._findings = fit_input.inspect_fit_input(self.model)

    def on_epoch_begin(self, epoch, logs=None):
        if self.guard.enabled(STEP_CLOCK):
            with self.guard(STEP_CLOCK):
                self.clock.begin_epoch(epoch, TRAIN)

    def on_epoch_end(self, epoch, logs=None):
        with self.guard(STEP_CLOCK):
            self.clock.end_epoch(TRAIN, epoch)
        self._window.end_epoch()
        self._write_epoch_outputs()

    def _write_epoch_outputs(self) -> None:
        # Written every epoch so that a crash loses at most the current epoch.
        report = self._built_report()
        if report is None:
            return
        self._write_report_file(report)
        if self._tensorboard is not None:
            self._tensorboard.epoch_ended(self.clock, report)

    def on_train_batch_begin(self, batch, logs=None):
        self._window.before_step(batch, self._swapped.get(TRAIN), self.clock)
        self._arm(TRAIN)

    def _arm(self, kind: str) -> None:
        timed = self._swapped.get(kind)
        if timed is not None:
            timed.armed = True
            # In place from here to the end of the step only: fit interrupted
            # between steps (Ctrl-C, another callback raising) leaves Keras' own
            # function on the model. About 1 us a step.
            setattr(self.model, _ATTRIBUTE[kind], timed)
        elif self._measurement == "whole-step":
            self._whole_step_start = time.time()

    def _disarm(self, kind: str) -> None:
        timed = self._swapped.get(kind)
        if timed is not None and getattr(self.model, _ATTRIBUTE[kind], None) is timed:
            setattr(self.model, _ATTRIBUTE[kind], timed.original)

    def on_train_batch_end(self, batch, logs=None):
        self._disarm(TRAIN)
        if self._measurement == "whole-step" and self._whole_step_start is not None:
            self._record_whole_step(TRAIN)
        self._window.after_step(batch)
        if self._tensorboard is not None:
            self._tensorboard.step_ended(
                self.clock, getattr(self.model, "steps_per_execution", 1) or 1
            )
        if time.monotonic() >= self._next_checkpoint:
            self._checkpoint()

    def _checkpoint(self) -> None:
        # Within long epochs: report.json and the scalars so far, on disk.
        began = time.monotonic()
        report = self._built_report()
        if report is not None:
            self._write_report_file(report)
        if self._tensorboard is not None:
            self._tensorboard.write_scalars(self.clock)
            self._tensorboard.flush()
        now = time.monotonic()
        self._next_checkpoint = now + max(CHECKPOINT_S, 100 * (now - began))

    def on_test_begin(self, logs=None):
        self._window.close(EPOCH_ENDED)
        self._validating_epoch = self.clock.epoch
        if not self._first_call:
            # evaluate() called on its own, outside fit.
            self._first_call = {TRAIN: True, VALIDATION: True}
        if self.guard.enabled(STEP_CLOCK):
            with self.guard(STEP_CLOCK):
                self.clock.begin_epoch(self._validating_epoch, VALIDATION)
                self._swap_in(VALIDATION)

    def on_test_batch_begin(self, batch, logs=None):
        self._arm(VALIDATION)

    def on_test_batch_end(self, batch, logs=None):
        self._disarm(VALIDATION)
        if self._measurement == "whole-step" and self._whole_step_start is not None:
            self._record_whole_step(VALIDATION)

    def on_test_end(self, logs=None):
        self._restore(VALIDATION)
        with self.guard(STEP_CLOCK):
            self.clock.end_epoch(VALIDATION, self._validating_epoch)

    def on_train_end(self, logs=None):
        self._restore_all()
        self._window.end_fit()
        if self.what_if_steps and not self.guard.enabled(STEP_CLOCK):
            # The replay is compared with the clock's steps: there are none.
            self._notes.append(
                "The what-if replay did not run: it compares with the step clock's "
                "timings, and the step clock was turned off."
            )
        elif self.what_if_steps and self.guard.enabled(WHAT_IF):
            with self.guard(WHAT_IF):
                # After training and with Keras' own functions back: the replay
                # restores the model's state, so training is not changed.
                self._what_if = what_if_replay.replay_after_fit(
                    self.model, self.what_if_steps, self.clock.stats(TRAIN)
                )
        self.finish()

    def finish(self) -> Report:
        """Builds the final report and writes the outputs (file, terminal summary).

        Called at the end of fit; custom loops reach it through `close()`.

        Returns:
            The final `Report`.
        """
        report = self._built_report()
        if report is None:
            return Report(notes=self._failure_notes())
        failures = len(self.guard.failures)
        self._write_report_file(report)
        if self._tensorboard is not None:
            self._tensorboard.finish(self.clock, report)
            if self.guard.enabled(STEP_TRACE):
                with self.guard(STEP_TRACE):
                    write_trace(self.clock, self.log_dir)
        if self.verbose and self.guard.enabled(SUMMARY):
            with self.guard(SUMMARY):
                from keras_pipeline_tuner.terminal_summary import print_summary

                print_summary(report)
        if len(self.guard.failures) != failures:
            # An output failed after the file was written: the file says so too.
            report.notes = report.notes + self._failure_notes()[failures:]
            self._write_report_file(report)
        return report

    def _built_report(self) -> Optional[Report]:
        # Building the report reads every feature's state: a failure there must
        # not end the user's fit either.
        if self.guard.enabled(REPORT):
            with self.guard(REPORT):
                return self.report
        return None

    def _failure_notes(self) -> list:
        return [
            f"{feature} was turned off after a failure: {reason}"
            for feature, reason in self.guard.failures.items()
        ]

    # Results.

    @property
    def report(self) -> Report:
        """The `Report` of the latest fit, built from what was measured so far."""
        tf = tensorflow()
        measurement, notes = self._measurement, list(self._notes)
        if self._loop_timer is not None:
            # Also hands the custom loop's latest steps to the clock.
            measurement, notes = self._loop_timer.describe(measurement, notes)
        validation = self.clock.stats(VALIDATION)
        train = self.clock.stats(TRAIN)
        notes += self._failure_notes()
        if not train.steps and TRAIN not in self.clock.first_steps:
            notes.append(
                "No training step was measured: the dataset gave no batch, or fit has not "
                "run a step yet."
            )
        report = Report(
            verdict=train.verdict,
            input_fraction=train.input_fraction,
            train=train,
            validation=validation if validation.steps else None,
            epochs=list(self.clock.epochs),
            first_steps=dict(self.clock.first_steps),
            measurement=measurement,
            steps_per_execution=int(getattr(self.model, "steps_per_execution", 1) or 1),
            notes=notes + self._window.notes,
            profile=self._window.evidence,
            findings=list(self._findings),
            what_if=self._what_if,
            environment={
                "tensorflow": tf.__version__,
                "keras": keras.__version__,
                "python": sys.version.split()[0],
            },
        )
        if self.guard.enabled(ADVICE):
            with self.guard(ADVICE):
                report.recommendations = advise(
                    report.train, report.profile, report.findings, what_if=report.what_if
                )
        return report

    # Custom training loops (the logic is in custom_loop.LoopTimer).

    def instrument(self, fn: Optional[Callable] = None, *, kind: str = TRAIN) -> Callable:
        """Decorates a custom loop's train step so that every call is timed.

        Stack it above or below `@tf.function`. Compute ends when the step's
        outputs are ready; input wait is the time since the previous call
        returned, or exactly the batch fetch when the loop uses `iterate()`.

        Args:
            fn: the step function (Python or `tf.function`).
            kind: "train", or "validation" for a validation loop's step.

        Returns:
            The wrapped function: same name, docstring and return values.

        Example:

        ```python
        @tuner.instrument
        @tf.function
        def train_step(x, y):
            ...
        ```
        """
        return self._custom_loop().instrument(fn, kind)

    def iterate(self, dataset: Iterable, *, kind: str = TRAIN) -> TimedIterator:
        """Wraps a custom loop's dataset so that each batch fetch is timed exactly.

        Args:
            dataset: a `tf.data.Dataset`, an iterator or any iterable of batches.
            kind: "train" or "validation".

        Returns:
            An iterable of the same batches; each pass over it is one epoch.

        Example:

        ```python
        for x, y in tuner.iterate(train_ds):
            train_step(x, y)
        ```
        """
        return self._custom_loop().iterate(dataset, kind)

    def end_epoch(self) -> None:
        """Marks the end of an epoch in a custom loop that does not use `iterate()`."""
        self._custom_loop().end_epoch()

    def close(self) -> Report:
        """Ends a custom loop's run: writes the report and prints the summary.

        Returns:
            The final `Report`.
        """
        return self._custom_loop().close()

    def __enter__(self) -> "PipelineTuner":
        self._custom_loop().open()
        return self

    def __exit__(self, exc_type, exc_value, traceback) -> bool:
        self.close()
        return False

    def _custom_loop(self) -> LoopTimer:
        if self._loop_timer is None:
            self._loop_timer = LoopTimer(self)
        return self._loop_timer

    # Swapping Keras' functions.

    def _swap_in(self, kind: str) -> None:
        attribute = _ATTRIBUTE[kind]
        current = getattr(self.model, attribute, None)
        if isinstance(current, timed_step_function.TimedFunction):
            # Left behind by a fit that was interrupted outside a step.
            current = current.original
            setattr(self.model, attribute, current)
        if current is None:
            return
        reason = timed_step_function.unsupported_reason(self.model)
        if reason is None and self.model.run_eagerly:
            reason = "the model runs eagerly (run_eagerly=True)"
        if reason is not None:
            self._fall_back(reason)
            return
        key = (id(self.model), kind)
        timed = self._timed_cache.get(key)
        if timed is None or timed.original is not current:
            timed = timed_step_function.TimedFunction(
                self.model,
                self.model.train_step if kind == TRAIN else self.model.test_step,
                current,
                on_rows=lambda rows, wall, called_at: self._on_rows(kind, rows, wall, called_at),
                on_error=self._on_step_error,
            )
            self._timed_cache[key] = timed
        # Put in place by `_arm` for each step only (see there).
        self._swapped[kind] = timed

    def _restore(self, kind: str) -> None:
        timed = self._swapped.pop(kind, None)
        if timed is not None and getattr(self.model, _ATTRIBUTE[kind], None) is timed:
            setattr(self.model, _ATTRIBUTE[kind], timed.original)

    def _restore_all(self) -> None:
        self._restore(TRAIN)
        self._restore(VALIDATION)

    def _on_step_error(self, error: Optional[BaseException]) -> None:
        self._restore_all()
        self._window.close(FIT_ENDED)
        if error is not None:
            # fit ends here without on_train_end: keep what was measured so far.
            report = self._built_report()
            if report is not None:
                self._write_report_file(report)

    def _write_report_file(self, report: Report) -> None:
        if self.log_dir is not None and self.guard.enabled(REPORT_FILE):
            with self.guard(REPORT_FILE):
                write_report(report, self.log_dir)

    def _fall_back(self, reason: str) -> None:
        if self._measurement != "whole-step":
            note = (
                f"Input wait is not separated from compute because {reason}: only "
                "the whole step time is measured (no input fraction, no verdict)."
            )
            logger.warning("keras-pipeline-tuner: %s", note)
            self._notes.append(note)
        self._measurement = "whole-step"

    # Recording.

    def _on_rows(self, kind: str, rows, wall_s: float, called_at: float) -> None:
        if not self.guard.enabled(STEP_CLOCK):
            return
        with self.guard(STEP_CLOCK):
            rows = np.asarray(rows)
            if self._first_call.get(kind, False):
                self._first_call[kind] = False
                self.clock.record_first_step(kind, wall_s, rows, called_at)
            else:
                self.clock.record(kind, rows, called_at)
        if not self.guard.enabled(STEP_CLOCK):
            self._restore_all()

    def _record_whole_step(self, kind: str) -> None:
        start, self._whole_step_start = self._whole_step_start, None
        end = time.time()
        self._on_rows(kind, np.array([[start, np.nan, end]]), end - start, start)


_ATTRIBUTE = {TRAIN: "train_function", VALIDATION: "test_function"}


def write_report(report: Report, log_dir: str) -> str:
    """Writes `report.json` into `log_dir` atomically.

    Args:
        report: the `Report`.
        log_dir: the directory; created if missing.

    Returns:
        The path written.
    """
    os.makedirs(log_dir, exist_ok=True)
    path = os.path.join(log_dir, REPORT_FILENAME)
    partial = path + ".partial"
    try:
        with open(partial, "w", encoding="utf-8") as file:
            file.write(report.to_json())
        os.replace(partial, path)
    except BaseException:
        # A full disk must not be filled further by a half-written file.
        with contextlib.suppress(OSError):
            os.remove(partial)
        raise
    return path


def _checked_log_dir(log_dir) -> Optional[str]:
    if log_dir is None:
        return None
    if not isinstance(log_dir, (str, os.PathLike)):
        raise TypeError(
            f"`log_dir` must be a path (str or os.PathLike), got {type(log_dir).__name__}."
        )
    log_dir = os.fspath(log_dir)
    if os.path.exists(log_dir) and not os.path.isdir(log_dir):
        raise ValueError(
            f"`log_dir` {log_dir!r} is a file, not a directory. Pass a directory path, "
            "e.g. log_dir='logs/run1'."
        )
    return log_dir


def _checked_profile(profile):
    if isinstance(profile, str):
        if profile not in _PROFILE_MODES:
            raise ValueError(
                f"`profile` must be 'auto', 'off' or a (start_step, stop_step) pair, "
                f"got {profile!r}."
            )
        return profile
    if (
        isinstance(profile, (tuple, list))
        and len(profile) == 2
        and all(isinstance(step, int) and not isinstance(step, bool) for step in profile)
    ):
        start, stop = profile
        if start < 0 or stop <= start:
            raise ValueError(
                f"`profile` range {tuple(profile)} is empty or negative: pass "
                "(start_step, stop_step) with 0 <= start_step < stop_step, e.g. (10, 30)."
            )
        return (start, stop)
    raise ValueError(
        f"`profile` must be 'auto', 'off' or a (start_step, stop_step) pair of ints, "
        f"got {profile!r}."
    )
