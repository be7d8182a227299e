"""The `fit` (or `evaluate`) that is running, seen from inside one of its callbacks.

A Keras callback is told neither which other callbacks share its fit nor what
the fit iterates. The tuner needs both: the other callbacks in two cases (a
`keras.callbacks.TensorBoard` that will profile: its window wins over the
tuner's; a second `PipelineTuner`: refused), and the epoch iterator that holds
the data adapter (what fit was given; on torch, the loader to stamp). Both are
found among the calling frames, read only: Keras' `CallbackList`, and the local
variables of `fit`'s own frame. Whether that fit still runs is asked later of
the live stack of its thread (`running_call`), without keeping its frame.
"""

import inspect
import sys
import threading
from typing import Any
from typing import List
from typing import Optional

# Frames searched above the caller (the tuner's hook is called from the
# `CallbackList`, through a few frames of the tuner's own).
_MAX_FRAMES = 12
# How far up the stack a callback hook may sit below `fit` / `evaluate`.
_MAX_LOOP_FRAMES = 30


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


def running_call_local(model, method: str, name: str) -> Any:
    """A local variable of the running `method` call ("fit", "evaluate") of `model`.

    Keras keeps the epoch iterator (and through it the data adapter) in a local
    variable of `fit`; a callback hook that `fit` calls finds it on the stack.

    Args:
        model: the model whose call is running.
        method: the method's name, e.g. "fit".
        name: the local variable, e.g. "epoch_iterator".

    Returns:
        Its value, or `None` when no such call is on the stack (a custom loop,
        or a Keras version that keeps it elsewhere).

    Example:

    >>> running_call_local(object(), "fit", "epoch_iterator") is None
    True
    """
    frame = _call_frame(sys._getframe(1), model, method)  # pylint: disable=protected-access
    try:
        return frame.f_locals.get(name) if frame is not None else None
    finally:
        del frame


class RunningCall:
    """Marks a running `fit` call, to ask later whether it still runs.

    Holds no reference to the call's frame (which would keep the model and
    the data alive): the thread, the frame's identity and its code, matched
    against the thread's live stack.

    Attributes:
        thread: the ident of the thread running the call.
        frame_id: `id()` of the call's frame while it runs.
        code: the call's code object.
    """

    __slots__ = ("thread", "frame_id", "code")

    def __init__(self, thread: int, frame_id: int, code):
        self.thread = thread
        self.frame_id = frame_id
        self.code = code

    def running(self) -> bool:
        """Whether the call is still on its thread's stack (it has not returned or raised)."""
        frame = sys._current_frames().get(self.thread)  # pylint: disable=protected-access
        try:
            while frame is not None:
                if id(frame) == self.frame_id and frame.f_code is self.code:
                    return True
                frame = frame.f_back
            return False
        finally:
            del frame


def running_call(model, method: str) -> Optional[RunningCall]:
    """The mark of the running `method` call ("fit", "evaluate") of `model`.

    Args:
        model: the model whose call is running.
        method: the method's name, e.g. "fit".

    Returns:
        Its `RunningCall`, or `None` when no such call is on the stack.

    Example:

    >>> running_call(object(), "fit") is None
    True
    """
    frame = _call_frame(sys._getframe(1), model, method)  # pylint: disable=protected-access
    try:
        if frame is None:
            return None
        return RunningCall(threading.get_ident(), id(frame), frame.f_code)
    finally:
        del frame


def _call_frame(frame, model, method: str):
    """The frame of `model.<method>` at or above `frame`, within `_MAX_LOOP_FRAMES`, or `None`."""
    for _ in range(_MAX_LOOP_FRAMES):
        if frame is None:
            return None
        if frame.f_code.co_name == method and frame.f_locals.get("self") is model:
            return frame
        frame = frame.f_back
    return None
