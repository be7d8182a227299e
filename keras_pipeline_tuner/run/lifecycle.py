"""The run lifecycle that `model.fit` and custom training loops both drive.

A run begins (a fit's `on_train_begin`, or a custom loop's first measured call),
receives timing rows from a timing source, sees epochs end, and finishes. Along
the way it keeps what the evidence modules found (the pipeline's findings, the
profiler window, the what-if replay, the CPU meter, the other workers'
summaries), builds the `Report` from them, and writes the outputs (report.json,
TensorBoard, the step trace, the terminal summary) at a cadence: every epoch,
every few seconds within one, when a step fails, and at the end.

Drivers (the Keras callback, the custom-loop timer) call only the public
methods here; timing sources hand rows to `record_rows`.
"""

import atexit
import dataclasses
import logging
import os
import sys
import time
import weakref
from typing import Callable, List, Optional

import numpy as np

from keras_pipeline_tuner._util import features
from keras_pipeline_tuner._util import files
from keras_pipeline_tuner._util.feature_guard import FeatureGuard
from keras_pipeline_tuner.advice.advisor import advise
from keras_pipeline_tuner.advice.verdict import judge
from keras_pipeline_tuner.advice.verdict import Judgement
from keras_pipeline_tuner._util.random_state import preserved_random_state
from keras_pipeline_tuner.outputs import terminal as terminal_summary
from keras_pipeline_tuner.outputs.report import Report
from keras_pipeline_tuner.outputs.report import REPORT_FILENAME
from keras_pipeline_tuner.outputs.report import write_report
from keras_pipeline_tuner.outputs import log_dir_runs
from keras_pipeline_tuner.outputs.tensorboard import TensorBoardSink
from keras_pipeline_tuner.outputs.trace import write_trace
from keras_pipeline_tuner.pipeline.graph.in_memory import InMemoryDataTooLarge
from keras_pipeline_tuner.pipeline.lint.grain_findings import grain_stage_findings
from keras_pipeline_tuner.profiling import grain_stages
from keras_pipeline_tuner.profiling.window import FIT_ENDED
from keras_pipeline_tuner.profiling.window import ProfilerWindow
from keras_pipeline_tuner.timing.cpu_usage import CpuMeter
from keras_pipeline_tuner.timing.step_clock import TRAIN
from keras_pipeline_tuner.timing.step_clock import VALIDATION
from keras_pipeline_tuner.timing.step_clock import StepClock
from keras_pipeline_tuner.timing.step_stats import Verdict
from keras_pipeline_tuner.workers import exchange as worker_reports

logger = logging.getLogger("keras_pipeline_tuner")

# Seconds between writes of report.json and the TensorBoard scalars within an
# epoch, so that a crash loses at most this much (a write costs about 3 ms).
CHECKPOINT_S = 5.0
# Runs in progress, written at interpreter exit: a script ended by an exception
# between steps (e.g. Ctrl-C) keeps the report up to that point.
_RUNNING = weakref.WeakSet()

# The early verdict: said once the steady state has this many steps and no
# profiler window is open, or at the latest after these many steps or seconds.
EARLY_MIN_STEPS = 20
EARLY_MAX_STEPS = 500
EARLY_MAX_S = 60.0

# `Report.measurement` of a run timed inside the step, and of one timed whole.
IN_STEP = "in-step"
WHOLE_STEP = "whole-step"


@dataclasses.dataclass
class RunSettings:
    """What a run needs of the tuner's arguments.

    Attributes:
        log_dir: where outputs go; `None` keeps the report in memory.
        verbose: 0 silences the terminal summary.
        buffer_steps: per-step rows the clock retains.
        tensorboard_workers: "chief" or "all" (multi-worker runs).
        worker_timeout_s: how long the chief waits for the other workers.
    """

    log_dir: Optional[str] = None
    verbose: int = 1
    buffer_steps: int = 10_000
    tensorboard_workers: str = "chief"
    worker_timeout_s: float = worker_reports.DEFAULT_TIMEOUT_S


class Run:
    """One measured run: a fit, or a custom loop from its first step to `close()`.

    Args:
        settings: the `RunSettings`.
        guard: the tuner's `FeatureGuard` (a failed feature stays off for the
            tuner's life, across runs).
        window: the tuner's `ProfilerWindow`.
        describe: returns `(measurement, notes)` of the timing source when it
            knows better than the run (custom loops), else `None`.
        flush_rows: hands over rows a timing source keeps back (custom loops
            record in batches); called before each output is written.
        kind: "fit", "loop" or "evaluate": names the run's folder when it is
            not the log dir's first, and only a training run's report is the log
            dir's own (see `outputs.log_dir_runs`).

    Example:

    ```python
    run = Run(RunSettings(log_dir="logs/run1"), FeatureGuard(), window)
    run.begin(worker_identity=None)
    run.record_rows("train", rows, wall_s, called_at)
    run.epoch_ended()
    report = run.finish()
    ```
    """

    def __init__(
        self,
        settings: RunSettings,
        guard: FeatureGuard,
        window: ProfilerWindow,
        describe: Optional[Callable[[], Optional[tuple]]] = None,
        flush_rows: Optional[Callable[[], None]] = None,
        kind: str = "fit",
    ):
        self.settings = settings
        self.guard = guard
        self.window = window
        self.clock = StepClock(settings.buffer_steps)
        self.measurement = IN_STEP
        self.notes: List[str] = []
        self.findings = []
        self.what_if = None
        # A Grain dataset being trained on, and Grain's timing of its stages.
        self.grain_dataset = None
        self.stage_timing = None
        # The advised fixes timed after training (`measure_fixes`).
        self.fix_timings = []
        self.steps_per_execution = 1
        self.finished = False
        self._describe = describe
        self._flush_rows = flush_rows
        self._first_call = {TRAIN: True, VALIDATION: True}
        self._cpu: Optional[CpuMeter] = None
        self._next_checkpoint = time.monotonic() + CHECKPOINT_S
        self._workers: Optional[worker_reports.WorkerExchange] = None
        self.worker_view: Optional[worker_reports.MultiWorkerSummary] = None
        self.output_dir = settings.log_dir
        self.tensorboard: Optional[TensorBoardSink] = None
        self.kind = kind
        # The run's own folder in the log dir, once claimed.
        self.entry: Optional[log_dir_runs.RunEntry] = None
        self._log_dir_runs: List[log_dir_runs.RunEntry] = []
        self.early_verdict: Optional[str] = None
        # The clock's `recorded` when the early verdict was last considered.
        self._checked_records = -1
        self._began = time.monotonic()

    # Lifecycle.

    def begin(self, worker_identity: Optional[worker_reports.WorkerIdentity]) -> None:
        """Starts the run: the CPU meter, the worker exchange, the profiler window.

        Args:
            worker_identity: this process's place in a multi-worker cluster, or
                `None`.
        """
        _RUNNING.add(self)
        self._began = time.monotonic()
        self._restart_cpu_meter()
        self._join_workers(worker_identity)
        self.window.begin_fit()

    @property
    def multi_worker(self) -> bool:
        """Whether this run exchanges summaries with other workers."""
        return self._workers is not None

    def record_rows(
        self,
        kind: str,
        rows,
        wall_s: float,
        called_at: float,
        tracing_s: Optional[float] = None,
    ) -> None:
        """Adds one call's steps: an (n, 3) array of (start, ready, end) seconds.

        The first call of each kind is kept apart (it traces the step).

        Args:
            kind: "train" or "validation".
            rows: the call's rows.
            wall_s: the call's wall time, seen from Python.
            called_at: when the call began (`time.time()`).
            tracing_s: for a first call, its tracing when the timing source
                measured it apart (see `StepClock.record_first_step`).
        """
        if not self.guard.enabled(features.STEP_CLOCK):
            return
        with self.guard(features.STEP_CLOCK):
            rows = np.asarray(rows)
            if self._first_call.get(kind, False):
                self._first_call[kind] = False
                self.clock.record_first_step(kind, wall_s, rows, called_at, tracing_s)
                if kind == TRAIN:
                    # CPU use is judged over the steps, as the input wait is:
                    # tracing the first one keeps a single core busy.
                    self._restart_cpu_meter()
            else:
                self.clock.record(kind, rows, called_at)

    def expect_first_call(self) -> None:
        """The next call of each kind is a first call again (evaluate() on its own)."""
        self._first_call = {TRAIN: True, VALIDATION: True}

    def fall_back(self, reason: str) -> None:
        """Only whole steps can be timed: said once, in the log and the report."""
        if self.measurement != WHOLE_STEP:
            note = (
                f"Input wait is not separated from compute because {reason}: only "
                "the whole step time is measured (no input fraction, no verdict)."
            )
            logger.warning("keras-pipeline-tuner: %s", note)
            self.notes.append(note)
        self.measurement = WHOLE_STEP

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

    def time_grain_stages(self) -> None:
        """After training on a Grain dataset that kept steps waiting: Grain's stage timing.

        Reads a few batches of the dataset apart, with Grain's own stage timing
        on (see `profiling.grain_stages`), names the slowest stage and adds the
        finding about it. Only for a run the report judges input-bound:
        otherwise no stage limits training and the pass would cost for nothing.
        """
        dataset, self.grain_dataset = self.grain_dataset, None
        if dataset is None or not self.guard.enabled(features.GRAIN_STAGES):
            return
        with self.guard(features.GRAIN_STAGES):
            # The report's own verdict, so that the pass runs when the advice
            # would look for the stage that holds the wait.
            self.flush_rows()
            verdict = self.report().verdict
            if verdict not in (Verdict.HIGHLY_INPUT_BOUND, Verdict.MODERATELY_INPUT_BOUND):
                return
            # The user's Python in the pipeline may draw from the global
            # generators: their next draws stay as without the tuner.
            with preserved_random_state():
                evidence = grain_stages.time_stages(dataset)
            self.stage_timing = evidence
            stage = grain_stages.placement(evidence)
            if stage is None:
                return
            found = grain_stage_findings(
                stage.label,
                evidence.bottleneck_node,
                evidence.bottleneck_iterator,
                stage.on_read_threads,
                stage.read_threads,
            )
            if self.findings:
                self.findings = list(self.findings) + list(found)
            else:
                self.findings = found

    def steps_ended(self, steps: int) -> None:
        """Between steps: counts them for TensorBoard, checkpoints every few seconds."""
        if steps and self.tensorboard is not None:
            self.tensorboard.step_ended(self.clock, steps)
        if self.early_verdict is None and self.clock.recorded != self._checked_records:
            # Only new rows can make it due: not looked at on every step (a
            # timing source may hand rows over a thousand steps at a time).
            self._checked_records = self.clock.recorded
            if self._early_verdict_due():
                self._say_early_verdict()
        if time.monotonic() >= self._next_checkpoint:
            self.checkpoint()

    def epoch_ended(self) -> None:
        """Writes the epoch's outputs, so a crash loses at most the current epoch."""
        self.window.end_epoch()
        self.flush_rows()
        self._next_checkpoint = time.monotonic() + CHECKPOINT_S
        self._exchange_worker_summaries(final=False)
        report = self.built_report()
        if report is None:
            return
        self._write_report_file(report)
        if self.tensorboard is not None:
            self.tensorboard.epoch_ended(self.clock, report)

    def checkpoint(self) -> None:
        """Within long epochs: report.json and the scalars so far, on disk."""
        self.flush_rows()
        report = self.built_report()
        if report is not None:
            self._write_report_file(report)
        if self.tensorboard is not None:
            self.tensorboard.write_scalars(self.clock)
            self.tensorboard.flush()
        self._next_checkpoint = time.monotonic() + CHECKPOINT_S

    def step_failed(self, error: Optional[BaseException]) -> None:
        """A step raised: the window closes and what was measured is written."""
        self.window.close(FIT_ENDED)
        if error is not None and self._first_call.get(TRAIN):
            # The first call's timings are lost with it; with several steps a
            # call, some may have run (and trained) before the failure.
            steps = self.steps_per_execution
            ran = f", after running up to {steps - 1} of its {steps} steps" if steps > 1 else ""
            self.notes.append(
                f"No training step was measured: the first training call failed "
                f"({type(error).__name__}){ran}, and its timings were lost with it."
            )
        if error is not None:
            # fit ends here without on_train_end: keep what was measured so far.
            _RUNNING.discard(self)
            self.checkpoint()

    def finish(self, summary: bool = True) -> Report:
        """Builds the final report and writes every output.

        The driver closes the profiler window first (`window.end_fit()`).

        Args:
            summary: print the terminal summary (when `verbose`); an
                `evaluate()` on its own prints none.

        Returns:
            The final `Report`.
        """
        _RUNNING.discard(self)
        self.finished = True
        self.flush_rows()
        self._end_claim()
        if self._cpu is not None and self.guard.enabled(features.CPU_USAGE):
            with self.guard(features.CPU_USAGE):
                self._cpu.stop()
        self._exchange_worker_summaries(final=True)
        report = self.built_report()
        if report is None:
            return Report(notes=self.failure_notes())
        failures = len(self.guard.failures)
        self._write_report_file(report)
        if self.tensorboard is not None:
            self.tensorboard.finish(self.clock, report)
            if self.guard.enabled(features.STEP_TRACE):
                with self.guard(features.STEP_TRACE):
                    write_trace(self.clock, self._own_folder())
        if summary and self.settings.verbose and self.guard.enabled(features.SUMMARY):
            with self.guard(features.SUMMARY):
                terminal_summary.print_summary(report)
        if len(self.guard.failures) != failures:
            # An output failed after the file was written: the file says so too.
            report.notes = report.notes + self.failure_notes()[failures:]
            self._write_report_file(report)
        return report

    def flush_rows(self) -> None:
        """Has the timing source hand over the rows it keeps back, if it keeps any."""
        if self._flush_rows is not None:
            self._flush_rows()

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
        return judge(
            self.clock.stats(TRAIN),
            self.window.evidence,
            self.clock.epochs,
            self.clock.steady_share(TRAIN),
            self.clock.epoch_start_share(TRAIN),
            self.what_if,
        )

    def report(self) -> Report:
        """The `Report` of what was measured so far."""
        import keras

        measurement, notes = self.measurement, list(self.notes)
        described = self._describe() if self._describe is not None else None
        if described is not None:
            measurement, source_notes = described
            notes += source_notes
        validation = self.clock.stats(VALIDATION)
        train = self.clock.stats(TRAIN)
        notes += self.failure_notes()
        if self.worker_view is not None:
            missing = worker_reports.missing_note(self.worker_view, self.settings.log_dir)
            if missing is not None and self.worker_view.waited_s is not None:
                notes.append(missing)
        if not train.steps and TRAIN not in self.clock.first_steps and not any(
            note.startswith("No training step was measured") for note in notes
        ):
            notes.append(
                "No training step was measured: the dataset gave no batch, or fit has not "
                "run a step yet."
            )
        # The one verdict: the terminal line, the file and the advice agree.
        judgement = self.judgement()
        report = Report(
            verdict=judgement.verdict,
            input_fraction=judgement.input_fraction,
            train=train,
            validation=validation if validation.steps else None,
            epochs=list(self.clock.epochs),
            first_steps=dict(self.clock.first_steps),
            measurement=measurement,
            steps_per_execution=self.steps_per_execution,
            notes=notes + self.window.notes,
            # Grain's own stage timing names Grain's stages; a profiler window
            # sees them only as Keras' generator around the dataset.
            profile=self.stage_timing or self.window.evidence,
            findings=list(self.findings),
            what_if=self.what_if,
            workers=self.worker_view,
            cpu=self._cpu_usage(),
            environment=_environment(keras.__version__),
            judgement=judgement,
            run=self.entry.run if self.entry is not None else None,
        )
        if self.guard.enabled(features.ADVICE):
            with self.guard(features.ADVICE):
                report.recommendations = advise(
                    report.train,
                    report.profile,
                    # With the pipeline they were found in, when inspected here.
                    self.findings,
                    what_if=report.what_if,
                    cpu=report.cpu,
                    workers=report.workers,
                    judgement=judgement,
                    fix_timings=self.fix_timings,
                )
        return report

    def failure_notes(self) -> List[str]:
        """One note per feature that failed and was turned off."""
        return [
            f"{feature} was turned off after a failure: {reason}"
            for feature, reason in self.guard.failures.items()
        ]

    # Internals.

    def _early_verdict_due(self) -> bool:
        # Between steps: a few integer comparisons.
        steady = self.clock.steady_share(TRAIN).steps
        if steady < EARLY_MIN_STEPS or self.measurement == WHOLE_STEP:
            return False
        capped = steady >= EARLY_MAX_STEPS or time.monotonic() - self._began >= EARLY_MAX_S
        if self._filling_a_cache():
            # The steady state starts after the epochs that fill the cache.
            return capped
        return capped or not self.window.capturing

    def _filling_a_cache(self) -> bool:
        """Whether the pipeline caches and fewer than two training epochs have ended.

        The first epoch fills the cache, and the verdict's steady state is the
        epochs after it, known once two have ended.
        """
        pipeline = getattr(self.findings, "pipeline", None)
        if pipeline is None or not any(stage.kind == "cache" for stage in pipeline.stages):
            return False
        return sum(1 for epoch in self.clock.epochs if epoch.kind == TRAIN) < 2

    def _say_early_verdict(self) -> None:
        """One line with the steady-state verdict and the top fix, and the outputs so far.

        A long job learns within its first minute what the end of fit would say;
        the final report refines it.
        """
        self.early_verdict = ""
        if not self.guard.enabled(features.EARLY_VERDICT):
            return
        report = self.built_report()
        if report is None:
            return
        with self.guard(features.EARLY_VERDICT):
            steps = report.train.steps
            line = f"keras-pipeline-tuner, early verdict after {steps} steps: "
            line += terminal_summary.verdict_line(report)
            if self._filling_a_cache():
                line += (
                    " This is still the first epoch, which fills the pipeline's cache: later "
                    "epochs may wait less."
                )
            speed = [r for r in report.recommendations if r.expected_gain is not None]
            if speed:
                line += f" Top fix: {speed[0].title}."
            line += " The final report follows at the end of training."
            self.early_verdict = line
            logger.info("%s", line)
            if self.settings.verbose:
                terminal_summary.print_line(line)
        self._write_report_file(report)
        if self.tensorboard is not None:
            self.tensorboard.write_report(report, report.train.steps)
            self.tensorboard.flush()

    def _write_report_file(self, report: Report) -> None:
        """The run's report into its own folder and, for training, the log dir's root.

        An `evaluate()` run leaves the root report, training's, as it is; at
        its end the root report's list of runs is brought up to date.
        """
        if self.output_dir is None or not self.guard.enabled(features.REPORT_FILE):
            return
        with self.guard(features.REPORT_FILE):
            entry = self.entry
            if entry is not None:
                write_report(report, log_dir_runs.run_folder(self.output_dir, entry.run))
            if entry is None or entry.kind in log_dir_runs.TRAINING_KINDS:
                listed = dataclasses.replace(report, runs=list(self._log_dir_runs))
                write_report(listed, self.output_dir)
            elif self.finished:
                self._list_this_run_in_the_root_report()

    def _list_this_run_in_the_root_report(self) -> None:
        root = os.path.join(self.output_dir, REPORT_FILENAME)
        try:
            trained = Report.from_json(files.read_text(root))
        except (OSError, ValueError):
            # No training report (an evaluate() on its own), or one this
            # version cannot read: this run's report stands in its folder.
            return
        trained.runs = list(self._log_dir_runs)
        write_report(trained, self.output_dir)

    def _own_folder(self) -> str:
        """Where this run's files go: the log dir for training, else the run's folder."""
        entry = self.entry
        if entry is None or entry.kind in log_dir_runs.TRAINING_KINDS:
            return self.output_dir
        return log_dir_runs.run_folder(self.output_dir, entry.run)

    def _end_claim(self) -> None:
        """Marks the run's folder finished, and lists the log dir's runs as they stand."""
        if self.entry is None or not self.guard.enabled(features.REPORT_FILE):
            return
        with self.guard(features.REPORT_FILE):
            log_dir_runs.finish_run(self.output_dir, self.entry)
            self._log_dir_runs = log_dir_runs.list_runs(self.output_dir)

    def _restart_cpu_meter(self) -> None:
        if self.guard.enabled(features.CPU_USAGE):
            with self.guard(features.CPU_USAGE):
                if self._cpu is None:
                    self._cpu = CpuMeter()
                else:
                    self._cpu.restart()

    def _cpu_usage(self):
        # Guarded apart: a failed reading must not take the whole report with it.
        if self._cpu is not None and self.guard.enabled(features.CPU_USAGE):
            with self.guard(features.CPU_USAGE):
                return self._cpu.usage()
        return None

    def _join_workers(self, identity: Optional[worker_reports.WorkerIdentity]) -> None:
        """Sets up the exchange with the chief, and where this worker writes.

        The chief writes into `log_dir`; another worker into its own folder under
        `log_dir/workers/`, and TensorBoard summaries only if
        `tensorboard_workers="all"`.
        """
        settings = self.settings
        self._workers, self.worker_view = None, None
        if identity is not None:
            self._workers = worker_reports.WorkerExchange(
                identity, settings.log_dir, settings.worker_timeout_s
            )
            if self.guard.enabled(features.WORKER_SUMMARY):
                with self.guard(features.WORKER_SUMMARY):
                    self._workers.begin_fit()
        workers = self._workers
        self.output_dir = workers.output_dir() if workers is not None else settings.log_dir
        self.window.log_dir = self.output_dir
        writes_summaries = workers is None or (
            workers.identity.is_chief or settings.tensorboard_workers == "all"
        )
        self.tensorboard = None
        self.entry = None
        if self.output_dir is not None and self.guard.enabled(features.REPORT_FILE):
            with self.guard(features.REPORT_FILE):
                # A folder of its own: a second fit's scalars never restart
                # inside the first's, nor does another process write into it.
                self.entry = log_dir_runs.claim_run(self.output_dir, self.kind)
                self._log_dir_runs = log_dir_runs.list_runs(self.output_dir)
        if self.output_dir is not None and writes_summaries:
            run_name = None
            if self.entry is not None and "/" in self.entry.run:
                run_name = self.entry.run.split("/", 1)[1]
            self.tensorboard = TensorBoardSink(self.output_dir, self.guard, run_name=run_name)

    def _exchange_worker_summaries(self, final: bool) -> None:
        """Writes this worker's summary; the chief also reads the others'.

        At the end the chief waits at most `worker_timeout_s` for them. Nothing
        here talks to the other workers directly, so a worker whose tuner fails
        makes the chief wait that long at most.
        """
        workers = self._workers
        if workers is None:
            return
        own = None
        if self.guard.enabled(features.WORKER_SUMMARY):
            with self.guard(features.WORKER_SUMMARY):
                own = worker_reports.WorkerSummary(
                    task=workers.identity.task,
                    host=worker_reports.this_host(),
                    chief=workers.identity.is_chief,
                    final=final,
                    epochs=sum(1 for epoch in self.clock.epochs if epoch.kind == TRAIN),
                    train=self.clock.stats(TRAIN),
                    cpu=self._cpu_usage(),
                    notes=self.failure_notes(),
                )
                workers.publish(own)
        if own is not None and self.guard.enabled(features.WORKER_COMPARISON):
            with self.guard(features.WORKER_COMPARISON):
                self.worker_view = workers.collect(own, final=final)


def _environment(keras_version: str) -> dict:
    import keras

    environment = {}
    # Named only when the run used them: the torch and JAX backends may run
    # without TensorFlow, and no framework is imported just to name it.
    for name in ("tensorflow", "jax", "torch"):
        module = sys.modules.get(name)
        if module is not None and hasattr(module, "__version__"):
            environment[name] = str(module.__version__)
    environment.update(
        keras=keras_version, backend=keras.backend.backend(), python=sys.version.split()[0]
    )
    return environment


@atexit.register
def _write_running_reports() -> None:
    for run in list(_RUNNING):
        _RUNNING.discard(run)
        run.checkpoint()
