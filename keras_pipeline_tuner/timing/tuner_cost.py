"""The tuner's own cost: what it adds to a fit, kept within a budget and stated.

Everything the tuner does after training (the probes, the wait for a profile's
conversion, its outputs) is wall time the user's job pays for. It is kept within
a budget, by default the larger of `MIN_BUDGET_S` and `FIT_SHARE` of the fit's
own time, and measured part by part, so the report can say what it cost. A
probe that would not fit in what is left of the budget does not run, and says
so (see `after_training.probes`).

The rest of its work once per fit is stated beside it: before the first step
(reading the pipeline and linting it, setting up the timing), and the outputs
written during training (each epoch's, the checkpoints', the early verdict's).
Together with the work after training that is what a fit with the tuner takes
beyond its steps (`TunerCost.per_fit_s`); what the tuner adds to each step is
measured by `bench/overhead.py` and `bench/step_cost.py`, not here.
"""

import contextlib
import dataclasses
import time
from typing import Dict
from typing import Optional

# The budget is the larger of these: seconds, and a share of the fit's time.
MIN_BUDGET_S = 2.0
FIT_SHARE = 0.02
# Work expected to take longer than this says so first, in one line.
ANNOUNCE_S = 1.0
# The part `measure_fixes` times within a cap of its own (as asked, or "auto"'s:
# `after_training.fix_timing.auto_budget`), not within the budget.
FIX_TIMING = "fix timing"
# The contention check run for the fix timing's sake (its replayed step is the
# floor the fixes' figures are capped at): counted with the fix timing.
FIX_FLOOR = "replay for the fixes' floor"
# The contention check: within the budget, or, when its result could change
# the verdict, on a cap of its own (`after_training.replay_probe`).
CONTENTION_CHECK = "contention check"
# An epoch's outputs (report file, TensorBoard text, dashboard, image) take at
# most this share of training time: after epochs shorter than their cost's
# 100x, the next ones wait (nothing is lost: the next write holds every step).
EPOCH_OUTPUT_SHARE = 0.005


@dataclasses.dataclass
class TunerCost:
    """What the tuner added to a run after training, against its budget.

    Attributes:
        fit_s: the run's own time, from its start to the end of training.
        budget_s: what the tuner's work after training may take.
        after_training_s: what it took, measured up to the final report.
        parts: seconds per part of that work ("contention check",
            "outputs", ...).
        fix_timing_cap_s: the cap of its own that `measure_fixes` gave
            the "fix timing" part, which then counts against it rather than
            the budget; `None` when it did not run on its own cap.
        check_cap_s: the cap of its own the contention check ran on because
            its result could change the verdict (it is given the time it
            needs, not the budget's); `None` when it ran within the budget.
        before_training_s: the tuner's work before the first step (its
            `on_train_begin`: reading and linting the pipeline, setting up
            the timing).
        outputs_during_training_s: the outputs it wrote during training
            (each epoch's, the checkpoints', the early verdict's).

    Example:

    >>> cost = TunerCost(fit_s=60.0, budget_s=2.0, after_training_s=0.4)
    >>> cost.within_budget
    True
    """

    fit_s: float = 0.0
    budget_s: float = MIN_BUDGET_S
    after_training_s: float = 0.0
    parts: Dict[str, float] = dataclasses.field(default_factory=dict)
    fix_timing_cap_s: Optional[float] = None
    check_cap_s: Optional[float] = None
    before_training_s: float = 0.0
    outputs_during_training_s: float = 0.0

    @property
    def per_fit_s(self) -> float:
        """The tuner's work once per fit: before training, its outputs during it, and after.

        Example:

        >>> TunerCost(60.0, 2.0, 0.25, before_training_s=0.03,
        ...           outputs_during_training_s=0.02).per_fit_s
        0.3
        """
        return self.before_training_s + self.outputs_during_training_s + self.after_training_s

    @property
    def within_budget(self) -> bool:
        """Whether the work after training took no more than its budget.

        Example:

        >>> cost = TunerCost(60.0, 2.0, 4.0, {"fix timing": 3.0}, fix_timing_cap_s=3.0)
        >>> cost.within_budget
        True
        """
        return self.after_training_s - self.capped_s <= self.budget_s

    @property
    def capped_s(self) -> float:
        """The seconds of work that counted against a cap of their own (the fix timing).

        Example:

        >>> TunerCost(60.0, 2.0, 4.0, {FIX_TIMING: 2.5, FIX_FLOOR: 0.5}, 3.0).capped_s
        3.0
        """
        return _capped_s(self.parts, self.fix_timing_cap_s, self.check_cap_s)

    def summary(self) -> str:
        """What the tuner's work after training took, and of what; then its work per fit.

        Example:

        >>> TunerCost(60.0, 2.0, 0.5, {"contention check": 0.4}).summary()
        "The tuner's own work after training took 0.50 s (contention check 0.40 s), \
within its budget of 2.0 s."
        >>> TunerCost(60.0, 2.0, 0.25, before_training_s=0.03,
        ...           outputs_during_training_s=0.02).summary()
        "The tuner's own work after training took 0.25 s, within its budget of 2.0 s. \
Once per fit it took 0.30 s in all: 0.03 s before the first step, 0.02 s of outputs \
during training, 0.25 s after it."
        >>> TunerCost(60.0, 2.0, 2.8, {FIX_FLOOR: 0.9, FIX_TIMING: 1.8}, 3.0).summary()
        "The tuner's own work after training took 2.80 s (replay for the fixes' floor 0.90 s, \
fix timing 1.80 s): the rest, 0.10 s, within its budget of 2.0 s, 2.70 s of fix timing (with \
any replay for its floor) against a cap of its own, 3.0 s (measure_fixes)."
        >>> TunerCost(60.0, 2.0, 3.5, {FIX_TIMING: 0.5, "outputs": 3.0}, 1.0).summary()
        "The tuner's own work after training took 3.50 s (fix timing 0.50 s, outputs 3.00 s): \
the rest, 3.00 s, over its budget of 2.0 s, 0.50 s of fix timing (with any replay for its \
floor) against a cap of its own, 1.0 s (measure_fixes)."
        """
        parts = ", ".join(f"{name} {seconds:.2f} s" for name, seconds in self.parts.items())
        within = "within" if self.within_budget else "over"
        took = (
            f"The tuner's own work after training took {self.after_training_s:.2f} s"
            f"{f' ({parts})' if parts else ''}"
        )
        capped_s = self.capped_s
        if self.fix_timing_cap_s is None and self.check_cap_s is None:
            text = f"{took}, {within} its budget of {self.budget_s:.1f} s."
        else:
            # The capped work is said apart: a total over the budget, of
            # which most ran against its own cap, read as "over" otherwise.
            text = (
                f"{took}: the rest, {self.after_training_s - capped_s:.2f} s, {within} its "
                f"budget of {self.budget_s:.1f} s"
            )
            if self.fix_timing_cap_s is not None:
                fix_s = _capped_s(self.parts, self.fix_timing_cap_s, None)
                text += (
                    f", {fix_s:.2f} s of fix timing (with any replay for its floor) against a "
                    f"cap of its own, {self.fix_timing_cap_s:.1f} s (measure_fixes)"
                )
            if self.check_cap_s is not None:
                text += (
                    f", {_capped_s(self.parts, None, self.check_cap_s):.2f} s of contention "
                    "check, which could change the verdict, against a cap of its own, "
                    f"{self.check_cap_s:.1f} s"
                )
            text += "."
        if self.before_training_s or self.outputs_during_training_s:
            text += (
                f" Once per fit it took {self.per_fit_s:.2f} s in all: "
                f"{self.before_training_s:.2f} s before the first step, "
                f"{self.outputs_during_training_s:.2f} s of outputs during training, "
                f"{self.after_training_s:.2f} s after it."
            )
        return text


def _capped_s(parts: Dict[str, float], fix_cap_s, check_cap_s) -> float:
    """The seconds of `parts` that counted against caps of their own."""
    capped = 0.0
    if fix_cap_s is not None:
        capped += parts.get(FIX_TIMING, 0.0) + parts.get(FIX_FLOOR, 0.0)
    if check_cap_s is not None:
        capped += parts.get(CONTENTION_CHECK, 0.0)
    return capped


def budget_for(fit_s: float, fixed_s: Optional[float] = None) -> float:
    """The budget of the tuner's work after a fit of `fit_s` seconds.

    Args:
        fit_s: the fit's own time.
        fixed_s: the user's budget in seconds (`PipelineTuner(cost_budget_s=)`),
            or `None` for the default rule.

    Returns:
        Seconds.

    Example:

    >>> budget_for(30.0), budget_for(600.0), budget_for(600.0, fixed_s=0.5)
    (2.0, 12.0, 0.5)
    """
    if fixed_s is not None:
        return float(fixed_s)
    return max(MIN_BUDGET_S, FIT_SHARE * max(fit_s, 0.0))


class CostMeter:
    """Measures the tuner's work after training, part by part, against its budget.

    Args:
        fixed_s: the user's budget in seconds, or `None` for the default rule
            (`budget_for`).

    Example:

    ```python
    meter = CostMeter()
    meter.run_started()
    ...                                  # training
    meter.training_ended()
    if meter.remaining_s() > estimate_s:
        with meter.part("contention check"):
            ...
    cost = meter.cost()
    ```
    """

    def __init__(self, fixed_s: Optional[float] = None):
        self._fixed_s = fixed_s
        self._started = time.monotonic()
        self._ended: Optional[float] = None
        # Set once the run's work is done: its cost no longer grows.
        self._stopped: Optional[float] = None
        self._parts: Dict[str, float] = {}
        self._reserved_s = 0.0
        self._outputs_due = 0.0
        self._fix_timing_cap_s: Optional[float] = None
        self._check_cap_s: Optional[float] = None
        self._before_s = 0.0
        self._during_s = 0.0

    def run_started(self) -> None:
        """The run begins: its fit time counts from now."""
        self._started = time.monotonic()
        self._ended = self._stopped = None
        self._parts = {}
        self._reserved_s = self._outputs_due = 0.0
        self._fix_timing_cap_s = self._check_cap_s = None
        self._before_s = self._during_s = 0.0

    def before_training(self, seconds: float) -> None:
        """The tuner's work before the first step took `seconds`."""
        self._before_s += seconds

    def output_during_training(self, seconds: float) -> None:
        """Outputs written during training (a checkpoint, the early verdict's) took `seconds`."""
        if self._ended is None:
            self._during_s += seconds

    def training_ended(self) -> None:
        """Training ended: the tuner's own work counts from now."""
        if self._ended is None:
            self._ended = time.monotonic()

    @property
    def budget_s(self) -> float:
        """The budget for this run's work after training."""
        end = self._ended if self._ended is not None else time.monotonic()
        return budget_for(end - self._started, self._fixed_s)

    def stopped(self) -> None:
        """The run's work is done: what it cost is final."""
        if self._ended is not None and self._stopped is None:
            self._stopped = time.monotonic()

    def spent_s(self) -> float:
        """The tuner's time from the end of training to now, or to `stopped()` (0 before)."""
        if self._ended is None:
            return 0.0
        return (self._stopped or time.monotonic()) - self._ended

    def outputs_due(self) -> bool:
        """Whether an epoch's outputs may be written now (see `EPOCH_OUTPUT_SHARE`)."""
        return time.monotonic() >= self._outputs_due

    def outputs_written(self, seconds: float) -> None:
        """An epoch's outputs took `seconds`: paces the next, and keeps their share.

        The next epoch's outputs wait until they stay within
        `EPOCH_OUTPUT_SHARE` of training time. The end of the run writes them
        again: the longest such write is kept back from the budget, and the
        probes before it get what is left.

        Example:

        >>> meter = CostMeter(fixed_s=2.0)
        >>> meter.outputs_written(0.5); meter.outputs_written(0.2)
        >>> meter.outputs_due()
        False
        >>> meter.training_ended()
        >>> round(meter.remaining_s(), 1)
        1.5
        """
        self._outputs_due = time.monotonic() + seconds / EPOCH_OUTPUT_SHARE
        self._reserved_s = max(self._reserved_s, seconds)
        self.output_during_training(seconds)

    def fix_timing_capped(self, cap_s: float) -> None:
        """The fix timing runs on a cap of its own (`measure_fixes`), not the budget."""
        self._fix_timing_cap_s = cap_s

    def check_capped(self, cap_s: float) -> None:
        """The contention check runs on a cap of its own (it could change the verdict)."""
        self._check_cap_s = cap_s

    @property
    def uses_default_budget(self) -> bool:
        """Whether the budget is the default rule's (the user set none)."""
        return self._fixed_s is None

    def remaining_s(self) -> float:
        """What is left of the budget for the probes: the outputs' share kept back."""
        capped = _capped_s(self._parts, self._fix_timing_cap_s, self._check_cap_s)
        return max(self.budget_s - (self.spent_s() - capped) - self._reserved_s, 0.0)

    def deadline(self, share: float = 1.0) -> float:
        """The `time.monotonic()` by which `share` of what is left of the budget is used."""
        return time.monotonic() + share * self.remaining_s()

    @contextlib.contextmanager
    def part(self, name: str):
        """Times one part of the work (added to `name` when it ran before)."""
        began = time.monotonic()
        try:
            yield
        finally:
            self._parts[name] = self._parts.get(name, 0.0) + time.monotonic() - began

    def cost(self) -> Optional[TunerCost]:
        """The `TunerCost` so far, or `None` while training runs."""
        if self._ended is None:
            return None
        return TunerCost(
            fit_s=self._ended - self._started,
            budget_s=self.budget_s,
            after_training_s=self.spent_s(),
            parts={name: round(seconds, 4) for name, seconds in self._parts.items()},
            fix_timing_cap_s=self._fix_timing_cap_s,
            check_cap_s=self._check_cap_s,
            before_training_s=self._before_s,
            outputs_during_training_s=self._during_s,
        )
