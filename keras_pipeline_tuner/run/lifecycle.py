"""The run lifecycle that `model.fit` and custom training loops both drive.

A run begins (a fit's `on_train_begin`, or a custom loop's first measured call),
takes in what its timing source measures, sees epochs end, and finishes. It owns
the way in: every timing source (one per Keras backend, and the custom loop's)
speaks the same verbs (`begin_epoch`, `add_rows`, `end_epoch`, `step_failed`,
`fall_back`; and a loop's `measured_with`), the first call of each kind is
kept apart here only, and rows are kept back in one buffer and recorded
together about once a second. Along the way the run keeps what the evidence
modules found (findings, the profiler window, the replay, the CPU meter, the
user's Python calls timed during training, the other workers' summaries),
builds the `Report` from them (`run_report`), and writes the outputs (its report files,
TensorBoard, the step trace, the terminal summary) at a cadence: every epoch,
every few seconds within one, when a step fails, and at the end; and once more
when a profile still converting at the end joins the run (`run.late_profile`).
"""

import atexit
import contextlib
import dataclasses
import logging
import threading
import time
import weakref
from typing import Callable
from typing import Dict
from typing import List
from typing import Optional
from typing import Tuple

import numpy as np

from keras_pipeline_tuner._util import features
from keras_pipeline_tuner._util.feature_guard import FeatureGuard
from keras_pipeline_tuner._util.random_state import preserved_random_state
from keras_pipeline_tuner.advice.verdict import Judgement
from keras_pipeline_tuner.outputs import terminal as terminal_summary
from keras_pipeline_tuner.outputs.report import Report
from keras_pipeline_tuner.outputs.tensorboard import TensorBoardSink
from keras_pipeline_tuner.outputs.trace import write_trace
from keras_pipeline_tuner.pipeline.graph.in_memory import InMemoryDataTooLarge
from keras_pipeline_tuner.pipeline.lint.memory_forecast import warn_of_memory
from keras_pipeline_tuner.profiling.evidence import ProfileEvidence
from keras_pipeline_tuner.profiling.fit_profile import FitProfile
from keras_pipeline_tuner.profiling.window import FIT_ENDED
from keras_pipeline_tuner.profiling.window import STEP_FAILED
from keras_pipeline_tuner.profiling.window import ProfilerWindow
from keras_pipeline_tuner.run import run_report
from keras_pipeline_tuner.run.early_verdict import EarlyVerdict
from keras_pipeline_tuner.run.early_verdict import filling_a_cache
from keras_pipeline_tuner.run.late_profile import LateProfile
from keras_pipeline_tuner.run.run_files import RunFiles
from keras_pipeline_tuner.run.run_workers import RunWorkers
from keras_pipeline_tuner.timing import measurement as measured_by
from keras_pipeline_tuner.timing.cpu_usage import CpuMark
from keras_pipeline_tuner.timing.cpu_usage import CpuMeter
from keras_pipeline_tuner.timing.held_rows import HeldRows
from keras_pipeline_tuner.timing.step_clock import TRAIN
from keras_pipeline_tuner.timing.step_clock import VALIDATION
from keras_pipeline_tuner.timing.step_clock import StepClock
from keras_pipeline_tuner.timing.tuner_cost import CostMeter
from keras_pipeline_tuner.workers import exchange as worker_reports

logger = logging.getLogger("keras_pipeline_tuner")

# Seconds between writes of report.json and the TensorBoard scalars within an
# epoch, so that a crash loses at most this much (a write costs about 3 ms).
CHECKPOINT_S = 5.0
# Rows kept back are recorded at least this often: the live outputs (scalars,
# the early verdict) are at most this far behind.
HAND_OVER_S = 1.0
# Runs in progress, written at interpreter exit: a script ended by an exception
# between steps (e.g. Ctrl-C) keeps the report up to that point.
_RUNNING = weakref.WeakSet()



@dataclasses.dataclass
class RunSettings:
    """What a run needs of the tuner's arguments.

    Attributes:
        log_dir: where outputs go; `None` keeps the report in memory.
        verbose: 0 silences the terminal summary.
        buffer_steps: per-step rows the clock retains.
        tensorboard_workers: "chief" or "all" (multi-worker runs).
        worker_timeout_s: how long the chief waits for the other workers.
        cost_budget_s: the budget of the tuner's work after training, in
            seconds; `None` for the default (see `timing.tuner_cost`).
    """

    log_dir: Optional[str] = None
    verbose: int = 1
    buffer_steps: int = 10_000
    tensorboard_workers: str = "chief"
    worker_timeout_s: float = worker_reports.DEFAULT_TIMEOUT_S
    cost_budget_s: Optional[float] = None


class Run:
    """One measured run: a fit, or a custom loop from its first step to `close()`.

    Args:
        settings: the `RunSettings`.
        guard: the tuner's `FeatureGuard` (a failed feature stays off for the
            tuner's life, across runs).
        window: the tuner's `ProfilerWindow`.
        flush_source: has the timing source hand over stamps it keeps itself
            (JAX waits for each step's outputs); called before the rows kept
            here are recorded.
        kind: "fit", "loop" or "evaluate": names the run's folder when it is
            not the log dir's first, and only a training run's report is the log
            dir's own (see `outputs.log_dir_runs`).

    Example:

    ```python
    run = Run(RunSettings(log_dir="logs/run1"), FeatureGuard(), window)
    run.begin(worker_identity=None)
    run.begin_epoch("train", 0)
    run.add_rows("train", rows, wall_s, called_at)   # each call, from a timing source
    run.end_epoch("train", 0)
    run.epoch_ended()
    report = run.finish()
    ```
    """

    def __init__(
        self,
        settings: RunSettings,
        guard: FeatureGuard,
        window: ProfilerWindow,
        flush_source: Optional[Callable[[], None]] = None,
        kind: str = "fit",
    ):
        self.settings = settings
        self.guard = guard
        self.window = window
        self.clock = StepClock(settings.buffer_steps)
        self.measurement = measured_by.IN_STEP
        self.notes: List[str] = []
        self.findings = []
        self.what_if = None
        # The measured fetch of a batch already in memory (`timing.fetch_floor`).
        self.fetch_floor = None
        # A Grain dataset being trained on, and Grain's timing of its stages.
        self.grain_dataset = None
        self.stage_timing = None
        # tf.data's live model of the fit's iterator: the latest read, and
        # every read (`instrumentation.live_model_reader`).
        self.stage_table, self.stage_table_history = None, []
        # Keras' fit on cached batches at a larger steps_per_execution (`execution_replay`).
        self.execution = None
        # The advised fixes timed after training (`measure_fixes`).
        self.fix_timings = []
        # The user's Python calls timed during training
        # (`instrumentation.user_calls`): final once training ended; until
        # then `user_calls_so_far` (when set) gives the figures so far.
        self.user_calls = []
        self.user_calls_so_far: Optional[Callable[[], list]] = None
        self.steps_per_execution = 1
        self.finished = False
        self.kind = kind
        self.files = RunFiles(settings.log_dir, kind, guard)
        self.tensorboard: Optional[TensorBoardSink] = None
        self.early = EarlyVerdict(guard, settings.verbose)
        # The tuner's own work after training, timed against its budget.
        self.cost = CostMeter(settings.cost_budget_s)
        self._flush_source = flush_source
        # Rows kept back, recorded together (see `flush_rows`).
        self._held = HeldRows(self.clock.record)
        self._first_call = {TRAIN: True, VALIDATION: True}
        self._hand_over_due = 0.0
        # What the early verdict was last looked at with: rows recorded, epochs ended.
        self._seen = (-1, -1)
        # Steps `steps_ended` counted and has not yet told TensorBoard, and
        # when it next does its work (`_steps_due`).
        self._steps_untold = 0
        self._steps_due_at = 0.0
        self._cpu: Optional[CpuMeter] = None
        # The CPU counters and the user's calls so far at each training
        # epoch's start: the verdict's steady state may start at an epoch
        # (`advice.verdict.later_epochs`), and so must the CPU it judges.
        self._epoch_marks: Dict[int, Tuple[CpuMark, list]] = {}
        self._next_checkpoint = time.monotonic() + CHECKPOINT_S
        self._workers: Optional[RunWorkers] = None
        # The profiler window's evidence of this run, once its training ended
        # (`end_window`), and the wait for a conversion still running then.
        self.profile: Optional[FitProfile] = None
        self._late: Optional[LateProfile] = None
        # The final outputs are written again when a late profile joins, on
        # another thread: one writer at a time.
        self._final_writes = threading.RLock()

    # Lifecycle.

    def begin(self, worker_identity: Optional[worker_reports.WorkerIdentity]) -> None:
        """Starts the run: the CPU meter, the worker exchange, its folder, the profiler window.

        Args:
            worker_identity: this process's place in a multi-worker cluster, or
                `None`.
        """
        _RUNNING.add(self)
        self.cost.run_started()
        self.early.restart()
        self._hand_over_due = time.monotonic() + HAND_OVER_S
        self._steps_due_at = min(self._hand_over_due, self._next_checkpoint)
        self._restart_cpu_meter()
        self._join_workers(worker_identity)
        self.window.begin_fit()

    @property
    def multi_worker(self) -> bool:
        """Whether this run exchanges summaries with other workers."""
        return self._workers is not None and self._workers.active

    @property
    def worker_view(self) -> Optional[worker_reports.MultiWorkerSummary]:
        """What the chief read of the other workers' summaries, when it has."""
        return self._workers.view if self._workers is not None else None

    # The way in: what timing sources hand the run.

    def begin_epoch(self, kind: str, epoch: int) -> None:
        """An epoch of `kind` ("train" or "validation") begins."""
        if self._flush_source is not None:
            # Rows kept back belong to the epoch they were measured in.
            self._flush_source()
        if self.guard.enabled(features.STEP_CLOCK):
            with self.guard(features.STEP_CLOCK):
                self._held.flush()
                self.clock.begin_epoch(epoch, kind)
        if kind == TRAIN:
            self._mark_epoch(epoch)

    def add_rows(
        self, kind: str, rows, wall_s: float, called_at: float, tracing_s: Optional[float] = None
    ) -> None:
        """Takes one call's steps: a `(start, ready, end)` row, or an (n, 3) array of them.

        Called on every step (a list append): the rows are kept back and
        recorded together (`flush_rows`). The first call of each kind is kept
        apart at once: it traces the step.

        Args:
            kind: "train" or "validation".
            rows: the call's rows, in seconds (`ready` NaN where not observed).
            wall_s: the call's wall time, seen from Python.
            called_at: when the call began (`time.time()`).
            tracing_s: for a first call, its tracing when the timing source
                measured it apart; NaN when it cannot be told apart from
                compute (see `StepClock.record_first_step`).
        """
        if not self._first_call.get(kind, False):
            self._held.add(kind, rows, called_at)
            return
        if not self.guard.enabled(features.STEP_CLOCK):
            return
        with self.guard(features.STEP_CLOCK):
            self._first_call[kind] = False
            rows = np.asarray(rows, dtype=np.float64).reshape(-1, 3)
            self.clock.record_first_step(kind, wall_s, rows, called_at, tracing_s)
            if kind == TRAIN:
                # CPU use is judged over the steps, as the input wait is:
                # tracing the first one keeps a single core busy.
                self._restart_cpu_meter()

    def rows_due(self) -> bool:
        """Whether the rows kept back are due to be recorded (about once a second)."""
        return time.monotonic() >= self._hand_over_due

    def flush_rows(self) -> None:
        """Records every row kept back, the timing source's own first."""
        self._hand_over_due = time.monotonic() + HAND_OVER_S
        if self._flush_source is not None:
            self._flush_source()
        if self.guard.enabled(features.STEP_CLOCK):
            with self.guard(features.STEP_CLOCK):
                self._held.flush()

    def end_epoch(self, kind: str, epoch: Optional[int] = None) -> None:
        """The epoch of `kind` ended: its steps are recorded and its breakdown kept."""
        self.flush_rows()
        if self.guard.enabled(features.STEP_CLOCK):
            with self.guard(features.STEP_CLOCK):
                self.clock.end_epoch(kind, epoch)

    def expect_first_call(self) -> None:
        """The next call of each kind is a first call again (evaluate() on its own)."""
        self._first_call = {TRAIN: True, VALIDATION: True}

    def fall_back(self, reason: str) -> None:
        """Only whole steps can be timed: said once, in the log and the report."""
        if self.measurement != measured_by.WHOLE_STEP:
            note = (
                f"Input wait is not separated from compute because {reason}: only "
                "the whole step time is measured (no input fraction, no verdict)."
            )
            logger.warning("keras-pipeline-tuner: %s", note)
            self.notes.append(note)
        self.measurement = measured_by.WHOLE_STEP

    def measured_with(self, measurement: str) -> None:
        """The timing source says what times the steps (a custom loop's decorator, iterator).

        A run that fell back to whole steps stays so.
        """
        if self.measurement != measured_by.WHOLE_STEP:
            self.measurement = measurement

    def step_failed(self, error: Optional[BaseException], ends_run: bool = True) -> None:
        """A step raised: the window closes and what was measured is written.

        Args:
            error: what the step raised; `None` when a call comes from a fit
                that no longer uses the tuner.
            ends_run: the failure ends the run (fit ends without its end
                hooks). A custom loop may catch it and go on: its window
                closes and converts, the run stays open.
        """
        if not ends_run:
            self.window.close(STEP_FAILED)
            if error is not None:
                self.checkpoint()
            return
        self.window.close(FIT_ENDED)
        if error is not None and self._first_call.get(TRAIN):
            # The first call's timings are lost with it; with several steps a
            # call, some may have run (and trained) before the failure.
            steps = self.steps_per_execution
            ran = f", after running up to {steps - 1} of its {steps} steps" if steps > 1 else ""
            self.notes.append(
                f"{run_report.NO_STEP}: the first training call failed "
                f"({type(error).__name__}){ran}, and its timings were lost with it."
            )
        if error is not None:
            # fit ends here without on_train_end: keep what was measured so far.
            self.window.fit_failed()
            _RUNNING.discard(self)
            self.checkpoint()

    # Evidence.

    def end_window(self) -> None:
        """Training ended: closes the profiler window and takes this run's profile (no wait).

        A conversion still running goes on in its process; its evidence joins
        the report when it ends (see `finish` and `run.late_profile`).
        """
        self.profile = self.window.end_fit()

    def profile_evidence(self) -> Optional[ProfileEvidence]:
        """The profiler window's evidence, once converted; `None` before."""
        profile = self.profile
        return profile.evidence if profile is not None else self.window.evidence

    def profile_notes(self) -> List[str]:
        """The profiler window's notes (windows skipped or not reached)."""
        profile = self.profile
        return profile.notes if profile is not None else self.window.notes

    @property
    def profile_pending(self) -> bool:
        """Whether a captured window's evidence is still to come (its conversion runs)."""
        profile = self.profile
        if profile is not None:
            return profile.pending
        return not self.finished and self.window.converting

    @property
    def awaiting_profile(self) -> bool:
        """Whether `wait_for_profile` has anything to wait for.

        Longer than `profile_pending`: a late profile's evidence has joined
        (it is no longer pending) a moment before the outputs say so.
        """
        return self.profile_pending or (self._late is not None and not self._late.done)

    def wait_for_profile(self, timeout_s: Optional[float] = None) -> bool:
        """Waits for a profile still converting after training to join the run.

        Before `finish`, on this thread: the evidence joins, and `finish`
        writes it. After, until the outputs have been written with it. A wait
        that may last over a second is said first, in one line.

        Args:
            timeout_s: the longest to wait; `None` waits until then.

        Returns:
            Whether nothing is pending any more.
        """
        late = self._late
        if late is not None:
            return late.wait(timeout_s)
        profile = self.profile
        if profile is None or not profile.pending:
            return True
        return profile.wait(self._announce, timeout_s)

    def inspect(self, find: Callable[[], list]) -> None:
        """Runs the pipeline inspection once, before the first step; keeps its findings.

        A dataset whose in-memory tensors are too large to read is an expected
        limit, said in the report, not a failure: fit and custom loops alike.

        Args:
            find: returns the findings (e.g. `lambda: kpt.inspect(dataset)`).
        """
        if not self.guard.enabled(features.INSPECTION):
            return
        # Reading the pipeline builds datasets of its own: the user's random
        # state stays as it was.
        with self.guard(features.INSPECTION), preserved_random_state():
            try:
                self.findings = find()
            except InMemoryDataTooLarge as reason:
                self.notes.append(f"The pipeline was not inspected. {reason}")
            # Before the first step: a cache that will not fit kills the job when it fills.
            warn_of_memory(self.findings)

    def cpu_usage(self):
        """The CPU meter's figures so far, or `None`."""
        # Guarded apart: a failed reading must not take the whole report with it.
        if self._cpu is not None and self.guard.enabled(features.CPU_USAGE):
            with self.guard(features.CPU_USAGE):
                return self._cpu.usage()
        return None

    def usage_since_epoch(self, epoch: int) -> Optional[Tuple[object, list]]:
        """The CPU meter's figures and the user's calls since training epoch `epoch` began.

        Returns:
            `(CpuUsage, user call timings at that epoch's start)`, or `None`
            where that epoch's start was not read.
        """
        mark = self._epoch_marks.get(epoch)
        if mark is None or self._cpu is None or not self.guard.enabled(features.CPU_USAGE):
            return None
        with self.guard(features.CPU_USAGE):
            return self._cpu.usage(mark[0]), mark[1]
        return None

    def failure_notes(self) -> List[str]:
        """One note per feature that failed and was turned off."""
        return [
            f"{feature} was turned off after a failure: {reason}"
            for feature, reason in self.guard.failures.items()
        ]

    # Outputs, at their cadence.

    def steps_ended(self, steps: int) -> None:
        """Between steps: counts them; about once a second, the work they make due.

        Called on every step on TensorFlow, so it is a count and a clock
        reading; once `HAND_OVER_S` has passed since it last did (`_steps_due`),
        it hands the rows kept back to the clock, the steps to TensorBoard's
        scalars, looks at the early verdict, and writes a checkpoint when due.
        The checkpoint is due by the clock alone (it takes the rows kept back
        itself): a SIGKILL loses at most the last `CHECKPOINT_S` seconds of
        summaries, however the rows are handed over.
        """
        self._steps_untold += steps
        now = time.monotonic()
        if now >= self._steps_due_at:
            self._steps_due(now)

    def _steps_due(self, now: float) -> None:
        if now >= self._hand_over_due:
            self.flush_rows()
        self._tell_steps()
        self._look_at_early_verdict()
        if now >= self._next_checkpoint:
            self.checkpoint()
        self._steps_due_at = min(self._hand_over_due, self._next_checkpoint)

    def _checkpoint_at(self, at: float) -> None:
        self._next_checkpoint = at
        # `steps_ended` looks no later than that.
        self._steps_due_at = min(self._steps_due_at, at)

    def _tell_steps(self) -> None:
        steps, self._steps_untold = self._steps_untold, 0
        if steps and self.tensorboard is not None:
            self.tensorboard.step_ended(self.clock, steps)

    def _look_at_early_verdict(self) -> None:
        # Only rows recorded or an epoch ended since the last look can make it due.
        seen = (self.clock.recorded, len(self.clock.epochs))
        if seen == self._seen:
            return
        self._seen = seen
        filling = filling_a_cache(self.findings, self.clock)
        if self.early.due(
            self.clock,
            window_capturing=self.window.capturing,
            filling_a_cache=filling,
            whole_step=self.measurement == measured_by.WHOLE_STEP,
        ):
            report = self.built_report()
            self.early.say(report, filling, lambda: self._write_early(report))

    def epoch_ended(self) -> None:
        """Writes the epoch's outputs, when that keeps them within their share of training."""
        self.window.end_epoch()
        self.flush_rows()
        self._tell_steps()
        self._look_at_early_verdict()
        self._checkpoint_at(time.monotonic() + CHECKPOINT_S)
        self._exchange_worker_summaries(final=False)
        if not self.writes_outputs:
            # Nowhere to write it (no log dir): the report is built when asked.
            return
        began = time.monotonic()
        report = self.built_report() if self.cost.outputs_due() else None
        if report is None:
            return
        self.files.write(report)
        if self.tensorboard is not None:
            self.tensorboard.epoch_ended(self.clock, report)
        self.cost.outputs_written(time.monotonic() - began)

    @property
    def writes_outputs(self) -> bool:
        """Whether the run writes anything during training (report files, TensorBoard)."""
        return self.files.writes or self.tensorboard is not None

    def checkpoint(self) -> None:
        """Within long epochs: report.json and the scalars so far, on disk."""
        self.flush_rows()
        self._checkpoint_at(time.monotonic() + CHECKPOINT_S)
        if not self.writes_outputs:
            return
        began = time.monotonic()
        report = self.built_report()
        if report is not None:
            self.files.write(report)
        if self.tensorboard is not None:
            self.tensorboard.write_scalars(self.clock)
            self.tensorboard.flush()
        ended = time.monotonic()
        self._checkpoint_at(ended + CHECKPOINT_S)
        self.cost.output_during_training(ended - began)

    def training_ended(self) -> None:
        """Training has ended: what follows is the tuner's own time, and no CPU use of the job's.

        The CPU meter stops here, before the probes after training (a
        replay, the fetch floor) and the outputs, so that the CPU figures are
        training's alone. Safe to call more than once.
        """
        self.cost.training_ended()
        if self._cpu is not None and self.guard.enabled(features.CPU_USAGE):
            with self.guard(features.CPU_USAGE):
                self._cpu.stop()

    def finish(self, summary: bool = True) -> Report:
        """Builds the final report and writes every output.

        The driver ends the profiler window first (`end_window()`). A profile
        still converting is not waited for: the report says it is pending
        (`Report.profile_pending`), and the outputs are written again, on a
        thread of the tuner's, when its evidence joins (`run.late_profile`).

        Args:
            summary: print the terminal summary (when `verbose`); an
                `evaluate()` on its own prints none.

        Returns:
            The final `Report`.
        """
        _RUNNING.discard(self)
        self.finished = True
        self.training_ended()
        self.flush_rows()
        self.files.finish()
        self._exchange_worker_summaries(final=True)
        profile = self.profile
        if profile is not None and profile.pending and profile.done():
            # Ended meanwhile (during the probes): it joins now, at once.
            profile.take()
        report = self._write_final_outputs(summary)
        if profile is not None and profile.pending and self._late is None:
            if self.guard.enabled(features.PROFILER_WINDOW):
                with self.guard(features.PROFILER_WINDOW):
                    self._late = LateProfile(profile, self._profile_joined, self._announce)
            if self._late is None:
                # The window's feature is off (e.g. no thread could start): the
                # conversion is stopped, not waited for.
                profile.take()
        return report

    def _write_final_outputs(self, summary: bool, late: bool = False) -> Report:
        """The final report, and every output written with it.

        Args:
            summary: print the terminal summary (when `verbose`).
            late: written again because a profile joined after `finish`: the
                tuner's cost stays what it was, the step trace (which holds no
                profile) is not written again, and the log dir's own report
                only while no later training run has begun there.

        Returns:
            The final `Report`.
        """
        with self._final_writes:
            report = self.built_report()
            if report is None:
                return Report(notes=self.failure_notes())
            failures = len(self.guard.failures)
            with contextlib.nullcontext() if late else self.cost.part("outputs"):
                if self.tensorboard is not None:
                    self.tensorboard.finish(self.clock, report)
                    if not late and self.guard.enabled(features.STEP_TRACE):
                        with self.guard(features.STEP_TRACE):
                            write_trace(self.clock, self.files.folder())
            # What the tuner's work after training cost, up to this last write.
            self.cost.stopped()
            report.tuner_cost = self.cost.cost()
            if len(self.guard.failures) != failures:
                # An output failed: the file says so too.
                report.notes = report.notes + self.failure_notes()[failures:]
            self.files.write(report, final=True, late=late)
            if summary and self.settings.verbose and self.guard.enabled(features.SUMMARY):
                written = len(self.guard.failures)
                with self.guard(features.SUMMARY):
                    terminal_summary.print_summary(report)
                if len(self.guard.failures) != written:
                    # The summary failed after the file was written: the file says so too.
                    report.notes = report.notes + self.failure_notes()[written:]
                    self.files.write(report, final=True, late=late)
            return report

    def _profile_joined(self) -> None:
        # On the late profile's thread: the final outputs, again, with it.
        report = self._write_final_outputs(summary=False, late=True)
        if report.profile is not None:
            logger.info(
                "keras-pipeline-tuner: the profile joined the report of %s: %s",
                report.run or "the run",
                report.profile.summary(),
            )

    def _announce(self, line: str) -> None:
        terminal_summary.announce(line, self.settings.verbose)

    # The report.

    def built_report(self) -> Optional[Report]:
        """The report, or `None` when building it failed (the failure is logged once)."""
        # Building the report reads every feature's state: a failure there must
        # not end the user's training either.
        if self.guard.enabled(features.REPORT):
            with self.guard(features.REPORT):
                return self.report()
        return None

    def judgement(self) -> Judgement:
        """The run's verdict from the evidence so far (see `advice.verdict.judge`)."""
        return run_report.judgement_of(self, self.cpu_usage())

    def report(self) -> Report:
        """The `Report` of what was measured so far."""
        return run_report.build_report(self)

    # Internals.

    def _write_early(self, report: Optional[Report]) -> None:
        # The early verdict's outputs: the report file and the TensorBoard report.
        if report is None or not self.writes_outputs:
            return
        began = time.monotonic()
        self.files.write(report)
        if self.tensorboard is not None:
            self.tensorboard.write_report(report, report.train.steps)
            self.tensorboard.flush()
        self.cost.output_during_training(time.monotonic() - began)

    def _mark_epoch(self, epoch: int) -> None:
        # Once an epoch, on the training thread: a few hundred microseconds.
        if self._cpu is None or not self.guard.enabled(features.CPU_USAGE):
            return
        with self.guard(features.CPU_USAGE):
            so_far = self.user_calls_so_far
            calls = so_far() if so_far is not None else list(self.user_calls)
            self._epoch_marks[epoch] = (self._cpu.mark(), calls)

    def _input_may_start_processes(self) -> bool:
        # Listing the live children reads every process of the host: skipped
        # where the input starts none (tf.data ops, arrays), as the
        # contention leaves children out there anyway.
        pipeline = getattr(self.findings, "pipeline", None)
        return pipeline is None or pipeline.worker_processes is not False

    def _restart_cpu_meter(self) -> None:
        if self.guard.enabled(features.CPU_USAGE):
            with self.guard(features.CPU_USAGE):
                if self._cpu is None:
                    self._cpu = CpuMeter(count_children=self._input_may_start_processes)
                else:
                    self._cpu.restart()

    def _join_workers(self, identity: Optional[worker_reports.WorkerIdentity]) -> None:
        """Sets up the exchange with the other workers, where this one writes, its folder."""
        settings = self.settings
        self._workers = RunWorkers(
            identity,
            settings.log_dir,
            settings.worker_timeout_s,
            settings.tensorboard_workers,
            self.guard,
        )
        output_dir = self._workers.output_dir
        self.files = RunFiles(output_dir, self.kind, self.guard)
        self.window.log_dir = output_dir
        self.tensorboard = None
        self.files.claim()
        if output_dir is not None and self._workers.writes_summaries:
            self.tensorboard = TensorBoardSink(
                output_dir, self.guard, run_name=self.files.run_name
            )

    def _exchange_worker_summaries(self, final: bool) -> None:
        if self._workers is not None:
            self._workers.exchange(final, self.clock, self.cpu_usage, self.failure_notes())


@atexit.register
def _write_running_reports() -> None:
    for run in list(_RUNNING):
        _RUNNING.discard(run)
        run.checkpoint()
