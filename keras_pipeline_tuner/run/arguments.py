"""The `PipelineTuner`'s arguments, checked when it is made: a bad one is named with its fix.

Every check runs at construction, not at the first fit: a typo fails on the line
that made the tuner, before any training.
"""

import dataclasses
import math
import os
from typing import Optional
from typing import Tuple
from typing import Union

from keras_pipeline_tuner.after_training import fix_timing
from keras_pipeline_tuner.after_training import what_if_replay
from keras_pipeline_tuner.timing.step_clock import StepClock
from keras_pipeline_tuner.workers import exchange as worker_reports

_PROFILE_MODES = ("auto", "off")


@dataclasses.dataclass
class TunerArguments:
    """The checked arguments of a `PipelineTuner` (see its docstring for each).

    Example:

    >>> TunerArguments.checked(what_if=True).what_if_steps
    20
    """

    log_dir: Optional[str] = None
    verbose: int = 1
    profile: Union[str, Tuple[int, int]] = "auto"
    buffer_steps: int = 10_000
    profile_steps: Optional[int] = None
    what_if_steps: int = 0
    tensorboard_workers: str = "chief"
    worker_timeout_s: float = worker_reports.DEFAULT_TIMEOUT_S
    check_contention: bool = True
    # None: "auto" (see `after_training.fix_timing.auto_budget`).
    measure_fixes_s: Optional[float] = None
    allow_unverified: bool = False
    cost_budget_s: Optional[float] = None

    @classmethod
    def checked(
        cls,
        log_dir=None,
        verbose=1,
        profile="auto",
        buffer_steps=10_000,
        profile_steps=None,
        what_if=False,
        tensorboard_workers="chief",
        worker_timeout_s=worker_reports.DEFAULT_TIMEOUT_S,
        check_contention=True,
        measure_fixes="auto",
        allow_unverified=False,
        cost_budget_s=None,
    ) -> "TunerArguments":
        """Checks the arguments as `PipelineTuner` takes them.

        Returns:
            The `TunerArguments`.

        Raises:
            ValueError, TypeError: for an argument out of its range, naming it
                and what to pass instead.
        """
        measure_fixes_s = fix_timing.checked_budget(measure_fixes)
        _check_flag(allow_unverified, "allow_unverified", (
            "Pass allow_unverified=True with measure_fixes=True to also time parallel calls "
            "of a Python function."
        ))
        if allow_unverified and measure_fixes_s == 0.0:
            raise ValueError(
                "`allow_unverified` applies to the fixes `measure_fixes` times, and "
                "measure_fixes is off: pass measure_fixes=\"auto\" or True, or drop "
                "allow_unverified."
            )
        _check_flag(check_contention, "check_contention", (
            "Pass check_contention=False to skip the short replay after fit on the CPU."
        ))
        if verbose not in (0, 1, 2) or isinstance(verbose, bool):
            raise ValueError(
                f"`verbose` must be 0, 1 or 2, got {verbose!r}. Pass verbose=0 to "
                "silence the end-of-fit summary, or verbose=1 to print it."
            )
        # Checked here, at construction, rather than at the first fit.
        StepClock(buffer_steps)
        return cls(
            log_dir=checked_log_dir(log_dir),
            verbose=verbose,
            profile=checked_profile(profile),
            buffer_steps=buffer_steps,
            profile_steps=profile_steps,
            what_if_steps=what_if_replay.checked_steps(what_if),
            tensorboard_workers=worker_reports.checked_tensorboard_workers(tensorboard_workers),
            worker_timeout_s=worker_reports.checked_timeout(worker_timeout_s),
            check_contention=check_contention,
            measure_fixes_s=measure_fixes_s,
            allow_unverified=allow_unverified,
            cost_budget_s=checked_cost_budget(cost_budget_s),
        )


def checked_cost_budget(cost_budget_s) -> Optional[float]:
    """`cost_budget_s` as seconds, `None` for the default rule, or a clear error.

    Example:

    >>> checked_cost_budget(None) is None, checked_cost_budget(3)
    (True, 3.0)
    """
    if cost_budget_s is None:
        return None
    if (
        isinstance(cost_budget_s, bool)
        or not isinstance(cost_budget_s, (int, float))
        or not math.isfinite(cost_budget_s)
        or cost_budget_s < 0
    ):
        raise ValueError(
            f"`cost_budget_s` must be a number of seconds, 0 or more, got {cost_budget_s!r}. "
            "Pass None for the default (the larger of 2 s and 2 % of the fit's time), or "
            "0 to run no automatic probe after training."
        )
    return float(cost_budget_s)


def checked_log_dir(log_dir) -> Optional[str]:
    """`log_dir` as a string, or a clear error when nothing could ever be written there.

    Example:

    >>> checked_log_dir(None) is None
    True
    """
    if log_dir is None:
        return None
    if not isinstance(log_dir, (str, os.PathLike)):
        raise TypeError(
            f"`log_dir` must be a path (str or os.PathLike), got {type(log_dir).__name__}. "
            "Pass a directory path, e.g. log_dir='logs/run1', or None to keep the "
            "report in memory only."
        )
    log_dir = os.fspath(log_dir)
    if not log_dir:
        raise ValueError(
            "`log_dir` is an empty string. Pass a directory path, e.g. "
            "log_dir='logs/run1', or None to keep the report in memory only."
        )
    # The nearest part of the path that exists must be a directory, or nothing
    # can ever be written there.
    existing = os.path.abspath(log_dir)
    while not os.path.exists(existing) and os.path.dirname(existing) != existing:
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        where = (
            "is a file"
            if existing == os.path.abspath(log_dir)
            else f"is under {existing!r}, which is a file"
        )
        raise ValueError(
            f"`log_dir` {log_dir!r} {where}, not a directory. Pass a directory path, "
            "e.g. log_dir='logs/run1'."
        )
    return log_dir


def checked_profile(profile):
    """`profile` if it is "auto", "off" or a `(start_step, stop_step)` pair, else a clear error.

    Example:

    >>> checked_profile([10, 30])
    (10, 30)
    """
    if isinstance(profile, str):
        if profile not in _PROFILE_MODES:
            raise ValueError(
                f"`profile` must be 'auto', 'off' or a (start_step, stop_step) pair, "
                f"got {profile!r}."
            )
        return profile
    if (
        isinstance(profile, (tuple, list))
        and len(profile) == 2
        and all(isinstance(step, int) and not isinstance(step, bool) for step in profile)
    ):
        start, stop = profile
        if start < 0 or stop <= start:
            raise ValueError(
                f"`profile` range {tuple(profile)} is empty or negative: pass "
                "(start_step, stop_step) with 0 <= start_step < stop_step, e.g. (10, 30)."
            )
        return (start, stop)
    raise ValueError(
        f"`profile` must be 'auto', 'off' or a (start_step, stop_step) pair of ints, "
        f"got {profile!r}."
    )


def _check_flag(value, name: str, how: str) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"`{name}` must be True or False, got {value!r}. {how}")
