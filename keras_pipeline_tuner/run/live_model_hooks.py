"""When the tuner reads tf.data's live model during a fit, under its feature guard.

The fit's hooks call these: `begin` once before the first step (a custom
loop's driver calls `begin_loop`, then `track` at each training pass), `steady_step`
at each training batch's begin (a count; a read in the middle of each pass),
`epoch_ended` at each epoch's end, `end` before the tuner's own work after
training. Each read lands in the run (`Run.stage_table`,
`Run.stage_table_history`); a failure turns the feature off and training goes
on (see `instrumentation.live_model_reader`).
"""

from typing import Optional

from keras_pipeline_tuner._util import features
from keras_pipeline_tuner.instrumentation.live_model_reader import LiveModelReader


class LiveModelHooks:
    """Drives one fit's `LiveModelReader` from the tuner's hooks.

    Args:
        guard: the tuner's `FeatureGuard`.

    Example:

    ```python
    hooks = LiveModelHooks(guard)
    hooks.begin(run, model, "jax")
    hooks.epoch_ended(run)
    hooks.end(run)
    ```
    """

    def __init__(self, guard):
        self._guard = guard
        self._reader: Optional[LiveModelReader] = None

    def begin(self, run, model, backend: str) -> None:
        """Finds the fit's tf.data iterator (once per fit, before the first step)."""
        self.end(run)
        if not self._guard.enabled(features.LIVE_MODEL):
            return
        with self._guard(features.LIVE_MODEL):
            reader = self._new_reader(run)
            # Kept before `begin`: what a failed `begin` replaced is put back.
            self._reader = reader
            if not reader.begin(model, backend):
                self._reader = None

    def begin_loop(self, run) -> None:
        """Starts reading the passes a custom loop makes over a tf.data dataset (`track`)."""
        self.end(run)
        if self._guard.enabled(features.LIVE_MODEL):
            self._reader = self._new_reader(run)

    def track(self, iterator) -> None:
        """A custom loop's training pass made `iterator` (see `LiveModelReader.track`)."""
        reader = self._reader
        if reader is None or not self._guard.enabled(features.LIVE_MODEL):
            return
        with self._guard(features.LIVE_MODEL):
            reader.track(iterator)

    def steady_step(self) -> None:
        """One training step: a count, and in the middle of each pass one read."""
        reader = self._reader
        if reader is not None:
            reader.steady_step()

    def epoch_ended(self, run) -> None:
        """Reads the model at an epoch's end; the run's table is the latest."""
        reader = self._reader
        if reader is None or not self._guard.enabled(features.LIVE_MODEL):
            return
        with self._guard(features.LIVE_MODEL):
            reader.read()
            reader.pass_ended()
            self._keep(run, reader)

    def end(self, run) -> None:
        """Reads a last time and puts back what `begin` replaced."""
        reader, self._reader = self._reader, None
        if reader is None:
            return
        # Put back even when the feature failed meanwhile: `end` restores first.
        with self._guard(features.LIVE_MODEL):
            reader.end()
            if run is not None:
                self._keep(run, reader)
                run.notes.extend(note for note in reader.notes if note not in run.notes)

    def _new_reader(self, run) -> LiveModelReader:
        # Stages are named from the run's own reading of the pipeline.
        return LiveModelReader(
            pipeline=lambda: getattr(run.findings, "pipeline", None),
            on_failure=self._failed,
        )

    def _keep(self, run, reader: LiveModelReader) -> None:
        if self._guard.enabled(features.LIVE_MODEL) and reader.table is not None:
            run.stage_table = reader.table
            run.stage_table_history = list(reader.history)

    def _failed(self, reason: str) -> None:
        self._guard.disable(features.LIVE_MODEL, reason)
