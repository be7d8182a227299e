"""What-if replay: how fast would training be if input were free?

A few batches of the training data are taken once, cached in memory and
replayed; the model's own compiled training step runs on them, timed inside
the step as during training. With input free, the step takes only its compute
time, on a machine whose cores are not shared with the input pipeline's
threads, so the replayed step time is the floor no change to the input
pipeline can go below, and the real step time over it is the ceiling of the
speed-up any such change can bring.

The replay trains the model on the replayed batches, so it is run on the
trained model after training and undone: the model's weights, its optimizer's
state (slots and iteration count), its metrics and its random seed state are
copied before and put back after. Training itself is not touched.
"""

import dataclasses
import logging
from typing import Callable, List, Optional

import numpy as np

from keras_pipeline_tuner._util.argument_checks import checked_dataset
from keras_pipeline_tuner._util.argument_checks import positive_int
from keras_pipeline_tuner.timing.step_stats import Distribution
from keras_pipeline_tuner.timing.step_stats import StepStats
from keras_pipeline_tuner._util.tf_import import tensorflow

logger = logging.getLogger("keras_pipeline_tuner")

DEFAULT_STEPS = 20
DEFAULT_CACHED_BATCHES = 8
AFTER_TRAINING = (
    "after training, on the trained model, with its weights, optimizer, metric and "
    "random seed state restored afterwards"
)
ON_REQUEST = (
    "on the model as it was given, with its weights, optimizer, metric and random seed "
    "state restored afterwards"
)
# Calls set apart before timing: the first may trace, and buffers fill.
_WARMUP_CALLS = 2
# Replay and pipeline steps alternate in blocks of this many calls.
_BLOCK_CALLS = 5


@dataclasses.dataclass
class WhatIfResult:
    """The training step with free input, against the real pipeline, same run.

    Attributes:
        speedup_if_input_free: mean step time with the real pipeline over mean
            step time on replayed batches: the most any input-pipeline change
            can speed training up (means, because total time is their sum).
        pipeline_step: step time with the real pipeline (input wait included).
        replay_step: step time on replayed, cached batches.
        replay_input_wait: input wait on replayed batches (near zero).
        pipeline_source: where `pipeline_step` comes from: "training" (the
            fit's steady-state steps) or "measured" (steps run on a fresh
            iterator alternately with the replay).
        replay_steps: replayed steps timed.
        cached_batches: distinct batches replayed.
        method: when and on what the replay ran, and how training was kept
            unchanged.
        notes: caveats.

    Example:

    ```python
    tuner = kpt.PipelineTuner(what_if=True)
    model.fit(train_ds, epochs=3, callbacks=[tuner])
    print(tuner.report.what_if.speedup_if_input_free)
    ```
    """

    speedup_if_input_free: Optional[float] = None
    pipeline_step: Distribution = dataclasses.field(default_factory=Distribution)
    replay_step: Distribution = dataclasses.field(default_factory=Distribution)
    replay_input_wait: Distribution = dataclasses.field(default_factory=Distribution)
    pipeline_source: str = "measured"
    replay_steps: int = 0
    cached_batches: int = 0
    method: str = ON_REQUEST
    notes: List[str] = dataclasses.field(default_factory=list)


def what_if(
    model,
    dataset,
    steps: int = DEFAULT_STEPS,
    cached_batches: int = DEFAULT_CACHED_BATCHES,
    pipeline_stats: Optional[StepStats] = None,
) -> WhatIfResult:
    """Times the model's training step on replayed batches, input free.

    Takes `cached_batches` batches of `dataset` once, caches them and replays
    them for `steps` steps of the model's compiled training step, timed inside
    the step. Unless `pipeline_stats` gives the real steps' times, as many
    steps run on `dataset` itself, alternating with the replay in blocks, so
    both are timed under the same conditions. The model's weights, optimizer,
    metric and seed state are restored afterwards: the model ends as it began.

    Args:
        model: a compiled `keras.Model` (TensorFlow backend).
        dataset: its training `tf.data.Dataset` (batches as `fit` takes them).
        steps: replayed steps to time (after two warm-up calls).
        cached_batches: distinct batches to replay.
        pipeline_stats: the real pipeline's `StepStats` from training (e.g.
            `tuner.report.train`); `None` measures real steps here.

    Returns:
        A `WhatIfResult`.

    Raises:
        TypeError: if `dataset` is not a `tf.data.Dataset`.
        ValueError: for `steps` or `cached_batches` below 1, an uncompiled
            model, or a model whose step cannot be timed (see the message).

    Example:

    ```python
    model.fit(train_ds, epochs=3)
    result = kpt.what_if(model, train_ds)
    print(f"at most {result.speedup_if_input_free:.1f}x faster with free input")
    ```
    """
    checked_dataset(dataset, "what_if")
    positive_int(steps, "steps")
    positive_int(cached_batches, "cached_batches")
    if getattr(model, "optimizer", None) is None or not getattr(model, "compiled", True):
        raise ValueError("The model is not compiled: call model.compile(...) first.")
    run_steps = _timed_steps_of(model)
    cached = dataset.take(cached_batches).cache()
    # One full pass completes the cache; the repeats then read only memory.
    found = sum(1 for _ in cached)
    replayed = cached.repeat()
    if found == 0:
        raise ValueError("The dataset is empty: there is nothing to replay.")

    saved = _State(model)
    try:
        replay_rows, pipeline_rows = _run(run_steps, replayed, dataset, steps, pipeline_stats is None)
    finally:
        saved.restore()

    replay = _stats(replay_rows)
    notes = []
    if pipeline_stats is not None:
        pipeline_step, source = pipeline_stats.step, "training"
    else:
        pipeline_step, source = _stats(pipeline_rows).step, "measured"
        notes.append(
            "The real pipeline's steps were timed on a fresh iterator, alternately with "
            "the replay."
        )
    if found < cached_batches:
        notes.append(f"The dataset has only {found} batches; they were all replayed.")
    speedup = None
    if pipeline_step.mean_ms and replay.step.mean_ms:
        speedup = pipeline_step.mean_ms / replay.step.mean_ms
    return WhatIfResult(
        speedup_if_input_free=speedup,
        pipeline_step=pipeline_step,
        replay_step=replay.step,
        replay_input_wait=replay.input_wait,
        pipeline_source=source,
        replay_steps=int(replay_rows.shape[0]),
        cached_batches=found,
        method=ON_REQUEST if pipeline_stats is None else AFTER_TRAINING,
        notes=notes,
    )


def replay_after_fit(model, steps: int, train_stats: StepStats) -> WhatIfResult:
    """The what-if replay of a `PipelineTuner`, run from `on_train_end`.

    Args:
        model: the model `fit` trained.
        steps: replayed steps to time.
        train_stats: the step clock's statistics of the training steps.

    Returns:
        A `WhatIfResult` whose real-pipeline figures are the training's.

    Raises:
        ValueError: when fit was not given a tf.data dataset or the real
            steps' times are unknown (says which).
    """
    from keras_pipeline_tuner.instrumentation import fit_input

    found = fit_input.find_fit_input(model)
    if found is None or found.kind != fit_input.TF_DATASET or found.source is None:
        kind = "no data it could find" if found is None else f"{found.kind} data"
        raise ValueError(
            f"the replay needs fit's training data as a tf.data.Dataset, and fit got {kind}; "
            "call kpt.what_if(model, dataset) with a tf.data version of it"
        )
    if not train_stats.steps or train_stats.step.mean_ms is None:
        raise ValueError("no training step was timed, so there is nothing to compare with")
    return what_if(model, found.source, steps=steps, pipeline_stats=train_stats)


def checked_steps(what_if) -> int:
    """Validates `PipelineTuner(what_if=...)`: the number of replay steps, 0 for off.

    Args:
        what_if: `False`, `True` (20 steps) or a positive number of steps.

    Returns:
        The number of replayed steps to time; 0 when the replay is off.

    Raises:
        ValueError: for anything else.
    """
    if isinstance(what_if, bool):
        return DEFAULT_STEPS if what_if else 0
    if isinstance(what_if, int) and what_if >= 1:
        return what_if
    raise ValueError(
        f"`what_if` must be True, False or a positive number of replayed steps, got "
        f"{what_if!r}. Pass what_if=True to time 20 replayed steps after training."
    )


def _run(run_steps, replayed, dataset, steps, measure_pipeline):
    replay_iterator = iter(replayed)
    pipeline_iterator = iter(dataset) if measure_pipeline else None
    for _ in range(_WARMUP_CALLS):
        run_steps(replay_iterator)
        if pipeline_iterator is not None:
            pipeline_iterator = _pipeline_call(run_steps, pipeline_iterator, dataset, [])
    replay_rows: List[np.ndarray] = []
    pipeline_rows: List[np.ndarray] = []
    while sum(rows.shape[0] for rows in replay_rows) < steps:
        for _ in range(_BLOCK_CALLS):
            replay_rows.append(np.asarray(run_steps(replay_iterator)).reshape(-1, 3))
        if pipeline_iterator is not None:
            for _ in range(_BLOCK_CALLS):
                pipeline_iterator = _pipeline_call(run_steps, pipeline_iterator, dataset, pipeline_rows)
    return (
        np.concatenate(replay_rows)[:steps],
        np.concatenate(pipeline_rows) if pipeline_rows else np.zeros((0, 3)),
    )


def _pipeline_call(run_steps, iterator, dataset, found):
    tf = tensorflow()
    try:
        found.append(np.asarray(run_steps(iterator)).reshape(-1, 3))
        return iterator
    except tf.errors.OutOfRangeError:
        # The epoch ended: start the next one, as fit would (its set-up untimed).
        iterator = iter(dataset)
        found.append(np.asarray(run_steps(iterator)).reshape(-1, 3))
        return iterator


def _stats(rows: np.ndarray) -> StepStats:
    if rows.shape[0] == 0:
        return StepStats()
    start, ready, end = rows[:, 0], rows[:, 1], rows[:, 2]
    return StepStats.from_arrays(np.maximum(ready - start, 0.0), np.maximum(end - ready, 0.0))


def _timed_steps_of(model) -> Callable:
    """Builds the model's timed training step, as the `PipelineTuner` runs it in fit."""
    from keras_pipeline_tuner.timing import timed_step_function

    reason = timed_step_function.unsupported_reason(model)
    if reason is None and model.run_eagerly:
        reason = "the model runs eagerly (run_eagerly=True)"
    if reason is None and type(model.distribute_strategy).__name__ != "_DefaultDistributionStrategy":
        reason = "the model trains under a distribution strategy, which the replay does not support"
    if reason is not None:
        raise ValueError(f"The training step cannot be timed here: {reason}.")
    if getattr(model, "train_function", None) is None:
        model.make_train_function()
    rows = []
    timed = timed_step_function.TimedFunction(
        model,
        model.train_step,
        model.train_function,
        on_rows=lambda found, wall, called_at: rows.append(found),
        on_error=lambda error: None,
    )

    def run_steps(iterator):
        timed.armed = True
        timed(iterator)
        return rows.pop()

    return run_steps


class _State:
    """A copy of everything a training step changes in a model, to put back."""

    def __init__(self, model):
        variables = list(model.variables)
        variables += list(getattr(model.optimizer, "variables", []))
        variables += list(getattr(model, "metrics_variables", []))
        unique = {id(variable): variable for variable in variables}
        self._saved = [(variable, np.array(variable.numpy())) for variable in unique.values()]

    def restore(self) -> None:
        for variable, value in self._saved:
            variable.assign(value)
