"""The run's verdict, decided in one place for the report, the terminal and the advice."""

import dataclasses
from typing import Optional

from keras_pipeline_tuner.advice.recommendation import PROFILER
from keras_pipeline_tuner.advice.recommendation import STEP_CLOCK
from keras_pipeline_tuner.timing.step_stats import StepStats
from keras_pipeline_tuner.timing.step_stats import Verdict


@dataclasses.dataclass
class Judgement:
    """The verdict of a run and the input share it rests on.

    Attributes:
        verdict: the `Verdict`.
        input_fraction: the share of step time spent waiting for input, or
            `None` when nothing measured it.
        source: what measured it: "step clock", or "profiler" when the step
            clock timed whole steps only and a profiler window split them.
    """

    verdict: Verdict = Verdict.UNKNOWN
    input_fraction: Optional[float] = None
    source: Optional[str] = None


def judge(stats: StepStats, profile=None) -> Judgement:
    """Decides the verdict of a run from its step statistics and profiler window.

    The step clock decides whenever it split wait from compute: it saw every
    step, the window only a few. When it timed whole steps only, the window's
    split decides.

    Args:
        stats: `StepStats` of the training steps.
        profile: the run's `ProfileEvidence`, if a window was converted.

    Returns:
        The `Judgement`.

    Example:

    >>> stats = StepStats.from_arrays(np.array([0.03, 0.03]), np.array([0.01, 0.01]))
    >>> judge(stats).verdict.value
    'highly input-bound'
    """
    if stats.verdict != Verdict.UNKNOWN:
        return Judgement(stats.verdict, stats.input_fraction, STEP_CLOCK)
    if profile is not None and profile.verdict != Verdict.UNKNOWN:
        return Judgement(profile.verdict, profile.input_fraction, PROFILER)
    return Judgement()
