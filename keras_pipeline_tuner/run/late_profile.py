"""A profile that joins its run after the end of fit, and what happens to it at interpreter exit.

Nothing slow happens in `on_train_end`: while any callback's `on_train_end`
runs, Keras' fit iterator is still alive and tf.data's prefetch keeps reading
the source, so a queue-fed dataset loses to the wait whatever the prefetch
takes meanwhile (two batches, where the end of fit waited for xprof). A
conversion of the profiler window still running at the end of fit is therefore
handed to a daemon thread, which blocks in the conversion process's
`Popen.wait()` (in `waitpid`, without the GIL: the training thread goes on
untouched), then reads the result (a small file) and has the run write its
final outputs again (`Run` serialises that with its other writes). The run is
the one that captured the window: a fit started meanwhile has a run of its own,
and this evidence never reaches it.

At interpreter exit, a conversion still running is waited for at most
`EXIT_WAIT_S`, said in one line first when that may take over a second; one
that takes longer is stopped, and the run's outputs say so.
"""

import atexit
import logging
import threading
import time
from typing import Callable
from typing import List
from typing import Optional

from keras_pipeline_tuner.profiling.fit_profile import WAIT_SAID_AFTER_S
from keras_pipeline_tuner.profiling.fit_profile import FitProfile

logger = logging.getLogger("keras_pipeline_tuner")

# The longest the interpreter's exit waits for conversions still running. A
# default window (15 steps) converts in well under a second (0.02-0.13 s of
# xprof, after about half a second to start the process and import xprof); a
# window of 400 steps took 4-9 s on two busy cores. 10 s lets such windows
# finish, and keeps a script whose conversion is stuck from seeming to hang.
EXIT_WAIT_S = 10.0
# After a stop at exit, the longest to wait for the outputs' rewrite that says so.
REWRITE_WAIT_S = 5.0

# Conversions still running, each until its evidence has joined its run.
_PENDING: List["LateProfile"] = []
_PENDING_LOCK = threading.Lock()
_exit_hook_registered = False


class LateProfile:
    """Waits, on a daemon thread, for a fit's profile conversion, then has its run rewrite outputs.

    Args:
        profile: the run's pending `FitProfile`.
        joined: called on that thread once the evidence has joined (the run's
            final outputs, again); it must not raise.
        announce: says one line before a wait that may take over a second.

    Example:

    ```python
    late = LateProfile(run.profile, rewrite_outputs, announce)
    ...                       # training goes on, or the next fit
    late.wait(timeout_s=30)   # True once the evidence has joined and the outputs say so
    ```
    """

    def __init__(
        self,
        profile: FitProfile,
        joined: Callable[[], None],
        announce: Callable[[str], None],
    ):
        global _exit_hook_registered
        self.profile = profile
        self.announce = announce
        self._joined = joined
        self._done = threading.Event()
        with _PENDING_LOCK:
            _PENDING.append(self)
            # Registered after the conversion's own exit clean-up (a `weakref.
            # finalize`, which kills it): exit hooks run last-registered first.
            if not _exit_hook_registered:
                atexit.register(_finish_at_exit)
                _exit_hook_registered = True
        self._thread = threading.Thread(
            target=self._wait_then_join, name="keras-pipeline-tuner-profile", daemon=True
        )
        self._thread.start()

    @property
    def done(self) -> bool:
        """Whether the evidence has joined and the outputs were written with it."""
        return self._done.is_set()

    def wait(self, timeout_s: Optional[float] = None) -> bool:
        """Waits for the evidence to join and the outputs to be written with it.

        A wait that may last over a second is said first, in one line.

        Args:
            timeout_s: the longest to wait; `None` waits until then.

        Returns:
            Whether that happened.
        """
        first = WAIT_SAID_AFTER_S if timeout_s is None else min(WAIT_SAID_AFTER_S, timeout_s)
        if self._done.wait(first):
            return True
        if timeout_s is not None and timeout_s <= first:
            return False
        self.announce("waiting for the profile's conversion (xprof) to join the report.")
        return self._done.wait(None if timeout_s is None else timeout_s - first)

    def stop(self, note: str) -> None:
        """Stops the conversion if it still runs; the outputs are written with `note`."""
        self.profile.stop(note)

    def _wait_then_join(self) -> None:
        try:
            self.profile.wait_for_process()
            self.profile.take()
            self._joined()
        except Exception:  # noqa: BLE001 - a thread of the tuner's: logged, never raised.
            logger.warning(
                "keras-pipeline-tuner: the profile could not join the report.", exc_info=True
            )
        finally:
            with _PENDING_LOCK:
                if self in _PENDING:
                    _PENDING.remove(self)
            self._done.set()


def wait_for_all(timeout_s: float) -> bool:
    """Waits for every late profile of this process (any tuner's) to join its run.

    Args:
        timeout_s: the longest to wait for all of them.

    Returns:
        Whether none is pending any more.
    """
    with _PENDING_LOCK:
        pending = list(_PENDING)
    return _all_done(pending, time.monotonic() + timeout_s)


def _finish_at_exit() -> None:
    """At interpreter exit: lets conversions still running finish, up to `EXIT_WAIT_S`."""
    with _PENDING_LOCK:
        pending = list(_PENDING)
    if not pending:
        return
    began = time.monotonic()
    if not _all_done(pending, began + WAIT_SAID_AFTER_S):
        pending[0].announce(
            f"the profile's conversion (xprof) is still running at exit: waiting up to "
            f"{EXIT_WAIT_S:.0f} s for it to join the report."
        )
        _all_done(pending, began + EXIT_WAIT_S)
    stopped = [late for late in pending if not late.done]
    for late in stopped:
        late.stop(
            f"The profile's conversion (xprof) was still running at interpreter exit "
            f"after a wait of {EXIT_WAIT_S:.0f} s, and was stopped: the capture is kept for "
            "TensorBoard's Profile tab, without its analysis here."
        )
    _all_done(stopped, time.monotonic() + REWRITE_WAIT_S)


def _all_done(pending: List[LateProfile], deadline: float) -> bool:
    # Each waited for in turn, up to one deadline for all.
    return all(late._done.wait(max(deadline - time.monotonic(), 0.0)) for late in pending)
