"""A fit's profile once its window has closed for good: the evidence, or its running conversion.

`ProfilerWindow.end_fit` hands it to the run and keeps none of it, so that the
next fit's window starts afresh: it can neither stop this conversion nor show
this evidence in the next fit's report. The end of fit does not wait for a
conversion still running (see `run.late_profile`); a custom loop's `close()`
does (`wait`).
"""

import logging
import threading
import time
from typing import Callable
from typing import List
from typing import Optional

from keras_pipeline_tuner._util import features
from keras_pipeline_tuner._util.feature_guard import FeatureGuard
from keras_pipeline_tuner.profiling.capture import ConvertingCapture
from keras_pipeline_tuner.profiling.evidence import ProfileEvidence

logger = logging.getLogger("keras_pipeline_tuner")

FEATURE = features.PROFILER_WINDOW
# A wait for the conversion is said in one line once it has lasted this long.
WAIT_SAID_AFTER_S = 1.0


class FitProfile:
    """The profiler window's evidence and notes of one ended fit (or custom loop).

    Args:
        evidence: the `ProfileEvidence`, when the window's conversion has
            ended; `None` while it runs, or when no window was captured.
        notes: the window's notes (windows skipped or not reached).
        converting: the `ConvertingCapture` still running, or `None`.
        guard: the tuner's `FeatureGuard`: a failed conversion turns the
            profiler window off, as during fit.

    Attributes:
        evidence: that evidence; set once the conversion's result is read
            (`take`), never half of it.
        notes: those notes.

    Example:

    ```python
    profile = window.end_fit()          # no wait
    if profile.pending and profile.done():
        profile.take()                  # reads the result: milliseconds
    ```
    """

    def __init__(
        self,
        evidence: Optional[ProfileEvidence],
        notes: List[str],
        converting: Optional[ConvertingCapture],
        guard: FeatureGuard,
    ):
        self.evidence = evidence
        self.notes = notes
        self._converting = converting
        self._guard = guard
        self._lock = threading.Lock()

    @property
    def pending(self) -> bool:
        """Whether the conversion's result has not joined the evidence yet."""
        return self._converting is not None

    def done(self) -> bool:
        """Whether nothing is left to wait for: no conversion, or one that has ended."""
        converting = self._converting
        return converting is None or converting.done()

    def wait_for_process(self) -> None:
        """Blocks until the conversion's process ends (`Popen.wait()`: no GIL held).

        For a thread of the tuner's own; it reads nothing (see `take`).
        """
        converting = self._converting
        if converting is not None:
            converting.conversion.wait()

    def wait(
        self, announce: Callable[[str], None], timeout_s: Optional[float] = None
    ) -> bool:
        """Waits on this thread for the conversion, then takes its evidence.

        A wait that may last over a second is said first, in one line.

        Args:
            announce: says that line (logged; printed when the tuner is verbose).
            timeout_s: the longest to wait; `None` waits until it ends.

        Returns:
            Whether the evidence has joined (nothing is pending any more).
        """
        converting = self._converting
        if converting is None:
            return True
        conversion = converting.conversion
        began = time.perf_counter()
        first = WAIT_SAID_AFTER_S if timeout_s is None else min(WAIT_SAID_AFTER_S, timeout_s)
        ended = conversion.wait(first)
        if not ended and (timeout_s is None or timeout_s > first):
            started = time.time() - conversion.began_at
            announce(f"converting the profile (xprof), started {started:.0f} s ago: waiting.")
            ended = conversion.wait(None if timeout_s is None else timeout_s - first)
        if ended:
            self.take(waited_s=time.perf_counter() - began)
        return not self.pending

    def take(self, waited_s: float = 0.0) -> None:
        """Reads the ended conversion's result into the evidence (idempotent).

        Waits for the process if it still runs: call it once `done()`. A
        failed conversion leaves the capture's evidence without its analysis
        (where the capture is, its cost) and turns the profiler window off.

        Args:
            waited_s: how long the training thread waited for the conversion.
        """
        with self._lock:
            converting = self._converting
            if converting is None:
                return
            try:
                if not self._guard.enabled(FEATURE):
                    converting.cancel()
                    return
                with self._guard(FEATURE):
                    try:
                        self.evidence = converting.join(waited_s)
                    except Exception:
                        self.evidence = converting.evidence
                        raise
            finally:
                self._converting = None

    def stop(self, note: str) -> None:
        """Stops a conversion still running: the evidence is the capture's, with `note`.

        Args:
            note: why, for the evidence's notes.
        """
        with self._lock:
            converting = self._converting
            if converting is None:
                return
            converting.cancel()
            evidence = converting.evidence
            evidence.notes.append(note)
            self.evidence = evidence
            self._converting = None
            logger.warning("keras-pipeline-tuner: %s", note)
