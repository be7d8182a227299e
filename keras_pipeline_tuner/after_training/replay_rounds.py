"""Timed blocks of replayed and real steps, alternated in rounds: the replay's clock.

A replay times a step function (`run_steps(iterator)`, which fetches one
call's batches and returns its `(start, ready, end)` rows) on cached batches,
and, between two parts of that, on a fresh iterator of the real pipeline, so
that both run under the same load (`run_rounds`). The step function is the
backend's: the tuner's timed compiled function on TensorFlow
(`what_if_replay`), Keras' own on JAX and torch (`framework_replay`).
"""

import dataclasses
import sys
import time
from typing import List
from typing import Optional
from typing import Tuple

import numpy as np

from keras_pipeline_tuner.timing.step_clock import EPOCH_START_STEPS
from keras_pipeline_tuner.timing.step_clock import split_rows
from keras_pipeline_tuner.timing.step_stats import StepStats

# Calls set apart before timing: the first may trace, and buffers fill.
WARMUP_CALLS = 2
# Rounds of pipeline steps in a contention check, at most.
MAX_ROUNDS = 2


@dataclasses.dataclass
class ReplayRound:
    """One round of a replay timed around the real pipeline: its steps and the replay's.

    Attributes:
        pipeline_ms: mean step time on the real pipeline in this round.
        replay_ms: mean step time of the replayed steps just before and just
            after them, under the same load.
        pipeline_wall_ms: the pipeline's steps' wall time a step, from one
            step's start to the next's (epoch restarts left out): it also
            holds what falls between steps, where a CPU quota's stops mostly
            land.
        replay_wall_ms: the same for the replayed steps either side.

    Example:

    ```python
    result = kpt.what_if(model, train_ds)
    for each in result.rounds:
        print(each.pipeline_ms / each.replay_ms)
    ```
    """

    pipeline_ms: float = 0.0
    replay_ms: float = 0.0
    pipeline_wall_ms: Optional[float] = None
    replay_wall_ms: Optional[float] = None

    def compared(self, wall_time: bool = False) -> Tuple[float, float, bool]:
        """`(pipeline, replay, walled)`: ms a step by wall time when asked and known, else by step.

        Args:
            wall_time: compare the wall time a step (start to start), as
                under a quota that throttled the job: its stops fall between
                steps too, where the step time misses them.

        Returns:
            The two figures in ms, and whether they are the wall times.
        """
        if wall_time and self.pipeline_wall_ms and self.replay_wall_ms:
            return self.pipeline_wall_ms, self.replay_wall_ms, True
        return self.pipeline_ms, self.replay_ms, False


def run_replay(run_steps, replayed, steps) -> np.ndarray:
    """Times `steps` replayed steps, after the warm-up calls."""
    replay_iterator = iter(replayed)
    for _ in range(WARMUP_CALLS):
        run_steps(replay_iterator)
    return np.concatenate(_calls(run_steps, replay_iterator, steps))[:steps]


def run_rounds(run_steps, replayed, dataset, steps, control):
    """Times the replay and the real pipeline in turn: A-B-A, then B-A per more round.

    The real pipeline's steps run between two parts of the replay: drift in
    the machine's load between the two sides cancels out, and no iterator of
    the real pipeline lives while the replay runs (its threads would keep
    working, and slow the replayed steps they should not touch). Each round
    compares its pipeline steps with the replayed steps just before and after;
    `control` (a `RoundControl`, or `None` for one round of `steps`) sizes the
    steps by the time the warm-up calls took and decides whether one more
    round runs, up to `MAX_ROUNDS`.
    """
    replay_iterator = iter(replayed)
    for _ in range(WARMUP_CALLS):
        # The last warm-up call times a call: the first ones trace the step.
        began = time.monotonic()
        run_steps(replay_iterator)
    if control is not None:
        steps = control.steps_for(steps, time.monotonic() - began)
    first_part = (steps + 1) // 2
    replay_parts = [_block(run_steps, replay_iterator, first_part)]
    pipeline_parts: List[List[np.ndarray]] = []
    rounds: List[ReplayRound] = []
    while True:
        round_began = time.monotonic()
        pipeline_parts.append(_pipeline_block(run_steps, dataset, steps))
        replay_parts.append(_block(run_steps, replay_iterator, steps - first_part))
        around = replay_parts[-2] + [_BREAK] + replay_parts[-1]
        rounds.append(
            ReplayRound(
                pipeline_ms=stats_of(_rows(pipeline_parts[-1])).step.mean_ms,
                replay_ms=stats_of(_rows(around)).step.mean_ms,
                pipeline_wall_ms=wall_ms(pipeline_parts[-1]),
                replay_wall_ms=wall_ms(around),
            )
        )
        if len(rounds) >= MAX_ROUNDS or control is None:
            break
        if not control.another_round(rounds[-1], time.monotonic() - round_began):
            break
    replay_rows = _rows([rows for part in replay_parts for rows in part])
    return replay_rows, _rows([rows for part in pipeline_parts for rows in part]), rounds


# Between two parts of timed steps that did not run back to back.
_BREAK = np.zeros((0, 3))


def _rows(parts: List[np.ndarray]) -> np.ndarray:
    return np.concatenate(parts) if parts else _BREAK


def _first(parts: List[np.ndarray], steps: int) -> List[np.ndarray]:
    """The calls' rows cut to the first `steps` (a call may run several steps)."""
    kept: List[np.ndarray] = []
    for rows in parts:
        left = steps - sum(found.shape[0] for found in kept)
        if left <= 0:
            break
        kept.append(rows[:left])
    return kept


def wall_ms(parts: List[np.ndarray]) -> Optional[float]:
    """Mean ms from one timed step's start to the next's, within runs of back-to-back steps.

    Unlike the step time (fetch to end of step), this holds what falls between
    steps as well: the loop's own work and, under a CPU quota, the kernel's
    stops, which land wherever the threads are.

    Args:
        parts: arrays of (start, ready, end) rows in seconds, each call's
            steps back to back with the previous array's unless an empty
            array (a break) stands between them.

    Returns:
        The mean interval in ms, or `None` with fewer than two steps in a row.

    Example:

    >>> wall_ms([np.array([[0.0, 0.1, 0.2], [0.5, 0.6, 0.7]]), np.array([[1.0, 1.1, 1.2]])])
    500.0
    >>> wall_ms([np.array([[0.0, 0.1, 0.2]]), np.zeros((0, 3)), np.array([[9.0, 9.1, 9.2]])])
    """
    total_s, intervals, previous = 0.0, 0, None
    for rows in parts:
        if rows.shape[0] == 0:
            previous = None
            continue
        starts = rows[:, 0]
        if previous is not None:
            total_s += starts[0] - previous
            intervals += 1
        total_s += starts[-1] - starts[0]
        intervals += rows.shape[0] - 1
        previous = starts[-1]
    return float(total_s / intervals * 1e3) if intervals else None


def _block(run_steps, iterator, steps) -> List[np.ndarray]:
    """The calls timing `steps` steps (or a few more) on `iterator`, back to back."""
    return _first(_calls(run_steps, iterator, steps), steps) if steps else []


def _pipeline_block(run_steps, dataset, steps) -> List[np.ndarray]:
    """Times `steps` steps on a fresh iterator of the real pipeline, then drops it.

    Returns its calls, with a `_BREAK` where an epoch restarted between them.
    """
    found: List[np.ndarray] = []
    iterator = iter(dataset)
    for _ in range(WARMUP_CALLS):
        iterator = _pipeline_call(run_steps, iterator, dataset, [])
    while sum(rows.shape[0] for rows in found) < steps:
        iterator = _pipeline_call(run_steps, iterator, dataset, found)
    return _first(found, steps)


def _calls(run_steps, iterator, steps) -> List[np.ndarray]:
    rows: List[np.ndarray] = []
    while sum(found.shape[0] for found in rows) < steps:
        rows.append(np.asarray(run_steps(iterator)).reshape(-1, 3))
    return rows


def _pipeline_call(run_steps, iterator, dataset, found):
    # A tf.data iterator of TensorFlow's ends with its own error; Python's
    # (JAX, torch) with StopIteration.
    tf = sys.modules.get("tensorflow")
    ended = (StopIteration,) + ((tf.errors.OutOfRangeError,) if tf is not None else ())
    try:
        found.append(np.asarray(run_steps(iterator)).reshape(-1, 3))
        return iterator
    except ended:
        pass
    # The epoch ended: start the next one, as fit would (its set-up untimed).
    # Its first steps wait for one-off work (a shuffle buffer refilling),
    # which the verdict leaves out too: they run untimed.
    found.append(_BREAK)
    iterator = iter(dataset)
    for _ in range(EPOCH_START_STEPS):
        try:
            run_steps(iterator)
        except ended:
            iterator = iter(dataset)
            break
    found.append(np.asarray(run_steps(iterator)).reshape(-1, 3))
    return iterator


def stats_of(rows: np.ndarray) -> StepStats:
    if rows.shape[0] == 0:
        return StepStats()
    return StepStats.from_arrays(*split_rows(rows))
