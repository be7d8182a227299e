"""`PipelineTuner`: the Keras callback, and the custom-loop API, that drive a `Run`."""

import copy
import functools
import os
import threading
import time
from typing import Callable, Iterable, Optional, Tuple, Union

import keras

from keras_pipeline_tuner._util import features
from keras_pipeline_tuner._util.feature_guard import FeatureGuard
from keras_pipeline_tuner._util.fit_callbacks import current_fit_callbacks
from keras_pipeline_tuner._util.random_state import preserved_random_state
from keras_pipeline_tuner._util.thread_owner import refuse_another_live_thread
from keras_pipeline_tuner._util.tf_import import tensorflow
from keras_pipeline_tuner.advice import fix_timing
from keras_pipeline_tuner.advice import verdict
from keras_pipeline_tuner.instrumentation import fit_input
from keras_pipeline_tuner.instrumentation import what_if_replay
from keras_pipeline_tuner.instrumentation.custom_loop import LoopHooks
from keras_pipeline_tuner.instrumentation.custom_loop import LoopTimer
from keras_pipeline_tuner.instrumentation.custom_loop import TimedIterator
from keras_pipeline_tuner.instrumentation.custom_loop import checked_kind
from keras_pipeline_tuner.instrumentation.timing_source import HAND_OVER_S
from keras_pipeline_tuner.instrumentation.timing_source import FitTiming
from keras_pipeline_tuner.instrumentation.fit_timing import fit_timing_for
from keras_pipeline_tuner.outputs.report import Report
from keras_pipeline_tuner.profiling.window import EPOCH_ENDED
from keras_pipeline_tuner.profiling.window import ProfilerWindow
from keras_pipeline_tuner.run.lifecycle import Run
from keras_pipeline_tuner.run.lifecycle import RunSettings
from keras_pipeline_tuner.timing.step_clock import TRAIN
from keras_pipeline_tuner.timing.step_clock import VALIDATION
from keras_pipeline_tuner.timing.step_clock import StepClock
from keras_pipeline_tuner.workers import exchange as worker_reports

_PROFILE_MODES = ("auto", "off")
# Keras backends whose fit loop may dispatch batch-end hooks asynchronously.
ASYNC_BACKENDS = ("jax", "torch")


class PipelineTuner(keras.callbacks.Callback):
    """Measures how long each training step waits for input, and why.

    Add it to `model.fit` callbacks. It drives one `Run` per fit (see
    `run.lifecycle`) and times each step with the timing source of the Keras
    backend (see `instrumentation.fit_timing`): on TensorFlow an equivalent compiled
    function that timestamps the batch fetch and the step, so every step's
    input wait and compute are measured, with no measurable cost. The
    replacement is on the model only while a step runs: however fit is
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
        check_contention: on the CPU, where the pipeline and the model share
            cores, replay a few cached batches after fit, around
            steps on the real pipeline (about a second, state
            restored), and count the step time the pipeline costs beyond its
            wait (see `tuner.report.judgement`); the replayed step also bounds
            the advice's gains.
        measure_fixes: after training, when fit was given a tf.data dataset
            and the run is input-bound, time each advised fix that `kpt.tune`
            can make (parallel map or interleave, AUTOTUNE, cache, final
            prefetch, vectorised map) on its own against the pipeline as
            written, on the dataset alone, and predict the step gain from it
            and the measured compute time (see `advice.fix_timing`): the
            advice then shows that measured figure and is ranked by it. True
            for a budget of about 5 seconds in all, or a number of seconds;
            off by default. The model is not touched; the pipeline (and its
            Python functions) runs for that long. A pipeline that shuffles,
            draws random numbers or changes state is not timed (its later
            epochs would differ), and a fix that cannot be timed keeps its
            bound.
        allow_unverified: with `measure_fixes`, also time fixes that call a
            Python function from several threads (a parallel map of a
            `tf.py_function`), as `kpt.tune(allow_unverified=True)` does:
            right only if the function keeps no state between calls.

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
        check_contention: bool = True,
        measure_fixes: Union[bool, float] = False,
        allow_unverified: bool = False,
    ):
        super().__init__()
        # What a copy (keras-tuner copies callbacks per trial) starts from.
        self._arguments = dict(
            log_dir=log_dir,
            verbose=verbose,
            profile=profile,
            buffer_steps=buffer_steps,
            profile_steps=profile_steps,
            what_if=what_if,
            tensorboard_workers=tensorboard_workers,
            worker_timeout_s=worker_timeout_s,
            check_contention=check_contention,
            measure_fixes=measure_fixes,
            allow_unverified=allow_unverified,
        )
        self.measure_fixes_s = fix_timing.checked_budget(measure_fixes)
        if not isinstance(allow_unverified, bool):
            raise ValueError(
                f"`allow_unverified` must be True or False, got {allow_unverified!r}. Pass "
                "allow_unverified=True with measure_fixes=True to also time parallel calls "
                "of a Python function."
            )
        if allow_unverified and not self.measure_fixes_s:
            raise ValueError(
                "`allow_unverified` applies to the fixes `measure_fixes` times, and "
                "measure_fixes is off: pass measure_fixes=True as well, or drop "
                "allow_unverified."
            )
        self.allow_unverified = allow_unverified
        if not isinstance(check_contention, bool):
            raise ValueError(
                f"`check_contention` must be True or False, got {check_contention!r}. Pass "
                "check_contention=False to skip the short replay after fit on the CPU."
            )
        self.check_contention = check_contention
        self.what_if_steps = what_if_replay.checked_steps(what_if)
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
        # Checked here, at construction, rather than at the first fit.
        StepClock(buffer_steps)
        self.buffer_steps = buffer_steps
        self.guard = FeatureGuard()
        self._window = ProfilerWindow(self.profile, profile_steps, self.log_dir, self.guard)
        self._run: Optional[Run] = None
        self._timing: Optional[FitTiming] = None
        self._loop: Optional[LoopTimer] = None
        self._validating_epoch = 0
        self._in_fit = False
        # The thread running the tuner's fit, while one runs.
        self._fit_thread: Optional[int] = None
        # On JAX: the first batch of the train call the profiler window last
        # saw begin, until its steps are counted.
        self._window_call: Optional[int] = None
        # When the timing source next hands its rows over (`time.monotonic()`);
        # on JAX and torch, the steps ended since the run last heard, and what
        # the profiler window marks steps through in this fit, if anything.
        self._hand_over_due = 0.0
        self._async_steps = 0
        self._marker = None
        # On JAX and torch Keras may run batch-end hooks on a callback thread,
        # unless a callback that overrides them is not `async_safe`: then it
        # runs every callback on the training thread, which slows those fits.
        # This callback is safe there because its batch-end hooks do nothing on
        # those backends (the end of one step is handled when the next begins).
        self.async_safe = keras.backend.backend() in ASYNC_BACKENDS

    def __deepcopy__(self, memo) -> "PipelineTuner":
        # A copy is a new tuner with the same arguments: compiled functions, the
        # run and its measurements stay with the original.
        return type(self)(**copy.deepcopy(self._arguments, memo))

    # Keras hooks.

    def on_train_begin(self, logs=None):
        _refuse_a_second_tuner()
        self._refuse_a_concurrent_fit()
        self._in_fit = True
        self._fit_thread = threading.get_ident()
        model = self.model
        run = self._new_run(flush_rows=self._flush_timing_rows)
        run.steps_per_execution = int(getattr(model, "steps_per_execution", 1) or 1)
        identity = None
        # Multi-worker training is a tf.distribute strategy: TensorFlow backend only.
        if not self.async_safe and self.guard.enabled(features.WORKER_SUMMARY):
            with self.guard(features.WORKER_SUMMARY):
                identity = worker_reports.identity_of(
                    getattr(model, "distribute_strategy", None)
                )
        run.begin(identity)
        self._timing = None
        self._window_call = None
        if self.guard.enabled(features.STEP_CLOCK) or run.multi_worker:
            with self.guard(features.STEP_CLOCK):
                self._timing = self._new_timing(model)
                self._timing.begin(TRAIN)
        self._async_steps = 0
        self._hand_over_due = time.monotonic() + HAND_OVER_S
        self._marker = self._async_marker() if self.async_safe else None
        if self.async_safe and self.profile != "off" and self._marker is None:
            # The window is not opened on this fit (see on_train_batch_begin).
            run.notes.append(
                f"No profiler window: it is captured on the TensorFlow backend, and on "
                f"JAX when fit is given a tf.data dataset (TensorFlow's profiler sees "
                f"tf.data only); this fit ran on {keras.backend.backend()!r} without one. "
                "The step clock, the advice and all outputs work on every backend; the "
                "tf.data lint needs TensorFlow installed."
            )
        # Once per fit, before the first step: never inside a timed step.
        run.inspect(lambda: fit_input.inspect_fit_input(model))
        if self.guard.enabled(features.GRAIN_STAGES):
            with self.guard(features.GRAIN_STAGES):
                given = fit_input.find_fit_input(model)
                if given is not None and given.kind == fit_input.GRAIN:
                    run.grain_dataset = given.source
        keras_input = fit_input.keras_built_input(run.findings)
        if keras_input is not None:
            self._window.name_keras_input(keras_input)

    def on_epoch_begin(self, epoch, logs=None):
        if self.guard.enabled(features.STEP_CLOCK):
            with self.guard(features.STEP_CLOCK):
                self._run.clock.begin_epoch(epoch, TRAIN)

    def on_epoch_end(self, epoch, logs=None):
        self._end_window_call()
        with self.guard(features.STEP_CLOCK):
            if self._timing is not None:
                # The epoch's last steps, before the epoch is closed.
                self._timing.flush_rows(wait=True)
            self._run.clock.end_epoch(TRAIN, epoch)
        self._run.epoch_ended()

    def on_train_batch_begin(self, batch, logs=None):
        if self.async_safe:
            # Here, on the training thread, rather than in the batch-end hook.
            # On every step only a count and a clock reading: the timing source
            # keeps its rows back, so what reads them runs about once a second.
            if self._timing is not None:
                self._timing.before_step(TRAIN)
            if batch:
                self._async_steps += self._run.steps_per_execution
            if time.monotonic() >= self._hand_over_due:
                self._between_async_steps()
            if self._marker is not None:
                self._mark_async_call(batch)
            return
        timing = self._timing
        if time.monotonic() >= self._hand_over_due or self._window.consults_clock:
            # Also before the window's check reads the rows.
            self._hand_over_rows()
        marker = timing.step_marker_target(TRAIN) if timing is not None else None
        self._window.before_step(batch, marker, self._run.clock, self._steps_left(batch))
        if timing is not None:
            timing.before_step(TRAIN)

    def _hand_over_rows(self) -> None:
        # The timing source keeps its rows back: to the run about once a second.
        self._hand_over_due = time.monotonic() + HAND_OVER_S
        self._flush_timing_rows()

    def _between_async_steps(self) -> None:
        # Rows to the run, then the steps to what counts them (TensorBoard's
        # scalars, the early verdict, checkpoints).
        self._hand_over_rows()
        steps, self._async_steps = self._async_steps, 0
        self._run.steps_ended(steps)

    def _mark_async_call(self, batch: int) -> None:
        marker = self._async_marker()
        if marker is None:
            return
        # The previous call ended before this one begins; its batch-end hook
        # may run on Keras' callback thread, so it is counted here.
        self._end_window_call(batch - 1)
        if self._window.consults_clock:
            # Rows are handed over in batches: the check needs them all.
            self._flush_timing_rows()
        self._window.before_step(batch, marker, self._run.clock, self._steps_left(batch))
        self._window_call = batch

    def _async_marker(self):
        # What the profiler window marks steps through on JAX and torch: the
        # timing source's train function when it can be marked, else None
        # (then no window: batch-end hooks may run off the training thread).
        if self._timing is None or not self.guard.enabled(features.STEP_CLOCK):
            return None
        return self._timing.step_marker_target(TRAIN)

    def _end_window_call(self, last_batch: Optional[int] = None) -> None:
        # Counts the steps of the last call the window saw begin on an
        # asynchronous backend (its batch-end hook is not used there).
        first, self._window_call = self._window_call, None
        if first is None:
            return
        if last_batch is None or last_batch < first:
            # The epoch's last call: as many steps as one call runs, at most
            # to the end of the epoch when Keras knows it.
            last_batch = first + self._run.steps_per_execution - 1
            steps = (self.params or {}).get("steps")
            if isinstance(steps, int) and steps > 0:
                last_batch = min(last_batch, steps - 1)
        self._window.after_step(last_batch)

    def _steps_left(self, batch: int) -> Optional[int]:
        # Keras gives the epoch's length when it knows it.
        steps = (self.params or {}).get("steps")
        if not isinstance(steps, int) or steps <= 0:
            return None
        return steps - batch

    def on_train_batch_end(self, batch, logs=None):
        if self.async_safe:
            # May run on Keras' callback thread: see `on_train_batch_begin`.
            # Only a time stamp here (JAX: the call's end, its logs are ready).
            timing = self._timing
            if timing is not None:
                timing.logs_ready(TRAIN, logs)
            return
        if self._timing is not None:
            self._timing.after_step(TRAIN)
        self._window.after_step(batch)
        self._run.steps_ended(self._run.steps_per_execution)

    def on_test_begin(self, logs=None):
        self._end_window_call()
        self._window.close(EPOCH_ENDED)
        if not self._in_fit:
            # evaluate() called on its own: a run of its own, ended in on_test_end.
            self._new_run(kind="evaluate").begin(None)
            self._timing = None
        run = self._run
        self._validating_epoch = run.clock.epoch
        if self.guard.enabled(features.STEP_CLOCK) or run.multi_worker:
            with self.guard(features.STEP_CLOCK):
                run.clock.begin_epoch(self._validating_epoch, VALIDATION)
                if self._timing is None:
                    self._timing = self._new_timing(self.model)
                self._timing.begin(VALIDATION)

    def on_test_batch_begin(self, batch, logs=None):
        if self.async_safe:
            if self._timing is not None:
                self._timing.before_step(VALIDATION)
            if time.monotonic() >= self._hand_over_due:
                self._between_async_steps()
            return
        if time.monotonic() >= self._hand_over_due:
            self._hand_over_rows()
        if self._timing is not None:
            with self.guard(features.STEP_CLOCK):
                self._timing.before_step(VALIDATION)

    def on_test_batch_end(self, batch, logs=None):
        if self.async_safe:
            timing = self._timing
            if timing is not None:
                timing.logs_ready(VALIDATION, logs)
            return
        if self._timing is not None:
            self._timing.after_step(VALIDATION)

    def on_test_end(self, logs=None):
        if self._timing is not None:
            self._timing.end(VALIDATION)
        with self.guard(features.STEP_CLOCK):
            self._run.clock.end_epoch(VALIDATION, self._validating_epoch)
        if not self._in_fit:
            self._window.end_fit()
            self._run.finish(summary=False)
            self._timing = None
            self.set_model(None)

    def on_train_end(self, logs=None):
        self._end_window_call()
        timing = self._timing
        self._end_timing()
        run = self._run
        if timing is not None:
            run.notes.extend(timing.notes())
        self._window.end_fit()
        if self.what_if_steps and not self.guard.enabled(features.STEP_CLOCK):
            # The replay is compared with the clock's steps: there are none.
            run.notes.append(
                "The what-if replay did not run: it compares with the step clock's "
                "timings, and the step clock was turned off."
            )
        elif self.what_if_steps and run.multi_worker:
            run.notes.append(
                "The what-if replay did not run: under MultiWorkerMirroredStrategy its "
                "steps would run the all-reduce, which stalls unless every worker replays "
                "the same steps."
            )
        elif self.what_if_steps and self.guard.enabled(features.WHAT_IF):
            with self.guard(features.WHAT_IF):
                # After training and with Keras' own functions back: the replay
                # restores the model's state, so training is not changed.
                try:
                    run.what_if = what_if_replay.replay_after_fit(
                        self.model, self.what_if_steps, run.clock.stats(TRAIN)
                    )
                except what_if_replay.ReplayUnsupported as limit:
                    # An expected limit (a strategy, array input): a note, no warning.
                    run.notes.append(f"The what-if replay did not run. {limit}")
        elif self._contention_check_due(run):
            with self.guard(features.CONTENTION_CHECK):
                try:
                    run.what_if = what_if_replay.contention_check(
                        self.model, run.clock.stats(TRAIN), verdict.shows_contention
                    )
                except what_if_replay.ReplayUnsupported as limit:
                    # An expected limit: the wait decides, and the report says why.
                    run.notes.append(f"The contention check did not run. {limit}")
        # After training, as the replay: a pass of its own over the dataset.
        run.time_grain_stages()
        if self.measure_fixes_s and self.guard.enabled(features.FIX_TIMING):
            with self.guard(features.FIX_TIMING):
                self._time_fixes(run)
        self._in_fit = False
        self._fit_thread = None
        run.finish()
        # Nothing the tuner keeps may keep the model alive after its fit.
        self._timing = None
        self.set_model(None)

    def _refuse_a_concurrent_fit(self) -> None:
        """One tuner times one fit at a time: a second thread's fit is refused.

        A fit of this thread that ended without its end hook (interrupted) is
        not running any more: the new one replaces it.
        """
        if not self._in_fit:
            return
        refuse_another_live_thread(
            self._fit_thread,
            "This PipelineTuner is timing a fit in another thread: one tuner times one fit "
            "at a time (the steps of two fits would be mixed in one report). Give each fit "
            "that runs at the same time a PipelineTuner of its own.",
        )

    def _time_fixes(self, run: Run) -> None:
        """Times the advised fixes on fit's dataset, after its last step (`measure_fixes`)."""
        found = fit_input.find_fit_input(self.model)
        source = found.source if found is not None else None
        if found is None or found.kind != fit_input.TF_DATASET or source is None or not isinstance(
            source, tensorflow().data.Dataset
        ):
            run.notes.append(
                "measure_fixes timed no fix: it times rewrites of a tf.data pipeline, and "
                "fit was not given one (or was given one distributed by a strategy)."
            )
            return
        report = run.built_report()
        if report is None or not fix_timing.input_bound(report.verdict):
            return
        # The user's Python functions run again: their draws from the global
        # generators must not move the user's next ones.
        with preserved_random_state():
            run.fix_timings = fix_timing.time_fixes(
                source,
                report.recommendations,
                report.train,
                self.measure_fixes_s,
                self.allow_unverified,
            )

    def finish(self) -> Report:
        """Builds the final report and writes the outputs (file, terminal summary).

        Called at the end of fit; custom loops reach it through `close()`.

        Returns:
            The final `Report`.
        """
        return self._current_run().finish()

    # Results.

    @property
    def report(self) -> Report:
        """The `Report` of the latest run, built from what was measured so far."""
        run = self._current_run()
        # A custom loop hands its latest steps to the clock in batches.
        run.flush_rows()
        return run.report()

    @property
    def clock(self) -> StepClock:
        """The `StepClock` of the latest run."""
        return self._current_run().clock

    # Custom training loops (the timing is in `instrumentation.custom_loop`).

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
        kind = checked_kind(kind, "instrument")
        if fn is None:
            # `@tuner.instrument(kind="validation")`.
            return functools.partial(self.instrument, kind=kind)
        wrapped = self._custom_loop().instrument(fn, kind)
        # Shown to users: `train_step.tuner.report`.
        wrapped.tuner = self
        return wrapped

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
        if self._loop is None:
            self._loop = LoopTimer(
                LoopHooks(
                    begin_run=self._begin_loop_run,
                    is_current=lambda clock: self._run is not None and self._run.clock is clock,
                    steps_ended=lambda steps: self._run.steps_ended(steps),
                    epoch_ended=lambda: self._run.epoch_ended(),
                    mark_step=self._mark_loop_step,
                    inspect=lambda find: self._run.inspect(find),
                    finish=self._finish_loop_run,
                    report=lambda: self.report,
                    profile_dataset=self._window.use_dataset,
                    grain_dataset=self._use_grain_dataset,
                ),
                self.guard,
            )
        return self._loop

    # Runs.

    def _new_run(self, describe=None, flush_rows=None, kind: str = "fit") -> Run:
        settings = RunSettings(
            log_dir=self.log_dir,
            verbose=self.verbose,
            buffer_steps=self.buffer_steps,
            tensorboard_workers=self.tensorboard_workers,
            worker_timeout_s=self.worker_timeout_s,
        )
        self._run = Run(settings, self.guard, self._window, describe, flush_rows, kind)
        return self._run

    def _current_run(self) -> Run:
        return self._run if self._run is not None else self._new_run()

    def _begin_loop_run(self) -> StepClock:
        # A custom loop's run starts as a fit does in `on_train_begin`.
        run = self._new_run(
            describe=self._loop.describe, flush_rows=self._loop.flush_rows, kind="loop"
        )
        identity = None
        if self.guard.enabled(features.WORKER_SUMMARY):
            with self.guard(features.WORKER_SUMMARY):
                # As for fit, under MultiWorkerMirroredStrategy (in scope, or TF_CONFIG).
                identity = worker_reports.identity_from_environment()
        run.begin(identity)
        return run.clock

    def _mark_loop_step(self) -> None:
        # The profiler's step marks run from one step's end to the next's, so
        # that each holds the loop's batch fetch as well as the step: the
        # analyzer's input time is the fetch inside a marked step.
        self._window.after_step(0)
        if self._window.consults_clock:
            # The loop hands its rows over in batches: the check needs them all.
            self._run.flush_rows()
        self._window.before_step(0, None, self._run.clock)

    def _finish_loop_run(self) -> Report:
        self._window.end_fit()
        self._run.time_grain_stages()
        return self._run.finish()

    def _use_grain_dataset(self, dataset) -> None:
        # The custom loop's Grain dataset, timed by Grain when the run ends.
        self._run.grain_dataset = dataset

    # The fit's timing source.

    def _new_timing(self, model) -> FitTiming:
        return fit_timing_for(
            model,
            self._on_rows,
            self._on_step_error,
            self._run.fall_back,
            first_batch_end_hook=self._first_batch_end_hook(),
        )

    def _first_batch_end_hook(self) -> bool:
        # Whether Keras calls this callback's batch-end hooks before any other
        # callback's: then they run as soon as Keras has the step's logs.
        base = keras.callbacks.Callback
        for callback in current_fit_callbacks():
            if callback is self:
                return True
            for name in ("on_batch_end", "on_train_batch_end", "on_test_batch_end"):
                if getattr(type(callback), name, None) is not getattr(base, name):
                    return False
        return True

    def _on_rows(
        self, kind: str, rows, wall_s: float, called_at: float, tracing_s: Optional[float] = None
    ) -> None:
        run = self._run
        run.record_rows(kind, rows, wall_s, called_at, tracing_s)
        if not self.guard.enabled(features.STEP_CLOCK) and not run.multi_worker:
            # Under MultiWorkerMirroredStrategy the timed function stays: Keras'
            # own, traced on this worker only, would wait in all-reduces that the
            # other workers, still on theirs, never join.
            self._end_timing()

    def _on_step_error(self, error: Optional[BaseException]) -> None:
        if error is not None:
            # fit ends here, without on_train_end.
            self._in_fit = False
        self._end_timing()
        self._run.step_failed(error)

    def _contention_check_due(self, run: Run) -> bool:
        """Whether the wait alone may miss what the pipeline costs the step.

        On the CPU the pipeline's threads share the cores with the model, which
        the wait at the fetch does not show. A short replay of cached batches
        times the step with input free (see `advice.verdict`). An input-bound
        job needs it too: the replayed step bounds what any fix can bring, and
        a pipeline that competes for the cores costs more than its wait.
        """
        if not (self.check_contention and self.guard.enabled(features.CONTENTION_CHECK)):
            return False
        if run.multi_worker or run.measurement != "in-step" or self.model is None:
            return False
        if keras.backend.backend() != "tensorflow":
            # The replay runs the TensorFlow backend's compiled step.
            return False
        if not self.guard.enabled(features.REPORT):
            # No verdict can be built (that feature failed): none to refine.
            return False
        with self.guard(features.CONTENTION_CHECK):
            steady = run.clock.steady_share(TRAIN)
            if steady.steps < what_if_replay.CONTENTION_MIN_STEPS:
                return False
            return what_if_replay.computes_on_cpu() and what_if_replay.can_replay(self.model)
        return False
    def _flush_timing_rows(self) -> None:
        # Rows the timing source keeps back until steps end (JAX), for the outputs.
        if self._timing is not None and self.guard.enabled(features.STEP_CLOCK):
            with self.guard(features.STEP_CLOCK):
                self._timing.flush_rows()

    def _end_timing(self) -> None:
        if self._timing is not None:
            self._timing.end(TRAIN)
            self._timing.end(VALIDATION)


def _refuse_a_second_tuner() -> None:
    # Before anything is swapped: two tuners would time the same steps, and the
    # second's timed function would take every step from the first.
    tuners = [c for c in current_fit_callbacks() if isinstance(c, PipelineTuner)]
    if len(tuners) > 1:
        raise ValueError(
            f"This fit has {len(tuners)} PipelineTuner callbacks; one fit takes one "
            "tuner (each would time the same steps, and the second would hide them "
            "from the first). Pass a single kpt.PipelineTuner in `callbacks`."
        )


def instrument(fn: Optional[Callable] = None, *, kind: str = TRAIN, **tuner_kwargs):
    """Times a custom loop's train step with a tuner of its own.

    The shortcut for `tuner = kpt.PipelineTuner(...)` then `@tuner.instrument`:
    the tuner is the decorated function's `tuner` attribute. Call
    `train_step.tuner.close()` after the loop for the report and the outputs.

    Args:
        fn: the train step (a Python function or a `tf.function`); omitted when
            arguments are given, as in `@kpt.instrument(log_dir="logs/run1")`.
        kind: "train" or "validation".
        **tuner_kwargs: arguments of `PipelineTuner` (`log_dir`, `verbose`, ...).

    Returns:
        The wrapped step, or a decorator when `fn` is omitted.

    Example:

    ```python
    @kpt.instrument(log_dir="logs/run1")
    @tf.function
    def train_step(x, y):
        ...

    for x, y in train_step.tuner.iterate(train_ds):
        train_step(x, y)
    train_step.tuner.close()
    ```
    """
    kind = checked_kind(kind, "instrument")
    return PipelineTuner(**tuner_kwargs).instrument(fn, kind=kind)


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
