"""`PipelineTuner`: the Keras callback, and the custom-loop API, that drive a `Run`.

The callback's hooks hand what they see to the run (`run.lifecycle`) and its
timing source (`instrumentation.timing_source`): epochs, the steps through the
batch hooks (`run.step_hooks`, chosen once per fit as Keras chooses its
dispatch), and, once training ended, the probes (`after_training.probes`). Custom loops
reach the same run through `instrument` and `iterate`, driven by the loop's
driver (`run.loop_driver`), the sibling of these hooks.
"""

import copy
import dataclasses
import functools
import logging
import os
import threading
import time
from typing import Callable
from typing import List
from typing import Optional
from typing import Tuple
from typing import Union

import keras

from keras_pipeline_tuner._util import features
from keras_pipeline_tuner._util.feature_guard import FeatureGuard
from keras_pipeline_tuner._util.running_fit import current_fit_callbacks
from keras_pipeline_tuner._util.running_fit import running_call
from keras_pipeline_tuner._util.thread_owner import refuse_another_live_thread
from keras_pipeline_tuner.after_training.probes import AfterTraining
from keras_pipeline_tuner.after_training.settings import ProbeSettings
from keras_pipeline_tuner.instrumentation import fit_input
from keras_pipeline_tuner.instrumentation.backend_timing import fit_timing_for
from keras_pipeline_tuner.instrumentation.grain_stage_timing import GrainStageTimer
from keras_pipeline_tuner.instrumentation.loop_timing import checked_kind
from keras_pipeline_tuner.instrumentation.timing_source import FitTiming
from keras_pipeline_tuner.instrumentation.user_calls import UserCallTimer
from keras_pipeline_tuner.outputs import terminal as terminal_summary
from keras_pipeline_tuner.outputs.report import Report
from keras_pipeline_tuner.profiling.window import EPOCH_ENDED
from keras_pipeline_tuner.profiling.window import ProfilerWindow
from keras_pipeline_tuner.run.arguments import TunerArguments
from keras_pipeline_tuner.run.lifecycle import Run
from keras_pipeline_tuner.run.lifecycle import RunSettings
from keras_pipeline_tuner.run.live_model_hooks import LiveModelHooks
from keras_pipeline_tuner.run.loop_driver import LoopDriver
from keras_pipeline_tuner.run.loop_methods import CustomLoopMethods
from keras_pipeline_tuner.run.step_hooks import AsyncSteps
from keras_pipeline_tuner.run.step_hooks import SyncSteps
from keras_pipeline_tuner.run.step_hooks import epoch_length
from keras_pipeline_tuner.timing import fetch_floor
from keras_pipeline_tuner.timing.step_clock import TRAIN
from keras_pipeline_tuner.timing.step_clock import VALIDATION
from keras_pipeline_tuner.timing.step_clock import StepClock
from keras_pipeline_tuner.workers import exchange as worker_reports

# Keras backends whose fit loop may dispatch batch-end hooks asynchronously.
ASYNC_BACKENDS = ("jax", "torch")

logger = logging.getLogger("keras_pipeline_tuner")


class PipelineTuner(CustomLoopMethods, keras.callbacks.Callback):
    """Measures how long each training step waits for input, and why.

    Add it to `model.fit` callbacks. It drives one `Run` per fit (see
    `run.lifecycle`) and times each step with the timing source of the Keras
    backend (see `instrumentation.timing_source`): on TensorFlow an equivalent compiled
    function that runs what Keras' own runs per call and timestamps the batch
    fetch and the step, so every step's input wait and compute are measured
    on the step the user runs. The replacement is on the model only from the
    batch-begin hook to the start of its call: however fit is
    interrupted, Keras' own functions are left in place (see the documentation's
    "What it runs, and never runs" for the one exception, legacy random ops). At the end of fit it
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
            window closes at the latest at the end of its epoch; its evidence,
            converted in a process of its own while training goes on, is
            `tuner.report.profile` once that is done. The end of fit does not
            wait for it: a conversion still running then joins the report,
            `report.json` and TensorBoard when it ends
            (`tuner.report.profile_pending` until then;
            `tuner.wait_for_profile()` waits for it).
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
            and the measured compute time (see `after_training.fix_timing`): the
            advice then shows that measured figure and is ranked by it.
            "auto" (the default): within the smaller of 10 s and 5 % of the
            fit's time, a cap of its own; True: about 5 s; or seconds; False:
            off. The model is not touched; a shuffle or random ops are timed
            on rebuilds with seeds of their own. A pipeline that runs your
            Python (a generator, a `tf.py_function`, a PyDataset) or keeps a
            `tf.random.Generator` is not run again unless you pass
            `allow_unverified=True` too: its fixes' gains are then predicted
            from its calls timed during training. The tuner never copies
            the process.
        allow_unverified: with `measure_fixes=True` (or seconds), you vouch
            that the pipeline's Python keeps no state and reads no queue or
            feed: after training, time its fixes by running it again in this
            process (also from several threads: a parallel map of a
            `tf.py_function`, a generator's by copies read at once), a
            PyDataset's advised `workers`, and a Grain pipeline's stages where
            training's own Grain iterators could not be timed.
        cost_budget_s: seconds the tuner's own work after training may take:
            the contention check runs only when it fits, and the report states
            what the work took (`report.tuner_cost`). `None` (the default): the
            larger of 2 s and 2 % of the fit's time; 0: no automatic probe.
            Probes asked for (`what_if`, `measure_fixes`) run as asked.

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
        measure_fixes: Union[str, bool, float] = "auto",
        allow_unverified: bool = False,
        cost_budget_s: Optional[float] = None,
    ):
        # What a copy (keras-tuner copies callbacks per trial) starts from.
        self._arguments = {
            name: value for name, value in locals().items() if name not in ("self", "__class__")
        }
        super().__init__()
        checked = TunerArguments.checked(**self._arguments)
        # The checked values, as attributes of the same names (`what_if_steps`,
        # `measure_fixes_s`: the arguments in the units the tuner works in).
        for field in dataclasses.fields(checked):
            setattr(self, field.name, getattr(checked, field.name))
        self.guard = FeatureGuard()
        self._window = ProfilerWindow(self.profile, checked.profile_steps, self.log_dir, self.guard)
        self._probes = AfterTraining(
            ProbeSettings(
                self.what_if_steps,
                self.check_contention,
                self.measure_fixes_s,
                self.allow_unverified,
            ),
            self.guard,
            announce=functools.partial(_announce, self.verbose),
        )
        self._run: Optional[Run] = None
        # Earlier runs whose profile was still converting when the next began
        # (a fit, then `evaluate()`): `wait_for_profile` waits for them too.
        self._converting_runs: List[Run] = []
        self._timing: Optional[FitTiming] = None
        self._steps = None
        self._loop: Optional[LoopDriver] = None
        # The user's Python calls of the running fit, timed where fit makes them.
        self._user_calls: Optional[UserCallTimer] = None
        # Grain's stage timing of the iterators the running fit reads.
        self._grain_stages: Optional[GrainStageTimer] = None
        # tf.data's live model of the running fit's iterator.
        self._live_model = LiveModelHooks(self.guard)
        self._validating_epoch = 0
        self._in_fit = False
        # The thread running the tuner's fit, while one runs.
        self._fit_thread: Optional[int] = None
        # On JAX and torch Keras may run batch-end hooks on a callback thread,
        # unless a callback that overrides them is not `async_safe`: then it
        # runs every callback on the training thread, which slows those fits.
        # This callback is safe there because its batch-end hooks only stamp
        # the time (the rest of a step's work is done when the next begins).
        self.async_safe = keras.backend.backend() in ASYNC_BACKENDS

    def __deepcopy__(self, memo) -> "PipelineTuner":
        # A copy is a new tuner with the same arguments: compiled functions, the
        # run and its measurements stay with the original.
        return type(self)(**copy.deepcopy(self._arguments, memo))

    # Keras hooks.

    def on_train_begin(self, logs=None):
        began = time.monotonic()
        _refuse_a_second_tuner()
        if self._in_fit:
            refuse_another_live_thread(
                self._fit_thread,
                "This PipelineTuner is timing a fit in another thread: one tuner times one "
                "fit at a time (the steps of two fits would be mixed in one report). Give "
                "each fit that runs at the same time a PipelineTuner of its own.",
            )
        self._in_fit, self._fit_thread = True, threading.get_ident()
        model = self.model
        # A fit that raised past the tuner's hooks keeps its figures.
        self._end_user_calls()
        self._end_grain_stages()
        run = self._new_run(flush_source=self._flush_timing_rows)
        run.steps_per_execution = int(getattr(model, "steps_per_execution", 1) or 1)
        # How Keras' progress bar counts its ms/step, shown beside the step.
        verbose = (self.params or {}).get("verbose")
        run.clock.keras_verbose = 1 if verbose == "auto" else verbose
        identity = None
        # Multi-worker training is a tf.distribute strategy: TensorFlow backend only.
        if not self.async_safe and self.guard.enabled(features.WORKER_SUMMARY):
            with self.guard(features.WORKER_SUMMARY):
                identity = worker_reports.identity_of(
                    getattr(model, "distribute_strategy", None)
                )
        run.begin(identity)
        self._timing = None
        if self.guard.enabled(features.STEP_CLOCK) or run.multi_worker:
            with self.guard(features.STEP_CLOCK):
                self._timing = self._new_timing(model)
                self._timing.begin(TRAIN)
        self._steps = self._step_hooks(run)
        self._inspect_fit_input(run, model)
        self._begin_user_calls(run, model)
        self._begin_grain_stages(run, model)
        self._live_model.begin(run, model, keras.backend.backend())
        run.cost.before_training(time.monotonic() - began)

    def on_epoch_begin(self, epoch, logs=None):
        self._run.begin_epoch(TRAIN, epoch)

    def on_epoch_end(self, epoch, logs=None):
        self._steps.call_ended()
        if self._timing is not None:
            with self.guard(features.STEP_CLOCK):
                # The epoch's last steps (JAX: once their outputs are ready).
                self._timing.flush_rows(wait=True)
        self._run.end_epoch(TRAIN, epoch)
        self._read_grain_stages()
        self._live_model.epoch_ended(self._run)
        self._run.epoch_ended()
        self._run.clock.epoch_work_ended()

    def on_train_batch_begin(self, batch, logs=None):
        self._steps.train_begin(batch)
        self._live_model.steady_step()

    def on_train_batch_end(self, batch, logs=None):
        # On JAX and torch maybe on Keras' callback thread: only a time stamp there.
        self._steps.train_end(batch, logs)

    def on_test_begin(self, logs=None):
        if self._steps is not None:
            self._steps.call_ended()
        self._window.close(EPOCH_ENDED)
        if not self._in_fit:
            # evaluate() called on its own: a run of its own, ended in on_test_end.
            self._new_run(kind="evaluate").begin(None)
            self._timing = None
            self._steps = self._step_hooks(self._run)
        run = self._run
        self._validating_epoch = run.clock.epoch
        run.begin_epoch(VALIDATION, self._validating_epoch)
        if self.guard.enabled(features.STEP_CLOCK) or run.multi_worker:
            with self.guard(features.STEP_CLOCK):
                if self._timing is None:
                    self._timing = self._new_timing(self.model)
                    self._steps = self._step_hooks(run)
                self._timing.begin(VALIDATION)

    def on_test_batch_begin(self, batch, logs=None):
        with self.guard(features.STEP_CLOCK):
            self._steps.test_begin()

    def on_test_batch_end(self, batch, logs=None):
        self._steps.test_end(logs)

    def on_test_end(self, logs=None):
        if self._timing is not None:
            self._timing.end(VALIDATION)
        self._run.end_epoch(VALIDATION, self._validating_epoch)
        if not self._in_fit:
            self._run.end_window()
            self._run.finish(summary=False)
            self._timing = None
            self.set_model(None)

    def on_train_end(self, logs=None):
        self._steps.call_ended()
        # Before anything of the tuner's own runs: only training's calls are timed.
        self._end_user_calls()
        self._end_grain_stages()
        self._live_model.end(self._run)
        timing = self._timing
        traced_step = timing.traced_train_step() if timing is not None else None
        self._end_timing()
        run = self._run
        # From here on, the tuner's own time (see `timing.tuner_cost`).
        run.training_ended()
        if timing is not None:
            run.notes.extend(timing.notes())
        # Nothing here waits for the profile's conversion: Keras' fit iterator
        # is alive until this hook returns, and its prefetch reads the source
        # meanwhile. The evidence joins the report when it is ready.
        with run.cost.part("profile window"):
            run.end_window()
        inputs = _probed_inputs(self.model)
        self._probes.run(run, model=self.model, traced_step=traced_step, **inputs)
        self._in_fit, self._fit_thread = False, None
        run.finish()
        # Nothing the tuner keeps may keep the model alive after its fit.
        self._timing = None
        self.set_model(None)

    def finish(self) -> Report:
        """Builds the final report and writes the outputs (file, terminal summary).

        Called at the end of fit; custom loops reach it through `close()`.

        Returns:
            The final `Report`.
        """
        return self._current_run().finish()

    def wait_for_profile(self, timeout_s: Optional[float] = None) -> Report:
        """Waits for the profiler window's evidence to join the report, and returns it.

        `model.fit` does not wait at its end for xprof's conversion of the
        profiler window (Keras' fit iterator is alive until every callback's
        `on_train_end` has returned, and its prefetch goes on reading the
        input meanwhile). A conversion still running then goes on in a process
        of its own; its evidence joins `tuner.report`, `report.json` and the
        TensorBoard outputs when it ends, and until then
        `tuner.report.profile_pending` is True. Call this where the profile is
        needed right after fit. A wait that may last over a second is said
        first, in one line. A custom loop's `close()` waits by itself.

        Also waits for the profile of an earlier run of this tuner still
        converting (a fit followed by `evaluate()`, whose run is the latest):
        its files are final when this returns.

        Args:
            timeout_s: the longest to wait, in seconds; `None` waits until
                the conversion has ended.

        Returns:
            The latest run's `Report`: with the profile evidence, or with
            `profile_pending` still True if `timeout_s` passed first. A run
            with no window, or whose evidence has joined, returns at once.

        Raises:
            ValueError: `timeout_s` is not a non-negative number.

        Example:

        ```python
        model.fit(train_ds, epochs=5, callbacks=[tuner])
        report = tuner.wait_for_profile(timeout_s=60)
        if report.profile is not None:
            print(report.profile.summary())
        ```
        """
        if timeout_s is not None and (
            isinstance(timeout_s, bool)
            or not isinstance(timeout_s, (int, float))
            or not timeout_s >= 0
        ):
            raise ValueError(
                f"`timeout_s` must be a number of seconds (0 or more) or None, got "
                f"{timeout_s!r}. Pass e.g. tuner.wait_for_profile(timeout_s=60)."
            )
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        for run in [*self._converting_runs, self._run]:
            if run is not None:
                left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
                run.wait_for_profile(left)
        self._converting_runs = [run for run in self._converting_runs if run.awaiting_profile]
        return self.report

    # Results.

    @property
    def report(self) -> Report:
        """The `Report` of the latest run, built from what was measured so far."""
        run = self._current_run()
        # Rows are kept back and recorded together: all of them first.
        run.flush_rows()
        return run.report()

    @property
    def clock(self) -> StepClock:
        """The `StepClock` of the latest run."""
        return self._current_run().clock

    # Runs.

    def _new_run(self, flush_source=None, kind: str = "fit") -> Run:
        settings = RunSettings(
            log_dir=self.log_dir,
            verbose=self.verbose,
            buffer_steps=self.buffer_steps,
            tensorboard_workers=self.tensorboard_workers,
            worker_timeout_s=self.worker_timeout_s,
            cost_budget_s=self.cost_budget_s,
        )
        earlier = [self._run] if self._run is not None else []
        self._converting_runs = [
            run for run in self._converting_runs + earlier if run.awaiting_profile
        ]
        self._run = Run(settings, self.guard, self._window, flush_source, kind)
        return self._run

    def _current_run(self) -> Run:
        return self._run if self._run is not None else self._new_run()

    def _begin_loop_run(self) -> Run:
        # A custom loop's run starts as a fit does in `on_train_begin`.
        run = self._new_run(kind="loop")
        identity = None
        if self.guard.enabled(features.WORKER_SUMMARY):
            with self.guard(features.WORKER_SUMMARY):
                # As for fit, under MultiWorkerMirroredStrategy (in scope, or TF_CONFIG).
                identity = worker_reports.identity_from_environment()
        run.begin(identity)
        return run

    def _custom_loop(self) -> LoopDriver:
        if self._loop is None:
            self._loop = LoopDriver(
                self._begin_loop_run,
                lambda run: run is self._run,
                self._finish_loop_run,
                self.guard,
            )
        return self._loop

    def _finish_loop_run(self, run: Run, dataset) -> Report:
        run.training_ended()
        with run.cost.part("profile conversion"):
            run.end_window()
            # The loop has ended and `close()` asked for the final report: it
            # waits for a conversion still running (fit's end does not).
            run.wait_for_profile()
        self._probes.run(run, model=None, dataset=dataset, fetched=_loop_fetched(dataset))
        return run.finish()

    # The fit's timing source and step hooks.

    def _inspect_fit_input(self, run: Run, model) -> None:
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

    def _begin_user_calls(self, run: Run, model) -> None:
        # Once per fit, after the fit input is found and before the first step.
        if not self.guard.enabled(features.USER_CALLS):
            return
        with self.guard(features.USER_CALLS):
            timer = UserCallTimer(on_failure=self._user_calls_failed)
            # Kept before `begin`: what a failed `begin` replaced is put back.
            self._user_calls = timer
            given = fit_input.find_fit_input(model)
            reads_tf_data = given is not None and given.kind == fit_input.TF_DATASET
            timer.begin(
                dataset=given.source if reads_tf_data else None,
                adapter=fit_input.data_adapter(model),
                fit=running_call(model, "fit"),
                pipeline=getattr(run.findings, "pipeline", None),
            )
            run.notes.extend(timer.notes)
            run.user_calls_so_far = timer.so_far

    def _end_user_calls(self) -> None:
        timer, self._user_calls = self._user_calls, None
        if timer is None:
            return
        run = self._run
        if run is not None:
            run.user_calls_so_far = None
        # Put back even when the feature failed meanwhile: `end` restores first.
        with self.guard(features.USER_CALLS):
            timings = timer.end()
            if run is not None and self.guard.enabled(features.USER_CALLS):
                run.user_calls = timings

    def _user_calls_failed(self, reason: str) -> None:
        # Maybe on a tf.data or Keras worker thread: the guard only logs and records.
        self.guard.disable(features.USER_CALLS, reason)

    def _begin_grain_stages(self, run: Run, model) -> None:
        # Once per fit, before the first step: Grain times the fit's own iterators.
        if not self.guard.enabled(features.GRAIN_STAGES):
            return
        with self.guard(features.GRAIN_STAGES):
            timer = GrainStageTimer(on_failure=self._grain_stages_failed)
            # Kept before `begin`: what a failed `begin` replaced is put back.
            self._grain_stages = timer
            timer.begin(model, keras.backend.backend())
            run.notes.extend(timer.notes)

    def _read_grain_stages(self) -> None:
        # At each epoch's end: the report so far names the stages.
        timer = self._grain_stages
        if timer is None or not self.guard.enabled(features.GRAIN_STAGES):
            return
        with self.guard(features.GRAIN_STAGES):
            evidence = timer.so_far()
            if evidence is not None:
                self._run.stage_timing = evidence

    def _end_grain_stages(self) -> None:
        timer, self._grain_stages = self._grain_stages, None
        if timer is None:
            return
        # Put back even when the feature failed meanwhile: `end` restores first.
        with self.guard(features.GRAIN_STAGES):
            evidence = timer.end()
            run = self._run
            if evidence is not None and run is not None:
                if self.guard.enabled(features.GRAIN_STAGES):
                    run.stage_timing = evidence

    def _grain_stages_failed(self, reason: str) -> None:
        # Maybe on a tf.data or loader thread: the guard only logs and records.
        self.guard.disable(features.GRAIN_STAGES, reason)

    def _step_hooks(self, run: Run):
        # Keras gives the epoch's length when it knows it.
        fit_steps = epoch_length((self.params or {}).get("steps"))
        if not self.async_safe:
            return SyncSteps(run, self._timing, fit_steps)
        steps = AsyncSteps(run, self._timing, fit_steps)
        if self.profile != "off" and self._in_fit and steps.marker is None:
            # The window is not opened on this fit (see `run.step_hooks`).
            run.notes.append(
                f"No profiler window: it is captured on the TensorFlow backend, and on "
                f"JAX when fit is given a tf.data dataset (TensorFlow's profiler sees "
                f"tf.data only); this fit ran on {keras.backend.backend()!r} without one. "
                "The step clock, the advice and all outputs work on every backend; the "
                "tf.data lint needs TensorFlow installed."
            )
        return steps

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
        # Called on every step: the run keeps the rows back.
        self._run.add_rows(kind, rows, wall_s, called_at, tracing_s)

    def _on_step_error(self, error: Optional[BaseException]) -> None:
        if error is not None:
            # fit ends here, without on_train_end.
            self._in_fit = False
        self._end_user_calls()
        self._end_grain_stages()
        self._live_model.end(self._run)
        self._end_timing()
        self._run.step_failed(error)

    def _flush_timing_rows(self) -> None:
        # Stamps the timing source keeps itself (JAX), before the run records.
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


def _announce(verbose: int, line: str) -> None:
    """One line before the tuner's own work that takes over a second."""
    terminal_summary.announce(line, verbose)


def _probed_inputs(model) -> dict:
    """What fit read, as the probes take it: a tf.data `dataset` or a `py_dataset`."""
    given = fit_input.find_fit_input(model)
    kind = given.kind if given is not None else None
    return {
        "dataset": given.source if kind == fit_input.TF_DATASET else None,
        "py_dataset": given.source if kind == fit_input.PY_DATASET else None,
        "fetched": _fetched(given),
    }


def _loop_fetched(dataset) -> Optional[tuple]:
    """`(backend, "loop", element_spec)` of a loop's `tuner.iterate` dataset, or `None`."""
    spec = getattr(dataset, "element_spec", None)
    if spec is None:
        return None
    import keras

    return keras.backend.backend(), fetch_floor.LOOP, spec


def _fetched(given) -> Optional[tuple]:
    """`(backend, kind, element_spec)` of the fit's fetch, for the fetch floor, or `None`."""
    if given is None:
        return None
    import keras

    dataset = given.replay_dataset if given.replay_dataset is not None else given.source
    return keras.backend.backend(), given.kind, getattr(dataset, "element_spec", None)
