"""What the advice is made of: recommendations, the evidence they rest on, their gains.

Plain data shared by the advisor, the scale-out rules and every output.
"""

import dataclasses
import math
from typing import List
from typing import Optional

from keras_pipeline_tuner.timing.step_stats import StepStats

# Where evidence comes from.
STEP_CLOCK = "step clock"
PROFILER = "profiler"
LINT = "pipeline inspection"
# The input's CPU use, against the budget, decided (`advice.cpu_contention`).
CPU_USE = "CPU use"
REPLAY = "what-if replay"
# The advised change itself, timed on the pipeline (`measure_fixes`).
FIX_TIMING = "fix timing"
# The user's own Python calls, timed where training made them.
USER_CALLS = "your Python, timed during training"
# tf.data's own statistics of the fit's iterator, and the capacity model on them.
LIVE_MODEL = "tf.data's live model"

# The advisor's own recommendation ids (the others are findings' ids).
NOT_THE_BOTTLENECK = "input-not-bottleneck"
BOTTLENECK_STAGE = "bottleneck-stage"
FIND_THE_BOTTLENECK = "input-bound"
# From the CPUs the job really has (`advice.cpu_limits`).
QUOTA_THREADS = "cpu-quota-threads"
QUOTA_WORKERS = "cpu-quota-workers"
THROTTLED = "cpu-throttled"

MEASURED = "measured"
# An upper bound: the measured ceiling (step / compute) or what removing a
# wait entirely would bring; the change itself may bring less.
BOUND = "bound"
ESTIMATED = "estimated"
# The change speeds up the first epoch only (a cache after the stage replays
# its output from then on): no steady-state gain.
FIRST_EPOCH_ONLY = "first epoch only"
# A cache in a fit that never reads an element twice: it is never read back.
NOT_READ_BACK = "never read back"

# A timed change that brings less than this is no clear gain: a few seconds
# of timing, on passes of a few batches, on a machine shared with the model
# and other work, varied by up to a fifth for the same change here.
LEAST_MEASURED_GAIN = 1.25
# A gain below this is not called "faster" (a ceiling this low is within the
# noise of a busy machine), and advice bringing no more is no speed fix.
LEAST_SHOWN_GAIN = 1.05


@dataclasses.dataclass
class Evidence:
    """One measured or observed fact a recommendation rests on.

    Attributes:
        source: where it comes from: "step clock", "profiler",
            "pipeline inspection", "what-if replay", "fix timing" or "your Python,
            timed during training".
        detail: the fact, in one sentence with its numbers.
    """

    source: str
    detail: str


@dataclasses.dataclass
class ExpectedGain:
    """How much faster training steps could get, and how that was worked out.

    Attributes:
        speedup: upper bound of step time now over step time after the change
            (e.g. 4.0: steps up to 4x faster); `None` when it cannot be bounded.
            When the change itself was timed, the figure that timing predicts
            (as `likely_speedup`).
        step_ms: mean training step time now.
        step_ms_after: mean step time `speedup` corresponds to.
        basis: "measured" when the figure is what was timed (a what-if
            replay of the step with input free, the change itself timed by
            `kpt.tune` or `measure_fixes`); "bound" when it is only a ceiling
            that the change need not reach (steps no faster than their
            compute; a profiled stage's share of the wait given back in full;
            a prefetch at most overlaps wait and compute); "first epoch only" for a
            stage whose output a later cache replays (no steady-state gain);
            "never read back" for a cache in a fit that reads no element twice;
            "estimated" otherwise.
        statement: the reasoning, in a sentence with its numbers.
        likely_speedup: what the change itself brought when it was timed
            (`PipelineTuner(measure_fixes=True)`); `None` otherwise.
        predicted_speedup: what the change should bring by the pipeline's
            capacity, from the profiler window's time in the stage: a
            sequential map given AUTOTUNE parallel calls spreads that time
            over the cores, a cache removes it from the passes that read it
            back. A prediction, shown beside the bound or the measured
            figure; `None` when no window timed the stage.
        timed: with `likely_speedup`, what was timed, as the figure's label
            says it: "the change timed", or "a replay of the change" where
            the change is the user's to write (copies of a generator read at
            once stand in for its work in a parallel map).
        reaches_compute: with `likely_speedup`, the figure is the fit's
            measured step over its compute: a cache read back whose timed
            batches came well under the compute (`measure_fixes`), so no
            noise of those few timed passes is in it. It then speeds up from
            `LEAST_SHOWN_GAIN`, not `LEAST_MEASURED_GAIN`.
    """

    speedup: Optional[float] = None
    step_ms: Optional[float] = None
    step_ms_after: Optional[float] = None
    basis: str = MEASURED
    statement: str = ""
    likely_speedup: Optional[float] = None
    predicted_speedup: Optional[float] = None
    timed: str = "the change timed"
    reaches_compute: bool = False

    @property
    def speeds_up(self) -> bool:
        """Whether the gain is one to call "faster": at least `LEAST_SHOWN_GAIN`.

        A timed change must reach `LEAST_MEASURED_GAIN` (unless
        `reaches_compute`); a ceiling below `LEAST_SHOWN_GAIN` (1.05x) is
        within the noise of a busy machine.

        Example:

        >>> ExpectedGain(speedup=1.03).speeds_up, ExpectedGain(speedup=1.5).speeds_up
        (False, True)
        """
        if self.likely_speedup is not None:
            least = LEAST_SHOWN_GAIN if self.reaches_compute else LEAST_MEASURED_GAIN
            return self.likely_speedup >= least
        if self.predicted_speedup is not None:
            # The change's own predicted figure, not the ceiling above it.
            return self.predicted_speedup >= LEAST_SHOWN_GAIN
        if self.basis in (FIRST_EPOCH_ONLY, NOT_READ_BACK):
            return False
        if self.speedup is None:
            # "Many times faster": input that is nearly all of the step.
            return self.step_ms is not None
        return self.speedup >= LEAST_SHOWN_GAIN


@dataclasses.dataclass
class Recommendation:
    """One change to make, with why and what it should bring.

    Attributes:
        id: a stable identifier: a finding's id (e.g. "sequential-map") or one of
            the advisor's own ("input-not-bottleneck", "bottleneck-stage",
            "input-bound").
        title: what to do, in one line.
        severity: "error" (the model sees wrong data), "warning" (the pipeline
            slows training) or "info".
        evidence: the `Evidence` it rests on, at least one.
        fix: the code to write, or an empty string when nothing is to change.
        expected_gain: the `ExpectedGain`; `None` for changes about correctness.
        stage: the tf.data stage it is about, e.g. "map(load_image)".
        reason: why it matters.
        stage_node: the stage's node in the dataset graph, when known: tells
            apart two stages written alike.
        also: ids of other findings about the same stage, folded into this
            one (one stage, one recommendation); their reasons are in
            `evidence`.

    Example:

    ```python
    top = tuner.report.recommendations[0]
    print(top.title, top.expected_gain.speedup)
    print(top.fix)
    ```
    """

    id: str
    title: str
    severity: str
    evidence: List[Evidence] = dataclasses.field(default_factory=list)
    fix: str = ""
    expected_gain: Optional[ExpectedGain] = None
    stage: Optional[str] = None
    reason: str = ""
    stage_node: Optional[str] = None
    also: List[str] = dataclasses.field(default_factory=list)


def free_input_gain(stats: StepStats) -> Optional[ExpectedGain]:
    """The most any input-pipeline change can bring: steps as fast as compute.

    Args:
        stats: `StepStats` of the training steps.

    Returns:
        The `ExpectedGain`, a bound (`speedup` is step time over compute time:
        the ceiling, which a change to the pipeline need not reach),
        or `None` when the input wait was not measured.

    Example:

    >>> import numpy as np
    >>> stats = StepStats.from_arrays(np.array([0.03, 0.03]), np.array([0.01, 0.01]))
    >>> round(free_input_gain(stats).speedup, 1)
    4.0
    """
    fraction = stats.input_fraction
    if fraction is None or stats.step.mean_ms is None:
        return None
    step_ms = stats.step.mean_ms
    compute_ms = stats.compute.mean_ms
    if compute_ms is None:
        compute_ms = step_ms * (1.0 - fraction)
    # The exact input fraction (over all steps, not only the retained ones)
    # gives the bound: step / compute = 1 / (1 - fraction).
    speedup = 1.0 / (1.0 - fraction) if fraction < 1.0 else None
    if speedup is None or compute_ms <= 0 or not math.isfinite(speedup):
        return ExpectedGain(
            None,
            step_ms,
            None,
            BOUND,
            f"Steps spend {fraction * 100:.1f} % of their {step_ms:.2f} ms waiting for "
            "input and almost nothing computing: free input would make them many times "
            "faster.",
        )
    return ExpectedGain(
        speedup,
        step_ms,
        compute_ms,
        BOUND,
        f"If input were free a step would take about its compute time, {compute_ms:.2f} ms "
        f"instead of {step_ms:.2f} ms: at most {speedup:.2f}x faster.",
    )


def describe_gain(gain: Optional[ExpectedGain]) -> str:
    """A short phrase for an expected gain, e.g. "up to 3.90x faster (measured)".

    Args:
        gain: the `ExpectedGain`, or `None` (a change about correctness).

    Returns:
        The phrase.

    One figure, the change's own: what timing the change measured
    (`likely_speedup`; below `LEAST_MEASURED_GAIN`, 1.25x, no clear gain),
    else what the evidence predicts it brings (`predicted_speedup`), else
    the bound (see `ExpectedGain.speeds_up`); the others stay in the
    statement.

    Example:

    >>> describe_gain(ExpectedGain(speedup=2.0, basis="estimated"))
    'up to 2.00x faster (estimated)'
    >>> describe_gain(ExpectedGain(speedup=1.0, basis="measured"))
    'no gain (measured)'
    >>> describe_gain(ExpectedGain(speedup=9.0, likely_speedup=3.0))
    '3.00x faster (measured: the change timed)'
    >>> describe_gain(ExpectedGain(speedup=9.0, likely_speedup=1.9,
    ...                            timed="a replay of the change"))
    '1.90x faster (measured: a replay of the change)'
    >>> describe_gain(ExpectedGain(speedup=9.0, likely_speedup=1.04))
    'no clear gain (measured: the change timed, 1.04x)'
    >>> describe_gain(ExpectedGain(speedup=1.2, likely_speedup=1.12, reaches_compute=True))
    '1.12x faster (measured: the change timed)'
    >>> describe_gain(ExpectedGain(speedup=1.02, basis="bound"))
    'no clear gain (bound: up to 1.02x)'
    >>> describe_gain(ExpectedGain(speedup=1.0, basis="never read back"))
    'no gain: this fit never reads a cache back'
    >>> describe_gain(ExpectedGain(speedup=40.0, basis="bound", predicted_speedup=1.9))
    '1.90x faster (predicted)'
    >>> describe_gain(ExpectedGain(speedup=3.0, basis="bound", predicted_speedup=1.01))
    'no clear gain (predicted: 1.01x)'
    """
    if gain is None:
        return "correctness, not speed"
    return _described(gain)


def _described(gain: ExpectedGain) -> str:
    if gain.likely_speedup is not None:
        if not gain.speeds_up:
            return f"no clear gain (measured: {gain.timed}, {gain.likely_speedup:.2f}x)"
        return f"{gain.likely_speedup:.2f}x faster (measured: {gain.timed})"
    if gain.predicted_speedup is not None and gain.basis not in (FIRST_EPOCH_ONLY, NOT_READ_BACK):
        if not gain.speeds_up:
            return f"no clear gain (predicted: {gain.predicted_speedup:.2f}x)"
        return f"{gain.predicted_speedup:.2f}x faster (predicted)"
    if gain.speedup is None:
        if gain.step_ms is None:
            return "gain not measured"
        return f"many times faster ({gain.basis})"
    if gain.basis == FIRST_EPOCH_ONLY:
        return "first epoch only: a cache replays it after"
    if gain.basis == NOT_READ_BACK:
        return "no gain: this fit never reads a cache back"
    if gain.speedup <= 1.0:
        return f"no gain ({gain.basis})"
    if not gain.speeds_up:
        return f"no clear gain ({gain.basis}: up to {gain.speedup:.2f}x)"
    return f"up to {gain.speedup:.2f}x faster ({gain.basis})"
