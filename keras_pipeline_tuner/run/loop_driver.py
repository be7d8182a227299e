"""The custom loop's driver of a `Run`: the sibling of fit's callback hooks.

`model.fit` drives its run from Keras' callback hooks (`run.tuner`,
`run.step_hooks`); a custom loop has none, so its timing source
(`instrumentation.loop_timing.LoopTiming`) calls this driver's hooks where the
loop's calls and passes happen. The driver does what fit's hooks do: begins a
run at the loop's first measured call, hands the source's rows, failed steps
and fallbacks to the run through the same verbs as fit's sources, marks the
profiler window's steps, inspects the iterated dataset, reads tf.data's live
model of its passes, times a Grain dataset's stages, writes the outputs
between steps, and ends the run at `close()`.
"""

import logging
import sys
import threading
from typing import Callable
from typing import Iterable
from typing import Optional

from keras_pipeline_tuner._util import features
from keras_pipeline_tuner._util.tf_import import tensorflow
from keras_pipeline_tuner._util.thread_owner import refuse_another_live_thread
from keras_pipeline_tuner.instrumentation.grain_stage_timing import GrainStageTimer
from keras_pipeline_tuner.instrumentation.loop_timing import LoopHooks
from keras_pipeline_tuner.instrumentation.loop_timing import LoopTiming
from keras_pipeline_tuner.instrumentation.loop_timing import TimedIterator
from keras_pipeline_tuner.outputs.report import Report
from keras_pipeline_tuner.pipeline.lint import keras_inputs as pipeline_lint
from keras_pipeline_tuner.profiling import grain_stages
from keras_pipeline_tuner.run.lifecycle import Run
from keras_pipeline_tuner.run.live_model_hooks import LiveModelHooks
from keras_pipeline_tuner.timing.step_clock import TRAIN

logger = logging.getLogger("keras_pipeline_tuner")

FEATURE = features.LOOP_CLOCK


class LoopDriver:
    """Drives a custom loop's `Run` from the calls its timing source sees.

    One per `PipelineTuner`, created at its first custom-loop use;
    `PipelineTuner.instrument`, `iterate`, `end_epoch`, `close` and the context
    manager delegate to it. A run starts at the first measured call (a new run,
    as `fit` starts one) and ends at `close()`.

    Args:
        begin_run: begins a run for the loop; returns the `Run`.
        is_current: whether a run is still the tuner's latest (a fit with the
            same tuner starts a run of its own, which ends the loop's).
        finish_run: ends a run, given the tf.data dataset the loop iterated
            (for the probes), or `None`; returns the final `Report`.
        guard: the tuner's `FeatureGuard`.

    Example:

    ```python
    tuner = kpt.PipelineTuner(log_dir="logs/run1")

    @tuner.instrument
    @tf.function
    def train_step(x, y):
        ...

    for x, y in tuner.iterate(train_ds):
        train_step(x, y)
    tuner.close()
    ```
    """

    def __init__(
        self,
        begin_run: Callable[[], Run],
        is_current: Callable[[Run], bool],
        finish_run: Callable[[Run, object], Report],
        guard,
    ):
        self._begin_run = begin_run
        self._is_current_run = is_current
        self._finish_run = finish_run
        self._guard = guard
        self._lock = threading.Lock()
        self._run: Optional[Run] = None
        self.timing = LoopTiming(
            LoopHooks(
                measuring=self._measuring,
                running=self._running,
                refuse_other_threads=self.refuse_other_threads,
                on_rows=self._on_rows,
                on_error=self._on_step_error,
                on_fallback=self._on_fallback,
                on_measurement=self._on_measurement,
                begin_epoch=self._begin_epoch,
                end_epoch=self._end_epoch,
                step_ended=self._step_ended,
                between_steps=self._between_steps,
                pass_started=self._pass_started,
                iterator_made=self._iterator_made,
            ),
            guard,
        )
        # The tf.data dataset iterated for training, for the probes at the end.
        self._dataset = None
        # tf.data's live model of the training passes over that dataset.
        self._live_model = LiveModelHooks(guard)
        # Grain's stage timing of the training passes over a Grain dataset.
        self._grain: Optional[GrainStageTimer] = None
        self._grain_dataset = None
        self._closed = False
        self._finished = False
        self._warned_closed = False
        self._inspected = False
        # The thread whose loop the run times (see `refuse_other_threads`).
        self._owner: Optional[int] = None

    # Public operations, reached through `PipelineTuner`.

    def instrument(self, fn: Optional[Callable], kind: str = TRAIN) -> Callable:
        """The step `fn`, each call timed as one step (see `LoopTiming.instrument`)."""
        return self.timing.instrument(fn, kind)

    def iterate(self, iterable: Iterable, kind: str = TRAIN) -> TimedIterator:
        """The loop's batches, each `next()` timed (see `LoopTiming.iterate`)."""
        return self.timing.iterate(iterable, kind)

    def end_epoch(self) -> None:
        """Closes the current epoch (training and validation) and starts the next."""
        self.timing.end_epoch()
        self._read_grain_stages(final=False)
        self._between_steps()

    def open(self) -> None:
        """Lets a closed driver measure a new run (entering `with tuner:`)."""
        with self._lock:
            if self._closed:
                self._closed = False
                self._run = None

    def close(self) -> Optional[Report]:
        """Ends the run: closes open epochs, then the probes, the report, the outputs.

        Returns:
            The final `Report`, or `None` when no loop's run was going.
        """
        running = self.timing.close_epochs()
        self._closed = True
        # `finish` writes everything measured.
        self.timing.take_unreported()
        self._read_grain_stages(final=True)
        if running and not self._finished:
            self._finished = True
            self._live_model.end(self._run)
            # As fit's end takes its source's notes.
            self._run.notes.extend(self.timing.notes())
            return self._finish_run(self._run, self._dataset)
        return None

    def refuse_other_threads(self) -> None:
        """Raises when a thread other than the one running the loop's run calls in.

        One tuner times one loop: the steps of two threads would be mixed in one
        report. A run whose thread has ended (or that was closed) is over.
        """
        if self._closed:
            return
        refuse_another_live_thread(
            self._owner,
            "This PipelineTuner is timing a training loop in another thread: one tuner "
            "times one loop at a time (the steps of two threads would be mixed in one "
            "report). Give each thread's loop a PipelineTuner (or kpt.instrument) of its own.",
        )

    # The source's hooks: the run's verbs.

    def _on_rows(self, kind, rows, wall_s, called_at, tracing_s=None) -> None:
        self._run.add_rows(kind, rows, wall_s, called_at, tracing_s)

    def _on_step_error(self, error: Optional[BaseException]) -> None:
        # The loop may catch it and go on: the run stays open.
        self._run.step_failed(error, ends_run=False)

    def _on_fallback(self, reason: str) -> None:
        self._run.fall_back(reason)

    def _on_measurement(self, measurement: str) -> None:
        self._run.measured_with(measurement)

    def _begin_epoch(self, kind: str, epoch: int) -> None:
        self._run.begin_epoch(kind, epoch)

    def _end_epoch(self, kind: str) -> None:
        self._run.end_epoch(kind)
        if kind == TRAIN:
            # About a millisecond, on the loop's thread, once an epoch.
            self._live_model.epoch_ended(self._run)

    def _step_ended(self, kind: str) -> None:
        """An eager training step ended: the profiler window marks one step to the next.

        Each marked step runs from one step's end to the next one's, so that it
        holds the loop's batch fetch as well as the step: the analyzer's input
        time is the fetch inside a marked step.
        """
        run = self._run
        window = run.window
        window.after_step(0)
        if window.consults_clock:
            run.flush_rows()
        window.before_step(0, None, run.clock)

    def _between_steps(self) -> None:
        """Hands finished steps and epochs to the run's outputs, as fit's hooks do."""
        run = self._run
        if run is None or self._closed or not self._guard.enabled(FEATURE):
            return
        with self._guard(FEATURE):
            steps, epochs = self.timing.take_unreported()
            if epochs:
                # Writes the epoch's outputs (and converts a profiler window
                # closed this epoch), between steps.
                run.epoch_ended()
            run.steps_ended(steps)

    def _pass_started(self, iterable, kind: str) -> None:
        """Lints the training dataset once per run, before its first batch, as `fit` does."""
        if kind != TRAIN or not self._measuring() or self._inspected:
            return
        self._inspected = True
        run = self._run
        if grain_stages.is_grain_dataset(iterable):
            run.grain_dataset = iterable
            self._begin_grain_stages(iterable)
            return
        if sys.modules.get("tensorflow") is None:
            # Not a tf.data dataset: without TensorFlow imported, there is none.
            return
        tf = tensorflow()
        if not isinstance(iterable, (tf.data.Dataset, tf.distribute.DistributedDataset)):
            return
        if isinstance(iterable, tf.data.Dataset):
            run.window.use_dataset(iterable)
            self._dataset = iterable
            self._live_model.begin_loop(run)
        run.inspect(lambda: pipeline_lint.inspect(iterable))

    def _iterator_made(self, iterable, iterator, kind: str) -> None:
        if kind == TRAIN and iterable is self._dataset and self._running():
            self._live_model.track(iterator)
        # Grain times a training pass's stages.
        grain = self._grain
        if grain is not None and kind == TRAIN and iterable is self._grain_dataset:
            grain.track(iterator)

    # Runs.

    def _measuring(self) -> bool:
        if not self._guard.enabled(FEATURE):
            return False
        with self._guard(FEATURE), self._lock:
            if self._closed:
                if not self._warned_closed:
                    self._warned_closed = True
                    logger.warning(
                        "keras-pipeline-tuner: the tuner was closed, so later steps are not "
                        "measured. Use a new PipelineTuner (or `with tuner:` again) for a "
                        "new run."
                    )
                return False
            if self._run is None or not self._is_current_run(self._run):
                self._start_run()
            return True
        return False

    def _running(self) -> bool:
        return self._run is not None and not self._closed and self._is_current_run(self._run)

    def _start_run(self) -> None:
        # A run left open (its loop not closed) ends its Grain timing here.
        self._read_grain_stages(final=True)
        self._owner = threading.get_ident()
        self._run = self._begin_run()
        self.timing.begin_run()
        self._dataset = None
        self._finished = False
        self._inspected = False

    def _begin_grain_stages(self, dataset) -> None:
        if not self._guard.enabled(features.GRAIN_STAGES):
            return
        with self._guard(features.GRAIN_STAGES):
            timer = GrainStageTimer(
                on_failure=lambda reason: self._guard.disable(features.GRAIN_STAGES, reason)
            )
            timer.begin_tracking()
            self._grain, self._grain_dataset = timer, dataset

    def _read_grain_stages(self, final: bool) -> None:
        """Hands Grain's timing so far to the run; `final` ends the timing."""
        timer, run = self._grain, self._run
        if timer is None:
            return
        if final:
            self._grain = self._grain_dataset = None
        # Ended even when the feature failed meanwhile: `end` puts back first.
        with self._guard(features.GRAIN_STAGES):
            evidence = timer.end() if final else timer.so_far()
            if evidence is not None and run is not None:
                if self._guard.enabled(features.GRAIN_STAGES):
                    run.stage_timing = evidence
