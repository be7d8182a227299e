"""Step rows made small enough to draw: every row when few, mean/max buckets when many.

A run of 100 000 steps is too much to send to a browser and draw; a screen shows
a few thousand marks at most. The server sends every row of the range asked for
when it holds at most `points` rows, and otherwise one bucket per group of
consecutive rows with the group's mean and largest wait, compute and step, so
that a zoomed range (a narrower `first`-`last`) comes back in full detail. Past a
fit's first steps a row itself stands for a block of steps (see
`summaries.STEP_COLUMNS`): each mark says the steps it covers (`step`-`last`).
"""

import dataclasses
from typing import Dict
from typing import List
from typing import Optional

import numpy as np

DEFAULT_POINTS = 2000
MAX_POINTS = 20000


@dataclasses.dataclass
class StepSeries:
    """Step rows of a range of steps, as sent to the dashboard.

    Times are in milliseconds; `start_s` in seconds since the Unix epoch.

    Attributes:
        total_steps: how many step rows the run holds.
        first_step: the first step number the run holds (0 when none).
        last_step: the last step number the run holds (0 when none).
        bucket_steps: stored rows per mark: 1 when every row is its own mark.
        single_steps: whether every mark is one step (no row or bucket of a
            block of steps).
        step: per mark, the first step number it covers.
        last: per mark, the last step number it covers.
        epoch: per mark, the epoch of its first step.
        start_s: per mark, when its first step started.
        end_s: per mark, when its last step ended.
        wait_ms: per mark, the mean input wait of its steps.
        compute_ms: per mark, the mean compute of its steps.
        wait_max_ms: per mark, the largest input wait among its steps.
        compute_max_ms: per mark, the largest compute among its steps.
        step_max_ms: per mark, the largest step time among its steps.
        epochs: the epochs' starts: `{"epoch", "step", "start_s"}` per epoch
            (over the whole run, not only the range).
    """

    total_steps: int = 0
    first_step: int = 0
    last_step: int = 0
    bucket_steps: int = 1
    single_steps: bool = True
    step: List[int] = dataclasses.field(default_factory=list)
    last: List[int] = dataclasses.field(default_factory=list)
    epoch: List[int] = dataclasses.field(default_factory=list)
    start_s: List[float] = dataclasses.field(default_factory=list)
    end_s: List[float] = dataclasses.field(default_factory=list)
    wait_ms: List[Optional[float]] = dataclasses.field(default_factory=list)
    compute_ms: List[Optional[float]] = dataclasses.field(default_factory=list)
    wait_max_ms: List[Optional[float]] = dataclasses.field(default_factory=list)
    compute_max_ms: List[Optional[float]] = dataclasses.field(default_factory=list)
    step_max_ms: List[Optional[float]] = dataclasses.field(default_factory=list)
    epochs: List[Dict[str, float]] = dataclasses.field(default_factory=list)


def downsample(
    rows: np.ndarray,
    first: Optional[int] = None,
    last: Optional[int] = None,
    points: int = DEFAULT_POINTS,
) -> StepSeries:
    """The steps `first`-`last` of `rows`, at most `points` marks.

    Args:
        rows: float64 array of rows `summaries.STEP_COLUMNS`, times in
            seconds, sorted by step; wait is NaN where it was not measured.
        first: first step number of the range; the run's first by default.
        last: last step number of the range; the run's last by default.
        points: at most this many marks.

    Returns:
        A `StepSeries`.

    Raises:
        ValueError: if `points` is not between 1 and `MAX_POINTS`.

    Example:

    >>> rows = np.array([[n, 0, n * 0.1, 0.08, 0.02, n, 0.08, 0.02, 0.1] for n in range(1, 101)])
    >>> series = downsample(rows, points=10)
    >>> series.bucket_steps, len(series.step), series.wait_ms[0]
    (10, 10, 80.0)
    >>> len(downsample(rows, first=1, last=10, points=10).step)
    10
    """
    if not 1 <= points <= MAX_POINTS:
        raise ValueError(f"`points` must be between 1 and {MAX_POINTS}, got {points}.")
    series = StepSeries()
    if rows.shape[0] == 0:
        return series
    numbers = rows[:, 0]
    series.total_steps = int(rows.shape[0])
    series.first_step, series.last_step = int(numbers[0]), int(numbers[-1])
    epoch_starts = np.flatnonzero(np.diff(rows[:, 1], prepend=np.nan) != 0)
    series.epochs = [
        {"epoch": int(rows[i, 1]), "step": int(numbers[i]), "start_s": float(rows[i, 2])}
        for i in epoch_starts
    ]
    low = np.searchsorted(numbers, series.first_step if first is None else first, "left")
    high = np.searchsorted(numbers, series.last_step if last is None else last, "right")
    selected = rows[low:high]
    if selected.shape[0] == 0:
        return series
    size = max(1, -(-selected.shape[0] // points))  # ceil: at most `points` buckets
    series.bucket_steps = size
    edges = np.arange(0, selected.shape[0], size)
    wait, compute = selected[:, 3], selected[:, 4]
    # A row of a block of steps counts as many steps as it covers.
    counts = selected[:, 0] - selected[:, 5] + 1
    ends = selected[:, 2] + counts * (np.nan_to_num(wait) + compute)
    series.step = np.minimum.reduceat(selected[:, 5], edges).astype(np.int64).tolist()
    last_rows = np.minimum(edges + size, selected.shape[0]) - 1
    series.last = selected[last_rows, 0].astype(np.int64).tolist()
    series.single_steps = bool(series.step == series.last)
    series.epoch = selected[edges, 1].astype(np.int64).tolist()
    series.start_s = selected[edges, 2].tolist()
    series.end_s = np.maximum.reduceat(ends, edges).tolist()
    series.wait_ms = _ms(_bucket_mean(wait, counts, edges))
    series.compute_ms = _ms(_bucket_mean(compute, counts, edges))
    series.wait_max_ms = _ms(_bucket_max(selected[:, 6], edges))
    series.compute_max_ms = _ms(_bucket_max(selected[:, 7], edges))
    series.step_max_ms = _ms(_bucket_max(selected[:, 8], edges))
    return series


def _bucket_mean(values: np.ndarray, weights: np.ndarray, edges: np.ndarray) -> np.ndarray:
    measured = ~np.isnan(values)
    sums = np.add.reduceat(np.where(measured, values * weights, 0.0), edges)
    counts = np.add.reduceat(np.where(measured, weights, 0.0), edges)
    return np.divide(sums, counts, out=np.full(sums.shape, np.nan), where=counts > 0)


def _bucket_max(values: np.ndarray, edges: np.ndarray) -> np.ndarray:
    maxima = np.maximum.reduceat(np.where(np.isnan(values), -np.inf, values), edges)
    return np.where(np.isinf(maxima), np.nan, maxima)


def _ms(seconds: np.ndarray) -> List[Optional[float]]:
    # JSON has no NaN: a step whose wait was not measured is null.
    return [None if np.isnan(value) else round(float(value) * 1e3, 4) for value in seconds]
