"""What bounds a step that does not wait for input: its compute, or the host's work between steps.

The step clock times each step and the host's time between one step's end and
the next one's start (Keras' loop, callbacks, dispatching the step). Where that
time is at least `OVERHEAD_SHARE` of the step and the gap together, the host
bounds training, not the model: a larger `steps_per_execution` pays it once
for several steps. Its gain is what Keras' own fit on cached batches measured
at that setting (`after_training.execution_replay`), never a prediction.
"""

from typing import Optional

from keras_pipeline_tuner.advice.recommendation import ESTIMATED
from keras_pipeline_tuner.advice.recommendation import MEASURED
from keras_pipeline_tuner.advice.recommendation import STEP_CLOCK
from keras_pipeline_tuner.advice.recommendation import Evidence
from keras_pipeline_tuner.advice.recommendation import ExpectedGain
from keras_pipeline_tuner.advice.recommendation import Recommendation

STEPS_PER_EXECUTION = "steps-per-execution"
# The setting advised (`after_training.execution_replay.ADVISED`'s, when it ran).
ADVISED = 32
# The host's share of (step + gap) from which it, not the model, bounds training.
OVERHEAD_SHARE = 0.3
# Evidence from the replay of cached batches at another steps_per_execution.
EXECUTION_REPLAY = "steps_per_execution replay"


def overhead_share(step_ms: Optional[float], gap_ms: Optional[float]) -> Optional[float]:
    """The host's share of a step and the gap after it, or `None` without both.

    Example:

    >>> overhead_share(0.2, 0.8)
    0.8
    """
    if not step_ms or gap_ms is None:
        return None
    return gap_ms / (step_ms + gap_ms)


def host_bound(step_ms: Optional[float], gap_ms: Optional[float]) -> bool:
    """Whether the host's work between steps bounds training (see `OVERHEAD_SHARE`)."""
    share = overhead_share(step_ms, gap_ms)
    return share is not None and share >= OVERHEAD_SHARE


def overhead_recommendation(stats, replay) -> Optional[Recommendation]:
    """`steps_per_execution` advice where the host bounds the step: measured where a replay ran.

    Args:
        stats: `StepStats` of the training steps (step and `host_gap`).
        replay: the `ExecutionReplay`, or `None` when none ran.

    Returns:
        The `Recommendation`, or `None`.
    """
    step_ms, gap_ms = stats.step.median_ms, stats.host_gap.median_ms
    if not host_bound(step_ms, gap_ms):
        return None
    share = overhead_share(step_ms, gap_ms)
    setting = replay.steps_per_execution if replay is not None else ADVISED
    now = step_ms + gap_ms
    if replay is not None:
        gain = ExpectedGain(
            speedup=replay.speedup,
            step_ms=replay.step_ms_at_one,
            step_ms_after=replay.step_ms_advised,
            basis=MEASURED,
            statement=replay.sentence(),
            likely_speedup=replay.speedup,
            timed="a replay of the change",
        )
    else:
        # No bound: the step clock's step holds some of each call's own work
        # too (measured: 32 steps a call delivered 5.35x where the step and
        # the gap gave 4.19x at most), so the figure is a prediction only.
        after = step_ms + gap_ms / setting
        gain = ExpectedGain(
            speedup=now / after,
            step_ms=now,
            step_ms_after=after,
            basis=ESTIMATED,
            statement=(
                f"Predicted at {setting} steps a call, the host's {gap_ms:.2f} ms between "
                f"steps paid once a call: {after:.2f} ms a step instead of {now:.2f} ms, "
                f"{now / after:.2f}x faster (not timed; the step's own per-call work may "
                "shrink too, so it can bring more)."
            ),
            predicted_speedup=now / after,
        )
    evidence = [
        Evidence(
            STEP_CLOCK,
            f"steps take {step_ms:.2f} ms and the host {gap_ms:.2f} ms between them "
            f"(median): {share * 100:.0f} % of the time is Keras' loop, not the model.",
        )
    ]
    if replay is not None:
        evidence.append(Evidence(EXECUTION_REPLAY, replay.sentence()))
    return Recommendation(
        id=STEPS_PER_EXECUTION,
        title=f"Run {setting} steps per call: the host's work between steps bounds training",
        severity="warning" if gain.speeds_up else "info",
        evidence=evidence,
        fix=f"model.compile(..., steps_per_execution={setting})",
        expected_gain=gain,
        reason=(
            "Each call of the compiled step costs the host a fixed time (Keras' loop, the "
            "callbacks, dispatching it); several steps per call pay it once. Keras 3 does "
            "not choose steps_per_execution itself. Callbacks then see batch hooks once per "
            "call."
        ),
    )
