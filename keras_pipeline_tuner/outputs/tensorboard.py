"""Writes what the tuner found where TensorBoard shows it.

Everything goes into one run, `<log_dir>/pipeline_tuner` (the run that also
holds the profiler window's captures for the Profile tab), so it sits beside
`keras.callbacks.TensorBoard`'s "train" and "validation" runs in the same
`log_dir` without sharing their event files:

- Scalars: per training step, `input_pipeline/input_wait_ms`, `.../compute_ms`,
  `.../step_ms` and `.../input_fraction` (the step's wait over its time).
- Text: `input_pipeline/report`, the report as markdown, each epoch.
- Images: `input_pipeline/timeline`, the latest steps as a timeline, with the
  tf.data stages of the profiler window when there is one.
- The "Input pipeline" dashboard's summaries (`outputs.dashboard.summaries`):
  every training step's row, written with the scalars; the report and the
  profiler window's stage rows, written with the text. Text, images and scalars
  stay: they are what a TensorBoard without the dashboard's plugin shows.

Nothing is written inside a step. Per-step scalars are taken from the step
clock's retained rows and written in bulk, at the end of each epoch and every
`flush_every` steps within long epochs (so rows are written before the clock's
ring drops them): with TensorFlow, by a compiled function that costs about
50 us per point, traced once per process and given each writer as an argument
(until it is traced, the process's first `_EAGER_POINTS` points are written
one by one, 0.7 ms each, which costs about as much as tracing it); without, by
TensorBoard's own writer, about 120 us per point.
Like Keras' `update_freq`, long runs are summarised so that neither the cost
nor the event file grows with every step: each of the first `full_steps`
(1000) steps of a fit is a point of its own; after that a point is the mean of
a block of steps (fraction: total wait over total step time), 10 steps a block
up to 10x `full_steps`, 100 up to 100x, and so on, about 900 points a decade.
The timeline image takes about 0.1 s to draw, so within fit it is drawn only
where drawing it (as long as the last one took, 0.1 s before any) keeps the
images under 2 % of the elapsed training time: after an epoch of a few seconds
or more, not after short ones; the final one is always drawn.
"""

import contextlib
import dataclasses
import logging
import os
import sys
import time
from typing import Optional
from typing import Tuple

import numpy as np

from keras_pipeline_tuner._util import features
from keras_pipeline_tuner._util import files
from keras_pipeline_tuner._util.feature_guard import FeatureGuard
from keras_pipeline_tuner._util.tf_import import tensorflow
from keras_pipeline_tuner.outputs import timeline_image
from keras_pipeline_tuner.outputs.compiled_scalars import compiled_scalar_writer
from keras_pipeline_tuner.outputs.compiled_scalars import scalar_metadata
from keras_pipeline_tuner.outputs.compiled_scalars import write_eagerly
from keras_pipeline_tuner.outputs.dashboard import summaries as dashboard
from keras_pipeline_tuner.outputs.downsampling import BlockMeans
from keras_pipeline_tuner.outputs.log_dir_runs import run_path
from keras_pipeline_tuner.outputs.report import Report
from keras_pipeline_tuner.outputs.report import figures_of
from keras_pipeline_tuner.outputs.stage_scalars import stage_scalars
from keras_pipeline_tuner.profiling.capture import PROFILE_RUN
from keras_pipeline_tuner.timing.step_clock import TRAIN
from keras_pipeline_tuner.timing.step_clock import StepClock
from keras_pipeline_tuner.timing.step_stats import step_seconds

logger = logging.getLogger("keras_pipeline_tuner")

RUN = PROFILE_RUN
TAG_PREFIX = "input_pipeline"
SCALAR_TAGS = tuple(
    f"{TAG_PREFIX}/{name}" for name in ("input_wait_ms", "compute_ms", "step_ms", "input_fraction")
)
WHOLE_STEP_TAG = f"{TAG_PREFIX}/step_ms"
REPORT_TAG = f"{TAG_PREFIX}/report"
TIMELINE_TAG = f"{TAG_PREFIX}/timeline"
TIMELINE_FILENAME = "timeline.png"

SCALARS = features.TENSORBOARD_SCALARS
TEXT = features.TENSORBOARD_TEXT
TIMELINE = features.TENSORBOARD_TIMELINE
DASHBOARD = features.TENSORBOARD_DASHBOARD
# Steps of a fit written one point each; then blocks of 10, 100... steps a point.
FULL_RESOLUTION_STEPS = 1000

# Tracing the compiled scalar writer takes about 170 ms; it then writes a point
# in about 50 us, where `tf.summary.write` one by one takes about 0.7 ms (four
# tags): a process's first points, up to as many as the tracing is worth, are
# written one by one, and the rest compiled, once per process (each fit's
# writer is an argument of the compiled function, not captured by it).
_EAGER_POINTS = 250
_IMAGE_BUDGET = 0.02
# What an image is expected to cost before one has been drawn (seconds).
_FIRST_IMAGE_S = 0.1


class TensorBoardSink:
    """Writes per-step scalars, the report text and the timeline image.

    Args:
        log_dir: the tuner's `log_dir`; the run `pipeline_tuner` is made in it.
        guard: the tuner's `FeatureGuard`: a failure turns off that output only.
        flush_every: steps between scalar writes within an epoch.
        full_steps: steps of each fit written one point each; later steps are
            written as means over blocks of 10, 100, ... steps (see the module
            docstring).

    Example:

    ```python
    sink = TensorBoardSink("logs/run1", FeatureGuard())
    sink.epoch_ended(tuner.clock, tuner.report)
    sink.finish(tuner.clock, tuner.report)
    ```
    """

    def __init__(
        self,
        log_dir: str,
        guard: FeatureGuard,
        flush_every: int = 1000,
        full_steps: int = FULL_RESOLUTION_STEPS,
        run_name: Optional[str] = None,
    ):
        self.run_dir = os.path.join(log_dir, run_path(run_name))
        self.guard = guard
        self.flush_every = flush_every
        self.full_steps = full_steps
        # The steps of the block being summed, not written yet (see _blocks).
        self._scalar_blocks = BlockMeans(full_steps)
        self._row_blocks = BlockMeans(full_steps)
        self._writer = None
        self._with_tensorflow: Optional[bool] = None
        self._clock: Optional[StepClock] = None
        self._written = 0
        self._pending = 0
        self._image_s = 0.0
        self._last_image_s = _FIRST_IMAGE_S
        self._last_text_step: Optional[int] = None
        self._last_text = None
        self._last_image: Optional[Tuple[int, str]] = None  # Its step and profile title.
        self._profile_rows = {}
        self._dashboard_clock: Optional[StepClock] = None
        self._dashboard_written = 0
        self._step_blocks = dashboard.StepBlocks()
        self._last_dashboard = None
        # The (step, reads) of the stage table last written as scalars.
        self._last_stage_table = None
        # TensorBoard's own writer, when TensorFlow is not imported (JAX, torch).
        self._event_writer = None
        if guard.enabled(TIMELINE):
            timeline_image.preload()

    # What the tuner calls.

    def step_ended(self, clock: StepClock, steps: int = 1) -> None:
        """Counts finished steps; writes the scalars every `flush_every` of them.

        Called between steps, so it must stay cheap: a counter, mostly.

        Args:
            clock: the tuner's `StepClock`.
            steps: how many steps just finished (`steps_per_execution`).
        """
        self._pending += steps
        # Well before the clock's ring starts dropping rows not yet written.
        if self._pending >= min(self.flush_every, max(clock.capacity // 2, 1)):
            self.write_scalars(clock)

    def epoch_ended(self, clock: StepClock, report: Report) -> None:
        """Writes the epoch's scalars and the report; the image when cheap enough.

        Args:
            clock: the tuner's `StepClock`.
            report: the report after this epoch.
        """
        self.write_scalars(clock, final=True)
        self.write_stage_table(report)
        self.write_report(report, self._current_step(clock))
        self.write_dashboard(report, self._current_step(clock))
        if self._image_s + self._last_image_s <= _IMAGE_BUDGET * _training_seconds(clock):
            self.write_timeline(clock, report)
        self.flush()

    def finish(self, clock: StepClock, report: Report) -> None:
        """Writes everything left, the final report and image, and flushes.

        Args:
            clock: the tuner's `StepClock`.
            report: the final report.
        """
        self.write_scalars(clock, final=True)
        self.write_stage_table(report)
        self.write_report(report, self._current_step(clock))
        self.write_dashboard(report, self._current_step(clock))
        self.write_timeline(clock, report)
        self.flush()

    # The outputs.

    def write_scalars(self, clock: StepClock, final: bool = False) -> int:
        """Writes the per-step scalars of training steps not written yet.

        Each of a fit's first `full_steps` steps is one point; later steps are
        summed into blocks (10, 100, ... steps), and a block is written as one
        point at its last step once complete, or at `final`.

        Args:
            clock: the tuner's `StepClock`.
            final: write the block in progress too (at an epoch's or fit's end).

        Returns:
            How many points were written.
        """
        self._pending = 0
        self.write_step_rows(clock, final)
        if not self.guard.enabled(SCALARS):
            return 0
        with self.guard(SCALARS):
            if clock is not self._clock:
                # A new fit (or custom loop run) starts counting from its own step 1.
                self._clock, self._written = clock, 0
                self._scalar_blocks.reset()
            new = clock.rows_since(TRAIN, self._written)
            numbers = new["number"]
            if not numbers.size and not (final and self._scalar_blocks.pending):
                return 0
            if numbers.size:
                self._written = int(numbers[-1])
            step = step_seconds(new["wait"], new["compute"])
            found = self._scalar_blocks.add(numbers, np.stack([new["wait"], step], axis=1), final)
            points, means = found.last, found.means
            if not points.size:
                return 0
            wait, step = means[:, 0], means[:, 1]
            measured = ~np.isnan(wait)
            if (~measured).any():
                # Points whose wait was not observed (whole steps, a custom loop's
                # first step of an epoch) have a step time and nothing else: no
                # NaN reaches TensorBoard.
                whole = ~measured
                self._write_scalar_rows(
                    (WHOLE_STEP_TAG,),
                    points[whole],
                    (step[whole] * 1e3)[None, :].astype(np.float32),
                )
            if measured.any():
                wait, step = wait[measured], step[measured]
                compute = step - wait
                fraction = np.divide(wait, step, out=np.zeros_like(step), where=step > 0)
                values = np.stack([wait * 1e3, compute * 1e3, step * 1e3, fraction])
                self._write_scalar_rows(SCALAR_TAGS, points[measured], values.astype(np.float32))
            return int(points.size)
        return 0

    def write_stage_table(self, report: Report) -> int:
        """Writes the stage table of tf.data's live model as scalars, once per read.

        One point per stage and quantity at the read's step (the batches its
        iterator gave): the time per element, the share of the pipeline's
        time, the parallelism chosen, and the final prefetch's fullness.

        Args:
            report: the `Report`, whose `stage_table` is the latest read.

        Returns:
            How many scalars were written.
        """
        table = report.stage_table
        if table is None or not self.guard.enabled(SCALARS):
            return 0
        key = (table.at_step, table.reads)
        if key == self._last_stage_table:
            return 0
        with self.guard(SCALARS):
            self._last_stage_table = key
            tags, values = stage_scalars(table)
            if tags:
                numbers = np.array([table.at_step], dtype=np.int64)
                column = np.array(values, dtype=np.float32)[:, None]
                self._write_scalar_rows(tags, numbers, column)
            return len(tags)
        return 0

    def write_step_rows(self, clock: StepClock, final: bool = False) -> int:
        """Writes the dashboard's rows of the training steps not written yet.

        Called with the scalars (every `flush_every` steps, at the tuner's
        checkpoints and at epoch ends), so the dashboard follows a running fit.
        Beyond `full_steps` a row is the mean of a block of steps, as for the
        scalars.

        Args:
            clock: the tuner's `StepClock`.
            final: write the block in progress too (at an epoch's or fit's end).

        Returns:
            How many steps were written.
        """
        if not self.guard.enabled(DASHBOARD):
            return 0
        with self.guard(DASHBOARD):
            if clock is not self._dashboard_clock:
                # A new fit starts counting from its own step 1.
                self._dashboard_clock, self._dashboard_written = clock, 0
                self._step_blocks.reset()
                self._row_blocks.reset()
            new = clock.rows_since(TRAIN, self._dashboard_written)
            numbers = new["number"]
            if not numbers.size and not (final and self._row_blocks.pending):
                return 0
            if numbers.size:
                self._dashboard_written = int(numbers[-1])
            # Long runs are summarised as the scalars are: the file stays bounded.
            # A block's row keeps its first step and its largest times beside
            # the means, so a stall in it stays visible on the timeline.
            step = step_seconds(new["wait"], new["compute"])
            found = self._row_blocks.add(
                numbers,
                np.stack(
                    [
                        new["epoch"].astype(np.float64),
                        new["start"],
                        new["wait"],
                        new["compute"],
                        step,
                    ],
                    axis=1,
                ),
                final,
            )
            if not found.last.size:
                return 0
            rows = _dashboard_rows(found)
            events = self._events() if self._without_tensorflow() else None
            with self._summaries_if(events is None):
                for block, block_rows in self._step_blocks.add(rows):
                    dashboard.write_step_block(block, block_rows, events)
            return int(rows.shape[0])
        return 0

    def write_dashboard(self, report: Report, step: int) -> None:
        """Writes the report and the profiler window's rows for the dashboard.

        Args:
            report: the `Report`.
            step: the training step it covers.
        """
        if not self.guard.enabled(DASHBOARD):
            return
        with self.guard(DASHBOARD):
            text = report.to_json(indent=None)
            if (text, step) == self._last_dashboard:
                return
            rows, title = self._profile(report)
            events = self._events() if self._without_tensorflow() else None
            with self._summaries_if(events is None):
                dashboard.write_json(dashboard.REPORT_TAG, text, step, events)
                if rows:
                    stages = {"title": title, "rows": [dataclasses.asdict(row) for row in rows]}
                    dashboard.write_json(
                        dashboard.PROFILE_STAGES_TAG, dashboard.json_text(stages), step, events
                    )
            self._last_dashboard = (text, step)

    def write_report(self, report: Report, step: int) -> None:
        """Writes the report as markdown to the Text tab, if it changed.

        Args:
            report: the `Report`.
            step: the training step it covers.
        """
        if not self.guard.enabled(TEXT):
            return
        with self.guard(TEXT):
            from keras_pipeline_tuner.outputs.markdown import render_markdown

            text = render_markdown(report, heading=_heading(report))
            if text == self._last_text and step == self._last_text_step:
                return
            if self._without_tensorflow():
                self._events().text(REPORT_TAG, text, step=step)
            else:
                tf = tensorflow()
                with self._summaries():
                    tf.summary.text(REPORT_TAG, text, step=step)
            self._last_text, self._last_text_step = text, step

    def write_timeline(self, clock: StepClock, report: Report) -> None:
        """Draws the timeline image and writes it to the Images tab.

        Args:
            clock: the tuner's `StepClock`.
            report: the `Report`, for the title and the profiler window.
        """
        step = self._current_step(clock)
        if not self.guard.enabled(TIMELINE):
            return
        with self.guard(TIMELINE):
            began = time.perf_counter()
            profiled, profile_title = self._profile(report)
            # Drawn again at a step when the profile's evidence has come in since.
            if (step, profile_title) == self._last_image:
                return
            steps = clock.steps(TRAIN)
            numbers = clock.step_numbers(TRAIN)
            shown = numbers[-timeline_image.DEFAULT_MAX_STEPS :]
            title = "No training step measured yet."
            if shown.size:
                title = f"Training steps {shown[0]}-{shown[-1]}: {_verdict_text(report)}"
            png = timeline_image.timeline_png(
                timeline_image.step_rows(steps), title, profiled, profile_title
            )
            description = "Input wait and compute of the latest training steps."
            if self._without_tensorflow():
                # Also a plain file, for a look without TensorBoard (and for docs).
                os.makedirs(self.run_dir, exist_ok=True)
                with open(os.path.join(self.run_dir, TIMELINE_FILENAME), "wb") as file:
                    file.write(png)
                self._events().image(TIMELINE_TAG, png, step=step, description=description)
            else:
                tf = tensorflow()
                tf.io.gfile.makedirs(self.run_dir)
                with tf.io.gfile.GFile(os.path.join(self.run_dir, TIMELINE_FILENAME), "wb") as file:
                    file.write(png)
                image = tf.expand_dims(tf.io.decode_png(png, channels=4), 0)
                with self._summaries():
                    tf.summary.image(TIMELINE_TAG, image, step=step, description=description)
            self._last_image = (step, profile_title)
            self._last_image_s = time.perf_counter() - began
            self._image_s += self._last_image_s

    def flush(self) -> None:
        """Flushes the event file, so TensorBoard sees what was written."""
        if self._writer is not None:
            with self.guard(SCALARS):
                self._writer.flush()
        if self._event_writer is not None:
            with self.guard(SCALARS):
                self._event_writer.flush()

    # Internals.

    def _summaries(self):
        tf = tensorflow()
        if self._writer is None:
            self._writer = tf.summary.create_file_writer(self.run_dir)
        return _Summaries(tf, self._writer)

    def _summaries_if(self, wanted: bool):
        # TensorFlow's writer as default only where TensorFlow writes.
        return self._summaries() if wanted else contextlib.nullcontext()

    def _without_tensorflow(self) -> bool:
        # TensorFlow's writer when the process has TensorFlow already (its
        # compiled scalar writer is the fastest); TensorBoard's own otherwise,
        # so that JAX and torch users need not install, or import, TensorFlow.
        # Decided at the first write and kept: TensorBoard's writer imports
        # TensorFlow when it is installed, and a run's summaries must stay in
        # one event file (TensorBoard reads a directory's files one at a time).
        if self._with_tensorflow is None:
            self._with_tensorflow = sys.modules.get("tensorflow") is not None
        return not self._with_tensorflow

    def _events(self):
        if self._event_writer is None:
            from keras_pipeline_tuner.outputs.event_writer import EventWriter

            self._event_writer = EventWriter(self.run_dir)
        return self._event_writer

    def _write_scalar_rows(self, tags, numbers: np.ndarray, values: np.ndarray) -> None:
        if self._without_tensorflow():
            self._events().scalars(tags, numbers, values)
            return
        tf = tensorflow()
        with self._summaries():
            if write_eagerly(tags, numbers.size, _EAGER_POINTS):
                scalar = scalar_metadata()
                for column, number in enumerate(numbers):
                    for row, tag in enumerate(tags):
                        tf.summary.write(
                            tag, values[row, column], step=int(number), metadata=scalar
                        )
                return
            write = compiled_scalar_writer(tf, tags)
            write(self._writer._resource, numbers, values)  # pylint: disable=protected-access

    def _current_step(self, clock: StepClock) -> int:
        numbers = clock.step_numbers(TRAIN)
        return int(numbers[-1]) if numbers.size else 0

    def _profile(self, report: Report):
        profile = report.profile
        if (
            profile is None
            or not profile.source  # not converted: the capture may be unreadable
            or not profile.xplane_path
            or not files.exists(profile.xplane_path)
        ):
            return (), ""
        window = figures_of(report).window
        within = (window.first_step, window.last_step) if window is not None else None
        key = (profile.xplane_path, within)
        rows = self._profile_rows.get(key)
        if rows is None:
            from keras_pipeline_tuner.profiling import evidence as profile_evidence

            stages = {
                iterator.iterator: iterator.stage
                for iterator in profile.iterators
                if not iterator.waiting and iterator.self_share >= 0.01
            }
            # As the conversion's process handed it back: not converted again.
            events = profile_evidence.first_steps_trace(profile.xplane_path)
            rows = timeline_image.profile_rows(events, stages, within=within)
            self._profile_rows = {key: rows}
        # The window's one range (`Figures.window`), and how many of its steps are drawn.
        span = window.span if window is not None else profile.span()
        title = f"Profiler window, {span}"
        if window is not None and window.input_fraction is not None:
            title += f", measured {window.input_fraction * 100:.1f} % input"
        drawn = len(rows[0].spans_ms) if rows else 0
        if drawn:
            title += f"; its first {drawn} drawn"
        if profile.bottleneck:
            title += f"; bottleneck {profile.bottleneck}"
        return rows, title


def _dashboard_rows(found) -> np.ndarray:
    """The dashboard's step rows (v2) of finished blocks of steps.

    Args:
        found: the blocks (`downsampling.Points`) of columns epoch, start,
            wait, compute and step time.

    Returns:
        One row per block: its last step's number, the epoch and start of its
        first step, the mean wait and compute, its first step's number, and its
        largest wait, compute and step time.
    """
    lows, means, highs = found.minima, found.means, found.maxima
    columns = [found.last.astype(np.float64), lows[:, 0], lows[:, 1], means[:, 2], means[:, 3]]
    columns += [found.first.astype(np.float64), highs[:, 2], highs[:, 3], highs[:, 4]]
    return np.stack(columns, axis=1)


class _Summaries:
    """The sink's writer as default, recording on whatever the user's settings."""

    def __init__(self, tf, writer):
        self._contexts = [writer.as_default(), tf.summary.record_if(True)]

    def __enter__(self):
        for context in self._contexts:
            context.__enter__()

    def __exit__(self, *exc_info):
        for context in reversed(self._contexts):
            context.__exit__(*exc_info)
        return False


def _training_seconds(clock: StepClock) -> float:
    # Wall time since the oldest step the clock retains: training time, roughly.
    starts = clock.steps(TRAIN)["start"]
    return max(time.time() - float(starts[0]), 0.0) if starts.size else 0.0


def _heading(report: Report) -> str:
    epochs = {breakdown.epoch for breakdown in report.epochs if breakdown.kind == TRAIN}
    if not epochs:
        return ""
    return f"after epoch {max(epochs) + 1}"


def _verdict_text(report: Report) -> str:
    figures = figures_of(report)
    if figures.input_fraction is None:
        return figures.verdict.value
    text = f"{figures.verdict.value}, {figures.input_fraction * 100:.1f} % input"
    if figures.step_ms is not None:
        text += f", step {figures.step_ms:.2f} ms (steady-state median)"
    return text
