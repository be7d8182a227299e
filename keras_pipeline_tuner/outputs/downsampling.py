"""Per-step series summarised in blocks as a run grows, so outputs stay bounded.

Each of a run's first `full_steps` steps is a point of its own; later steps are
averaged in blocks of 10 up to 10x `full_steps`, of 100 up to 100x, and so on:
about 900 points a decade, the way Keras' `update_freq` thins its logs, so a
run of 100 000 steps writes 2 800 points, not 100 000. Both the TensorBoard
scalars and the dashboard's step rows are written through one of these.
"""

from typing import Optional, Tuple

import numpy as np


class BlockMeans:
    """Turns step rows, as they arrive, into points: one per step, then block means.

    A block not complete yet is kept as sums (the clock's ring may drop its rows
    before the block ends) and written when it completes, or at `final`.

    Args:
        full_steps: steps written one point each before blocks begin.

    Example:

    >>> blocks = BlockMeans(full_steps=2)
    >>> points, means = blocks.add(np.arange(1, 26), np.ones((25, 1)), final=True)
    >>> points.tolist()
    [1, 2, 10, 20, 25]
    """

    def __init__(self, full_steps: int):
        self.full_steps = full_steps
        # (end, last, count, measured per column, sums per column) of the open block.
        self._open: Optional[Tuple[int, int, float, np.ndarray, np.ndarray]] = None

    def reset(self) -> None:
        """Forgets the block in progress (a new run starts from step 1)."""
        self._open = None

    @property
    def pending(self) -> bool:
        """Whether a block is in progress."""
        return self._open is not None

    def add(self, numbers: np.ndarray, columns: np.ndarray, final: bool = False):
        """Adds steps and returns the points complete now.

        Args:
            numbers: the steps' run-wide numbers, increasing.
            columns: (steps, k) values per step; NaN where not observed.
            final: also return the block in progress (an epoch's or run's end).

        Returns:
            `(points, means)`: each point's last step number, and the (points, k)
            means of its steps' observed values (NaN where none was observed).
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
            ends, last = ends[starts], numbers[np.r_[starts[1:] - 1, numbers.size - 1]]
            count = np.add.reduceat(count, starts)
            measured = np.add.reduceat(measured, starts, axis=0)
            sums = np.add.reduceat(sums, starts, axis=0)
        else:
            ends = last = np.zeros(0, np.int64)
            measured = sums = np.zeros((0, width))
            count = np.zeros(0)
        if self._open is not None:
            end, open_last, open_count, open_measured, open_sums = self._open
            if ends.size and ends[0] == end:
                count[0] += open_count
                measured[0] += open_measured
                sums[0] += open_sums
            else:
                ends, last = np.r_[end, ends], np.r_[open_last, last]
                count = np.r_[open_count, count]
                measured = np.vstack([open_measured[None, :], measured])
                sums = np.vstack([open_sums[None, :], sums])
        self._open = None
        if ends.size and not final and last[-1] != ends[-1]:
            self._open = (int(ends[-1]), int(last[-1]), float(count[-1]), measured[-1], sums[-1])
            ends, last, count, measured, sums = (
                part[:-1] for part in (ends, last, count, measured, sums)
            )
        means = np.divide(sums, measured, out=np.full_like(sums, np.nan), where=measured > 0)
        return last.astype(np.int64), means
