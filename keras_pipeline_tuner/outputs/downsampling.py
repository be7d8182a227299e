"""Per-step series summarised in blocks as a run grows, so outputs stay bounded.

Each of a run's first `full_steps` steps is a point of its own; later steps are
averaged in blocks of 10 up to 10x `full_steps`, of 100 up to 100x, and so on:
about 900 points a decade, the way Keras' `update_freq` thins its logs, so a
run of 100 000 steps writes 2 800 points, not 100 000. Both the TensorBoard
scalars and the dashboard's step rows are written through one of these.
"""

import dataclasses
from typing import Optional

import numpy as np


@dataclasses.dataclass
class Points:
    """Points made of step rows: each a step, or a block of steps.

    Attributes:
        last: each point's last step number.
        first: each point's first step number (`last` for a single step).
        means: (points, k) means of its steps' observed values (NaN where none).
        minima: (points, k) smallest observed values.
        maxima: (points, k) largest observed values: a stall in a block of
            steps stays visible in its maximum, where the mean hides it.
    """

    last: np.ndarray
    first: np.ndarray
    means: np.ndarray
    minima: np.ndarray
    maxima: np.ndarray


class BlockMeans:
    """Turns step rows, as they arrive, into points: one per step, then block means.

    A block not complete yet is kept as sums (the clock's ring may drop its rows
    before the block ends) and written when it completes, or at `final`.

    Args:
        full_steps: steps written one point each before blocks begin.

    Example:

    >>> blocks = BlockMeans(full_steps=2)
    >>> points = blocks.add(np.arange(1, 26), np.arange(1.0, 26.0)[:, None], final=True)
    >>> points.last.tolist(), points.first.tolist(), points.maxima[:, 0].tolist()
    ([1, 2, 10, 20, 25], [1, 2, 3, 11, 21], [1.0, 2.0, 10.0, 20.0, 25.0])
    """

    def __init__(self, full_steps: int):
        self.full_steps = full_steps
        # The open block: end, first, last, count, measured, sums, minima, maxima.
        self._open: Optional[tuple] = None

    def reset(self) -> None:
        """Forgets the block in progress (a new run starts from step 1)."""
        self._open = None

    @property
    def pending(self) -> bool:
        """Whether a block is in progress."""
        return self._open is not None

    def add(self, numbers: np.ndarray, columns: np.ndarray, final: bool = False) -> Points:
        """Adds steps and returns the points complete now.

        Args:
            numbers: the steps' run-wide numbers, increasing.
            columns: (steps, k) values per step; NaN where not observed.
            final: also return the block in progress (an epoch's or run's end).

        Returns:
            The `Points` complete now.
        """
        numbers = np.asarray(numbers, dtype=np.int64)
        columns = np.asarray(columns, dtype=np.float64)
        if columns.ndim == 1:
            columns = columns[:, None]
        width = columns.shape[1]
        measured = (~np.isnan(columns)).astype(np.float64)
        sums = np.nan_to_num(columns, nan=0.0)
        count = np.ones(numbers.size)
        if numbers.size:
            ratio = np.maximum(numbers / self.full_steps, 1.0)
            size = np.where(
                numbers <= self.full_steps, 1, 10 ** np.ceil(np.log10(ratio))
            ).astype(np.int64)
            ends = (numbers + size - 1) // size * size
            starts = np.flatnonzero(np.r_[True, ends[1:] != ends[:-1]])
            ends, first = ends[starts], numbers[starts]
            last = numbers[np.r_[starts[1:] - 1, numbers.size - 1]]
            count = np.add.reduceat(count, starts)
            measured = np.add.reduceat(measured, starts, axis=0)
            sums = np.add.reduceat(sums, starts, axis=0)
            minima = np.fmin.reduceat(columns, starts, axis=0)
            maxima = np.fmax.reduceat(columns, starts, axis=0)
        else:
            ends = first = last = np.zeros(0, np.int64)
            measured = sums = minima = maxima = np.zeros((0, width))
            count = np.zeros(0)
        parts = [ends, first, last, count, measured, sums, minima, maxima]
        if self._open is not None:
            if ends.size and ends[0] == self._open[0]:
                _merge_into_first(parts, self._open)
            else:
                parts = [
                    np.r_[held, part] if part.ndim == 1 else np.vstack([held[None, :], part])
                    for held, part in zip(self._open, parts)
                ]
        self._open = None
        ends, first, last = parts[0], parts[1], parts[2]
        if ends.size and not final and last[-1] != ends[-1]:
            self._open = tuple(part[-1] for part in parts)
            parts = [part[:-1] for part in parts]
        _, first, last, _, measured, sums, minima, maxima = parts
        means = np.divide(sums, measured, out=np.full_like(sums, np.nan), where=measured > 0)
        return Points(last.astype(np.int64), first.astype(np.int64), means, minima, maxima)


def _merge_into_first(parts, held) -> None:
    """Folds the block held open into the first new point, which continues it."""
    _, held_first, _, held_count, held_measured, held_sums, held_min, held_max = held
    parts[1][0] = held_first
    parts[3][0] += held_count
    parts[4][0] += held_measured
    parts[5][0] += held_sums
    parts[6][0] = np.fmin(parts[6][0], held_min)
    parts[7][0] = np.fmax(parts[7][0], held_max)
