"""Step rows kept back on the training thread and handed to the step clock together.

Making the clock's rows from one step costs some tens of microseconds of NumPy
work, whatever the number of rows: as much as a fast step itself. So a run keeps
each call's rows here (a list append) and hands them to the clock in `flush`,
about once a second, at each epoch's end and before any output is written.
"""

from typing import Callable
from typing import Dict
from typing import List

import numpy as np

from keras_pipeline_tuner.timing.step_clock import TRAIN
from keras_pipeline_tuner.timing.step_clock import VALIDATION

# (kind, rows as an (n, 3) array, when the first of them was called).
Record = Callable[[str, np.ndarray, float], None]


class HeldRows:
    """Calls' `(start, ready, end)` rows, kept back per kind until `flush`.

    Args:
        record: called in `flush` with `(kind, rows, called_at)` for each kind
            that holds rows: an (n, 3) array, and when its first call began.

    Example:

    >>> handed = []
    >>> held = HeldRows(lambda kind, rows, called_at: handed.append((kind, len(rows))))
    >>> held.add("train", (0.3, 0.3, 0.4), called_at=0.3)
    >>> held.add("train", np.array([[0.4, 0.4, 0.5], [0.5, 0.5, 0.6]]), called_at=0.4)
    >>> handed
    []
    >>> held.flush()
    >>> handed
    [('train', 3)]
    """

    def __init__(self, record: Record):
        self._record = record
        self._held: Dict[str, List] = {TRAIN: [], VALIDATION: []}
        self._called_at: Dict[str, float] = {}

    def add(self, kind: str, rows, called_at: float) -> None:
        """Keeps one call's rows: one `(start, ready, end)` row, or an (n, 3) array."""
        held = self._held[kind]
        if not held:
            self._called_at[kind] = called_at
        held.append(rows)

    def flush(self) -> None:
        """Hands over every kind's rows kept back, a kind at a time."""
        for kind, held in self._held.items():
            count = len(held)
            if not count:
                continue
            taken = held[:count]
            # Rows appended meanwhile (by another thread) stay, after these.
            del held[:count]
            try:
                rows = np.array(taken, dtype=np.float64).reshape(-1, 3)
            except ValueError:
                # Calls of several steps, or of as many rows as differ.
                rows = np.concatenate([np.reshape(part, (-1, 3)) for part in taken])
            called_at = self._called_at.pop(kind)
            if len(rows):
                self._record(kind, rows, called_at)
