"""The progress bar of `tune`'s timed passes.

The number of passes is an estimate that shrinks as rewrites are refused or the
budget runs out; the bar ends full at the passes actually run.
"""

import time


class PassProgress:
    """Shows the timed passes of one tuning session, and the budget used.

    Args:
        verbose: 1 shows the bar, 0 shows nothing.
        budget: the session's `Budget` (its start and its seconds are shown).

    Example:

    >>> progress = PassProgress(verbose=0, budget=None)
    >>> progress.start(total_passes=12)  # shows nothing: verbose=0
    >>> progress.stop()
    """

    def __init__(self, verbose: int, budget):
        self.verbose = verbose
        self.budget = budget
        self._progress = None
        self._task = None

    def start(self, total_passes: int) -> None:
        """Starts the bar, `total_passes` long (an estimate)."""
        if not self.verbose:
            return
        # rich writes no cursor codes when its output is not a terminal: a
        # log file gets the final line only.
        from rich.progress import BarColumn
        from rich.progress import Progress
        from rich.progress import TextColumn
        from rich.table import Column

        # One text column after the bar: a narrow console cuts its end (what
        # is timed), not the counts.
        self._progress = Progress(
            BarColumn(bar_width=12),
            TextColumn(
                "kpt.tune: {task.completed:.0f}/{task.total:.0f} timed passes, "
                "{task.fields[elapsed]}{task.fields[what]}",
                table_column=Column(no_wrap=True, overflow="ellipsis"),
            ),
        )
        self._task = self._progress.add_task(
            "tune", total=total_passes, elapsed=self._elapsed(), what=""
        )
        self._progress.start()

    def estimate(self, passes_left: int) -> None:
        """Makes the bar's length the passes done and `passes_left` more."""
        if self._progress is not None:
            done = self._progress.tasks[0].completed
            self._progress.update(self._task, total=done + passes_left)

    def timing(self, what: str) -> None:
        """Names what the next passes time, e.g. "map(load, num_parallel_calls=AUTOTUNE)"."""
        if self._progress is not None:
            self._progress.update(self._task, what=f"; timing {what}", elapsed=self._elapsed())

    def advance(self) -> None:
        """Counts one timed pass."""
        if self._progress is not None:
            self._progress.update(self._task, advance=1, elapsed=self._elapsed())

    def _elapsed(self) -> str:
        used = time.perf_counter() - self.budget.started
        left = max(self.budget.budget_s - used, 0.0)
        return f"{used:.0f} s of {self.budget.budget_s:g} s used, {left:.0f} s left"

    def stop(self) -> None:
        """Ends the bar at the passes done."""
        if self._progress is not None:
            task = self._progress.tasks[0]
            # Rewrites skipped or stopped early leave the estimate short of done.
            self._progress.update(self._task, total=task.completed)
            self._progress.stop()
            self._progress = None
