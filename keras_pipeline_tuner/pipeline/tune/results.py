"""What `tune` measured and changed: the result, and what became of each rewrite.

Plain data: `TuneResult` for `tune`, `RewriteOutcome` for each rewrite it
considered, `TimedRewrite` for a rewrite `time_rewrites` timed on its own, the
statuses an outcome can have, and the rule by which a rewrite is kept.
"""

import dataclasses
import math
import statistics
from typing import List
from typing import Optional
from typing import Sequence

# What became of a rewrite (`RewriteOutcome.status`).
KEPT = "kept"
SLOWER = "not faster"
CHANGED_ELEMENTS = "changed the elements"
FAILED = "failed"
NOT_MEASURED = "not measured"
NOT_APPLICABLE = "not applicable"
UNVERIFIED = "not proven"
# Timed only, by `time_rewrites`: neither kept nor refused.
MEASURED = "measured"

# The least a rewrite must bring to be kept: 3 % less time per pass. The
# advice holds a CPU quota's private thread pool to it too.
DEFAULT_MIN_GAIN = 0.03


def fast_enough_to_keep(ratio: float, min_gain: float = DEFAULT_MIN_GAIN) -> bool:
    """Whether a rewrite timed at `ratio` (time with it over time without) is kept.

    Example:

    >>> fast_enough_to_keep(0.96), fast_enough_to_keep(0.98)
    (True, False)
    """
    return ratio <= 1.0 - min_gain


# Share of a final comparison's rounds in which the tuned pipeline must be the
# faster one: a median alone can come from one lucky round in three.
FASTER_ROUNDS_SHARE = 0.75


def not_delivered(
    original_times: Sequence[float], tuned_times: Sequence[float], min_gain: float
) -> Optional[str]:
    """Why a tuned pipeline is not faster than the original beyond the noise, or `None`.

    The tuned pipeline and the original are timed in alternating rounds; the
    tuned one is delivered only when the median of the per-round ratios
    (tuned over original) is at least `min_gain` under 1 and it was the faster
    one in `FASTER_ROUNDS_SHARE` of the rounds or more.

    Args:
        original_times: the original's pass times, one per round.
        tuned_times: the tuned pipeline's, from the same rounds.
        min_gain: the least speed-up to deliver (0.03 = 3 % less time).

    Returns:
        The reason, with its figures, or `None` when the tuned pipeline is faster.

    Example:

    >>> not_delivered([1.0, 1.0, 1.0], [0.8, 0.82, 0.79], 0.03) is None
    True
    >>> not_delivered([1.0, 1.0, 1.0], [1.5, 1.52, 1.49], 0.03)
    "the tuned pipeline took 1.50x the original's time (median of 3 alternated rounds)"
    >>> not_delivered([1.0, 1.0, 1.0], [0.8, 0.9, 1.05], 0.03)
    'the tuned pipeline was faster in only 2 of 3 alternated rounds (median ratio 0.90)'
    """
    ratios = [tuned / original for tuned, original in zip(tuned_times, original_times) if original]
    if not ratios:
        return "the final comparison has no timed round"
    median = statistics.median(ratios)
    rounds = len(ratios)
    if median >= 1.0:
        return (
            f"the tuned pipeline took {median:.2f}x the original's time (median of {rounds} "
            "alternated rounds)"
        )
    if not fast_enough_to_keep(median, min_gain):
        return (
            f"the tuned pipeline took {median:.2f}x the original's time (median of {rounds} "
            f"alternated rounds): not at least {min_gain:.0%} faster"
        )
    faster = sum(ratio < 1.0 for ratio in ratios)
    if faster < math.ceil(FASTER_ROUNDS_SHARE * rounds):
        return (
            f"the tuned pipeline was faster in only {faster} of {rounds} alternated rounds "
            f"(median ratio {median:.2f})"
        )
    return None


@dataclasses.dataclass
class RewriteOutcome:
    """A rewrite `tune` considered, and what became of it.

    Attributes:
        kind: "vectorize", "parallel-map", "parallel-interleave", "autotune",
            "parallel-batch", "map-fusion", "cache", "prefetch",
            "nondeterministic" (deterministic=False), "private-threadpool" or
            "autotune-off".
        stage: the stage as the user wrote it, e.g. "map(load)".
        change: the stage after the rewrite, as code.
        applied: whether the tuned dataset has it.
        status: "kept", "not faster", "changed the elements", "failed",
            "not measured" (the budget was spent, the rewrite is too slow to
            measure in the budget, or the limit of passes over Python code was
            reached; `reason` gives the figures), "not proven" (its elements
            cannot be proven equal and `allow_unverified` was not given) or
            "not applicable".
        ratio: median over rounds of the pass time with the rewrite over the
            pass time without it (the rewrites kept before it in both), timed
            side by side; below 1 is faster. `None` when not measured.
        rounds: how many side-by-side rounds `ratio` comes from.
        reason: why it was kept or not, in words.
        changes_order: whether it can change the order of the elements (for
            a rewrite that cannot be proven, such as parallel calls of a Python
            function: which element the function's state goes with).
        changes_determinism: whether it can change the elements' values from
            run to run (random numbers drawn in another order).
        caveat: what it assumes about the user's code, if anything.
        verified: False when the elements could not be proven equal (e.g. a
            Python function called from several threads) and it was kept
            because `allow_unverified=True`.
        elements_check: how its elements were compared with the pipeline's
            without it: "equal" (same values in the same order), "equal within
            rtol=..." (floating-point values, after vectorisation), "same
            elements, any order" (it may reorder) or "structure" (the pipeline
            is random: number, types and shapes only); empty when not run.
    """

    kind: str
    stage: str
    change: str = ""
    applied: bool = False
    status: str = NOT_APPLICABLE
    ratio: Optional[float] = None
    rounds: int = 0
    reason: str = ""
    changes_order: bool = False
    changes_determinism: bool = False
    caveat: Optional[str] = None
    verified: bool = True
    elements_check: str = ""

    @property
    def speedup(self) -> Optional[float]:
        """How many times faster the rewrite made the pipeline (1 / ratio)."""
        return None if not self.ratio else 1.0 / self.ratio


@dataclasses.dataclass
class TuneResult:
    """What `tune` measured and changed.

    All times are medians of passes timed side by side in the same run; a pass
    is `epochs` epochs of at most `batches_per_epoch` batches, each followed by
    a simulated training step of `consumer_step_s` seconds. Passes of
    `batches_per_epoch` batches time the steady state: a cache in them is
    filled first, untimed, with the elements the passes read (said in `notes`).

    Attributes:
        original_s: seconds per pass of the original pipeline.
        tuned_s: seconds per pass of the tuned pipeline.
        ratio: median over rounds of tuned / original pass time; 1.0 when
            nothing was changed. Below 1 is faster.
        rounds: how many rounds `ratio` comes from.
        rewrites: every rewrite considered, with its own measured ratio.
        elements_check: how the tuned elements were checked: "equal" (same
            elements in the same order as the original's first epoch), "equal
            within rtol=..." (the same, floating-point values within that
            tolerance: a kept vectorised map), "same
            elements, any order" (a kept rewrite may reorder them) or
            "structure" (the pipeline is random: same number, types and shapes).
        pipeline: the original pipeline, as code.
        tuned_pipeline: the tuned pipeline, as code.
        epochs: epochs per pass.
        batches_per_epoch: batches per epoch (`None`: whole epochs).
        consumer_step_s: the simulated training step, if any.
        elapsed_s: how long tuning took.
        notes: caveats in plain words.
        code: the tuned pipeline as Python to paste in place of the original
            lines, with the user's function names (empty when nothing changed).
        epochs_run: how many epochs of the pipeline tuning ran, checks
            included (each runs the user's functions and their side effects).
        epoch_limit: the most epochs tuning could run, for a pipeline that
            calls Python; `None` when only the time budget bounds it.

    Example:

    ```python
    tuned_ds, result = kpt.tune(train_ds, consumer_step_s=0.01)
    print(f"{result.speedup:.2f}x", [r.change for r in result.applied])
    print(result.code)   # the tuned lines, to paste in place of the original
    ```
    """

    original_s: float
    tuned_s: float
    ratio: float = 1.0
    rounds: int = 0
    rewrites: List[RewriteOutcome] = dataclasses.field(default_factory=list)
    elements_check: str = "equal"
    pipeline: str = ""
    tuned_pipeline: str = ""
    epochs: int = 2
    batches_per_epoch: Optional[int] = None
    consumer_step_s: Optional[float] = None
    elapsed_s: float = 0.0
    notes: List[str] = dataclasses.field(default_factory=list)
    code: str = ""
    epochs_run: int = 0
    epoch_limit: Optional[int] = None

    @property
    def speedup(self) -> float:
        """How many times faster the tuned pipeline is (1 / ratio)."""
        return 1.0 / self.ratio if self.ratio > 0 else math.inf

    @property
    def applied(self) -> List[RewriteOutcome]:
        """The rewrites the tuned dataset has."""
        return [outcome for outcome in self.rewrites if outcome.applied]

    @property
    def changes_order(self) -> bool:
        """Whether any applied rewrite can change the order of the elements."""
        return any(outcome.changes_order for outcome in self.applied)

    @property
    def changes_determinism(self) -> bool:
        """Whether any applied rewrite can change the elements from run to run."""
        return any(outcome.changes_determinism for outcome in self.applied)


@dataclasses.dataclass
class TimedRewrite:
    """One rewrite timed on its own against the pipeline as written (`time_rewrites`).

    Attributes:
        outcome: the `RewriteOutcome`: `status` is "measured" when it was
            timed (`ratio` is then its median per-round time ratio), else why
            not ("not proven", "not measured", "failed", "changed the
            elements", "not applicable").
        without_s: median seconds per pass of the pipeline as written.
        with_s: median seconds per pass with the rewrite.
        batches: batches (elements of the final dataset) per pass.
    """

    outcome: RewriteOutcome
    without_s: Optional[float] = None
    with_s: Optional[float] = None
    batches: int = 0
