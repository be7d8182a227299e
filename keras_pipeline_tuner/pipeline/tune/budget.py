"""The time and epochs a tuning session may spend, and how many rounds that allows.

`tune` runs for about `budget_s` seconds. Every rewrite needs a check and at
least `MIN_ROUNDS` side-by-side rounds, and, once rewrites are kept, the final
comparison with the original must still fit after it. A pipeline that calls
Python runs its side effects on every epoch, so the epochs tuning runs of it
are counted against a limit too. Fast pipelines get more rounds: a pass of
tens of milliseconds is at the mercy of one scheduling slice.
"""

import time
from typing import Dict
from typing import List
from typing import Optional

MIN_ROUNDS = 3
_MAX_ROUNDS = 9
# A pass of tens of milliseconds is at the mercy of one scheduling slice: fast
# pipelines get more rounds, up to about this many seconds per side...
_FAST_SIDE_S = 1.0
# ... and at most this many rounds.
_MAX_FAST_ROUNDS = 45
# Share of what is left of the budget that filling or sizing a cache may take.
EPOCH_BUDGET_SHARE = 0.3
# Share of the budget the first read of the original may take: it is read three
# times before any timing (the reference, whether it repeats, its rebuild), so a
# longer epoch is cut there and every pass reads a few batches of it.
REFERENCE_SHARE = 0.1
# Share of the budget past which that first read gives up when it has not even
# read the batches an epoch is cut to: the two reads after it would fill the
# budget, and no rewrite could be timed.
REFERENCE_GIVE_UP_SHARE = 1 / 3
# Share of the budget a pass under way may run past its end before it is
# stopped: rounds are sized from the passes timed so far, and a machine that
# slows down several-fold after that would otherwise carry them far past it.
OVERRUN_SHARE = 0.02


class Budget:
    """What one tuning session may spend, what it has spent, and the rounds that fit.

    Args:
        plan: the `PassPlan` of the session's timed passes.
        budget_s: about how long the session may take, in seconds.

    Attributes:
        budget_s: the budget, in seconds.
        started: `time.perf_counter()` when the session started.
        deadline: `time.perf_counter()` when the budget is spent.
        stop_at: `time.perf_counter()` when a timed pass still running is
            stopped (`OVERRUN_SHARE` of the budget after `deadline`).
        pass_estimate_s: seconds of one timed pass of the pipeline as it
            stands (the original, then with the rewrites kept).
        pass_overhead_s: wall time a timed pass costs beyond the pass itself
            (building the rewritten dataset, garbage collection between
            rounds), as measured.
        epoch_s: seconds of one epoch of the pipeline as it stands.
        epochs_run: epochs of the pipeline run so far, checks included.
        epoch_limit: the most epochs the session may run (a pipeline that
            calls Python), or `None`.
        rounds: rounds per comparison, as last worked out (`rounds_for`).

    Example:

    >>> from keras_pipeline_tuner.pipeline.tune.paired_timing import PassPlan
    >>> budget = Budget(PassPlan(epochs=2), budget_s=60.0)
    >>> budget.pass_estimate_s = 1.0
    >>> budget.rounds_for(comparisons=2)
    9
    """

    def __init__(self, plan, budget_s: float):
        self.plan = plan
        self.budget_s = budget_s
        self.started = time.perf_counter()
        self.deadline = self.started + budget_s
        self.stop_at = self.deadline + OVERRUN_SHARE * budget_s
        self.pass_estimate_s = 0.0
        self.pass_overhead_s = 0.0
        self.epoch_s = 0.0
        self.epochs_run = 0
        self.epoch_limit: Optional[int] = None
        self.rounds = MIN_ROUNDS

    def rounds_for(self, comparisons: int) -> int:
        """Rounds per comparison that let `comparisons` more of them fit the budget."""
        pass_s = max(self.pass_estimate_s, 1e-3)
        most = max(_MAX_ROUNDS, min(_MAX_FAST_ROUNDS, int(_FAST_SIDE_S / pass_s)))
        if self.epoch_limit is not None:
            # Every epoch runs the user's Python side effects: the epochs left
            # are shared among the comparisons left (each with its check).
            epochs_left = self.epoch_limit - self.epochs_run - max(comparisons, 1)
            shared = epochs_left // (max(comparisons, 1) * 2 * self.plan.epochs)
            most = max(MIN_ROUNDS, min(most, shared))
        left = self.deadline - time.perf_counter()
        per_round = max(comparisons, 1) * 2 * max(self.pass_cost_s(), 1e-3)
        return int(min(most, max(MIN_ROUNDS, left // per_round)))

    def affordable_rounds(self, final: bool) -> int:
        """Rounds of a two-way comparison the epoch limit allows (the final one's kept)."""
        if self.epoch_limit is None:
            return self.rounds
        reserve = 2 * MIN_ROUNDS * self.plan.epochs if final else 0
        left = self.epoch_limit - self.epochs_run - reserve
        return max(1, min(self.rounds, left // (2 * self.plan.epochs)))

    def rounds_alone(self) -> int:
        """Rounds of the original timed on its own, when nothing was compared with it."""
        if self.epoch_limit is None:
            return MIN_ROUNDS
        return max(1, min(MIN_ROUNDS, (self.epoch_limit - self.epochs_run) // self.plan.epochs))

    def comparison_s(self) -> float:
        """Seconds of the fewest rounds of one side-by-side comparison."""
        return 2 * MIN_ROUNDS * self.pass_cost_s()

    def pass_cost_s(self) -> float:
        """Wall seconds one timed pass costs the budget, building included."""
        return self.pass_estimate_s + self.pass_overhead_s

    def shortfall(self, final: bool, extra_epochs: int = 0) -> Optional[str]:
        """Why a rewrite cannot be measured now (with its figures), or None."""
        passes = 2 * MIN_ROUNDS
        needed_s = self.epoch_s + self.comparison_s()
        reserve_s = self.comparison_s() if final else 0.0
        left_s = self.deadline - time.perf_counter()
        used_s = time.perf_counter() - self.started
        return budget_shortfall(
            needed_s=needed_s,
            reserve_s=reserve_s,
            left_s=left_s,
            used_s=used_s,
            budget_s=self.budget_s,
            pass_s=self.pass_cost_s(),
            passes=passes,
        ) or self._epoch_shortfall(final, extra_epochs)

    def _epoch_shortfall(self, final: bool, extra_epochs: int) -> Optional[str]:
        if self.epoch_limit is None:
            return None
        # Its check (two more epochs for a vectorised map compared within a
        # tolerance), its timed passes, and the final comparison's.
        needed = 3 + extra_epochs + 2 * MIN_ROUNDS * self.plan.epochs * (2 if final else 1)
        if self.epochs_run + needed <= self.epoch_limit:
            return None
        return (
            f"the pipeline calls Python, and measuring it needs {needed} more "
            f"epochs of it; {self.epochs_run} of the {self.epoch_limit} allowed "
            "(max_python_epochs) were run"
        )

    def record_passes(self, times: Dict[str, List[float]], began: float) -> None:
        """Counts the epochs of timed passes, and their cost beyond the passes themselves.

        Args:
            times: the passes' times by dataset, from `paired_timing.side_by_side`.
            began: `time.perf_counter()` before the passes were built and run.
        """
        passes = sum(len(found) for found in times.values())
        timed = sum(sum(found) for found in times.values())
        if passes:
            self.pass_overhead_s = max(0.0, (time.perf_counter() - began - timed) / passes)
        self.epochs_run += self.plan.epochs * sum(len(found) for found in times.values())


def budget_shortfall(
    needed_s: float,
    reserve_s: float,
    left_s: float,
    used_s: float,
    budget_s: float,
    pass_s: float,
    passes: int,
) -> Optional[str]:
    """Why the time budget does not allow measuring one rewrite, or `None`.

    A rewrite needs one checking epoch and `passes` timed passes; when it
    would be kept on top of others, the final comparison with the original
    (`reserve_s`) must still fit after it.

    Args:
        needed_s: seconds the rewrite's own check and passes take.
        reserve_s: seconds kept for the final comparison.
        left_s: seconds of the budget left.
        used_s: seconds of the budget used.
        budget_s: the whole budget.
        pass_s: seconds of one timed pass.
        passes: timed passes the rewrite needs.

    Returns:
        The reason, with its figures, or `None` when it can be measured.

    Example:

    >>> budget_shortfall(3.0, 0.0, 5.0, 1.0, 6.0, 0.5, 6) is None
    True
    >>> budget_shortfall(13.0, 0.0, 20.0, 0.0, 20.0, 2.0, 6) is None
    True
    >>> budget_shortfall(30.0, 0.0, 9.0, 1.0, 10.0, 4.9, 6).split(":")[0]
    'too slow to measure within budget_s=10'
    >>> budget_shortfall(13.0, 1.0, 6.8, 13.2, 20.0, 2.0, 6).split(";")[0]
    'the time budget left is too short (13.2 s of 20 s used, 6.8 s left)'
    """
    if needed_s > budget_s:
        return (
            f"too slow to measure within budget_s={budget_s:g}: one timed "
            f"pass takes about {pass_s:.2f} s, and measuring it needs {passes} passes and a "
            f"check (about {needed_s:.1f} s)"
        )
    if needed_s + reserve_s > left_s:
        final = (
            f", and {reserve_s:.1f} s kept for the final comparison with the original"
            if reserve_s
            else ""
        )
        # "Spent" only when nothing is left: with seconds left, the budget is short.
        spent = "was spent" if left_s <= 0.0 else "left is too short"
        return (
            f"the time budget {spent} ({used_s:.1f} s of {budget_s:g} s "
            f"used, {max(left_s, 0.0):.1f} s left); measuring it needs about {needed_s:.1f} s "
            f"({passes} passes of {pass_s:.2f} s and a check){final}"
        )
    return None
