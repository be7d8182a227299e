"""`PipelineTuner`: the Keras callback that measures input wait on every step."""

import atexit
import logging
import os
import sys
import time
import weakref
from typing import Callable, Iterable, Optional, Tuple, Union

import keras
import numpy as np

from keras_pipeline_tuner.advice.advisor import advise
from keras_pipeline_tuner.timing.cpu_usage import CpuMeter
from keras_pipeline_tuner.instrument.custom_loop import LoopTimer
from keras_pipeline_tuner.instrument.custom_loop import TimedIterator
from keras_pipeline_tuner._util.feature_guard import FeatureGuard
from keras_pipeline_tuner._util.files import write_atomically
from keras_pipeline_tuner.profiling.window import EPOCH_ENDED
from keras_pipeline_tuner.profiling.window import FIT_ENDED
from keras_pipeline_tuner.profiling.window import ProfilerWindow
from keras_pipeline_tuner.outputs.report import REPORT_FILENAME
from keras_pipeline_tuner.outputs.report import Report
from keras_pipeline_tuner.timing.step_clock import TRAIN
from keras_pipeline_tuner.timing.step_clock import VALIDATION
from keras_pipeline_tuner.timing.step_clock import StepClock
from keras_pipeline_tuner.outputs.tensorboard import RUN
from keras_pipeline_tuner.outputs.tensorboard import TensorBoardSink
from keras_pipeline_tuner.outputs.trace import write_trace
from keras_pipeline_tuner.instrument import fit_input
from keras_pipeline_tuner.instrument import backend_fit_timing
from keras_pipeline_tuner.pipeline import graph as pipeline_graph
from keras_pipeline_tuner.timing import timed_step_function
from keras_pipeline_tuner.instrument import what_if_replay
from keras_pipeline_tuner.workers import exchange as worker_reports

logger = logging.getLogger("keras_pipeline_tuner")

STEP_CLOCK = "step clock"
REPORT_FILE = "report file"
SUMMARY = "terminal summary"
ADVICE = "advice"
STEP_TRACE = "step timeline trace"
INSPECTION = "pipeline inspection"
WHAT_IF = "what-if replay"
REPORT = "report"
WORKER_SUMMARY = "worker summary"
WORKER_COMPARISON = "worker comparison"
CPU_USAGE = "CPU usage"

_PROFILE_MODES = ("auto", "off")
# Seconds between writes of report.json and the TensorBoard scalars within an
# epoch, so that a crash loses at most this much (a write costs about 3 ms).
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
    The replacement is on the model only while a step runs: however fit is
    interrupted, Keras' own functions are left in place. At the end of fit it
    prints a verdict and writes `report.json` to `log_dir`; the file is also
    written every epoch, every few seconds within an epoch, when a step fails and
    at interpreter exit, so an interrupted run keeps what was measured. A failure
    inside any of the tuner's features logs one warning, turns that feature off
    and leaves training untouched.

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
        tensorboard_workers: under `tf.distribute.MultiWorkerMirroredStrategy`,
            which workers write TensorBoard summaries: "chief" (the default) or
            "all" (each other worker into `<log_dir>/workers/<task>/`).
            Whichever is chosen, every worker writes a summary of its
            measurements to `<log_dir>/workers/<task>/`, where the chief's
            report compares them and names the straggler
            (`tuner.report.workers`); give every worker the same `log_dir`.
        worker_timeout_s: how long the chief waits at the end of fit for the
            other workers' summaries before reporting without them.

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
        tensorboard_workers: str = "chief",
        worker_timeout_s: float = worker_reports.DEFAULT_TIMEOUT_S,
    ):
        super().__init__()
        self.what_if_steps = what_if_replay.checked_steps(what_if)
        self._what_if = None
        self.log_dir = _checked_log_dir(log_dir)
        self.tensorboard_workers = worker_reports.checked_tensorboard_workers(
            tensorboard_workers
        )
        self.worker_timeout_s = worker_reports.checked_timeout(worker_timeout_s)
        if verbose not in (0, 1, 2) or isinstance(verbose, bool):
            raise ValueError(
                f"`verbose` must be 0, 1 or 2, got {verbose!r}. Pass verbose=0 to "
                "silence the end-of-fit summary, or verbose=1 to print it."
            )
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
        self._next_checkpoint = time.monotonic() + CHECKPOINT_S
        self._loop_timer: Optional[LoopTimer] = None
        self._findings = []
        self._cpu = CpuMeter()
        # Under MultiWorkerMirroredStrategy: this worker's exchange of summaries
        # with the chief, and where its outputs go (see `_begin_workers`).
        self._workers: Optional[worker_reports.WorkerExchange] = None
        self._worker_view: Optional[worker_reports.MultiWorkerSummary] = None
        self._output_dir = self.log_dir
        # On JAX and torch, input wait is timed by a per-backend timing source,
        # and Keras may run batch-end hooks on its callback thread: this
        # callback says it is safe there (its batch-end hooks then do nothing),
        # so adding it does not make Keras dispatch callbacks synchronously.
        self._backend = keras.backend.backend()
        self.async_safe = self._backend in backend_fit_timing.BACKENDS
        self._fit_timing = None

    # Keras hooks.

    def on_train_begin(self, logs=None):
        self.clock = StepClock(self.buffer_steps)
        self._notes = []
        self._measurement = "in-step"
        self._first_call = {TRAIN: True, VALIDATION: True}
        self._what_if = None
        self._next_checkpoint = time.monotonic() + CHECKPOINT_S
        _RUNNING.add(self)
        self._restart_cpu_meter()
        self._fit_timing = None
        if self.async_safe:
            self._workers, self._worker_view = None, None
            self._window.begin_fit()
            self._window.close(FIT_ENDED)
        else:
            self._begin_workers(self.model.distribute_strategy)
            self._window.begin_fit()
        if self.guard.enabled(STEP_CLOCK) or self._workers is not None:
            with self.guard(STEP_CLOCK):
                self._swap_in(TRAIN)
        self._findings = []
        if self.guard.enabled(INSPECTION):
            with self.guard(INSPECTION):
                # Once per fit, before the first step: never inside a timed step.
                try:
                    self._findings = fit_input.inspect_fit_input(self.model)
                except pipeline_graph.InMemoryDataTooLarge as reason:
                    # An expected limit, not a fault: said in the report, no warning.
                    self._notes.append(f"The pipeline was not inspected. {reason}")

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
        self._next_checkpoint = time.monotonic() + CHECKPOINT_S
        self._exchange_worker_summaries(final=False)
        report = self._built_report()
        if report is None:
            return
        self._write_report_file(report)
        if self._tensorboard is not None:
            self._tensorboard.epoch_ended(self.clock, report)

    def on_train_batch_begin(self, batch, logs=None):
        if self.async_safe:
            # The previous step's end-of-step work, here on the training thread.
            self._backend_step(TRAIN)
            self._after_train_step()
            return
        self._window.before_step(batch, self._swapped.get(TRAIN), self.clock)
        self._arm(TRAIN)

    def _backend_step(self, kind: str) -> None:
        if self._fit_timing is not None and self.guard.enabled(STEP_CLOCK):
            with self.guard(STEP_CLOCK):
                self._fit_timing.before_step(kind)

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
        if self.async_safe:
            # May run on Keras' callback thread: see `on_train_batch_begin`.
            return
        self._disarm(TRAIN)
        if self._measurement == "whole-step" and self._whole_step_start is not None:
            self._record_whole_step(TRAIN)
        self._window.after_step(batch)
        self._after_train_step()

    def _after_train_step(self) -> None:
        if self._tensorboard is not None:
            self._tensorboard.step_ended(
                self.clock, getattr(self.model, "steps_per_execution", 1) or 1
            )
        if time.monotonic() >= self._next_checkpoint:
            self._checkpoint()

    def _checkpoint(self) -> None:
        # Within long epochs: report.json and the scalars so far, on disk.
        report = self._built_report()
        if report is not None:
            self._write_report_file(report)
        if self._tensorboard is not None:
            self._tensorboard.write_scalars(self.clock)
            self._tensorboard.flush()
        self._next_checkpoint = time.monotonic() + CHECKPOINT_S

    def on_test_begin(self, logs=None):
        self._window.close(EPOCH_ENDED)
        self._validating_epoch = self.clock.epoch
        if not self._first_call:
            # evaluate() called on its own, outside fit.
            self._first_call = {TRAIN: True, VALIDATION: True}
        if self.guard.enabled(STEP_CLOCK) or self._workers is not None:
            with self.guard(STEP_CLOCK):
                self.clock.begin_epoch(self._validating_epoch, VALIDATION)
                self._swap_in(VALIDATION)

    def on_test_batch_begin(self, batch, logs=None):
        if self.async_safe:
            self._backend_step(VALIDATION)
            return
        self._arm(VALIDATION)

    def on_test_batch_end(self, batch, logs=None):
        if self.async_safe:
            return
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
        elif self.what_if_steps and self._workers is not None:
            self._notes.append(
                "The what-if replay did not run: under MultiWorkerMirroredStrategy its "
                "steps would run the all-reduce, which stalls unless every worker replays "
                "the same steps."
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
        _RUNNING.discard(self)
        if self.guard.enabled(CPU_USAGE):
            with self.guard(CPU_USAGE):
                self._cpu.stop()
        self._exchange_worker_summaries(final=True)
        report = self._built_report()
        if report is None:
            return Report(notes=self._failure_notes())
        failures = len(self.guard.failures)
        self._write_report_file(report)
        if self._tensorboard is not None:
            self._tensorboard.finish(self.clock, report)
            if self.guard.enabled(STEP_TRACE):
                with self.guard(STEP_TRACE):
                    write_trace(self.clock, self._output_dir)
        if self.verbose and self.guard.enabled(SUMMARY):
            with self.guard(SUMMARY):
                from keras_pipeline_tuner.outputs.terminal import print_summary

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
        measurement, notes = self._measurement, list(self._notes)
        if self._fit_timing is not None:
            notes += self._fit_timing.notes()
            if measurement != "whole-step":
                measurement = self._fit_timing.measurement
        if self._loop_timer is not None:
            # Also hands the custom loop's latest steps to the clock.
            measurement, notes = self._loop_timer.describe(measurement, notes)
        validation = self.clock.stats(VALIDATION)
        train = self.clock.stats(TRAIN)
        notes += self._failure_notes()
        if self._worker_view is not None:
            missing = worker_reports.missing_note(self._worker_view, self.log_dir)
            if missing is not None and self._worker_view.waited_s is not None:
                notes.append(missing)
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
            workers=self._worker_view,
            cpu=self._cpu_usage(),
            environment=backend_fit_timing.environment(),
        )
        if self.guard.enabled(ADVICE):
            with self.guard(ADVICE):
                report.recommendations = advise(
                    report.train,
                    report.profile,
                    # With the pipeline they were found in, when inspected here.
                    self._findings,
                    what_if=report.what_if,
                    cpu=report.cpu,
                    workers=report.workers,
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
        _RUNNING.discard(self)
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

    def _restart_cpu_meter(self) -> None:
        if self.guard.enabled(CPU_USAGE):
            with self.guard(CPU_USAGE):
                self._cpu.restart()

    def _cpu_usage(self):
        # Guarded apart: a failed reading must not take the whole report with it.
        if self.guard.enabled(CPU_USAGE):
            with self.guard(CPU_USAGE):
                return self._cpu.usage()
        return None

    def _begin_loop_run(self) -> None:
        # A custom loop's run starts as a fit does in `on_train_begin`.
        self.clock = StepClock(self.buffer_steps)
        self._notes = []
        self._findings = []
        self._what_if = None
        self._next_checkpoint = time.monotonic() + CHECKPOINT_S
        _RUNNING.add(self)
        self._restart_cpu_meter()
        self._window.begin_fit()
        # As for fit, under MultiWorkerMirroredStrategy (in scope, or TF_CONFIG).
        identity = None
        if self.guard.enabled(WORKER_SUMMARY):
            with self.guard(WORKER_SUMMARY):
                identity = worker_reports.identity_from_environment()
        self._join_workers(identity)

    def _loop_steps_ended(self, steps: int) -> None:
        # Between a custom loop's steps, as `on_train_batch_end` for fit.
        if steps and self._tensorboard is not None:
            self._tensorboard.step_ended(self.clock, steps)
        if time.monotonic() >= self._next_checkpoint:
            self._checkpoint()

    # Swapping Keras' functions.

    def _swap_in(self, kind: str) -> None:
        if self.async_safe:
            if self._fit_timing is None:
                self._fit_timing = backend_fit_timing.fit_timing_for(
                    self.model,
                    on_rows=self._on_rows,
                    on_error=self._on_step_error,
                    on_fallback=self._fall_back,
                )
            self._fit_timing.begin(kind)
            return
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
        if self._fit_timing is not None:
            # Hands over the last steps' rows, then puts Keras' own back.
            with self.guard(STEP_CLOCK):
                self._fit_timing.end(kind)
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
            _RUNNING.discard(self)
            self._checkpoint()

    def _write_report_file(self, report: Report) -> None:
        if self._output_dir is not None and self.guard.enabled(REPORT_FILE):
            with self.guard(REPORT_FILE):
                write_report(report, self._output_dir)

    def _fall_back(self, reason: str) -> None:
        if self._measurement != "whole-step":
            note = (
                f"Input wait is not separated from compute because {reason}: only "
                "the whole step time is measured (no input fraction, no verdict)."
            )
            logger.warning("keras-pipeline-tuner: %s", note)
            self._notes.append(note)
        self._measurement = "whole-step"

    # Multi-worker training.

    def _begin_workers(self, strategy) -> None:
        """Finds this worker's place in a multi-worker cluster, if any."""
        identity = None
        if self.guard.enabled(WORKER_SUMMARY):
            with self.guard(WORKER_SUMMARY):
                identity = worker_reports.identity_of(strategy)
        self._join_workers(identity)

    def _join_workers(self, identity: Optional[worker_reports.WorkerIdentity]) -> None:
        """Sets up the exchange with the chief, and where this worker writes.

        The chief writes into `log_dir`; another worker into its own folder under
        `log_dir/workers/`, and TensorBoard summaries only if
        `tensorboard_workers="all"`.
        """
        self._workers, self._worker_view = None, None
        if identity is not None:
            self._workers = worker_reports.WorkerExchange(
                identity, self.log_dir, self.worker_timeout_s
            )
            if self.guard.enabled(WORKER_SUMMARY):
                with self.guard(WORKER_SUMMARY):
                    self._workers.begin_fit()
        workers = self._workers
        self._output_dir = workers.output_dir() if workers is not None else self.log_dir
        self._window.log_dir = self._output_dir
        if self._output_dir is None or not (
            workers is None or workers.identity.is_chief or self.tensorboard_workers == "all"
        ):
            self._tensorboard = None
        elif self._tensorboard is None or self._tensorboard.run_dir != os.path.join(
            self._output_dir, RUN
        ):
            self._tensorboard = TensorBoardSink(self._output_dir, self.guard)

    def _exchange_worker_summaries(self, final: bool) -> None:
        """Writes this worker's summary; the chief also reads the others'.

        At the end of fit the chief waits at most `worker_timeout_s` for them.
        Nothing here talks to the other workers directly, so a worker whose
        tuner fails makes the chief wait that long at most.
        """
        workers = self._workers
        if workers is None:
            return
        own = None
        if self.guard.enabled(WORKER_SUMMARY):
            with self.guard(WORKER_SUMMARY):
                own = worker_reports.WorkerSummary(
                    task=workers.identity.task,
                    host=worker_reports.this_host(),
                    chief=workers.identity.is_chief,
                    final=final,
                    epochs=sum(1 for epoch in self.clock.epochs if epoch.kind == TRAIN),
                    train=self.clock.stats(TRAIN),
                    cpu=self._cpu_usage(),
                    notes=self._failure_notes(),
                )
                workers.publish(own)
        if own is not None and self.guard.enabled(WORKER_COMPARISON):
            with self.guard(WORKER_COMPARISON):
                self._worker_view = workers.collect(own, final=final)

    # Recording.

    def _on_rows(self, kind: str, rows, wall_s: float, called_at: float) -> None:
        if not self.guard.enabled(STEP_CLOCK):
            return
        with self.guard(STEP_CLOCK):
            rows = np.asarray(rows)
            if self._first_call.get(kind, False):
                self._first_call[kind] = False
                self.clock.record_first_step(kind, wall_s, rows, called_at)
                if kind == TRAIN:
                    # CPU use is judged over the steps, as the input wait is:
                    # tracing the first one keeps a single core busy.
                    self._restart_cpu_meter()
            else:
                self.clock.record(kind, rows, called_at)
        if not self.guard.enabled(STEP_CLOCK) and self._workers is None:
            # Under MultiWorkerMirroredStrategy the timed function stays: Keras'
            # own, traced on this worker only, would wait in all-reduces that the
            # other workers, still on theirs, never join.
            self._restore_all()

    def _record_whole_step(self, kind: str) -> None:
        start, self._whole_step_start = self._whole_step_start, None
        end = time.time()
        self._on_rows(kind, np.array([[start, np.nan, end]]), end - start, start)


_ATTRIBUTE = {TRAIN: "train_function", VALIDATION: "test_function"}


@atexit.register
def _write_running_reports() -> None:
    for tuner in list(_RUNNING):
        _RUNNING.discard(tuner)
        tuner._checkpoint()  # pylint: disable=protected-access


def write_report(report: Report, log_dir: str) -> str:
    """Writes `report.json` into `log_dir` atomically.

    Args:
        report: the `Report`.
        log_dir: the directory; created if missing.

    Returns:
        The path written.
    """
    return write_atomically(log_dir, REPORT_FILENAME, report.to_json())


def _checked_log_dir(log_dir) -> Optional[str]:
    if log_dir is None:
        return None
    if not isinstance(log_dir, (str, os.PathLike)):
        raise TypeError(
            f"`log_dir` must be a path (str or os.PathLike), got {type(log_dir).__name__}. "
            "Pass a directory path, e.g. log_dir='logs/run1', or None to keep the "
            "report in memory only."
        )
    log_dir = os.fspath(log_dir)
    if not log_dir:
        raise ValueError(
            "`log_dir` is an empty string. Pass a directory path, e.g. "
            "log_dir='logs/run1', or None to keep the report in memory only."
        )
    # The nearest part of the path that exists must be a directory, or nothing
    # can ever be written there.
    existing = os.path.abspath(log_dir)
    while not os.path.exists(existing) and os.path.dirname(existing) != existing:
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        where = (
            "is a file"
            if existing == os.path.abspath(log_dir)
            else f"is under {existing!r}, which is a file"
        )
        raise ValueError(
            f"`log_dir` {log_dir!r} {where}, not a directory. Pass a directory path, "
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
