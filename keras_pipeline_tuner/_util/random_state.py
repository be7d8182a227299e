"""Python's and NumPy's global random state, kept across work the tuner does for itself."""

import contextlib
import random
from typing import Iterator

import numpy as np


@contextlib.contextmanager
def preserved_random_state() -> Iterator[None]:
    """Restores Python's and NumPy's global random generators after the block.

    The user's Python functions (a `tf.py_function` in a map) may draw from
    them; when the tuner runs those functions for its own measurements, the
    user's next draws must be the ones they would have been without it.

    Example:

    >>> with preserved_random_state():
    ...     _ = np.random.random()
    """
    python_state = random.getstate()
    numpy_state = np.random.get_state()
    try:
        yield
    finally:
        random.setstate(python_state)
        np.random.set_state(numpy_state)
