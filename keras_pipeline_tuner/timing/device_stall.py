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

import math
from typing import Optional, Tuple


def stall_row(
    start: float, ready: float, end: float, previous_end: Optional[float]
) -> Tuple[float, float, float]:
    """A step clock row whose input wait is the device's idle wait for the batch.

    Args:
        start: when the fetch of the step's batch began (seconds).
        ready: when the batch was there.
        end: when the step's outputs were ready.
        previous_end: when the previous step's outputs were ready, or `None`
            for the first step (then the whole fetch is wait).

    Returns:
        `(start, ready, end)` with `start` moved to the previous step's end when
        the fetch began while that step still computed, and `ready` no earlier
        than `start`.

    Example:

    >>> stall_row(0.0, 0.08, 0.11, previous_end=0.03)  # 50 ms of idle device
    (0.03, 0.08, 0.11)
    >>> stall_row(0.0, 0.02, 0.06, previous_end=0.03)  # fetch hidden by the step
    (0.03, 0.03, 0.06)
    """
    begin = start
    if previous_end is not None and not math.isnan(previous_end):
        begin = max(start, previous_end)
    return (begin, max(ready, begin), end)
