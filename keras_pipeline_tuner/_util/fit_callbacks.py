"""The callbacks of the `fit` that is running, seen from one of them.

A Keras callback is not told which other callbacks share its fit. The tuner needs
to know in two cases: a `keras.callbacks.TensorBoard` that will profile (its window
wins over the tuner's), and a second `PipelineTuner` (refused). Keras'
`CallbackList` that calls the hooks is found among the calling frames, read only.
"""

import inspect
from typing import List

# Frames searched above the caller (the tuner's hook is called from the
# `CallbackList`, through a few frames of the tuner's own).
_MAX_FRAMES = 12


def current_fit_callbacks() -> List[object]:
    """The callbacks of the fit whose hook is running, if Keras' `CallbackList` is reachable.

    Returns:
        The callbacks, in the order Keras calls them; empty outside a fit.

    Example:

    >>> current_fit_callbacks()  # not inside a fit
    []
    """
    import keras

    frame = inspect.currentframe()
    try:
        for _ in range(_MAX_FRAMES):
            if frame is None:
                break
            candidate = frame.f_locals.get("self")
            if isinstance(candidate, keras.callbacks.CallbackList):
                return list(getattr(candidate, "callbacks", []))
            frame = frame.f_back
    finally:
        # Frames hold their locals: let them go at once.
        del frame
    return []
