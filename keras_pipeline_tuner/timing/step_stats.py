"""Statistics of step timings and the input-bound verdict.

The verdict uses the TF Profiler's thresholds so that the step clock and the
Profile tab agree: an input share of step time of 20 % or more is "highly
input-bound", 5 % to 20 % "moderately input-bound", below 5 % "not input-bound".
"""

import dataclasses
import enum
import math
from typing import Optional

import numpy as np

HIGHLY_INPUT_BOUND_FRACTION = 0.20
MODERATELY_INPUT_BOUND_FRACTION = 0.05
# A fetch of a batch already in memory takes at most about this long inside a
# step, even on a busy machine (a replay of cached batches measured 0.05-0.14
# ms quiet, 0.5-1.25 ms beside two busy loops here: the fetch's op, and the
# timestamp after it, wait for a free thread like any op): a wait within it
# may be the fetch alone, and only the wait beyond it is the pipeline's for
# certain.
FETCH_FLOOR_BOUND_MS = 1.0


class Verdict(str, enum.Enum):
    """How much of the training step is spent waiting for input.

    Example:

    >>> Verdict.MODERATELY_INPUT_BOUND.input_bound, Verdict.UNKNOWN.input_bound
    (True, False)
    """

    HIGHLY_INPUT_BOUND = "highly input-bound"
    MODERATELY_INPUT_BOUND = "moderately input-bound"
    NOT_INPUT_BOUND = "not input-bound"
    # Only when the wait could not be separated from compute (see the report's notes).
    UNKNOWN = "unknown"

    def __str__(self) -> str:
        return self.value

    @property
    def input_bound(self) -> bool:
        """Whether the input costs enough of the step to be worth changing (5 % or more)."""
        return self in (Verdict.HIGHLY_INPUT_BOUND, Verdict.MODERATELY_INPUT_BOUND)


def verdict_for(input_fraction: Optional[float]) -> Verdict:
    """Classifies an input share of step time with the TF Profiler's thresholds.

    Args:
        input_fraction: share of step time spent waiting for input, in [0, 1], or
            `None` when it was not measured.

    Returns:
        The `Verdict`.

    Example:

    >>> verdict_for(0.5).value
    'highly input-bound'
    >>> verdict_for(0.01).value
    'not input-bound'
    """
    if input_fraction is None or math.isnan(input_fraction):
        return Verdict.UNKNOWN
    if input_fraction >= HIGHLY_INPUT_BOUND_FRACTION:
        return Verdict.HIGHLY_INPUT_BOUND
    if input_fraction >= MODERATELY_INPUT_BOUND_FRACTION:
        return Verdict.MODERATELY_INPUT_BOUND
    return Verdict.NOT_INPUT_BOUND


def beyond_fetch_bound(fraction: Optional[float], step_ms: Optional[float]) -> Optional[float]:
    """The share of step time waiting beyond `FETCH_FLOOR_BOUND_MS` a step: surely the pipeline's.

    What decides, where nothing measured the fetch of a ready batch (no replay
    ran): a sub-millisecond step on a busy machine waits most of its time at
    the fetch, its pipeline idle or not.

    Args:
        fraction: the share of step time waiting at the fetch.
        step_ms: the mean step time.

    Returns:
        The share beyond the bound (0 when within it), or `fraction` when
        either is unmeasured.

    Example:

    >>> round(beyond_fetch_bound(0.85, 0.77), 2), round(beyond_fetch_bound(0.9, 30.0), 3)
    (0.0, 0.867)
    """
    if fraction is None or not step_ms or step_ms <= 0:
        return fraction
    return max(fraction - FETCH_FLOOR_BOUND_MS / step_ms, 0.0)


def format_ms(value: Optional[float]) -> str:
    """A duration in milliseconds as text for tables: two decimals, "-" if unmeasured.

    Args:
        value: milliseconds, or `None`.

    Returns:
        The text.

    Example:

    >>> format_ms(14.7112), format_ms(None)
    ('14.71', '-')
    """
    return "-" if value is None else f"{value:.2f}"


def step_seconds(wait_s: np.ndarray, compute_s: np.ndarray) -> np.ndarray:
    """Each step's time: its input wait plus its compute.

    Where the wait was not observed (NaN) the compute holds the whole step, so
    the step time is the compute alone: never NaN for a measured step. The one
    rule for the clock, the report and every output.

    Args:
        wait_s: input wait per step, NaN where not observed.
        compute_s: compute per step (the whole step where the wait is NaN).

    Returns:
        Step time per step, in the same unit.

    Example:

    >>> step_seconds(np.array([0.02, np.nan]), np.array([0.01, 0.05])).round(3).tolist()
    [0.03, 0.05]
    """
    wait_s = np.asarray(wait_s, dtype=np.float64)
    compute_s = np.asarray(compute_s, dtype=np.float64)
    return np.where(np.isnan(wait_s), compute_s, wait_s + compute_s)


@dataclasses.dataclass
class Distribution:
    """Mean, median, quartiles and 90th percentile of one timing, in milliseconds.

    Attributes:
        mean_ms: the mean.
        median_ms: the median.
        p90_ms: the 90th percentile.
        p25_ms: the first quartile; `None` in reports written before the
            quartiles were kept.
        p75_ms: the third quartile; `None` there too.

    Example:

    >>> timing = Distribution.of_seconds(np.array([0.010, 0.020, 0.030, 0.040]))
    >>> round(timing.median_ms, 1), round(timing.p25_ms, 1), round(timing.p75_ms, 1)
    (25.0, 17.5, 32.5)
    """

    mean_ms: Optional[float] = None
    median_ms: Optional[float] = None
    p90_ms: Optional[float] = None
    p25_ms: Optional[float] = None
    p75_ms: Optional[float] = None

    @classmethod
    def of_seconds(cls, values: np.ndarray) -> "Distribution":
        """Summarises timings given in seconds; NaNs (not measured) are ignored.

        Args:
            values: 1-D array of durations in seconds.

        Returns:
            A `Distribution` in milliseconds, all `None` when nothing was measured.
        """
        values = np.asarray(values, dtype=np.float64)
        values = values[~np.isnan(values)]
        if values.size == 0:
            return cls()
        p25_s, p75_s, p90_s = np.percentile(values, [25, 75, 90])
        return cls(
            mean_ms=float(values.mean() * 1e3),
            median_ms=float(np.median(values) * 1e3),
            p90_ms=float(p90_s * 1e3),
            p25_ms=float(p25_s * 1e3),
            p75_ms=float(p75_s * 1e3),
        )


@dataclasses.dataclass
class StepStats:
    """Timing statistics of a set of steps.

    Attributes:
        steps: number of steps summarised.
        input_wait: time each step waited for its batch (`get_next`).
        compute: time each step computed, from batch ready to updated weights.
        step: input wait plus compute.
        host_gap: time between one step's end and the next one's start, spent in
            Python (Keras' loop and callbacks); not part of the step.
        input_fraction: total input wait over total step time; `None` when the
            wait could not be separated from compute. Evidence: the run's
            verdict and its input share are decided once, from this and the
            rest of the evidence (`advice.verdict.judge`), and shown from the
            report's `figures`.
    """

    steps: int = 0
    input_wait: Distribution = dataclasses.field(default_factory=Distribution)
    compute: Distribution = dataclasses.field(default_factory=Distribution)
    step: Distribution = dataclasses.field(default_factory=Distribution)
    host_gap: Distribution = dataclasses.field(default_factory=Distribution)
    input_fraction: Optional[float] = None

    @classmethod
    def from_arrays(
        cls,
        wait_s: np.ndarray,
        compute_s: np.ndarray,
        gap_s: Optional[np.ndarray] = None,
    ) -> "StepStats":
        """Summarises per-step durations given in seconds.

        Args:
            wait_s: input wait per step; NaN where it could not be measured.
            compute_s: compute per step (whole step where the wait is NaN).
            gap_s: host time between steps, NaN where undefined.

        Returns:
            A `StepStats`.

        Example:

        >>> stats = StepStats.from_arrays(np.array([0.03, 0.03]), np.array([0.01, 0.01]))
        >>> round(stats.input_fraction, 2)
        0.75
        """
        wait_s = np.asarray(wait_s, dtype=np.float64)
        compute_s = np.asarray(compute_s, dtype=np.float64)
        step_s = step_seconds(wait_s, compute_s)
        measured = ~np.isnan(wait_s)
        fraction = None
        if measured.any():
            total = step_s[measured].sum()
            fraction = float(wait_s[measured].sum() / total) if total > 0 else 0.0
        return cls(
            steps=int(step_s.size),
            input_wait=Distribution.of_seconds(wait_s),
            compute=Distribution.of_seconds(np.where(measured, compute_s, np.nan)),
            step=Distribution.of_seconds(step_s),
            host_gap=Distribution.of_seconds(
                np.asarray(gap_s if gap_s is not None else [], dtype=np.float64)
            ),
            input_fraction=fraction,
        )
