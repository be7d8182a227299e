"""Contention from the replay: steps on the real pipeline against steps on replayed batches.

The replay after training times the fit's own step fed cached batches, around
steps on the real pipeline, under the same load (`after_training`). Where the
real step is slower beyond the noise of these machines, `1 - replayed / real`
is the input's cost inside the step (`advice.verdict` weighs it). Under a
quota that throttled the job, the rounds are compared by wall time a step.
"""

from typing import Optional

from keras_pipeline_tuner.timing.step_clock import Share
from keras_pipeline_tuner.timing.step_stats import StepStats

# The replayed step must be at least this much faster than the real one for
# the difference to count as input cost: below it, the two are within the
# noise of these machines (steps come out two-valued in 10 ms thread slices;
# a healthy cached pipeline beside a 20 ms model measured 1.00-1.17 here).
CONTENTION_MIN_SPEEDUP = 1.15
# ...and by at least this many ms a step: with sub-millisecond steps, a ratio
# above 1.15 is a tenth of a millisecond, which scheduling moves from one fit
# to the next (0.38 against 0.52 ms, and 0.15 against 0.18 ms, in fits of a
# healthy cached pipeline of 0.2 ms steps on a quiet machine here).
CONTENTION_MIN_MS = 0.2
# How the rounds are compared under a quota that throttled the job, as the line says.
WALL_STATISTIC = "wall time a step, start to start, with the quota's stops between steps"


def compared_steps(what_if, share: Optional[Share], stats: StepStats, throttled: bool = False):
    """`(real ms, replayed ms, statistic)` the contention is judged from, or None."""
    if what_if is None or what_if.replay_step.mean_ms is None:
        return None
    if what_if.pipeline_source == "measured" and what_if.rounds:
        # Timed beside the replay, under the same load: the fairer comparison.
        # By means, as total time goes: a pipeline whose threads work in bursts
        # slows some steps only, which a median would not show. Of several
        # rounds, the one with the least contention: a burst of another load
        # on the machine can fall on one round's pipeline steps, seldom on all.
        # Under a quota that throttled the job, by wall time a step: the stops
        # land between steps too, and on either side (a fit's replay step read
        # 1.04 ms against 0.56 ms on the pipeline, its wall time 1.46 against 2.11).
        figures = [found.compared(throttled) for found in what_if.rounds]
        real_ms, replayed_ms, walled = min(figures, key=lambda each: each[0] / each[1])
        if not walled:
            # The verdict is about training's steps: pipeline steps the check
            # timed slower than training's met a load of the check's own
            # (beside two busy loops one round's read 12x its replayed steps
            # on a healthy pipeline), which is not the pipeline's cost.
            real_ms = min(real_ms, mean_step_ms(share, stats) or real_ms)
        return real_ms, replayed_ms, WALL_STATISTIC if walled else "mean"
    if what_if.pipeline_source == "measured" and what_if.pipeline_step.mean_ms:
        return what_if.pipeline_step.mean_ms, what_if.replay_step.mean_ms, "mean"
    return mean_step_ms(share, stats), what_if.replay_step.mean_ms, "mean"


def mean_step_ms(share: Optional[Share], stats: StepStats) -> Optional[float]:
    """Training's mean step in the verdict's steady state, else over all its steps, in ms."""
    if share is not None and share.steps:
        return share.step_ms / share.steps
    return stats.step.mean_ms


def contention_of(compared) -> Optional[float]:
    """`1 - replayed / real` step time, when the replay is clearly faster."""
    if compared is None:
        return None
    real_ms, replayed_ms, _ = compared
    if not real_ms or not replayed_ms or replayed_ms <= 0:
        return None
    if not shows_contention(real_ms, replayed_ms):
        return 0.0
    return 1.0 - replayed_ms / real_ms


def resolution(real_ms: float) -> float:
    """The least share of the step a replay can tell from the noise (`shows_contention`).

    Example:

    >>> round(resolution(10.0), 3), round(resolution(0.5), 2)
    (0.13, 0.4)
    """
    return max(1.0 - 1.0 / CONTENTION_MIN_SPEEDUP, CONTENTION_MIN_MS / real_ms if real_ms else 1.0)


def shows_contention(real_ms: float, replayed_ms: float) -> bool:
    """Whether steps on the real pipeline were slower than replayed ones beyond the noise.

    Args:
        real_ms: mean step time with the real input pipeline.
        replayed_ms: mean step time on replayed, cached batches, under the
            same load.

    Returns:
        True when the real step is at least `CONTENTION_MIN_SPEEDUP` times the
        replayed one, and `CONTENTION_MIN_MS` longer: the input pipeline's work
        slows the step.

    Example:

    >>> shows_contention(10.0, 7.0), shows_contention(10.0, 9.6), shows_contention(0.18, 0.15)
    (True, False, False)
    """
    if replayed_ms <= 0:
        return False
    return (
        real_ms / replayed_ms >= CONTENTION_MIN_SPEEDUP
        and real_ms - replayed_ms >= CONTENTION_MIN_MS
    )


def alongside(what_if) -> str:
    if what_if.pipeline_source != "measured":
        return ""
    if len(what_if.rounds) > 1:
        return (
            f" (timed between parts of the replay, in {len(what_if.rounds)} rounds; "
            "the round with the least difference)"
        )
    return " (timed between two halves of the replay)"
