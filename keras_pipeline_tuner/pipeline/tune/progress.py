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
        from rich.progress import MofNCompleteColumn
        from rich.progress import Progress
        from rich.progress import TextColumn

        self._progress = Progress(
            TextColumn("kpt.tune: timed passes"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[elapsed]}"),
        )
        self._task = self._progress.add_task("tune", total=total_passes, elapsed="")
        self._progress.start()

    def estimate(self, passes_left: int) -> None:
        """Makes the bar's length the passes done and `passes_left` more."""
        if self._progress is not None:
            done = self._progress.tasks[0].completed
            self._progress.update(self._task, total=done + passes_left)

    def advance(self) -> None:
        """Counts one timed pass."""
        if self._progress is not None:
            used = time.perf_counter() - self.budget.started
            self._progress.update(
                self._task, advance=1, elapsed=f"{used:.0f} s of {self.budget.budget_s:g} s"
            )

    def stop(self) -> None:
        """Ends the bar at the passes done."""
        if self._progress is not None:
            task = self._progress.tasks[0]
            # Rewrites skipped or stopped early leave the estimate short of done.
            self._progress.update(self._task, total=task.completed)
            self._progress.stop()
            self._progress = None
