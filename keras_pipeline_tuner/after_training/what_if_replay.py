"""What-if replay: how fast would training be if input were free?

A few batches of the training data are taken once, cached in memory and
replayed; the model's own compiled training step runs on them, timed inside
the step as during training. With input free, the step takes only its compute
time, on a machine whose cores are not shared with the input pipeline's
threads, so the replayed step time is the floor no change to the input
pipeline can go below, and the real step time over it is the ceiling of the
speed-up any such change can bring.

The replay trains the model on the replayed batches, so it is run on the
trained model after training and undone: every variable the replayed step
reads or writes (the model's weights, its optimizer's slots and iteration
count, its metrics, its seed state, and state kept elsewhere, such as a custom
`train_step`'s `tf.random.Generator` or a layer's own `tf.Variable`) is copied
before and put back after. Training itself is not touched.
"""

import dataclasses
import logging
import math
import time
from typing import Callable
from typing import List
from typing import Optional
from typing import Tuple

import numpy as np

from keras_pipeline_tuner._util.argument_checks import checked_dataset
from keras_pipeline_tuner._util.argument_checks import positive_int
from keras_pipeline_tuner._util.random_state import preserved_random_state
from keras_pipeline_tuner._util.tf_import import tensorflow
from keras_pipeline_tuner.after_training.replay_rounds import WARMUP_CALLS
from keras_pipeline_tuner.after_training.replay_rounds import ReplayRound
from keras_pipeline_tuner.after_training.replay_rounds import run_replay
from keras_pipeline_tuner.after_training.replay_rounds import run_rounds
from keras_pipeline_tuner.after_training.replay_rounds import stats_of
from keras_pipeline_tuner.instrumentation import fit_input
from keras_pipeline_tuner.pipeline.graph import rerun
from keras_pipeline_tuner.pipeline.tune import rebuild as pipeline_rewrite
from keras_pipeline_tuner.timing import timed_step_function
from keras_pipeline_tuner.timing.step_stats import Distribution
from keras_pipeline_tuner.timing.step_stats import StepStats

logger = logging.getLogger("keras_pipeline_tuner")

DEFAULT_STEPS = 20
DEFAULT_CACHED_BATCHES = 8
AFTER_TRAINING = (
    "after training, on the trained model, with every variable the step touched "
    "(weights, optimizer, metric, random seed and other state) restored afterwards"
)
ON_REQUEST = (
    "on the model as it was given, with every variable the step touched (weights, "
    "optimizer, metric, random seed and other state) restored afterwards"
)


class ReplayUnsupported(ValueError):
    """The replay cannot run on this model or data: an expected limit, not a failure.

    Raised for a step that cannot be timed here (a distribution strategy, eager
    execution, Keras internals this version does not know) and for training data
    that is not a `tf.data.Dataset`. The `PipelineTuner` reports it as a note.
    """


@dataclasses.dataclass
class WhatIfResult:
    """The training step with free input, against the real pipeline, same run.

    Attributes:
        speedup_if_input_free: mean step time with the real pipeline over mean
            step time on replayed batches: the most any input-pipeline change
            can speed training up (means, because total time is their sum).
            Below 1 when the replay ran slower (a note says why): no gain.
        pipeline_step: step time with the real pipeline (input wait included).
        replay_step: step time on replayed, cached batches.
        replay_input_wait: input wait on replayed batches: the fetch of a
            batch already in memory.
        pipeline_source: where `pipeline_step` comes from: "training" (the
            fit's steady-state steps) or "measured" (steps run on a fresh
            iterator between parts of the replay).
        replay_steps: replayed steps timed.
        cached_batches: distinct batches replayed.
        rounds: when the real pipeline's steps were measured here, each
            round of them against the replayed steps either side
            (`ReplayRound`). The contention check runs a second round when
            the first shows the pipeline slowing the step, so that one burst
            of another load on the machine cannot decide alone.
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
    rounds: List[ReplayRound] = dataclasses.field(default_factory=list)


def what_if(
    model,
    dataset,
    steps: int = DEFAULT_STEPS,
    cached_batches: int = DEFAULT_CACHED_BATCHES,
    pipeline_stats: Optional[StepStats] = None,
) -> WhatIfResult:
    """Times the model's training step on replayed batches, input free.

    Takes `cached_batches` batches of `dataset` once (from a copy with random
    seeds of its own, so that later passes over `dataset` shuffle as they
    would have; see `independent_copy`), caches them and replays
    them for `steps` steps of the model's compiled training step, timed inside
    the step. Unless `pipeline_stats` gives the real steps' times, as many
    steps run on `dataset` itself, between two halves of the replay, so
    both are timed under the same conditions. Every variable the step touches
    (weights, optimizer, metrics, seeds, and state kept outside the model) is
    restored afterwards: the model ends as it began.

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
    return _what_if(model, dataset, steps, cached_batches, pipeline_stats)


def _what_if(
    model,
    dataset,
    steps,
    cached_batches,
    pipeline_stats,
    control=None,
    traced=None,
    keras_made: bool = False,
):
    """`what_if` on checked arguments.

    `control` (a `RoundControl`) sizes its rounds by time; `traced` is fit's
    timed function, reused (see `_timed_steps_of`); `keras_made`: the dataset
    is the one Keras built over NumPy arrays, which holds no code or state of
    the user's (a gather of each batch's rows): its graph, which holds the
    arrays, is not read to check it.
    """
    if not keras_made:
        # Variables the pipeline writes (a Keras random layer's seed) are put
        # back afterwards; any other state it changes is a hazard.
        hazard = rerun.dataset_rerun_hazard(dataset, restores_variables=True)
        if hazard is not None:
            # Reading it again would change what a later fit reads from it.
            raise ReplayUnsupported(f"The pipeline is not run again: {hazard}.")
    # Before any pass over it: the values the next fit's passes start from.
    pipeline_state = rerun.PipelineVariables(dataset)
    run_steps, variables_touched = _timed_steps_of(model, traced)
    # Passes over the dataset itself would move its shuffle seeds on, and a
    # later fit on it would see another order: the replay reads a copy with
    # seeds of its own (and the same caches). Keras' dataset over arrays
    # holds no seed generator (it shuffles indices in a map), and copying
    # its graph would copy the arrays: it is read as it is.
    if not keras_made:
        dataset = pipeline_rewrite.independent_copy(dataset)
    if dataset is None:
        raise ReplayUnsupported(
            "The dataset reshuffles every epoch and holds more than "
            f"{pipeline_rewrite.COPY_MAX_IN_MEMORY_BYTES // 2**20} MB of in-memory tensors: "
            "replaying it would change the order a later fit on it sees, and a copy with "
            "its own seeds would copy the data."
        )
    # The user's Python functions in the pipeline may draw from Python's and
    # NumPy's global generators: their next draws stay what they would have been.
    try:
        with preserved_random_state():
            found, replay_rows, pipeline_rows, rounds = _replay(
                model,
                run_steps,
                variables_touched,
                dataset,
                steps,
                cached_batches,
                pipeline_stats,
                control,
            )
    finally:
        # The replay's iterators are gone by now: nothing writes them after this.
        pipeline_state.restore()
    return result_of(found, cached_batches, replay_rows, pipeline_rows, rounds, pipeline_stats)


def result_of(
    found: int,
    cached_batches: int,
    replay_rows: np.ndarray,
    pipeline_rows: Optional[np.ndarray],
    rounds: List["ReplayRound"],
    pipeline_stats: Optional[StepStats],
) -> "WhatIfResult":
    """The `WhatIfResult` of a replay's rows, on any backend.

    Args:
        found: distinct batches replayed.
        cached_batches: distinct batches asked for.
        replay_rows: the replayed steps' (start, ready, end) rows.
        pipeline_rows: the real pipeline's rows timed here, or `None`.
        rounds: the rounds of the check (`run_rounds`).
        pipeline_stats: the real pipeline's `StepStats` from training, or
            `None` when its steps were timed here.

    Returns:
        The `WhatIfResult`.
    """
    replay = stats_of(replay_rows)
    notes = []
    if pipeline_stats is not None:
        pipeline_step, source = pipeline_stats.step, "training"
    else:
        pipeline_step, source = stats_of(pipeline_rows).step, "measured"
        notes.append(
            "The real pipeline's steps were timed on a fresh iterator, between two parts "
            "of the replay" + (f", in {len(rounds)} rounds." if len(rounds) > 1 else ".")
        )
    if found < cached_batches:
        notes.append(f"The dataset has only {found} batches; they were all replayed.")
    speedup = None
    if pipeline_step.mean_ms and replay.step.mean_ms:
        speedup = pipeline_step.mean_ms / replay.step.mean_ms
        if speedup < 1.0:
            notes.append(
                f"The replayed step ({replay.step.mean_ms:.2f} ms) was slower than the "
                f"step with the real pipeline ({pipeline_step.mean_ms:.2f} ms), so "
                f"speedup_if_input_free is {speedup:.2f}, below 1: not a slow-down input "
                "would cause, but input costing nothing measurable, plus timing noise or "
                "the replay's own conditions (another load on the machine, the model "
                "after training). No input-pipeline change can speed this training up."
            )
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
        rounds=rounds,
    )


def replay_after_fit(
    model, steps: int, train_stats: StepStats, traced_step=None, batches=None
) -> WhatIfResult:
    """The what-if replay of a `PipelineTuner`, run from `on_train_end`.

    Args:
        model: the model `fit` trained.
        steps: replayed steps to time.
        train_stats: the step clock's statistics of the training steps.
        traced_step: fit's timed training function, traced already
            (`FitTiming.traced_train_step()`), or `None` to trace one.
        batches: a `tf.data.Dataset` of a few of the pipeline's batches to
            replay, or `None` for fit's data.

    Returns:
        A `WhatIfResult` whose real-pipeline figures are the training's.

    Raises:
        ReplayUnsupported: when fit was given neither a tf.data dataset nor
            NumPy arrays (which Keras turns into one), or the step cannot be
            replayed here (says which).
        ValueError: when the real steps' times are unknown.
    """
    keras_made = False
    if batches is not None:
        dataset, cached = batches, int(batches.cardinality())
    else:
        found = fit_input.find_fit_input(model)
        if found is None or found.replay_dataset is None:
            kind = "no data it could find" if found is None else f"{found.kind} data"
            raise ReplayUnsupported(
                f"The replay needs fit's training data as a tf.data.Dataset or NumPy arrays, "
                f"and fit got {kind}: call kpt.what_if(model, dataset) with a tf.data version "
                "of it."
            )
        dataset, cached = found.replay_dataset, DEFAULT_CACHED_BATCHES
        keras_made = found.kind == fit_input.ARRAYS
    if not train_stats.steps or train_stats.step.mean_ms is None:
        raise ValueError("no training step was timed, so there is nothing to compare with")
    return _what_if(
        model, dataset, steps, cached, train_stats, traced=traced_step, keras_made=keras_made
    )


# The contention check after fit: a replay sized by time, within the tuner's budget.
CONTENTION_MIN_STEPS = 10
# Timed steps a side in a round: at least this many (fewer leave a mean to a
# few scheduling slices), at most this many (short steps: enough already).
CONTENTION_MIN_TIMED = 5
CONTENTION_MAX_STEPS = 100
# The check's own cap: the larger of these seconds and this share of the fit's
# time. A fit of 10 ms steps would otherwise spend its whole share of the
# budget (1.5 s of 2 s) on a check whose mean of 15 steps a side is already
# within a few percent, and a fit under a minute should cost under a second.
CONTENTION_LEAST_S = 0.5
CONTENTION_FIT_SHARE = 0.01
# A check whose result could change the verdict class is given the time it
# needs rather than that cap: this many times its shortest form (the set-up
# before its steps are sized takes part of it, and a round's steps are sized
# with room for the pipeline's epoch ends), at most the larger of that cap
# and this share of the fit, and never more than these seconds.
CONTENTION_NEEDED_ROOM = 2.0
CONTENTION_NEEDED_FIT_SHARE = 0.25
CONTENTION_NEEDED_MAX_S = 60.0
# The first round may take this share of what is left of the budget: the
# outputs need the rest (a second round runs only if it still fits).
CONTENTION_BUDGET_SHARE = 0.75
CONTENTION_CACHED_BATCHES = 4
CONTENTION_METHOD = (
    "automatic contention check after training (the model computes on the CPU, "
    "which the input pipeline shares), on the trained model, with its weights, "
    "optimizer, metric and random seed state restored afterwards"
)


def computes_on_cpu() -> bool:
    """Whether the model's step runs on the CPU (no GPU or TPU is visible)."""
    tf = tensorflow()
    return not any(
        device.device_type in ("GPU", "TPU") for device in tf.config.list_logical_devices()
    )


def can_replay(model) -> bool:
    """Whether fit iterates a tf.data dataset (the user's, or Keras' over arrays) to replay."""
    found = fit_input.find_fit_input(model)
    return found is not None and found.replay_dataset is not None


@dataclasses.dataclass
class ContentionPlan:
    """How long a contention check runs: its steps, sized by time.

    Attributes:
        steps: timed steps a side (pipeline, replay) in a round.
        estimate_s: what the first round is expected to take, all in: tracing
            the step twice, filling the replay's cache, warm-up calls, a fresh
            iterator of the pipeline and the timed steps.
        round_s: what one more round is expected to take.
        step_s: the training's mean step time, which a step on the real
            pipeline takes at least.
    """

    steps: int
    estimate_s: float
    round_s: float
    step_s: float = 0.0


def contention_cap_s(fit_s: float) -> float:
    """The most a contention check after a fit of `fit_s` seconds may take, in seconds.

    Example:

    >>> contention_cap_s(30.0), contention_cap_s(600.0)
    (0.5, 6.0)
    """
    return max(CONTENTION_LEAST_S, CONTENTION_FIT_SHARE * max(fit_s, 0.0))


def needed_bound_s(fit_s: float) -> float:
    """The most a contention check that could change the verdict may take, in seconds.

    The larger of `contention_cap_s` and `CONTENTION_NEEDED_FIT_SHARE` of the
    fit, at most `CONTENTION_NEEDED_MAX_S`.

    Example:

    >>> needed_bound_s(40.0), needed_bound_s(1000.0)
    (10.0, 60.0)
    """
    return min(
        CONTENTION_NEEDED_MAX_S,
        max(contention_cap_s(fit_s), CONTENTION_NEEDED_FIT_SHARE * max(fit_s, 0.0)),
    )


def needed_cap_s(smallest_s: float, fit_s: float) -> Optional[float]:
    """The cap of a contention check that could change the verdict: the time it needs.

    Args:
        smallest_s: what its shortest form takes (`contention_plan`).
        fit_s: the fit's time.

    Returns:
        `CONTENTION_NEEDED_ROOM` times `smallest_s`, or `None` when that is
        more than `needed_bound_s`.

    Example:

    >>> needed_cap_s(8.0, 120.0), needed_cap_s(8.0, 40.0)
    (16.0, None)
    """
    needed_s = CONTENTION_NEEDED_ROOM * smallest_s
    return needed_s if needed_s <= needed_bound_s(fit_s) else None


def contention_plan(
    step_ms: float,
    tracing_s: float,
    fresh_iterator_s: float,
    budget_s: float,
    cap_s: float = math.inf,
    setup_s: float = 0.0,
) -> Tuple[Optional[ContentionPlan], float]:
    """Sizes a contention check by time: as many steps as fit in the budget.

    Args:
        step_ms: the training steps' mean time.
        tracing_s: the training's first-step tracing, which the check pays
            twice (its variable search and its timed function trace the step).
        fresh_iterator_s: what a new iterator of the pipeline took to give its
            first steps in training (set-up, a shuffle buffer filling).
        budget_s: what is left of the tuner's budget.
        cap_s: the most the check may take (`contention_cap_s`).
        setup_s: what reading (and copying) the pipeline's graph takes once.

    Returns:
        `(plan, smallest_s)`: the plan, or `None` when even the smallest check
        (`CONTENTION_MIN_TIMED` steps a side) would not fit in its share of the
        budget or its cap; and what that smallest check would take.

    Example:

    >>> plan, _ = contention_plan(2.0, 0.1, 0.0, budget_s=2.0)
    >>> plan.steps
    100
    >>> contention_plan(12.0, 0.0, 0.0, budget_s=2.0, cap_s=0.5)[0].steps
    16
    >>> contention_plan(300.0, 0.5, 1.0, budget_s=2.0)[0] is None
    True
    """
    step_s = max(step_ms, 0.0) / 1e3
    fixed_s = (
        2 * tracing_s
        + (CONTENTION_CACHED_BATCHES + 2 * WARMUP_CALLS) * step_s
        + fresh_iterator_s
        + setup_s
    )
    smallest_s = fixed_s + 2 * CONTENTION_MIN_TIMED * step_s
    allowed_s = min(CONTENTION_BUDGET_SHARE * budget_s, cap_s)
    if smallest_s > allowed_s:
        return None, smallest_s
    steps = CONTENTION_MAX_STEPS
    if step_s > 0:
        steps = min(steps, int((allowed_s - fixed_s) / (2 * step_s)))
    round_s = fresh_iterator_s + (WARMUP_CALLS + 2 * steps) * step_s
    return ContentionPlan(steps, fixed_s + 2 * steps * step_s, round_s, step_s), smallest_s


@dataclasses.dataclass
class RoundControl:
    """Sizes a contention check's rounds by time, and decides on a second round.

    Attributes:
        shows_contention: the verdict's rule, `shows_contention(pipeline_ms,
            replay_ms)`: a round that shows contention is checked by another.
        deadline: `time.monotonic()` by which the check must end.
        pipeline_step_s: the training's mean step time, which a step on the
            real pipeline takes at least.
        first_round_by: `time.monotonic()` by which the first round must
            end (the check's own cap), or `None` for `deadline`. A second
            round, which runs only when the first showed contention, may go on
            to `deadline`: it is what keeps a burst of load from deciding.
        wall_time: rounds are compared by wall time a step
            (`ReplayRound.compared`), as the verdict compares them.
    """

    shows_contention: Callable[[float, float], bool]
    deadline: float
    pipeline_step_s: float
    first_round_by: Optional[float] = None
    wall_time: bool = False
    # The steps a side the first round timed (`steps_for`).
    sized_steps: int = 0
    # When the check began (`time.monotonic()`).
    began: float = dataclasses.field(default_factory=time.monotonic)
    # Set when the check was given the time it needs (its bound, seconds).
    given_s: Optional[float] = None

    def steps_for(self, steps: int, call_s: float) -> int:
        """The timed steps a side that fit before the deadline, at most `steps`.

        Args:
            steps: the planned steps a side.
            call_s: what one replayed call took, measured on the warm-up calls.

        Raises:
            ReplayUnsupported: when not even `CONTENTION_MIN_TIMED` fit.
        """
        capped = self.first_round_by is not None and self.first_round_by < self.deadline
        ends_by = self.first_round_by if capped else self.deadline
        remaining_s = ends_by - time.monotonic()
        # A step of each side, with room for the pipeline's fresh iterator and
        # its epoch ends (measured here: blocks take up to about twice this).
        side_s = 2 * (call_s + max(call_s, self.pipeline_step_s))
        fitting = min(steps, int(remaining_s / side_s)) if side_s > 0 else steps
        if fitting < CONTENTION_MIN_TIMED:
            # Name what ran out: a larger budget does not lift the cap.
            if self.given_s is not None:
                used = (
                    f"the {self.given_s:.1f} s it was given (a quarter of the fit's time at "
                    "most; a longer fit allows more)"
                )
            elif capped:
                used = (
                    f"the check's own cap ({self.first_round_by - self.began:.1f} s; a "
                    "longer fit allows more)"
                )
            else:
                used = "the tuner's time budget (PipelineTuner(cost_budget_s=...) gives it more)"
            raise ReplayUnsupported(
                "Its set-up (copying the pipeline, filling its cache, finding what the "
                f"step changes) used {used} before any step was timed. The wait decides."
            )
        self.sized_steps = fitting
        return fitting

    def another_round(self, last: "ReplayRound", round_s: float) -> bool:
        """Whether one more round runs: the last showed contention, and one as long fits.

        Args:
            last: the last round's figures.
            round_s: the wall time the last round took.
        """
        in_time = time.monotonic() + round_s < self.deadline
        pipeline_ms, replay_ms, _ = last.compared(self.wall_time)
        return in_time and self.shows_contention(pipeline_ms, replay_ms)


def contention_check(
    model,
    shows_contention: Callable[[float, float], bool],
    plan: ContentionPlan,
    deadline: float,
    traced_step=None,
    first_round_by: Optional[float] = None,
    wall_time: bool = False,
    replay: Optional[Callable[..., WhatIfResult]] = None,
    given_s: Optional[float] = None,
) -> WhatIfResult:
    """A short what-if replay after fit, to count the pipeline's share of the step.

    Args:
        model: the model `fit` trained (TensorFlow backend; a tf.data
            dataset, or NumPy arrays, which Keras turns into one).
        shows_contention: `shows_contention(pipeline_ms, replay_ms)`, whether
            a round's steps show the pipeline slowing the step (the verdict's
            rule). When the first round does, a second one runs if it fits
            before `deadline`: one burst of another load on the machine during
            the first round's pipeline steps would look the same, and seldom
            falls on both.
        plan: the `ContentionPlan` (`contention_plan`).
        deadline: `time.monotonic()` after which no second round starts.
        traced_step: fit's timed training function, traced already
            (`FitTiming.traced_train_step()`), or `None` to trace one.
        first_round_by: `time.monotonic()` by which the first round must end
            (`contention_cap_s`), or `None` for `deadline`.
        wall_time: a round shows contention by its wall times a step
            (`ReplayRound.compared`): for a job the quota throttled.
        replay: `replay(steps, cached_batches, pipeline_stats, control)`, the
            replay of another backend (`framework_replay.replay` on JAX and
            torch); `None` for TensorFlow's.
        given_s: the seconds it was given because it could change the
            verdict (`needed_bound_s`), for its notes; `None` otherwise.

    Returns:
        The `WhatIfResult`, its `method` saying it ran on its own.
    """
    control = RoundControl(
        shows_contention, deadline, plan.step_s, first_round_by, wall_time=wall_time,
        given_s=given_s,
    )
    if replay is not None:
        result = replay(plan.steps, CONTENTION_CACHED_BATCHES, None, control)
        result.method = CONTENTION_METHOD
        return result
    found = fit_input.find_fit_input(model)

    # The real pipeline's steps are timed here too, between parts of the
    # replay, rather than taken from training: both then run under the same
    # load, which on a shared machine changes between training and the check.
    # Training's iterators are gone; a new one over the same dataset reads the
    # same caches, which training filled.
    result = _what_if(
        model,
        found.replay_dataset,
        plan.steps,
        CONTENTION_CACHED_BATCHES,
        None,
        control,
        traced_step,
        keras_made=found.kind == fit_input.ARRAYS,
    )
    result.method = CONTENTION_METHOD
    return result


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


def _replay(
    model,
    run_steps,
    variables_touched,
    dataset,
    steps,
    cached_batches,
    pipeline_stats,
    control,
):
    """Caches a few batches and times the replay (and the pipeline); restores the model."""
    cached = dataset.take(cached_batches).cache()
    # One full pass completes the cache; the repeats then read only memory.
    found = sum(1 for _ in cached)
    if found == 0:
        raise ValueError("The dataset is empty: there is nothing to replay.")
    replayed = cached.repeat()
    # Everything the replayed step can change, found before it runs: the
    # step may keep state outside the model (a custom `train_step`'s random
    # generator, a layer's own variable), and all of it must end as it began.
    touched = variables_touched(iter(replayed))
    if pipeline_stats is None:
        touched += variables_touched(iter(dataset))
    saved = _State(model, touched)
    try:
        if pipeline_stats is None:
            replay_rows, pipeline_rows, rounds = run_rounds(
                run_steps, replayed, dataset, steps, control
            )
        else:
            replay_rows, pipeline_rows, rounds = run_replay(run_steps, replayed, steps), None, []
    finally:
        saved.restore()
    return found, replay_rows, pipeline_rows, rounds


def _timed_steps_of(model, traced=None) -> Callable:
    """The model's timed training step, as the `PipelineTuner` runs it in fit.

    `traced`, fit's own timed function, is reused when given: its step is
    traced already for iterators of fit's data, which the replay's are too
    (the same element spec), so the check does not pay a second tracing.
    """
    reason = timed_step_function.unsupported_reason(model)
    if reason is None and model.run_eagerly:
        reason = "the model runs eagerly (run_eagerly=True)"
    if (
        reason is None
        and type(model.distribute_strategy).__name__ != "_DefaultDistributionStrategy"
    ):
        reason = "the model trains under a distribution strategy, which the replay does not support"
    if reason is not None:
        raise ReplayUnsupported(f"The training step cannot be timed here: {reason}.")
    rows = []

    def on_rows(found, wall, called_at):
        rows.append(found)

    def on_error(error):
        pass

    if traced is not None:
        timed = traced
        timed.detach()
        timed.attach(on_rows, on_error)
    else:
        if getattr(model, "train_function", None) is None:
            model.make_train_function()
        timed = timed_step_function.TimedFunction(
            model, model.train_step, model.train_function, on_rows, on_error
        )

    def run_steps(iterator):
        timed.armed = True
        timed(iterator)
        return rows.pop()

    return run_steps, timed.variables_touched


class _State:
    """A copy of everything a training step changes in a model, to put back."""

    def __init__(self, model, touched: list):
        variables = list(model.variables)
        variables += list(getattr(model.optimizer, "variables", []))
        variables += list(getattr(model, "metrics_variables", []))
        variables += list(touched)
        unique = {id(variable): variable for variable in variables}
        self._saved = [(variable, np.array(variable.numpy())) for variable in unique.values()]

    def restore(self) -> None:
        for variable, value in self._saved:
            variable.assign(value)
