"""The advice's order: by each change's own figure, and one recommendation a stage.

Measured or predicted gains come first, largest first; then changes with a
bound only; then those measured or predicted at no gain. Two findings on one
stage are one change to make there: the first recommendation of a stage keeps
the others in its evidence.
"""

from typing import TYPE_CHECKING
from typing import List
from typing import Optional

from keras_pipeline_tuner.advice.recommendation import BOUND
from keras_pipeline_tuner.advice.recommendation import LEAST_SHOWN_GAIN
from keras_pipeline_tuner.advice.recommendation import LINT
from keras_pipeline_tuner.advice.recommendation import NOT_THE_BOTTLENECK
from keras_pipeline_tuner.advice.recommendation import Evidence
from keras_pipeline_tuner.advice.recommendation import ExpectedGain
from keras_pipeline_tuner.advice.recommendation import Recommendation
from keras_pipeline_tuner.advice.recommendation import describe_gain
from keras_pipeline_tuner.pipeline.lint.catalogue import CACHE_MISSING

if TYPE_CHECKING:
    pass


_SEVERITY_RANK = {"error": 0, "warning": 1, "info": 2}


def sort_by_figure(ranked: List[Recommendation]) -> None:
    """Ranks by each change's own figure: measured or predicted first, largest first;
    then those with a bound only; then those measured or predicted at no gain.

    Stable: within a tier the rules' order stands, so that one stage's
    recommendation is its fix with the largest figure, or else its first with
    a bound. A bound never outranks a measured or predicted gain: an untimed
    cache of the bottleneck stage with no prediction follows a fix timed
    faster, and its ceiling is in its statement; one the evidence predicts
    larger than the timed fix leads it.
    """
    ranked.sort(key=_figure_key)


def _own_figure(gain: Optional[ExpectedGain]) -> Optional[float]:
    """The change's own figure: what timing it measured, else what is predicted, else `None`."""
    if gain is None:
        return None
    return gain.likely_speedup if gain.likely_speedup is not None else gain.predicted_speedup


def _figure_tier(recommendation: Recommendation) -> int:
    """0: measured or predicted faster; 1: a bound only; 2: measured or predicted at no gain."""
    gain = recommendation.expected_gain
    if _own_figure(gain) is None:
        return 1
    return 0 if gain.speeds_up else 2


def _figure_key(recommendation: Recommendation):
    tier = _figure_tier(recommendation)
    return (tier, -_own_figure(recommendation.expected_gain) if tier == 0 else 0.0)


def bottleneck_key(recommendation: Recommendation, run):
    # At the stage the steps wait for, caching its output (where the lint found
    # it deterministic) removes the stage's work from every epoch after the
    # first, which no amount of parallelism does; Python under the GIL may not
    # parallelise at all. So among speed fixes of that stage, the cache leads.
    first = 0 if recommendation.severity == "error" else (
        1 if _cache_leads(recommendation, run) else 2
    )
    return (first,) + rank_key(recommendation, run)


def _cache_leads(recommendation: Recommendation, run) -> bool:
    """Whether a cache leads its stage: it speeds up, and the fit's passes are not known.

    Where they are (`DataReuse`), its gain counts its filling pass over the
    fit's, and it ranks by that figure like any other fix.
    """
    gain = recommendation.expected_gain
    if recommendation.id != CACHE_MISSING or (gain is not None and not gain.speeds_up):
        return False
    return run.reuse is None or run.reuse.repeats is None


def cannot_help(recommendation: Recommendation) -> bool:
    """Whether even the change's ceiling is under `LEAST_SHOWN_GAIN`: no advice at all.

    A change only predicted to bring nothing stays, after every speed fix
    (`no_speed_fix`): its stage's other fix leads, and its figure says why.
    """
    gain = recommendation.expected_gain
    return (
        recommendation.severity != "error"
        and gain is not None
        and gain.basis == BOUND
        and gain.likely_speedup is None
        and gain.speedup is not None
        and gain.speedup < LEAST_SHOWN_GAIN
    )


def no_speed_fix(recommendation: Recommendation) -> bool:
    gain = recommendation.expected_gain
    return (
        recommendation.severity != "error"
        and recommendation.id != NOT_THE_BOTTLENECK
        and gain is not None
        and not gain.speeds_up
    )


def one_per_stage(ranked: List[Recommendation]) -> List[Recommendation]:
    """Keeps the first recommendation of each stage; the others join its evidence.

    Two findings on one stage (a sequential map that also calls Python) are
    one change to make there; a second line would double-count its gain.
    Errors, about what the model sees, always stay.
    """
    kept, by_stage = [], {}
    for recommendation in ranked:
        key = recommendation.stage_node or recommendation.stage
        first = by_stage.get(key) if key else None
        if first is None or recommendation.severity == "error" or first.severity == "error":
            kept.append(recommendation)
            if key and key not in by_stage:
                by_stage[key] = recommendation
            continue
        timed = ""
        gain = recommendation.expected_gain
        if gain is not None and gain.likely_speedup is not None:
            timed = f" Timed: {describe_gain(gain)}."
        elif gain is not None and recommendation.id == CACHE_MISSING:
            # One change, one gain: the cache's own figure, and why.
            timed = f" Its gain: {describe_gain(gain)}. {gain.statement}"
        first.evidence.append(
            Evidence(
                LINT,
                f"Also at this stage: {recommendation.title}.{timed} {recommendation.reason}",
            )
        )
        first.also.append(recommendation.id)
    return kept


def rank_key(recommendation: Recommendation, run: Optional[object] = None):
    gain = recommendation.expected_gain or ExpectedGain()
    return (
        _SEVERITY_RANK.get(recommendation.severity, len(_SEVERITY_RANK)),
        _figure_tier(recommendation),
        _looseness(gain, run),
        -(_own_figure(gain) or gain.speedup or 0.0),
    )


def _looseness(gain: ExpectedGain, run: Optional[object]) -> int:
    """How loose a bound is: 0 predicted (or measured), 1 a tighter ceiling, 2 the run's own.

    Among bounds, the tightest honest estimate ranks first: a prediction from
    the stage's profiled time (over the cores, or served by a cache), then a
    ceiling tighter than the run's "input free" one (the cores a parallel map
    may use, a stage's profiled share), then that ceiling itself, which every
    input change shares (a rewrite in TensorFlow ops gets it).
    """
    if gain.basis != BOUND or gain.likely_speedup is not None or gain.predicted_speedup:
        return 0
    ceiling = run.bound.speedup if run is not None and run.bound is not None else None
    if gain.speedup is not None and ceiling is not None and gain.speedup < 0.9 * ceiling:
        return 1
    return 2
