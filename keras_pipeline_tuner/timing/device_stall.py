"""Input wait under asynchronous dispatch: how long the device sat idle for a batch.

On the JAX backend a step's compiled call returns long before the step is done,
so the loop fetches the next batch while the device still computes the previous
step. Time spent inside `next()` is then not wait: the device waited only for
the part of the fetch that outlasted the previous step,

    stall = max(0, ready - max(start, end of the previous step)),

where a step ends when its outputs are ready. This module turns the raw stamps
into the step clock's (start, ready, end) rows so that `ready - start` is
that stall.
"""

from typing import Tuple

import numpy as np


def stall_rows(
    fetches: np.ndarray, ends: np.ndarray, previous_end: float = float("nan")
) -> Tuple[np.ndarray, float]:
    """Step clock rows whose input wait is the device's idle wait for each batch.

    Args:
        fetches: (n, 2) array of when each step's batch fetch began and when
            the batch was there (seconds), in step order.
        ends: the n steps' ends: when their outputs were ready, NaN for a step
            whose end is unknown (that step is left out).
        previous_end: when the step before the first one ended; NaN when
            there was none (then the first fetch is all wait).

    Returns:
        `(rows, last_end)`: an (m, 3) array of `(start, ready, end)` with
        `start` moved to the previous step's end when the fetch began while
        that step still computed, and `ready` no earlier than `start`; and the
        last step's end, to pass as `previous_end` with the steps that follow.
        Steps end in order, so an end stamped earlier than the previous one
        (stamps taken on several threads) is read as that previous one.

    Example:

    >>> fetches = np.array([[0.0, 0.08], [0.09, 0.10]])
    >>> rows, last_end = stall_rows(fetches, np.array([0.11, 0.14]), previous_end=0.03)
    >>> rows.round(2).tolist()  # 50 ms of idle device, then a fetch the step hid
    [[0.03, 0.08, 0.11], [0.11, 0.11, 0.14]]
    >>> round(last_end, 2)
    0.14
    """
    fetches = np.asarray(fetches, dtype=np.float64).reshape(-1, 2)
    ends = np.asarray(ends, dtype=np.float64).reshape(-1)
    known = ~np.isnan(ends)
    fetches, ends = fetches[known], ends[known]
    if not ends.size:
        return np.empty((0, 3)), previous_end
    ends = np.fmax.accumulate(np.concatenate([[previous_end], ends]))
    # fmax: a NaN previous end (the first step) leaves the fetch's start.
    start = np.fmax(fetches[:, 0], ends[:-1])
    ready = np.maximum(fetches[:, 1], start)
    return np.column_stack([start, ready, ends[1:]]), float(ends[-1])
