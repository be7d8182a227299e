"""The user's Python stages as the advice weighs them: cost a step, a change's predicted step.

The tuner times the user's own Python calls during training, where the fit
makes them (`instrumentation.user_calls`): a generator's `next`, a
`tf.py_function` in a map, a PyDataset's `__getitem__`. Nothing runs them
again after training, so a change to such a stage (its work spread over
threads or workers, or cached) is not measured: its gain is predicted here,
from those calls and the step clock, by an operational model of the one stage
it touches (as Plumber's, MLSys 2022):

- the input prepares a batch in `t_in`: the step's wait, plus the compute it
  overlaps when the pipeline runs ahead of the step (a prefetch, a parallel
  stage);
- the stage takes `p` of it: its calls' wall time a step, at most `t_in`;
- spread over `k` threads it takes `max(p / k, p * serial)`, where `serial`
  is twice its calls' CPU share, at most 1: Python that computes holds the GIL,
  and a thread that waits for the GIL (or a CPU) is not computing either, so
  its wall time holds about as much waiting as computing that no thread can
  overlap. Only the rest (a `sleep`, a read) spreads. Measured here: a
  pure-Python map computing 56 % of its time got 1.25x from two threads, 0.77x
  beside two busy loops; a map that sleeps (2 % CPU) got 1.99x. A cache read
  back takes none of the stage's time;
- after the change the pipeline runs ahead (parallel calls, workers, a cache
  read back), so a step takes the longer of its compute and the input's new
  `t_in - p + p_after`.

A prediction, labelled as such wherever it is shown; `kpt.tune` (tf.data) or
`measure_fixes=True` with `allow_unverified=True` measure the change itself.
"""

import dataclasses
from typing import Iterable
from typing import List
from typing import Optional

# Spread over no thread: the stage's output read back from a cache.
CACHED = 0


@dataclasses.dataclass(frozen=True)
class PythonStageCost:
    """One Python stage's calls in training, per training step.

    Attributes:
        stage: the stage, as the lint and the advice name it (e.g. "map(load)").
        function: the user's function (e.g. "load"; several joined by ", ").
        step_ms: its calls' wall time per training step, in milliseconds.
        cpu_share: the share of that time its threads computed (CPU time over
            wall time): the part that holds the GIL.
        calls: calls timed in training.
        call_ms: mean wall time a call.

    Example:

    >>> cost = PythonStageCost("map(load)", "load", step_ms=24.0, cpu_share=0.0,
    ...                        calls=96, call_ms=6.0)
    >>> cost.sentence()
    'load in map(load) took 6.00 ms a call, 24.00 ms a training step (0 % of it computing \
in Python), timed during training over 96 calls.'
    """

    stage: str
    function: str
    step_ms: float
    cpu_share: float
    calls: int
    call_ms: float

    @property
    def serial_share(self) -> float:
        """The share of its time threads cannot spread: its computing, and as much waiting.

        Example:

        >>> PythonStageCost("map(f)", "f", 10.0, cpu_share=0.3, calls=1, call_ms=10.0).serial_share
        0.6
        """
        return min(1.0, 2.0 * self.cpu_share)

    def sentence(self) -> str:
        """What was timed, in a sentence with its numbers."""
        return (
            f"{self.function} in {self.stage} took {self.call_ms:.2f} ms a call, "
            f"{self.step_ms:.2f} ms a training step ({self.cpu_share * 100:.0f} % of it "
            f"computing in Python), timed during training over {self.calls} calls."
        )


def stage_costs(user_calls: Iterable, steps: int) -> List[PythonStageCost]:
    """Each Python stage's cost a training step, most costly first.

    Args:
        user_calls: the run's `UserCallTiming`s (`Report.user_calls`); calls
            made once per pass over the data (a generator's start) are left
            out: they are set-up, not a step's work.
        steps: the training steps the calls fed, for timings that do not
            say their calls a batch (`per_batch_calls`).

    Returns:
        A `PythonStageCost` per stage with timed per-element calls.

    Example:

    >>> from keras_pipeline_tuner.instrumentation.user_calls import UserCallTiming
    >>> timed = UserCallTiming("map(load)", "load", "tf.py_function", calls=96,
    ...     wall_ms=6.0, wall_ms_median=6.0, cpu_ms=0.6, threads=1)
    >>> (cost,) = stage_costs([timed], steps=24)
    >>> cost.step_ms, round(cost.cpu_share, 2)
    (24.0, 0.1)
    """
    if steps <= 0:
        return []
    by_stage = {}
    for timed in user_calls:
        if not timed.per_element or timed.calls <= 0:
            continue
        by_stage.setdefault(timed.stage, []).append(timed)
    costs = []
    for stage, timings in by_stage.items():
        wall_ms = sum(item.wall_ms * item.calls for item in timings)
        cpu_ms = sum(item.cpu_ms * item.calls for item in timings)
        calls = sum(item.calls for item in timings)
        step_ms = sum(
            item.wall_ms * (item.per_batch_calls or item.calls / steps) for item in timings
        )
        functions = ", ".join(dict.fromkeys(item.function for item in timings))
        costs.append(PythonStageCost(
            stage=stage,
            function=functions,
            step_ms=step_ms,
            cpu_share=min(cpu_ms / wall_ms, 1.0) if wall_ms > 0 else 0.0,
            calls=calls,
            call_ms=wall_ms / calls,
        ))
    return sorted(costs, key=lambda cost: -cost.step_ms)


def predicted_step_ms(
    step_ms: float,
    compute_ms: float,
    cost: PythonStageCost,
    threads: int,
    ahead: bool,
) -> Optional[float]:
    """The step after spreading `cost`'s stage over `threads` (or caching it), by the model above.

    Args:
        step_ms: the steady-state step now (wait and compute).
        compute_ms: the step with input free (the floor).
        cost: the stage's `PythonStageCost`.
        threads: threads or workers the change runs the stage on, or
            `CACHED` for a cache read back.
        ahead: whether the pipeline already runs ahead of the step.

    Returns:
        The predicted step in milliseconds, or `None` without a compute time
        under the step.

    Example:

    >>> cost = PythonStageCost("map(load)", "load", 24.0, 0.0, 96, 6.0)
    >>> predicted_step_ms(25.0, 1.0, cost, threads=2, ahead=True)
    13.0
    >>> busy = dataclasses.replace(cost, cpu_share=0.6)  # Python computing: serial under the GIL
    >>> predicted_step_ms(25.0, 1.0, busy, threads=2, ahead=True)
    25.0
    """
    if not compute_ms or compute_ms >= step_ms:
        return None
    wait_ms = step_ms - compute_ms
    t_in = wait_ms + (compute_ms if ahead else 0.0)
    stage_ms = min(cost.step_ms, t_in)
    if threads == CACHED:
        after_ms = 0.0
    else:
        after_ms = max(stage_ms / max(threads, 1), stage_ms * cost.serial_share)
    return max(compute_ms, t_in - stage_ms + after_ms)


def cost_of(costs: Iterable[PythonStageCost], same_stage, stage: Optional[str]):
    """The cost of the stage `same_stage(cost.stage, stage)` names, or `None`."""
    return next((cost for cost in costs if same_stage(cost.stage, stage)), None)
