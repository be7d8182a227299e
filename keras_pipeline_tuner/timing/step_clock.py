"""The step clock: a bounded record of when each step waited and computed.

Every source of timings (the `model.fit` callback, the custom-loop decorator, the
timed iterator) hands the clock rows of three timestamps per step, in seconds:

    start   the step began asking for its batch,
    ready   the batch was there (NaN when it could not be observed),
    end     the step's outputs and weight updates were done.

From these the clock derives input wait (`ready - start`), compute
(`end - max(ready, start)`) and the host gap between steps, keeps the most recent
rows in a fixed-size ring (memory does not grow with the run) and exact running
totals per epoch, and summarises them as `StepStats`.
"""

import dataclasses
import math
import time
from typing import Dict
from typing import List
from typing import Optional
from typing import Tuple

import numpy as np

from keras_pipeline_tuner.timing.step_stats import StepStats
from keras_pipeline_tuner.timing.step_stats import step_seconds

TRAIN = "train"
VALIDATION = "validation"
_KINDS = (TRAIN, VALIDATION)
# The first steps of every epoch wait for one-off work (a new iterator, a
# shuffle buffer refilling, parallel calls warming up): measured on cached,
# shuffled in-memory data, the first two steps of an epoch held 6.8 of its
# 15.6 ms of wait. They are totalled apart from the steady state.
EPOCH_START_STEPS = 2


@dataclasses.dataclass
class Share:
    """Total input wait and step time over a set of steps.

    Attributes:
        steps: steps counted (those whose wait was observed).
        wait_ms: their total input wait.
        step_ms: their total step time.
    """

    steps: int = 0
    wait_ms: float = 0.0
    step_ms: float = 0.0

    @property
    def input_fraction(self) -> Optional[float]:
        """Wait over step time, or `None` for no steps."""
        if not self.steps:
            return None
        return self.wait_ms / self.step_ms if self.step_ms > 0 else 0.0

    @property
    def mean_wait_ms(self) -> Optional[float]:
        """Mean input wait per step, or `None` for no steps."""
        return self.wait_ms / self.steps if self.steps else None

    def plus(self, other: "Share") -> "Share":
        """The two sets of steps together."""
        return Share(
            self.steps + other.steps, self.wait_ms + other.wait_ms, self.step_ms + other.step_ms
        )

    def minus(self, other: "Share") -> "Share":
        """These steps without `other`, a subset of them."""
        return Share(
            self.steps - other.steps,
            max(self.wait_ms - other.wait_ms, 0.0),
            max(self.step_ms - other.step_ms, 0.0),
        )


@dataclasses.dataclass
class FirstStep:
    """The first step of a run, reported apart: it includes tracing.

    Attributes:
        wall_ms: wall time of the first call, measured from Python.
        input_wait_ms: input wait measured inside the step (NaN if unknown).
        compute_ms: compute measured inside the step.
        tracing_ms: wall time not spent in the step itself: tracing and
            graph optimisation of the step function.
    """

    wall_ms: float
    input_wait_ms: Optional[float]
    compute_ms: Optional[float]
    tracing_ms: Optional[float]


@dataclasses.dataclass
class EpochBreakdown:
    """Steady-state statistics of one epoch of one kind (train or validation).

    Attributes:
        epoch: the epoch number (as Keras counts them, from 0).
        kind: "train" or "validation".
        setup_ms: time from the start of the epoch to its first step: iterator
            creation, and the destruction of the previous epoch's iterator.
        stats: `StepStats` of the epoch's steps, the run's first step excluded.
        steady: `Share` of the epoch's steps after its first
            `EPOCH_START_STEPS`, which wait for one-off work.
        start: `Share` of those first steps of the epoch.
        keras_ms_per_step: the ms/step Keras' progress bar shows for the epoch,
            counted as it counts it (`StepClock.keras_verbose`): with
            `verbose=2` (one line an epoch) the epoch's wall time from its
            start over all its steps; with `verbose=1` (the bar) its time after
            its first step over its later steps. Counted to the next training
            epoch's start, so that the callbacks' work at the epoch's end and
            its validation are in it as they are in Keras' figure; a last
            epoch to the end of the tuner's own work at the epoch's end.
            `None` where no progress bar ran (`verbose=0`, custom loops), for
            an epoch of one step, and in reports written before it was kept.
        keras_steps: the steps that figure is over.
    """

    epoch: int
    kind: str
    setup_ms: Optional[float]
    stats: StepStats
    steady: Optional[Share] = None
    start: Optional[Share] = None
    keras_ms_per_step: Optional[float] = None
    keras_steps: int = 0


@dataclasses.dataclass
class _Totals:
    """Exact running sums, kept apart from the ring so they survive wrap-around."""

    steps: int = 0
    measured_steps: int = 0
    wait_s: float = 0.0
    step_s: float = 0.0

    def add(self, wait: np.ndarray, compute: np.ndarray) -> None:
        measured = ~np.isnan(wait)
        self.steps += int(wait.size)
        self.measured_steps += int(measured.sum())
        self.wait_s += float(wait[measured].sum())
        self.step_s += float(step_seconds(wait[measured], compute[measured]).sum())

    def fraction(self) -> Optional[float]:
        if self.measured_steps == 0:
            return None
        return self.wait_s / self.step_s if self.step_s > 0 else 0.0

    def share(self) -> Share:
        return Share(self.measured_steps, self.wait_s * 1e3, self.step_s * 1e3)



def split_rows(rows) -> Tuple[np.ndarray, np.ndarray]:
    """The input wait and compute of `(start, ready, end)` rows, in seconds.

    The one rule for every row: wait is `ready - start`, compute `end - ready`,
    neither below zero. Where `ready` was not observed (NaN) the wait is NaN
    and the whole step counts as compute.

    Args:
        rows: an (n, 3) array (or one row) of seconds.

    Returns:
        `(wait, compute)`, two arrays of n seconds.

    Example:

    >>> wait, compute = split_rows([[0.0, 0.05, 0.06], [1.0, float("nan"), 1.02]])
    >>> wait.round(3).tolist(), compute.round(3).tolist()
    ([0.05, nan], [0.01, 0.02])
    """
    rows = np.asarray(rows, dtype=np.float64).reshape(-1, 3)
    start, ready, end = rows[:, 0], rows[:, 1], rows[:, 2]
    observed = ~np.isnan(ready)
    wait = np.where(observed, np.maximum(ready - start, 0.0), np.nan)
    compute = np.maximum(end - np.where(observed, np.fmax(ready, start), start), 0.0)
    return wait, compute


class StepClock:
    """Bounded per-step timing records with per-epoch summaries.

    Args:
        capacity: how many of the most recent steps keep their individual
            timings (for medians, percentiles and timelines). Totals and the input
            fraction stay exact beyond it.

    Attributes:
        recorded: how many times steps were recorded (`record` and
            `record_first_step` calls): it changes exactly when the figures may.

    Example:

    >>> clock = StepClock(capacity=100)
    >>> clock.begin_epoch(0)
    >>> clock.record("train", np.array([[0.0, 0.03, 0.04], [0.04, 0.07, 0.08]]))
    >>> round(clock.stats("train").input_fraction, 2)
    0.75
    """

    def __init__(self, capacity: int = 10_000):
        if not isinstance(capacity, int) or isinstance(capacity, bool) or capacity < 1:
            raise ValueError(
                f"`buffer_steps` must be a positive integer, got {capacity!r}. "
                "Pass e.g. buffer_steps=10000."
            )
        self.capacity = capacity
        self._kind = np.zeros(capacity, dtype=np.int8)
        self._epoch = np.zeros(capacity, dtype=np.int32)
        self._start = np.zeros(capacity, dtype=np.float64)
        self._wait = np.zeros(capacity, dtype=np.float64)
        self._compute = np.zeros(capacity, dtype=np.float64)
        self._gap = np.zeros(capacity, dtype=np.float64)
        # Each step's place in its epoch (0 for its first): the steady state
        # leaves out each epoch's first `EPOCH_START_STEPS`.
        self._position = np.zeros(capacity, dtype=np.int64)
        self._size = 0
        self._next = 0
        self._totals: Dict[str, _Totals] = {kind: _Totals() for kind in _KINDS}
        self._epoch_totals: Dict[str, _Totals] = {kind: _Totals() for kind in _KINDS}
        # The first steps of each epoch, run-wide and in the current epoch.
        self._start_totals: Dict[str, _Totals] = {kind: _Totals() for kind in _KINDS}
        self._epoch_start_totals: Dict[str, _Totals] = {kind: _Totals() for kind in _KINDS}
        self._epoch_step_count: Dict[str, int] = {kind: 0 for kind in _KINDS}
        self._last_end: Dict[str, float] = {}
        self._epoch_started: Dict[str, float] = {}
        self._epoch_setup: Dict[str, Optional[float]] = {}
        # When each kind's epoch's first step ended (Keras' progress bar with
        # verbose=1 counts its ms/step from there), and the training epoch
        # still counted to the next one's start.
        self._first_end: Dict[str, float] = {}
        self._open_train_epoch: Optional[EpochBreakdown] = None
        self._open_train_start: Optional[float] = None
        # Keras' `verbose` of the fit (1: a progress bar, 2: one line an
        # epoch, 0 or `None`: none): how its ms/step is counted.
        self.keras_verbose: Optional[int] = None
        self.epoch = 0
        self.recorded = 0
        self.first_steps: Dict[str, FirstStep] = {}
        self.epochs: List[EpochBreakdown] = []

    def begin_epoch(self, epoch: int, kind: str = TRAIN) -> None:
        """Marks the start of an epoch; the time to its first step is its setup.

        Args:
            epoch: the epoch number.
            kind: "train" or "validation".
        """
        now = time.time()
        if kind == TRAIN:
            self.epoch = epoch
            # Keras' progress bar ends the last epoch's clock after every
            # callback's work at its end: counted to here.
            self._count_keras_time(now)
        self._first_end.pop(kind, None)
        self._epoch_totals[kind] = _Totals()
        self._epoch_start_totals[kind] = _Totals()
        self._epoch_step_count[kind] = 0
        self._epoch_started[kind] = now
        self._epoch_setup[kind] = None
        self._last_end.pop(kind, None)

    def record(self, kind: str, rows: np.ndarray, called_at: Optional[float] = None) -> None:
        """Adds steps given as rows of (start, ready, end) timestamps in seconds.

        Args:
            kind: "train" or "validation".
            rows: array of shape (steps, 3); `ready` may be NaN when the input
                wait could not be separated from compute.
            called_at: when the call that ran these steps began, seen from Python
                (`time.time()`); ends the epoch's setup time. Defaults to the
                first row's start.
        """
        rows = np.asarray(rows, dtype=np.float64).reshape(-1, 3)
        self.recorded += 1
        self._note_setup(kind, rows, called_at)
        if rows.shape[0] == 0:
            return
        start, end = rows[:, 0], rows[:, 2]
        wait, compute = split_rows(rows)
        previous_end = np.concatenate(
            [[self._last_end.get(kind, np.nan)], end[:-1]]
        )
        gap = np.maximum(start - previous_end, 0.0)
        self._last_end[kind] = float(end[-1])
        self._first_end.setdefault(kind, float(end[0]))
        position = self._epoch_step_count[kind] + np.arange(wait.size)
        self._totals[kind].add(wait, compute)
        self._epoch_totals[kind].add(wait, compute)
        starting = max(EPOCH_START_STEPS - self._epoch_step_count[kind], 0)
        if starting:
            self._start_totals[kind].add(wait[:starting], compute[:starting])
            self._epoch_start_totals[kind].add(wait[:starting], compute[:starting])
        self._epoch_step_count[kind] += int(wait.size)
        self._append(_KINDS.index(kind), start, wait, compute, gap, position)

    def record_first_step(
        self,
        kind: str,
        wall_s: float,
        rows: np.ndarray,
        called_at: Optional[float] = None,
        tracing_s: Optional[float] = None,
    ) -> None:
        """Keeps a run's first step of `kind` apart: it includes tracing.

        Args:
            kind: "train" or "validation".
            wall_s: wall time of the first call, measured from Python.
            rows: its (start, ready, end) rows, as for `record`; with
                `steps_per_execution > 1` the rows after the first are ordinary steps.
            called_at: as for `record`.
            tracing_s: the tracing, when the timing source measured it apart.
                Without it, tracing is the wall time beyond the step's own
                rows (a step that computes inside its call). With it (JAX:
                the call returns once the step is compiled and dispatched,
                and the step computes after), the first step's compute is
                its time from the batch to its end less the tracing. NaN: it
                cannot be told apart from compute (a custom loop's step, seen
                from Python), and is not reported.
        """
        rows = np.asarray(rows, dtype=np.float64).reshape(-1, 3)
        self.recorded += 1
        start, ready, end = rows[0]
        measured = not math.isnan(ready)
        compute_s = float(end - (ready if measured else start))
        if tracing_s is None:
            tracing_s = max(wall_s - float(rows[-1, 2] - start), 0.0)
        elif not math.isnan(tracing_s):
            compute_s = max(compute_s - tracing_s, 0.0)
        self.first_steps[kind] = FirstStep(
            wall_ms=wall_s * 1e3,
            input_wait_ms=float(max(ready - start, 0.0) * 1e3) if measured else None,
            compute_ms=compute_s * 1e3,
            tracing_ms=None if math.isnan(tracing_s) else float(tracing_s * 1e3),
        )
        self._note_setup(kind, rows, called_at)
        self._last_end[kind] = float(end)
        self._first_end.setdefault(kind, float(end))
        # The first step is one of its epoch's first steps, though kept apart.
        self._epoch_step_count[kind] += 1
        self.record(kind, rows[1:])

    def end_epoch(self, kind: str = TRAIN, epoch: Optional[int] = None) -> EpochBreakdown:
        """Closes the current epoch of `kind` and keeps its breakdown.

        Args:
            kind: "train" or "validation".
            epoch: the epoch number; defaults to the current training epoch.

        Returns:
            The `EpochBreakdown` of that epoch.
        """
        epoch = self.epoch if epoch is None else epoch
        selected = self._select(kind, epoch)
        breakdown = EpochBreakdown(
            epoch=epoch,
            kind=kind,
            setup_ms=_ms(self._epoch_setup.get(kind)),
            stats=self._summarise(selected, self._epoch_totals[kind]),
            steady=self._epoch_totals[kind].share().minus(self._epoch_start_totals[kind].share()),
            start=self._epoch_start_totals[kind].share(),
            keras_steps=self._epoch_step_count[kind] - (1 if self.keras_verbose == 1 else 0),
        )
        self.epochs.append(breakdown)
        started = self._epoch_started.pop(kind, None)
        if kind == TRAIN and self.keras_verbose in (1, 2):
            # Counted to here for now; to the next epoch's start once it begins.
            self._open_train_epoch, self._open_train_start = breakdown, started
            self.epoch_work_ended()
        return breakdown

    def epoch_work_ended(self) -> None:
        """The tuner's work at a training epoch's end is done: Keras' ms/step counted to now.

        Counted again when the next epoch begins, after every callback's
        work at this one's end, as Keras counts it.
        """
        self._count_keras_time(time.time(), final=False)

    def ended_epochs(self, kind: str = TRAIN) -> int:
        """Epochs of `kind` that ended having taken steps.

        Example:

        >>> import numpy as np
        >>> clock = StepClock()
        >>> clock.begin_epoch(0)
        >>> clock.record("train", np.array([[0.0, 0.001, 0.002]]))
        >>> _ = clock.end_epoch("train", 0)
        >>> clock.begin_epoch(1)
        >>> _ = clock.end_epoch("train", 1)  # no step: not counted
        >>> clock.ended_epochs(), clock.ended_epochs("validation")
        (1, 0)
        """
        return sum(1 for epoch in self.epochs if epoch.kind == kind and epoch.stats.steps)

    def steady_steps(
        self, kind: str = TRAIN, from_epoch: Optional[int] = None, epoch: Optional[int] = None
    ) -> Dict[str, np.ndarray]:
        """The retained steps of the steady state: each epoch's first `EPOCH_START_STEPS` out.

        Args:
            kind: "train" or "validation".
            from_epoch: leave out the epochs before this one too (the verdict's
                steady state once two epochs ended starts at the second).
            epoch: only this epoch's steps.

        Returns:
            As `steps()`.

        Example:

        >>> clock = StepClock()
        >>> clock.begin_epoch(0)
        >>> clock.record("train", np.array([[0.0, 0.05, 0.06], [0.06, 0.07, 0.08],
        ...                                 [0.08, 0.081, 0.09]]))
        >>> clock.steady_steps("train")["wait"].round(3).tolist()
        [0.001]
        """
        order = self._order(kind, epoch)
        kept = self._position[order] >= EPOCH_START_STEPS
        if from_epoch is not None:
            kept &= self._epoch[order] >= from_epoch
        return self._columns(order[kept])

    def stats(self, kind: str = TRAIN) -> StepStats:
        """Steady-state statistics of all steps of `kind` so far.

        Args:
            kind: "train" or "validation".

        Returns:
            A `StepStats`; percentiles come from the retained steps, the step count
            and the input fraction are exact.
        """
        return self._summarise(self._select(kind), self._totals[kind])

    def steady_share(self, kind: str = TRAIN) -> Share:
        """Wait and step time of all steps of `kind` but each epoch's first ones.

        Args:
            kind: "train" or "validation".

        Returns:
            The `Share`, exact over the whole run.

        Example:

        >>> clock = StepClock()
        >>> clock.begin_epoch(0)
        >>> clock.record("train", np.array([[0.0, 0.05, 0.06], [0.06, 0.07, 0.08],
        ...                                 [0.08, 0.081, 0.09]]))
        >>> share = clock.steady_share("train")
        >>> share.steps, round(share.input_fraction, 1)
        (1, 0.1)
        """
        return self._totals[kind].share().minus(self._start_totals[kind].share())

    def epoch_start_share(self, kind: str = TRAIN) -> Share:
        """Wait and step time of each epoch's first `EPOCH_START_STEPS` steps, run-wide."""
        return self._start_totals[kind].share()

    def steps(self, kind: str = TRAIN) -> Dict[str, np.ndarray]:
        """The retained per-step timings of `kind`, oldest first.

        Args:
            kind: "train" or "validation".

        Returns:
            A dict of equal-length arrays: "epoch", "start" (seconds since the
            epoch), "wait", "compute" and "gap" (seconds).
        """
        return self._select(kind)

    def step_numbers(self, kind: str = TRAIN) -> np.ndarray:
        """The run-wide number of each retained step of `kind`, in `steps()` order.

        Args:
            kind: "train" or "validation".

        Returns:
            An int64 array; the first step (reported apart) is step 0, so the
            retained steps end at the number of steps recorded.
        """
        retained = int(np.count_nonzero(self._kind[: self._size] == _KINDS.index(kind)))
        total = self._totals[kind].steps
        return np.arange(total - retained + 1, total + 1, dtype=np.int64)

    def rows_since(self, kind: str, number: int) -> Dict[str, np.ndarray]:
        """The retained steps of `kind` numbered after `number`, for outputs that
        write what is new since their last write.

        Args:
            kind: "train" or "validation".
            number: the last step number already handled (0 for none).

        Returns:
            As `steps()`, with a "number" array of the steps' run-wide numbers.

        Example:

        >>> clock = StepClock(capacity=10)
        >>> clock.begin_epoch(0)
        >>> clock.record("train", np.array([[0.0, 0.01, 0.02], [0.02, 0.03, 0.04]]))
        >>> clock.rows_since("train", 1)["number"].tolist()
        [2]
        """
        numbers = self.step_numbers(kind)
        new = numbers > number
        selected = {name: values[new] for name, values in self._select(kind).items()}
        selected["number"] = numbers[new]
        return selected

    @property
    def retained_steps(self) -> int:
        """How many per-step rows the ring holds now (at most `capacity`)."""
        return self._size

    # Internals.

    def _note_setup(self, kind: str, rows: np.ndarray, called_at: Optional[float]) -> None:
        if self._epoch_setup.get(kind) is not None or kind not in self._epoch_started:
            return
        if called_at is None:
            if rows.shape[0] == 0:
                return
            called_at = float(rows[0, 0])
        self._epoch_setup[kind] = max(0.0, called_at - self._epoch_started[kind])

    def _count_keras_time(self, now: float, final: bool = True) -> None:
        """Keras' ms/step of the training epoch that ended last, counted to `now`."""
        breakdown = self._open_train_epoch
        if breakdown is None or breakdown.keras_steps < 1:
            return
        began = self._first_end.get(TRAIN) if self.keras_verbose == 1 else self._open_train_start
        if began is not None:
            breakdown.keras_ms_per_step = max(now - began, 0.0) * 1e3 / breakdown.keras_steps
        if final:
            self._open_train_epoch = self._open_train_start = None

    def _append(self, kind_code, start, wait, compute, gap, position) -> None:
        count = start.size
        if count > self.capacity:
            start, wait, compute, gap, position = (
                a[-self.capacity:] for a in (start, wait, compute, gap, position)
            )
            count = self.capacity
        index = (self._next + np.arange(count)) % self.capacity
        self._kind[index] = kind_code
        self._epoch[index] = self.epoch
        self._start[index] = start
        self._wait[index] = wait
        self._compute[index] = compute
        self._gap[index] = gap
        self._position[index] = position
        self._next = int((self._next + count) % self.capacity)
        self._size = min(self._size + count, self.capacity)

    def _order(self, kind: str, epoch: Optional[int] = None) -> np.ndarray:
        """Ring indices of the retained steps of `kind` (of `epoch`), oldest first."""
        order = (self._next - self._size + np.arange(self._size)) % self.capacity
        mask = self._kind[order] == _KINDS.index(kind)
        if epoch is not None:
            mask &= self._epoch[order] == epoch
        return order[mask]

    def _select(self, kind: str, epoch: Optional[int] = None) -> Dict[str, np.ndarray]:
        return self._columns(self._order(kind, epoch))

    def _columns(self, order: np.ndarray) -> Dict[str, np.ndarray]:
        return {
            "epoch": self._epoch[order],
            "start": self._start[order],
            "wait": self._wait[order],
            "compute": self._compute[order],
            "gap": self._gap[order],
        }

    @staticmethod
    def _summarise(selected: Dict[str, np.ndarray], totals: _Totals) -> StepStats:
        stats = StepStats.from_arrays(selected["wait"], selected["compute"], selected["gap"])
        stats.steps = totals.steps
        stats.input_fraction = totals.fraction()
        return stats


def _ms(seconds: Optional[float]) -> Optional[float]:
    return None if seconds is None else float(seconds * 1e3)

