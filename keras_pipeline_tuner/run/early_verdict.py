"""The early verdict: one line, within a long job's first minute, of what the end will say.

Said once the steady state has `EARLY_MIN_STEPS` steps and no profiler window is
open, or at the latest after `EARLY_MAX_STEPS` steps or `EARLY_MAX_S` seconds;
while a first epoch fills the pipeline's cache, only at the latest (the steady
state starts after it). The final report refines it.
"""

import logging
import time
from typing import Callable
from typing import Optional

from keras_pipeline_tuner._util import features
from keras_pipeline_tuner.outputs import terminal as terminal_summary
from keras_pipeline_tuner.pipeline.graph import kinds
from keras_pipeline_tuner.timing.cpu_usage import throttled
from keras_pipeline_tuner.timing.step_clock import TRAIN

logger = logging.getLogger("keras_pipeline_tuner")

EARLY_MIN_STEPS = 20
EARLY_MAX_STEPS = 500
EARLY_MAX_S = 60.0


class EarlyVerdict:
    """Decides when the early verdict is due, and words it.

    Args:
        guard: the tuner's `FeatureGuard`.
        verbose: 0 keeps the line out of the terminal (it is still logged).

    Attributes:
        line: the line said, `""` when it was due but not said (the feature is
            off), `None` before it was due.

    Example:

    ```python
    early = EarlyVerdict(guard, verbose=1)
    if early.due(clock, window_capturing=False, filling_a_cache=False, whole_step=False):
        early.say(report, filling_a_cache=False)
    ```
    """

    def __init__(self, guard, verbose: int):
        self._guard = guard
        self._verbose = verbose
        self._began = time.monotonic()
        # The clock's `recorded`, and whether a cache was filling, when the
        # verdict was last considered.
        self._checked = (-1, False)
        self.line: Optional[str] = None

    def restart(self) -> None:
        """Counts the minute from now (the run began)."""
        self._began = time.monotonic()

    def due(self, clock, window_capturing: bool, filling_a_cache: bool, whole_step: bool) -> bool:
        """Whether to say it now: between steps, a few integer comparisons.

        Only new rows, or the end of the epoch that filled a cache, can make it
        due: it is not looked at on every step (a timing source may hand rows
        over a thousand steps at a time). The cache's epoch may end with no
        rows after it: its last rows were handed over at its last step.
        """
        checked = (clock.recorded, filling_a_cache)
        if self.line is not None or checked == self._checked:
            return False
        self._checked = checked
        steady = clock.steady_share(TRAIN).steps
        if steady < EARLY_MIN_STEPS or whole_step:
            return False
        capped = steady >= EARLY_MAX_STEPS or time.monotonic() - self._began >= EARLY_MAX_S
        if filling_a_cache:
            return capped
        return capped or not window_capturing

    def say(self, report, filling_a_cache: bool, write: Callable[[], None]) -> None:
        """Says the verdict and the top fix in one line, then writes the outputs so far.

        Args:
            report: the run's report now, or `None` when it could not be built.
            filling_a_cache: the first epoch is filling the pipeline's cache.
            write: writes the report file and the TensorBoard report.
        """
        self.line = ""
        if report is None or not self._guard.enabled(features.EARLY_VERDICT):
            return
        with self._guard(features.EARLY_VERDICT):
            line = f"keras-pipeline-tuner, early verdict after {report.train.steps} steps: "
            line += terminal_summary.verdict_line(report)
            if filling_a_cache:
                line += (
                    " This is still the first epoch, which fills the pipeline's cache: later "
                    "epochs may wait less."
                )
            speed = [
                r for r in report.recommendations
                if r.expected_gain is not None and r.expected_gain.speeds_up
            ]
            if speed:
                line += f" Top fix: {speed[0].title}."
            # The early line has neither the fetch floor nor the contention
            # check, which only run after training: said, so that a change of
            # class at the end is no surprise.
            line += (
                " Provisional: the final report, at the end of training, also weighs the "
                "fetch of a batch already in memory and the pipeline's contention with the "
                "model."
            )
            if throttled(report.cpu):
                # The step clock misses the stops between steps, where many
                # fall: said, since the final verdict may read another class.
                line += (
                    f" The CPU quota stopped the job in {report.cpu.throttling.share:.0%} of "
                    "its periods so far, between steps too, where the step clock does not "
                    "see them: the contention check after training compares wall time a step."
                )
            self.line = line
            logger.info("%s", line)
            if self._verbose:
                terminal_summary.print_line(line)
        write()


def filling_a_cache(findings, clock) -> bool:
    """Whether the pipeline caches and fewer than two training epochs have ended.

    The first epoch fills the cache, and the verdict's steady state is the
    epochs after it, known once two have ended.

    Args:
        findings: the run's findings (`kpt.inspect`), with the pipeline read.
        clock: the run's `StepClock`.
    """
    pipeline = getattr(findings, "pipeline", None)
    if pipeline is None or not any(stage.kind == kinds.CACHE for stage in pipeline.stages):
        return False
    return clock.ended_epochs() < 2
