"""The gain model: what each change is expected to bring, from the run's evidence.

If input were free a step would take its compute (or its time less the
input's share, or what a replay with input free measured), so no
input-pipeline change can make steps faster than that: the run's one "input
free" ceiling (`advice.figures.input_free`, of the steady-state step). A stage the
profiler timed can at most remove its own share of the input's cost, a tighter
ceiling; what a given change brings is predicted from the stage's profiled time
or from the user's calls timed in training (`python_stages`), by an operational
model of the one stage it touches, and measured where the change was timed
(`timed_gains`).
"""

import dataclasses
import math
from typing import TYPE_CHECKING
from typing import Optional

from keras_pipeline_tuner.advice import capacity as capacity_model
from keras_pipeline_tuner.advice import python_stages
from keras_pipeline_tuner.advice.recommendation import BOUND
from keras_pipeline_tuner.advice.recommendation import FIRST_EPOCH_ONLY
from keras_pipeline_tuner.advice.recommendation import MEASURED
from keras_pipeline_tuner.advice.recommendation import NOT_READ_BACK
from keras_pipeline_tuner.advice.recommendation import REPLAY
from keras_pipeline_tuner.advice.recommendation import ExpectedGain
from keras_pipeline_tuner.advice.replay_comparison import WALL_STATISTIC
from keras_pipeline_tuner.advice.stage_fixes import CACHE
from keras_pipeline_tuner.advice.stage_fixes import PARALLEL
from keras_pipeline_tuner.advice.stage_fixes import SPREAD
from keras_pipeline_tuner.advice.stages import parse_stage
from keras_pipeline_tuner.advice.stages import same_place
from keras_pipeline_tuner.after_training import fix_timing
from keras_pipeline_tuner.pipeline.graph import kinds
from keras_pipeline_tuner.pipeline.lint.keras_inputs import ADVISED_WORKERS
from keras_pipeline_tuner.profiling.evidence import GRAIN

if TYPE_CHECKING:
    pass


def free_input_ceiling(fraction: float) -> float:
    # Steps that spend `fraction` of their time on input are at most this much
    # faster with input free (capped: a share of 1 would be no finite bound).
    return 1.0 / (1.0 - min(fraction, 0.99))


def stage_gain(
    run, stage: str, change: Optional[str], node: Optional[str] = None
) -> Optional[ExpectedGain]:
    """The ceiling of changing `stage`, and what `change` is predicted to bring.

    `change` is PARALLEL for AUTOTUNE parallel calls of a sequential map, CACHE
    for a cache after the stage, `None` for any other change (no prediction).
    """
    gain = _stage_gain(run, stage, change, node)
    if gain is not None and change == SPREAD and parse_stage(stage)[0] in LOADER_KINDS:
        if MEASURE_WITH_TUNE not in gain.statement:
            # A DataLoader's dataset is not timed call by call (its load is
            # the wait): a bound only, and `kpt.tune` for the measured gain.
            gain = dataclasses.replace(gain, statement=gain.statement + MEASURE_WITH_TUNE)
    return gain


def _stage_gain(run, stage: str, change: Optional[str], node: Optional[str]):
    cost = run.python_cost(stage)
    if cost is not None and change is not None and run.bound is not None:
        # Its own calls, timed in training, say what it costs a step: a
        # prediction from them, whatever a profile's share would bound.
        return _python_gain(run, cost, change, _within_cores if change == PARALLEL else None)
    gain, stage_ms = _stage_share_gain(run, stage, node)
    if change == PARALLEL:
        gain = _within_cores(run, gain)
    modelled = _capacity_gain(run, gain, stage, change, node)
    if modelled is not None:
        return modelled
    if gain is None or stage_ms is None or not gain.step_ms or change is None:
        return gain
    after = _predicted_step_ms(run, gain.step_ms, stage_ms, change)
    if after is None:
        return gain
    predicted = min(gain.step_ms / after, gain.speedup or math.inf)
    return dataclasses.replace(
        gain,
        predicted_speedup=predicted,
        statement=(
            f"{gain.statement} Predicted from the profiled stage ({stage_ms:.2f} ms a step"
            + (f" over {run.cpu_count} cores" if change != CACHE else ", served by the cache")
            + f"): a step of {after:.2f} ms, {predicted:.2f}x faster."
        ),
    )


# Loaders whose worker settings `kpt.tune` measures on their own batches.
LOADER_KINDS = (kinds.PY_DATASET, kinds.DATA_LOADER)
MEASURE_WITH_TUNE = (
    " kpt.tune(loader) measures it: each worker setting timed on the loader's own batches, "
    "within the CPU budget, the best proven against yours."
)

def _capacity_gain(run, gain, stage: str, change: Optional[str], node) -> Optional[ExpectedGain]:
    """`gain` with the capacity model's predicted step for `change`, where it holds the stage.

    The model (`advice.capacity`) spreads the stage over the budget's cores
    (parallel calls, or its work moved onto them) or drops it and its inputs
    (a cache read back), from
    tf.data's own measurement of every stage of the fit's iterator; the
    prediction never passes the ceiling.
    """
    capacity = getattr(run.figures, "capacity", None)
    kind = {PARALLEL: capacity_model.PARALLEL, SPREAD: capacity_model.SPREAD,
            CACHE: capacity_model.CACHE}.get(change)
    if capacity is None or kind is None or gain is None or not gain.step_ms:
        return None
    after = capacity.predicted_step_ms(stage, kind, node)
    if after is None or after <= 0 or not capacity.step_ms:
        return None
    # The model's step now over its step after: both predicted, so that its
    # own errors cancel; never past the ceiling.
    predicted = min(capacity.step_ms / after, gain.speedup or math.inf)
    how = (
        "served by the cache" if kind == capacity_model.CACHE
        else f"over {capacity.cpu_budget} cores"
    )
    return dataclasses.replace(
        gain,
        predicted_speedup=predicted,
        statement=(
            f"{gain.statement} Predicted by the capacity model from tf.data's own statistics "
            f"of every stage ({stage} {how}, the step the larger of its "
            f"{capacity.compute_ms:.2f} ms compute and the input's time a batch): a step of "
            f"{after:.2f} ms instead of {capacity.step_ms:.2f} ms, {predicted:.2f}x faster."
        ),
    )


def _python_gain(run, cost, change: str, within=None) -> Optional[ExpectedGain]:
    """The gain of `change` to a Python stage, predicted from its calls timed in training.

    The ceiling is the stage's cost given back in full (never past the step
    with input free); the prediction spreads it over the threads the change
    runs it on (`python_stages.predicted_step_ms`): the cores for AUTOTUNE
    parallel calls, `ADVISED_WORKERS` for a PyDataset's workers, none for a
    cache read back.
    """
    bound = run.bound
    step_ms, compute_ms = bound.step_ms, bound.step_ms_after or 0.0
    if not step_ms:
        return bound
    ceiling_ms = max(compute_ms, step_ms - cost.step_ms)
    gain = ExpectedGain(
        step_ms / ceiling_ms,
        step_ms,
        ceiling_ms,
        BOUND,
        f"{cost.sentence()} Removing that time from the step would make it "
        f"{ceiling_ms:.2f} ms instead of {step_ms:.2f} ms: at most "
        f"{step_ms / ceiling_ms:.2f}x faster.",
    )
    if within is not None:
        gain = within(run, gain)
    threads = {PARALLEL: run.cpu_count, SPREAD: run.cpu_count, CACHE: python_stages.CACHED}
    workers = threads.get(change)
    loader = parse_stage(cost.stage)[0] in LOADER_KINDS
    if change == SPREAD and loader:
        workers = ADVISED_WORKERS
    if workers is None:
        return gain
    ahead = fix_timing.ends_ahead(run.pipeline) if run.pipeline is not None else False
    after = python_stages.predicted_step_ms(step_ms, compute_ms, cost, workers, ahead)
    if after is None:
        return gain
    predicted = min(step_ms / after, gain.speedup or math.inf)
    over = f"{parse_stage(cost.stage)[0]} workers" if change == SPREAD and loader else "threads"
    spread = (
        "served by a cache read back" if workers == python_stages.CACHED
        else f"spread over {workers} {over}, the {cost.serial_share * 100:.0f} % of its time "
        "that computes in Python or waits for the GIL staying serial"
    )
    return dataclasses.replace(
        gain,
        predicted_speedup=predicted,
        statement=(
            f"{gain.statement} Predicted from those calls timed during training, {spread}: "
            f"a step of {after:.2f} ms, {predicted:.2f}x faster (a prediction: your Python "
            "is not run again to measure it)."
            + (MEASURE_WITH_TUNE if change == SPREAD and loader else "")
        ),
    )


def _predicted_step_ms(run, step_ms: float, stage_ms: float, change: str):
    """The step after `change` by Plumber's operational analysis of the one stage it touches.

    The input prepares a batch in `t_in` (the wait, plus the compute it
    overlaps when the pipeline already runs ahead of the step); the stage's
    part of it is spread over the cores (AUTOTUNE parallel calls, which also
    run ahead of the step) or gone (a cache, on the passes that read it back).
    A step takes its compute plus the input, or the longer of the two when the
    input runs ahead. `None` without a compute time.
    """
    compute = run.bound.step_ms_after if run.bound is not None else None
    if not compute or compute >= step_ms:
        return None
    wait = step_ms - compute
    ahead = fix_timing.ends_ahead(run.pipeline) if run.pipeline is not None else False
    t_in = wait + (compute if ahead else 0.0)
    stage_in = min(stage_ms / wait, 1.0) * t_in
    if change in (PARALLEL, SPREAD):
        return max(compute, t_in - stage_in * (1.0 - 1.0 / run.cpu_count))
    left = t_in - stage_in
    return max(compute, left) if ahead else compute + left


def _within_cores(run, gain: Optional[ExpectedGain]) -> Optional[ExpectedGain]:
    """The ceiling of a sequential map given AUTOTUNE parallel calls: `cpu_count` times.

    tf.data's AUTOTUNE runs at most as many parallel calls of a map as the
    cores the process may use, so a sequential map gets at most that many
    times faster, and with it the step (far below "steps as fast as their compute").
    A ceiling, not a prediction: threads do nothing for Python under the GIL,
    and TensorFlow ops share the cores with the model; timing the change says
    what it brings. A fixed, larger parallelism on waiting work (remote reads)
    may do better, which is why other parallelising fixes keep their bound.
    """
    cores = run.cpu_count
    if gain is None or gain.speedup is None or gain.step_ms is None or gain.speedup <= cores:
        return gain
    return dataclasses.replace(
        gain,
        speedup=float(cores),
        step_ms_after=gain.step_ms / cores,
        statement=(
            f"{gain.statement} AUTOTUNE runs at most {cores} parallel call"
            f"{'s' if cores != 1 else ''}, one per core this process may use: at most "
            f"{cores:.2f}x faster."
        ),
    )


def _stage_share_gain(run, stage: str, node: Optional[str]):
    """The ceiling of changing `stage` (its profiled share of the input's cost given back).

    Returns `(gain, stage_ms)`: the `ExpectedGain`, and the milliseconds of a
    step the profiled stage costs (`None` when no window timed it).
    """
    bound, figures = run.bound, run.figures
    if bound is None:
        return unmeasured(), None
    profile = run.profile
    timed = stage_time(profile, stage, node) if profile is not None else None
    if timed is None and profile is not None and profile.bottleneck and profile.iterators:
        # The window timed the pipeline and found no work of this stage's own:
        # it cannot outrank the stage that holds the wait.
        # A bound, like every gain read off a profiled share: the change itself
        # was not timed.
        step_ms = bound.step_ms
        return ExpectedGain(
            1.0,
            step_ms,
            step_ms,
            BOUND,
            f"The profiler timed no work of {stage}'s own in the input pipeline (it "
            f"names {profile.bottleneck} the bottleneck): changing it frees no "
            "measurable input time.",
        ), None
    if timed is None or figures.input_fraction is None or bound.step_ms is None:
        return dataclasses.replace(
            bound,
            basis=BOUND,
            statement=bound.statement
            + " This change gets there only if this stage is what the input waits for "
            "(no profile timed it).",
        ), None
    step_ms = bound.step_ms
    # What the input costs a step in the steady state the verdict describes
    # (a cache-filling first epoch left out): its wait, or more where a replay
    # measured the step with input free (a pipeline that competes for the
    # cores slows the compute too).
    wait_ms = (figures.wait_fraction or 0.0) * step_ms
    cost_ms = max(wait_ms, figures.input_fraction * step_ms)
    stage_ms = timed.self_share * cost_ms
    # Making the stage free removes at most its share of that cost, and a step
    # never gets faster than it does with input free.
    after = max(bound.step_ms_after or 0.0, step_ms - stage_ms)
    if after <= 0:
        return bound, None
    # A ceiling: the change gives back at most the stage's share; how much of
    # it a given fix (threads, a cache) gives back is what timing it shows.
    return ExpectedGain(
        step_ms / after,
        step_ms,
        after,
        BOUND,
        f"{timed_by(profile)} puts {timed.self_share * 100:.0f} % of the input pipeline's "
        f"time in {stage}; removing that share of the {cost_ms:.2f} ms the input costs a step "
        f"({'measured by the replay' if figures.source == REPLAY else 'its wait'}) would "
        "make a step "
        f"{after:.2f} ms instead of {step_ms:.2f} ms: at most {step_ms / after:.2f}x faster.",
    ), stage_ms


def cache_gain(run, gain: Optional[ExpectedGain]) -> Optional[ExpectedGain]:
    """A cache's gain in this fit: none if it never reads an element twice.

    A cache computes each element once, in the first pass, and is read back
    on the next ones: the steady-state ceiling holds for those, and the fit as
    a whole gains less (see `DataReuse.fit_speedup`).
    """
    reuse = run.reuse
    if reuse is None or gain is None or gain.step_ms is None:
        return gain
    line = reuse.line[:1].upper() + reuse.line[1:] + "."
    if reuse.repeats is None or gain.speedup is None:
        return dataclasses.replace(gain, statement=f"{gain.statement} {line}".strip())
    if not reuse.repeats:
        return ExpectedGain(1.0, gain.step_ms, gain.step_ms, NOT_READ_BACK, line)
    speedup = reuse.fit_speedup(gain.speedup)
    predicted = gain.predicted_speedup
    return dataclasses.replace(
        gain,
        speedup=speedup,
        predicted_speedup=reuse.fit_speedup(predicted) if predicted is not None else None,
        step_ms_after=gain.step_ms / speedup,
        statement=(
            f"{gain.statement} {line} Over the fit's {reuse.passes:.1f} passes, the first "
            f"at today's speed to fill it: at most {speedup:.2f}x faster."
        ),
    )


def cache_after(pipeline, node: Optional[str]):
    """The cache stage downstream of `node`, if the pipeline caches its output."""
    if pipeline is None or not node:
        return None
    stage = next((item for item in pipeline.stages if item.node == node), None)
    if stage is None:
        return None
    return next((item for item in pipeline.downstream(stage) if item.kind == kinds.CACHE), None)


def first_epoch_only(run, stage: str, cache) -> ExpectedGain:
    # From the second epoch on the cache replays this stage's output: changing
    # the stage speeds up the first epoch only, a one-off cost, not the steady
    # state the verdict and the other gains describe.
    step_ms = run.bound.step_ms if run.bound is not None else run.figures.step_ms
    return ExpectedGain(
        1.0,
        step_ms,
        step_ms,
        FIRST_EPOCH_ONLY,
        f"{cache.label} after {stage} replays its output from the second epoch on: "
        "changing it speeds up the first epoch only, not the steady state.",
    )


def replayed_gain(what_if, throttled: bool = False) -> Optional[ExpectedGain]:
    """The replay's measured ceiling: the step on the pipeline over the step input free.

    Under a quota that throttled the job, by wall time a step over the check's
    rounds, as the verdict compares them: the kernel's stops fall between steps
    too, where the steps' own times miss them.
    """
    if what_if is None or what_if.speedup_if_input_free is None:
        return None
    step_ms, free_ms = what_if.pipeline_step.mean_ms, what_if.replay_step.mean_ms
    if step_ms is None or free_ms is None:
        return None
    speedup, how, by = what_if.speedup_if_input_free, "the training step took", ""
    walls = [found.compared(throttled) for found in what_if.rounds] if throttled else []
    if walls and all(walled for _, _, walled in walls):
        step_ms = sum(pipeline for pipeline, _, _ in walls) / len(walls)
        free_ms = sum(replay for _, replay, _ in walls) / len(walls)
        speedup, how, by = step_ms / free_ms, "a step took", f" ({WALL_STATISTIC})"
    if speedup < 1.0:
        # Slower with input free: the input costs nothing measurable, and the
        # difference is noise or the replay's conditions. Not a gain: no gain.
        return ExpectedGain(
            1.0,
            step_ms,
            step_ms,
            MEASURED,
            f"Replayed from cached batches (input free), {how} "
            f"{free_ms:.2f} ms, no faster than the {step_ms:.2f} ms it took with the real "
            f"pipeline{by} (the difference is timing noise or the replay's own conditions): "
            "free input would not make training faster.",
        )
    return ExpectedGain(
        speedup,
        step_ms,
        min(free_ms, step_ms),
        MEASURED,
        f"Replayed from cached batches (input free), {how} "
        f"{free_ms:.2f} ms instead of {step_ms:.2f} ms{by}: at most {speedup:.2f}x faster.",
    )


def unmeasured() -> ExpectedGain:
    return ExpectedGain(
        basis=BOUND,
        statement="The input wait was not measured, so the gain cannot be bounded.",
    )


def overlap_gain(figures) -> ExpectedGain:
    """What a prefetch at most brings: the step's wait overlapped with its compute.

    From the run's `Figures`: the steady-state step, and the verdict's share
    of it waiting at the fetch.
    """
    step, fraction = figures.step_ms, figures.wait_fraction
    if step is None or fraction is None or step <= 0:
        return unmeasured()
    wait, compute = fraction * step, (1.0 - fraction) * step
    # With a prefetch buffer the next batch is prepared while the step computes,
    # so a step takes the longer of the two instead of their sum.
    after = max(wait, compute)
    if after <= 0:
        return unmeasured()
    speedup = step / after
    return ExpectedGain(
        speedup,
        step,
        after,
        BOUND,
        f"Prefetching at best overlaps preparing the next batch ({wait:.2f} ms) with "
        f"computing this one ({compute:.2f} ms): a step takes at least {after:.2f} ms "
        f"instead of {step:.2f} ms, so at most {speedup:.2f}x faster (a bound: the "
        "pipeline's threads also compete with the model for the cores).",
    )


def stage_time(profile, stage, node=None):
    # A stage can run as several iterators (an interleave and the datasets its
    # function opens; Keras' wrapper around a PyDataset): its time is theirs.
    found = [
        iterator
        for iterator in profile.iterators
        if not iterator.waiting and same_place(iterator.stage, iterator.stage_node, stage, node)
    ]
    if not found:
        return None
    return dataclasses.replace(
        found[0],
        self_ms=sum(iterator.self_ms for iterator in found),
        self_share=min(1.0, sum(iterator.self_share for iterator in found)),
    )


def timed_by(profile) -> str:
    return "Grain's stage timing" if profile.source == GRAIN else "The profiler"
