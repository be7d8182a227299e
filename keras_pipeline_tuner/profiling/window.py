"""The profiler window: a short TF Profiler capture during `model.fit`.

The step clock runs on every step at no measurable cost; the TF Profiler costs
5 % to 70 % more per step while it runs, so it only runs for a short window: after
a warm-up when the step clock finds the job input-bound ("auto"), or at the steps
the user names. Each step in the window is wrapped in a step marker (`_r=1`), without which
xprof's input-pipeline analyzer finds no steps. The capture is written to a
fresh run folder where TensorBoard's Profile tab finds it, and converted with
xprof in a process of its own, started when the window closes, while training
goes on (see `conversion`). Its evidence joins the run at the first epoch end
after it is done; a conversion still running at the end of fit is handed to the
run with the fit's profile (`end_fit`, see `fit_profile`), which does not wait
for it there (see `run.late_profile`). Until then the run reads none (never
half of it).
"""

import contextlib
import logging
from typing import List
from typing import Optional
from typing import Tuple
from typing import Union

from keras_pipeline_tuner._util import features
from keras_pipeline_tuner._util.feature_guard import FeatureGuard
from keras_pipeline_tuner._util.running_fit import current_fit_callbacks
from keras_pipeline_tuner._util.tf_import import tensorflow
from keras_pipeline_tuner.profiling import evidence as profile_evidence
from keras_pipeline_tuner.profiling import user_profile
from keras_pipeline_tuner.profiling.capture import Capture
from keras_pipeline_tuner.profiling.capture import ConvertingCapture
from keras_pipeline_tuner.profiling.capture import ProfilerBusy
from keras_pipeline_tuner.profiling.evidence import ProfileEvidence
from keras_pipeline_tuner.profiling.fit_profile import FitProfile
from keras_pipeline_tuner.timing.step_clock import TRAIN
from keras_pipeline_tuner.timing.step_stats import beyond_fetch_bound
from keras_pipeline_tuner.timing.step_stats import verdict_for

logger = logging.getLogger("keras_pipeline_tuner")

FEATURE = features.PROFILER_WINDOW
# Steps the step clock measures before "auto" judges the job (the first step, which
# traces, is not counted). Until it fires, the check repeats at twice the step count
# of the previous one: summarising the clock costs up to a millisecond, which must
# not add up over a long job that is not input-bound.
AUTO_WARMUP_STEPS = 10
DEFAULT_PROFILE_STEPS = 15
EPOCH_ENDED = "the epoch ended"
FIT_ENDED = "the fit ended"
STEP_FAILED = "a step failed"


def checked_profile_steps(
    profile: Union[str, Tuple[int, int]], profile_steps: Optional[int]
) -> int:
    """Validates `profile_steps` against `profile`.

    Args:
        profile: the validated `profile` argument of `PipelineTuner`.
        profile_steps: steps in an "auto" window, or `None` for the default.

    Returns:
        The number of steps a window spans.

    Raises:
        ValueError: naming the problem and the fix.
    """
    if isinstance(profile, tuple):
        if profile_steps is not None:
            raise ValueError(
                f"`profile_steps` applies to profile='auto' only, but profile={profile} "
                "already names the steps. Drop `profile_steps`, or pass profile='auto'."
            )
        return profile[1] - profile[0]
    if profile_steps is None:
        return DEFAULT_PROFILE_STEPS
    if isinstance(profile_steps, bool) or not isinstance(profile_steps, int) or profile_steps < 1:
        raise ValueError(
            f"`profile_steps` must be a positive integer (the number of training steps "
            f"in the profiler window), got {profile_steps!r}. Pass e.g. profile_steps=15."
        )
    return profile_steps


class ProfilerWindow:
    """Decides when to profile, captures the window, and has it converted meanwhile.

    `PipelineTuner` calls it from its hooks; every failure inside it turns the
    feature off through the `FeatureGuard` and training goes on.

    Args:
        profile: "auto", "off" or a `(start_step, stop_step)` pair of training
            steps, counted from 0 over the whole fit.
        profile_steps: steps in an "auto" window (`None`: 15).
        log_dir: where the capture goes (under `pipeline_tuner/`); `None`
            captures into a new temporary directory, kept for TensorBoard and
            named in the evidence.
        guard: the tuner's `FeatureGuard`.

    Attributes:
        evidence: the `ProfileEvidence` of the latest fit, once its conversion
            has ended (`None` until then).
        notes: plain-language notes on windows that were skipped or not reached.

    Example:

    ```python
    window = ProfilerWindow((10, 30), None, "logs/run1", FeatureGuard())
    ```
    """

    def __init__(
        self,
        profile: Union[str, Tuple[int, int]],
        profile_steps: Optional[int],
        log_dir: Optional[str],
        guard: FeatureGuard,
    ):
        self.profile = profile
        self.steps = checked_profile_steps(profile, profile_steps)
        self.log_dir = log_dir
        self._guard = guard
        self._capture: Optional[Capture] = None
        self._user_known: List[str] = []
        self._reset()

    def _reset(self) -> None:
        """What one fit (or custom loop) starts with: no window yet."""
        self.evidence: Optional[ProfileEvidence] = None
        self.notes: List[str] = []
        # A closed capture not converting yet (the user's, until its file is found).
        self._pending: Optional[Capture] = None
        # The capture being converted, its evidence not shown until it is done.
        self._converting: Optional[ConvertingCapture] = None
        self._taken = self.profile == "off"
        self._steps_done = 0
        self._calls = 0
        self._call_begin = 0
        self._next_check = AUTO_WARMUP_STEPS
        self._dataset = None
        self._keras_input = None
        self._user: Optional[user_profile.ProfileRequest] = None

    @property
    def capturing(self) -> bool:
        """Whether a window is open now (its steps are being captured)."""
        return self._capture is not None

    @property
    def converting(self) -> bool:
        """Whether a closed window's evidence is still to come (its conversion runs)."""
        return self._converting is not None or self._pending is not None

    @property
    def consults_clock(self) -> bool:
        """Whether the next `before_step` reads the step clock (an "auto" check).

        Timing sources that hand rows over in batches hand them over first.
        """
        return (
            self.profile == "auto"
            and self._user is None
            and self._capture is None
            and not self._taken
            and self._steps_done >= self._next_check
        )

    # Hooks.

    def use_dataset(self, dataset) -> None:
        """Names the dataset the steps read, for windows whose steps do not show it.

        A custom loop iterates its dataset in Python (`tuner.iterate(ds)`), so
        the profiled steps carry no iterator to read the pipeline from; with the
        dataset known, its stages are named as in `fit`, e.g. "map(load)".

        Args:
            dataset: the `tf.data.Dataset` the loop iterates.
        """
        self._dataset = dataset

    def name_keras_input(self, stage) -> None:
        """Names the stages Keras builds itself after what the user gave `fit`.

        Keras wraps a `PyDataset`, a Python generator or NumPy arrays in a
        tf.data pipeline of its own (`from_generator`, slicing maps); the
        profiler sees those ops, but the user wrote none of them.

        Args:
            stage: the `Stage` that stands for the user's input (e.g. the
                PyDataset's, as the pipeline inspection names it).
        """
        self._keras_input = stage

    def begin_fit(self, callbacks: Optional[list] = None) -> None:
        """Starts a new fit: one window at most per fit.

        Args:
            callbacks: the fit's callbacks, to find a profile the user asked
                for (`keras.callbacks.TensorBoard(profile_batch=...)`), which
                wins over the tuner's own window; `None` looks for them in the
                fit that is calling.
        """
        self._abandon()
        self._reset()
        if self._taken or not self._usable():
            return
        with self._guard(FEATURE):
            if callbacks is None:
                callbacks = current_fit_callbacks()
            self._user, note = user_profile.followed_request(
                self.profile, user_profile.requested_profile(callbacks)
            )
            self.notes += [note] if note else []
            if self._user is not None:
                self._user_known = user_profile.run_folders(self._user.profile_dir)

    def before_step(self, batch: int, timed, clock, steps_left: Optional[int] = None) -> None:
        """Opens the window if it is due, and marks the step when it is open.

        `call_begins(batch)`, then `act(...)` when it says so.

        Args:
            batch: the batch index Keras passes to `on_train_batch_begin`.
            timed: the function standing in for `train_function` that takes a
                `trace_step` (the `TimedFunction` on TensorFlow, the timed JAX
                function when fit is given tf.data), or
                `None` when only whole steps are measured (the step marker is
                then entered here and exited in `after_step`).
            clock: the tuner's `StepClock`, for the "auto" decision.
            steps_left: training steps left in the epoch, when known: an
                "auto" window is not opened where it could not hold the steps
                it needs to name a bottleneck; it opens in the next epoch.
        """
        if self.call_begins(batch):
            self.act(timed, clock, steps_left)

    def call_begins(self, batch: int) -> bool:
        """Counts a training call that begins; whether `act` has anything to do before it.

        On most steps it has not (no window open, no "auto" check due): the
        hooks then skip the rest, whose guard and contexts cost a few
        microseconds, a per cent of a small step.

        Args:
            batch: the batch index Keras passes to `on_train_batch_begin`.

        Returns:
            Whether to call `act` for this call.
        """
        self._call_begin = batch
        self._calls += 1
        if self._capture is not None:
            return True
        if self._taken:
            # Off, or this fit's window has been: nothing to do on this step.
            return False
        return not (
            self._steps_done < self._next_check and self._user is None and self.profile == "auto"
        )

    def act(self, timed, clock, steps_left: Optional[int] = None) -> None:
        """Opens the window if it is due, and marks the step when it is open (see `before_step`)."""
        if not self._usable():
            return
        with self._guard(FEATURE), self._cleanup_on_failure():
            if self._user is not None:
                if self._capture is None and not self._taken and self._user.covers(self._calls):
                    self._follow_user(timed)
            elif self._capture is None and not self._taken:
                trigger = self._due(clock, steps_left)
                if trigger is not None:
                    self._open(trigger, timed)
            if self._capture is not None and self._capture.timed is None:
                self._capture.enter_marker(self._steps_done)

    def after_step(self, batch: int) -> None:
        """Counts the steps of the call that ended, and closes the window when due.

        Args:
            batch: the batch index Keras passes to `on_train_batch_end` (with
                `steps_per_execution > 1`, the call's last step).
        """
        self._steps_done += max(batch - self._call_begin + 1, 1)
        if self._capture is None or not self._usable():
            # No window open: nothing to close.
            return
        with self._guard(FEATURE), self._cleanup_on_failure():
            if self._capture is not None:
                self._capture.exit_marker()
                if self._capture.adopted:
                    if self._calls >= self._user.stop_batch:
                        self._release_user(None)
                elif self._steps_done >= self._capture.stop_step:
                    self._close(None)
                    self._start_conversion()

    def close(self, reason: str) -> None:
        """Closes an open window early, e.g. at the end of an epoch.

        The tuner's own capture starts converting at once, or with `FIT_ENDED`
        in `end_fit` (a fit that failed leaves it unconverted); the user's at
        the epoch's end, once their callback has written it.

        Args:
            reason: why, for the evidence's notes (e.g. `EPOCH_ENDED`).
        """
        if not self._usable():
            return
        with self._guard(FEATURE), self._cleanup_on_failure():
            if self._capture is not None and self._capture.adopted:
                # The user's window goes on over epoch ends, as their callback does.
                if reason == FIT_ENDED:
                    self._release_user(reason)
            elif self._capture is not None:
                self._close(reason)
                if reason != FIT_ENDED:
                    self._start_conversion()

    def end_epoch(self) -> None:
        """Closes an open window; takes its conversion's evidence if it is done (no wait)."""
        self.close(EPOCH_ENDED)
        self._join_conversion()

    def end_fit(self) -> FitProfile:
        """Closes the window, starts its conversion, and hands the fit's profile over.

        Nothing waits for the conversion here: a conversion that has ended
        joins the evidence now, one still running goes with the `FitProfile`,
        and the window keeps no part of it (the next fit's `begin_fit` cannot
        stop it). A window the fit did not reach is noted.

        Returns:
            The fit's `FitProfile`: the evidence, the notes, and the
            conversion if it still runs.
        """
        self.close(FIT_ENDED)
        self._join_conversion()
        if (
            isinstance(self.profile, tuple)
            and not self._taken
            and self._user is None
            and self._guard.enabled(FEATURE)
        ):
            self.notes.append(
                f"No profiler window: profile={self.profile} starts after the last "
                f"step of this fit ({self._steps_done} steps). Pick steps inside the fit."
            )
        converting, self._converting = self._converting, None
        return FitProfile(self.evidence, list(self.notes), converting, self._guard)

    def fit_failed(self) -> None:
        """The fit ends by an exception, after `close(FIT_ENDED)`: nothing of it goes on.

        A conversion that has ended joins the run, one still running is
        stopped: the exception reaches the user at once, and nothing of this
        fit can land in the next fit's report. A capture closed by the failure
        is kept for the Profile tab, not converted.
        """
        if self._guard.enabled(FEATURE):
            with self._guard(FEATURE):
                self._take_evidence()
        self._abandon()

    # Internals.

    def _usable(self) -> bool:
        if self._guard.enabled(FEATURE):
            return True
        self._abandon()
        return False

    def _follow_user(self, timed) -> None:
        # The user's callback starts (or has started) the profiler at this call;
        # the tuner only marks the steps, so that xprof's analyzer finds them.
        self._taken = True
        user = self._user
        self._capture = Capture(
            trigger=f"requested by the user: {user.description}",
            first_step=self._steps_done,
            stop_step=self._steps_done + user.stop_batch - self._calls + 1,
            timed=timed,
        )
        if timed is not None:
            timed.trace_step = self._mark
        logger.info(
            "keras-pipeline-tuner: using the profile of %s from step %d.",
            user.description,
            self._steps_done,
        )

    def _release_user(self, reason: Optional[str]) -> None:
        capture, self._capture = self._capture, None
        capture.end_steps(self._steps_done)
        if reason is not None:
            capture.notes.append(
                f"The user's profile window was still open when {reason}; its capture "
                "is read if the TensorBoard callback has written it by then."
            )
        self._pending = capture

    def _due(self, clock, steps_left: Optional[int] = None) -> Optional[str]:
        step = self._steps_done
        if isinstance(self.profile, tuple):
            start, stop = self.profile
            if start <= step < stop:
                return f"requested: profile={self.profile}"
            return None
        if step < self._next_check:
            return None
        if steps_left is not None and steps_left < min(self.steps, profile_evidence.MIN_STEPS):
            # Too close to the end of the epoch to complete: asked again at the
            # next step, which the next epoch's start soon is.
            return None
        self._next_check = 2 * step
        return _auto_trigger(clock.stats(TRAIN))

    def _open(self, trigger: str, timed) -> None:
        self._taken = True
        stop_step = (
            self.profile[1] if isinstance(self.profile, tuple) else self._steps_done + self.steps
        )
        try:
            self._capture = Capture.start(trigger, self._steps_done, stop_step, timed)
        except ProfilerBusy:
            note = (
                "No profiler window: another TF Profiler session was already running "
                "(for example keras.callbacks.TensorBoard(profile_batch=...)); its "
                "capture is kept and this one was skipped."
            )
            logger.warning("keras-pipeline-tuner: %s", note)
            self.notes.append(note)
            return
        self._capture.dataset = self._dataset
        self._capture.keras_input = self._keras_input
        if timed is not None:
            timed.trace_step = self._mark
        logger.info(
            "keras-pipeline-tuner: profiling steps from %d (%s).", self._steps_done, trigger
        )

    def _mark(self, iterator):
        # Runs inside TimedFunction's call: it must not raise into the user's step.
        capture = self._capture
        if capture is None or not self._guard.enabled(FEATURE):
            return None
        with self._guard(FEATURE):
            tf = tensorflow()
            if capture.dataset is None:
                # A tf.data iterator (TensorFlow backend), or the dataset itself
                # (JAX, where Keras iterates NumPy batches made from it).
                capture.dataset = (
                    iterator
                    if isinstance(iterator, tf.data.Dataset)
                    else getattr(iterator, "_dataset", None)
                )
            return tf.profiler.experimental.Trace(
                profile_evidence.STEP_MARKER, step_num=self._steps_done, _r=1
            )
        return None

    def _close(self, reason: Optional[str]) -> None:
        capture, self._capture = self._capture, None
        capture.stop(self._steps_done, reason, self.log_dir)
        self._pending = capture

    def _start_conversion(self) -> None:
        capture, self._pending = self._pending, None
        if capture is None:
            return
        if capture.adopted:
            # Written by now, when the user's callback stopped its window.
            missing = user_profile.find_capture(self._user, self._user_known, capture)
            if missing:
                self.notes.append(missing)
                return
        evidence = capture.evidence()
        try:
            self._converting = ConvertingCapture(capture, evidence)
        except Exception:
            # Kept when the analysis fails: where the capture is, and its cost.
            self.evidence = evidence
            raise

    def _join_conversion(self) -> None:
        # Starts converting the user's capture (written by now); takes the
        # evidence of a conversion that has ended (no wait).
        if not self._usable():
            return
        with self._guard(FEATURE):
            self._start_conversion()
            self._take_evidence()

    def _take_evidence(self) -> None:
        converting = self._converting
        if converting is None or not converting.done():
            return
        self._converting = None
        try:
            self.evidence = converting.join()
        except Exception:
            self.evidence = converting.evidence
            raise

    def _abandon(self) -> None:
        capture, self._capture = self._capture, None
        if capture is not None:
            capture.abandon()
        converting, self._converting = self._converting, None
        if converting is not None:
            converting.cancel()

    @contextlib.contextmanager
    def _cleanup_on_failure(self):
        try:
            yield
        except BaseException:
            self._abandon()
            raise


def _auto_trigger(stats) -> Optional[str]:
    """Why an "auto" window opens, from the step clock's `StepStats`; `None` when it should not.

    The wait a fetch of a ready batch may take on a busy machine opens no
    window: a healthy sub-millisecond step would pay for one.

    Example:

    >>> import numpy as np
    >>> from keras_pipeline_tuner.timing.step_stats import StepStats
    >>> busy = StepStats.from_arrays(np.full(40, 0.00065), np.full(40, 0.00012))
    >>> round(busy.input_fraction, 2), _auto_trigger(busy)
    (0.84, None)
    >>> _auto_trigger(StepStats.from_arrays(np.full(40, 0.03), np.full(40, 0.001)))
    'auto: the step clock measured 96.8 % input wait over 40 steps (highly input-bound)'
    """
    certain = beyond_fetch_bound(stats.input_fraction, stats.step.mean_ms)
    if not verdict_for(certain).input_bound:
        return None
    return (
        f"auto: the step clock measured {stats.input_fraction * 100:.1f} % input "
        f"wait over {stats.steps} steps ({verdict_for(stats.input_fraction).value})"
    )
