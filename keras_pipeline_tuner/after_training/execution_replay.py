"""Execution replay: the step at another `steps_per_execution`, on a copy of the pipeline.

When a step is not bound by its input, it is bound by its compute or by the
host's own work between steps (Keras' loop, callbacks, dispatching each
step): a tiny model on a fast pipeline spends most of its time there. Keras 3
has no automatic `steps_per_execution`; a larger one runs several steps in one
call and pays that work once.

After training, a copy of the fit's pipeline (read again only where it is
made of TensorFlow ops, see `pipeline.graph.rerun`; with seeds of its own, so
that a later fit's order is unchanged) is trained on by Keras' own `fit`, at
`steps_per_execution` 1 and at the advised setting, alternated (the order
turned every round), the median of each: the gain is measured, not
predicted. A fit's step is its time from its first call's end (the first
call makes the iterator, and the first fit at a setting compiles) to its
end, over the steps in between. A fit at the advised setting runs
`ADVISED_CALLS` calls, so that both sides are timed over about the same wall
time: fits of 4 calls timed by whole epochs varied 0.66-1.28x of what the
setting delivered on a loaded machine. The pipeline's own work stays
in both, as in the fit: cached batches alone overstated the gain 1.5-2x where
the input's work shows once the loop's is gone (a 2-core machine, load 8-10).
Every variable those fits change (weights, optimizer and its iteration count,
metrics) and the model's attributes they touch (`history`,
`steps_per_execution`, its compiled train function, `stop_training`) are put
back; Python's and NumPy's global random state too. Not on the torch backend
(Keras requires `steps_per_execution=1` there).
"""

import dataclasses
import statistics
import time
from typing import Optional

from keras_pipeline_tuner._util.random_state import preserved_random_state
from keras_pipeline_tuner.pipeline.graph import rerun
from keras_pipeline_tuner.pipeline.tune import rebuild as pipeline_rewrite

# The setting advised: Keras' documentation's example, far past where the per-step
# host work stops mattering for a step of a few milliseconds.
ADVISED = 32
# Training steps each timed fit at 1 runs; at the advised setting, ADVISED_CALLS
# calls (its steps cost a fraction of those at 1).
STEPS = 8 * ADVISED
ADVISED_CALLS = 32
ROUNDS = 3
# A compilation of the train function, about (a small model here: 0.1-0.6 s).
COMPILE_S = 0.5


@dataclasses.dataclass(frozen=True)
class ExecutionReplay:
    """The step at `steps_per_execution` 1 and at the advised setting (measured).

    Attributes:
        steps_per_execution: the advised setting.
        step_ms_at_one: the mean step of a fit on cached batches at 1.
        step_ms_advised: the same at `steps_per_execution`.
        speedup: `step_ms_at_one` over `step_ms_advised`.
        steps: training steps each timed fit at 1 ran.
        rounds: alternated rounds (medians of them).
    """

    steps_per_execution: int
    step_ms_at_one: float
    step_ms_advised: float
    speedup: float
    steps: int
    rounds: int
    steps_advised: int = 0

    def sentence(self) -> str:
        """What was measured, in one sentence.

        Example:

        >>> ExecutionReplay(32, 2.0, 0.5, 4.0, 128, 3).sentence()  # doctest: +ELLIPSIS
        'Keras fits of 128 batches at 1 and 128 at 32 of a copy of the pipeline, timed after ...'
        """
        return (
            f"Keras fits of {self.steps} batches at 1 and {self.steps_advised or self.steps} "
            f"at {self.steps_per_execution} of a copy of the pipeline, timed after their "
            "first call: "
            f"{self.step_ms_at_one:.2f} ms a step at "
            f"steps_per_execution=1, {self.step_ms_advised:.2f} ms at "
            f"{self.steps_per_execution} ({self.speedup:.2f}x, medians of {self.rounds} "
            "alternated rounds, measured after training, state restored)."
        )


def due(model, report) -> bool:
    """Whether the replay applies: the host's work between steps bounding a fit at 1.

    Args:
        model: the model fit trained.
        report: the run's `Report` after training.

    Returns:
        Whether to time it (never on torch, nor where `steps_per_execution` is set).
    """
    import keras

    from keras_pipeline_tuner.advice.step_overhead import host_bound

    if keras.backend.backend() == "torch" or getattr(model, "steps_per_execution", 1) != 1:
        return False
    return host_bound(report.train.step.median_ms, report.train.host_gap.median_ms)


def estimated_s(stats) -> float:
    """About how long the replay takes: two compilations, and its fits' steps at today's speed.

    Example:

    >>> from keras_pipeline_tuner.timing.step_stats import StepStats
    >>> round(estimated_s(StepStats()), 1)
    1.0
    """
    step_ms = (stats.step.median_ms or 0.0) + (stats.host_gap.median_ms or 0.0)
    # Both settings' fits at today's step: the advised one takes less.
    return 2 * COMPILE_S + ROUNDS * 2 * STEPS * step_ms / 1e3


def replay_execution(model, dataset, setting: int = ADVISED) -> Optional[ExecutionReplay]:
    """Times Keras' fit on cached batches at `steps_per_execution` 1 and `setting`.

    Args:
        model: the model fit trained (compiled).
        dataset: the `tf.data.Dataset` fit read.
        setting: the `steps_per_execution` to time.

    Returns:
        The `ExecutionReplay`.

    Raises:
        ValueError: the pipeline cannot be read again without changing what a
            later fit reads, or holds no batch (says why).
    """
    hazard = rerun.dataset_rerun_hazard(dataset)
    if hazard is not None:
        raise ValueError(f"The pipeline is not run again: {hazard}.")
    copy = pipeline_rewrite.independent_copy(dataset)
    if copy is None:
        raise ValueError("The pipeline cannot be copied apart from the one fit reads.")
    if int(copy.cardinality()) == 0:
        raise ValueError("The dataset gives no batch to replay.")
    replayed = copy.repeat()
    saved = _Saved(model)
    times = {1: [], setting: []}
    # Each setting's compiled function, traced once and reused in later rounds.
    functions = {}
    try:
        with preserved_random_state():
            for index in range(ROUNDS):
                for each in (1, setting) if index % 2 == 0 else (setting, 1):
                    times[each].append(_step_ms(model, replayed, each, functions))
    finally:
        saved.restore()
    at_one, advised = statistics.median(times[1]), statistics.median(times[setting])
    return ExecutionReplay(
        setting, at_one, advised, at_one / advised, STEPS, ROUNDS, _steps(setting)
    )


def _steps(setting: int) -> int:
    """Training steps a timed fit at `setting` runs."""
    return STEPS if setting == 1 else ADVISED_CALLS * setting


def _step_ms(model, replayed, setting: int, functions: dict) -> float:
    """The mean step of a fit at `setting` after its first call (which may compile)."""
    import keras

    model.steps_per_execution = setting
    model.train_function = functions.get(setting)
    marks = []

    class _Calls(keras.callbacks.Callback):
        # Keras calls it once a call, with the call's last batch.
        def on_train_batch_end(self, batch, logs=None):
            if not marks:
                marks.append((time.perf_counter(), batch + 1))

        def on_epoch_end(self, epoch, logs=None):
            marks.append((time.perf_counter(), steps))

    steps = _steps(setting)
    model.fit(replayed, steps_per_epoch=steps, epochs=1, verbose=0, callbacks=[_Calls()])
    functions[setting] = model.train_function
    (began, first), (ended, last) = marks[0], marks[-1]
    return (ended - began) * 1e3 / (last - first)


class _Saved:
    """What the timed fits change in a model, to put back."""

    _ATTRIBUTES = ("history", "steps_per_execution", "train_function", "stop_training")

    def __init__(self, model):
        import numpy as np

        variables = list(model.variables)
        variables += list(getattr(model.optimizer, "variables", []))
        variables += list(getattr(model, "metrics_variables", []))
        unique = {id(variable): variable for variable in variables}
        self._model = model
        self._values = [(variable, np.array(variable.numpy())) for variable in unique.values()]
        self._attributes = {
            name: getattr(model, name) for name in self._ATTRIBUTES if hasattr(model, name)
        }

    def restore(self) -> None:
        for variable, value in self._values:
            variable.assign(value)
        for name, value in self._attributes.items():
            setattr(self._model, name, value)
