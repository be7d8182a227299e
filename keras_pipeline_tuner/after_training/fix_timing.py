"""Advised fixes timed on the user's pipeline: `PipelineTuner(measure_fixes=True)`.

A recommendation's gain is otherwise a bound (steps no faster than their
compute) or a profiled stage's share: what the change could bring at most.
After training, on the dataset object fit was given, each advised change that
`kpt.tune`'s rewriter can make (a parallel map or interleave, AUTOTUNE for a
fixed parallelism, a cache, a final prefetch, a vectorised map) is timed on
its own against the pipeline as written, with `tune`'s machinery
(`pipeline.tune.tuning.time_rewrites`): rebuilt from the graph, its elements
checked, timed side by side with the original in alternating rounds, GC off,
within a budget of a few seconds.

The pipeline is timed alone: `advice.timed_gains` turns its throughput change
into a step time with the compute the step clock measured. Each timed pass
starts a new iterator, as an epoch does, so the pipeline's start-up (opening
files, filling buffers) is timed with it when passes are whole epochs. Passes
of a few batches (an epoch too long for the budget) read `WARMUP_BATCHES`
untimed batches first, as `kpt.tune`'s do: on a busy machine a parallel
stage's threads and AUTOTUNE's first choices took most of a pass of a few
batches, and a change that delivered 1.6x in the fit timed at 0.9x.

A fix only the user can write (a `from_generator` source that does its work
in the generator, told to yield cheap items and do the work in a parallel
map) is timed by a replay: as many copies of the generator as the run has
CPUs, read at once, against the one as written. That is the rate its work
reaches spread over those threads, as it would in a parallel map; the
copies' elements repeat, and only the rate is kept (`rewrites.GENERATOR_COPIES`).
A pipeline that runs the user's Python (a generator, a `py_function`) or
keeps state of its own (a `tf.random.Generator`) is never run again after
training unless the user asks (`allow_unverified=True`): then in this process,
where its Python runs again and may move state the next fit reads; the
report says so beside the figures. Otherwise its fixes' figures are predicted
from its calls timed during training (see `advice`).
"""

import dataclasses
import logging
import math
from typing import Iterable
from typing import List
from typing import Optional
from typing import Tuple

from keras_pipeline_tuner.advice.data_reuse import DataReuse
from keras_pipeline_tuner.advice.recommendation import BOTTLENECK_STAGE
from keras_pipeline_tuner.advice.recommendation import QUOTA_THREADS
from keras_pipeline_tuner.advice.recommendation import Recommendation
from keras_pipeline_tuner.pipeline.graph import kinds
from keras_pipeline_tuner.pipeline.graph import rerun
from keras_pipeline_tuner.pipeline.graph.in_memory import COPY_BYTES_PER_S
from keras_pipeline_tuner.pipeline.graph.in_memory import too_much_to_copy
from keras_pipeline_tuner.pipeline.lint.catalogue import CACHE_MISSING
from keras_pipeline_tuner.pipeline.lint.catalogue import FIXED_PARALLELISM
from keras_pipeline_tuner.pipeline.lint.catalogue import MISSING_PREFETCH
from keras_pipeline_tuner.pipeline.lint.catalogue import SEQUENTIAL_INTERLEAVE
from keras_pipeline_tuner.pipeline.lint.catalogue import SEQUENTIAL_MAP
from keras_pipeline_tuner.pipeline.lint.catalogue import VECTORIZE_MAP
from keras_pipeline_tuner.pipeline.tune import results as tune_results
from keras_pipeline_tuner.pipeline.tune.element_checks import TooSlowForBudget
from keras_pipeline_tuner.pipeline.tune.pass_size import WARMUP_BATCHES
from keras_pipeline_tuner.pipeline.tune.planning import plan_rewrites
from keras_pipeline_tuner.pipeline.tune.rebuild import copied_by_rebuild
from keras_pipeline_tuner.pipeline.tune.rebuild import pipeline_for_rebuild
from keras_pipeline_tuner.pipeline.tune.rewrites import AUTOTUNE_PARALLELISM
from keras_pipeline_tuner.pipeline.tune.rewrites import CACHE
from keras_pipeline_tuner.pipeline.tune.rewrites import GENERATOR_COPIES
from keras_pipeline_tuner.pipeline.tune.rewrites import PARALLEL_INTERLEAVE
from keras_pipeline_tuner.pipeline.tune.rewrites import PARALLEL_MAP
from keras_pipeline_tuner.pipeline.tune.rewrites import PREFETCH
from keras_pipeline_tuner.pipeline.tune.rewrites import THREADPOOL
from keras_pipeline_tuner.pipeline.tune.rewrites import VECTORIZE
from keras_pipeline_tuner.pipeline.tune.rewrites import Rewrite
from keras_pipeline_tuner.pipeline.tune.rewrites import Skipped
from keras_pipeline_tuner.pipeline.tune.tuning import time_rewrites
from keras_pipeline_tuner.timing.cpu_usage import budget_cpus
from keras_pipeline_tuner.timing.step_stats import StepStats

logger = logging.getLogger("keras_pipeline_tuner")

# Seconds `measure_fixes=True` may take after training, all fixes together.
DEFAULT_BUDGET_S = 5.0
# `measure_fixes="auto"` (the default): an input-bound fit's fixes are timed
# within the smaller of these, seconds and a share of the fit's own time, so
# that the top recommendation's figure is a measurement where that is cheap.
AUTO = "auto"
AUTO_CAP_S = 10.0
AUTO_FIT_SHARE = 0.05
# Below this, no fix can be timed (reading the pipeline and one pass of each
# side take longer): the automatic timing does not start.
AUTO_LEAST_S = 0.5
# The share of the cap the timed rounds are planned for: reading and
# rebuilding the pipeline and its last round's check take the rest (up to a
# fifth of the budget was seen beyond it).
AUTO_PLANNED_SHARE = 0.75
# In-memory arrays a pipeline may hold to be rebuilt and timed: rebuilding
# copies them (about 10 ms per MB here), after training, in the user's memory.
MAX_IN_MEMORY_BYTES = 256 * 2**20
# And no more than the budget can copy (`in_memory.too_much_to_copy`): 118 MB
# of encoded images spent a 5.4 s cap before the first timed pass.
# Batches per timed epoch when epochs are cut short: fewer leaves the
# iterator's start-up to dominate, more does not fit the budget.
_MIN_BATCHES = 4
_MAX_BATCHES = 200
# Epochs the timing reads besides its timed passes: the original's first
# epoch twice and its rebuild once, then one check per fix.
_SETUP_EPOCHS = 3
# Timed passes per fix, at the fewest rounds (with and without, three each).
_PASSES_PER_FIX = 6
# Share of the budget the passes are sized to fill: building the rebuilt
# datasets and the checks' reading take the rest.
_BUDGET_SHARE = 0.6

# The rewrite that makes each finding's fix. Under a CPU quota, the private
# thread pool of the budget's size: it joins the advice only when it times
# faster (`advice.cpu_limits`); AUTOTUNE's budget is advised by rule, as
# tf.data cannot see the quota, and `kpt.tune` times it.
_REWRITE_OF = {
    SEQUENTIAL_MAP: PARALLEL_MAP,
    SEQUENTIAL_INTERLEAVE: PARALLEL_INTERLEAVE,
    FIXED_PARALLELISM: AUTOTUNE_PARALLELISM,
    CACHE_MISSING: CACHE,
    MISSING_PREFETCH: PREFETCH,
    VECTORIZE_MAP: VECTORIZE,
    QUOTA_THREADS: THREADPOOL,
}
# Final ops that work on the next elements in background threads while the
# consumer computes, as a prefetch does (TensorFlow's fused map_and_batch too).
_ASYNCHRONOUS_OPS = frozenset(
    {
        "PrefetchDataset",
        "MapAndBatchDataset",
        "ParallelMapDatasetV2",
        "ParallelInterleaveDatasetV4",
        "ParallelBatchDataset",
    }
)
# Rewrites of which a pipeline has at most one, wherever the finding points.
_ONE_PER_PIPELINE = (CACHE, PREFETCH, THREADPOOL)


@dataclasses.dataclass
class FixTiming:
    """One advised fix, timed on the pipeline after training (or why not).

    Attributes:
        recommendation: the recommendation's id, e.g. "sequential-map".
        stage: the stage it is about, as the recommendation names it.
        stage_node: that stage's node in the dataset graph.
        change: the rewrite timed, as code, e.g.
            "map(load, num_parallel_calls=AUTOTUNE)".
        status: "measured", or why not: "not proven" (it runs a Python
            function from several threads; see `allow_unverified`), "not
            measured" (the budget), "not applicable", "failed", "changed the
            elements".
        reason: why it was not timed, in words.
        batch_ms_before: the pipeline alone, milliseconds per batch as written.
        batch_ms_after: the same with the change.
        rounds: side-by-side rounds the figures come from.
        batches: batches per timed pass.
        overlapped_before: whether the last stage TensorFlow runs prepares
            batches ahead (a prefetch, written or injected, or a parallel
            stage), so a batch is prepared while a step computes.
        overlapped_after: the same with the change.
        reran_python: timed by running the pipeline's Python again in this
            process, as the user asked (`allow_unverified=True`): its state
            (a Python function's, a random generator's) may have moved on.
        read_back_only: a cache timed on passes that read it back, filled
            before them: the figures leave out the pass that fills it.
        replay: how what was timed stands in for a fix that cannot be made
            on the graph (copies of a generator), in a sentence; empty when
            the fix itself was timed.

    Example:

    >>> timing = FixTiming("sequential-map", "map(f)", "MapDataset/_3",
    ...                    "map(f, num_parallel_calls=AUTOTUNE)", "measured",
    ...                    batch_ms_before=40.0, batch_ms_after=10.0)
    >>> timing.measured
    True
    """

    recommendation: str
    stage: Optional[str]
    stage_node: Optional[str]
    change: str
    status: str
    reason: str = ""
    batch_ms_before: Optional[float] = None
    batch_ms_after: Optional[float] = None
    rounds: int = 0
    batches: int = 0
    overlapped_before: bool = False
    overlapped_after: bool = False
    reran_python: bool = False
    read_back_only: bool = False
    replay: str = ""

    @property
    def measured(self) -> bool:
        """Whether the change was timed (both batch times are known)."""
        return self.batch_ms_before is not None and self.batch_ms_after is not None

    def matches(self, recommendation: Recommendation) -> bool:
        """Whether this timing is of `recommendation`'s fix.

        The stage's graph node tells apart two stages written alike where both
        sides know it; a stage named before the profile's evidence joined the
        report (which gives the node) is matched by its label.
        """
        if recommendation.id != self.recommendation or recommendation.stage != self.stage:
            return False
        nodes = (recommendation.stage_node, self.stage_node)
        return None in nodes or nodes[0] == nodes[1]


def checked_budget(measure_fixes) -> Optional[float]:
    """Validates `PipelineTuner(measure_fixes=...)`: the seconds it may take, 0 for off.

    Args:
        measure_fixes: "auto" (`auto_budget`), `False`, `True`
            (`DEFAULT_BUDGET_S` seconds) or a positive number of seconds.

    Returns:
        The budget in seconds; 0.0 when off; `None` for "auto".

    Raises:
        ValueError: for anything else.

    Example:

    >>> checked_budget(True), checked_budget(False), checked_budget(2), checked_budget("auto")
    (5.0, 0.0, 2.0, None)
    """
    if isinstance(measure_fixes, str) and measure_fixes == AUTO:
        return None
    if isinstance(measure_fixes, bool):
        return DEFAULT_BUDGET_S if measure_fixes else 0.0
    if (
        isinstance(measure_fixes, (int, float))
        and math.isfinite(measure_fixes)
        and measure_fixes > 0
    ):
        return float(measure_fixes)
    raise ValueError(
        f"`measure_fixes` must be \"auto\", True, False or a positive number of seconds, got "
        f"{measure_fixes!r}. Pass measure_fixes=True to time the advised fixes for about "
        f"{DEFAULT_BUDGET_S:g} s after training."
    )


def auto_budget(fit_s: float) -> float:
    """The seconds `measure_fixes="auto"` gives the fixes of a fit of `fit_s` seconds.

    Example:

    >>> auto_budget(30.0), auto_budget(600.0)
    (1.5, 10.0)
    """
    return min(AUTO_CAP_S, AUTO_FIT_SHARE * max(fit_s, 0.0))


def time_fixes(
    dataset,
    recommendations: Iterable[Recommendation],
    stats: StepStats,
    budget_s: float = DEFAULT_BUDGET_S,
    allow_unverified: bool = False,
    reuse: Optional[DataReuse] = None,
    cpus: Optional[int] = None,
    min_pass_s: float = 0.0,
) -> List[FixTiming]:
    """Times the advised fixes that `kpt.tune`'s rewriter can make, each on its own.

    Runs the user's pipeline (and its Python functions) for about `budget_s`
    seconds; the model is not involved.

    Args:
        dataset: the `tf.data.Dataset` fit was given.
        recommendations: the advice formed for the run.
        stats: the run's training `StepStats`, to size the timed passes.
        budget_s: about how long all the timing may take, in seconds.
        allow_unverified: the user vouches that the pipeline's Python can
            run again (it keeps no state between calls, reads no queue or
            feed): time its fixes in this process, also those that call it
            from several threads. Otherwise a pipeline that runs Python or
            keeps state (a `tf.random.Generator`) is not run again, and its
            fixes are said not applicable.
        reuse: the fit's `DataReuse`: a cache in a fit that reads no element
            twice is not timed (it would never be read back).
        cpus: the CPUs the run may use (its `CpuBudget`): how many copies of
            a generator the replay of its fix reads at once; `None` reads the
            process's budget now.
        min_pass_s: the least a timed pass of a few batches should last, in
            seconds, as estimated from the steps (`timing.cpu_budget.quota_span_s` under a
            binding CPU quota).

    Returns:
        One `FixTiming` per advised fix that is a rewrite: each
        recommendation's own, and those folded into it (`also`, the other
        findings about its stage), which may turn out faster.

    Example:

    ```python
    timings = time_fixes(train_ds, report.recommendations, report.train)
    for timing in timings:
        print(timing.change, timing.status, timing.batch_ms_before, timing.batch_ms_after)
    ```
    """
    pipeline, candidates, skipped, untouchable, reran_python = _candidates(
        dataset, allow_unverified, budget_s, cpus or budget_cpus(None)
    )
    timings, wanted = _wanted(recommendations, candidates, skipped, untouchable, reuse)
    if not wanted:
        return timings
    overlapped = ends_ahead(pipeline)
    for timing, rewrite in wanted:
        timing.overlapped_before = overlapped
        timing.overlapped_after = overlapped or rewrite.kind == PREFETCH
        timing.reran_python = reran_python
    epochs, num_batches, cache_reason = _plan(dataset, stats, wanted, budget_s, min_pass_s)
    order = _timing_order(wanted, cache_reason)
    if not order:
        return timings
    _time_in_order(dataset, order, budget_s, epochs, num_batches, allow_unverified)
    return timings


def _time_in_order(dataset, order, budget_s, epochs, num_batches, allow_unverified):
    """Times each `(rewrite, its timings)` of `order` (`_time`); records the figures, or
    why there are none, on the timings."""
    rewrites = [rewrite for rewrite, _ in order]
    try:
        timed = time_rewrites(
            dataset,
            rewrites,
            budget_s,
            epochs=epochs,
            num_batches=num_batches,
            allow_unverified=allow_unverified,
        )
    except ValueError as limit:
        # An epoch too long for the budget (an expected limit): said per fix.
        status = tune_results.NOT_MEASURED
        for _, found in order:
            for timing in found:
                timing.status, timing.reason = status, _limit_reason(limit, budget_s)
        return
    for (rewrite, found), item in zip(order, timed):
        for timing in found:
            _record(timing, rewrite, item, epochs)


def _limit_reason(limit: Exception, budget_s: float) -> str:
    """Why the timing stopped, in the terms of `PipelineTuner`, not of `kpt.tune`.

    Example:

    >>> _limit_reason(TooSlowForBudget("...", 4, 0.64), 0.97)
    'its batches are too slow to time within the 0.97 s it was given: the first 4 took \
0.64 s; PipelineTuner(measure_fixes=<seconds>) gives the timing more (True: 5 s)'
    """
    if not isinstance(limit, TooSlowForBudget):
        return str(limit)
    return (
        f"its batches are too slow to time within the {budget_s:.2f} s it was given: the first "
        f"{limit.batches} took {limit.elapsed_s:.2f} s; PipelineTuner(measure_fixes=<seconds>) "
        f"gives the timing more (True: {DEFAULT_BUDGET_S:g} s)"
    )


def _timing_order(wanted, cache_reason: Optional[str]):
    """`(rewrite, its timings)` per distinct rewrite, however many fixes name it, in timing order.

    Caches first: where the data repeats a cache removes its stage's whole
    cost after the first pass, which no other change to the stage can beat,
    and its passes read memory, so it costs the budget least. A budget that
    runs out leaves the later fixes untimed. A cache that cannot be timed
    (`cache_reason`) is said so and left out.
    """
    distinct = {}
    for timing, rewrite in wanted:
        if cache_reason is not None and rewrite.kind == CACHE:
            timing.status, timing.reason = tune_results.NOT_MEASURED, cache_reason
            continue
        distinct.setdefault((rewrite.kind, rewrite.node), (rewrite, []))[1].append(timing)
    return sorted(distinct.values(), key=lambda item: item[0].kind != CACHE)


def _candidates(dataset, allow_unverified: bool, budget_s: float, cpus: int):
    """`(pipeline, rewrites planned, rewrites skipped, why none can be timed or None,
    whether timing them runs the user's Python again)`."""
    # Rebuilding the pipeline from its graph copies the arrays it holds (a
    # source over `LIGHT_OVER_BYTES` is not copied: see `tune.rebuild`).
    cap_s = min(budget_s, MAX_IN_MEMORY_BYTES / COPY_BYTES_PER_S)
    untouchable = too_much_to_copy(
        copied_by_rebuild(dataset),
        cap_s,
        "rebuilding it to time the change within the fix timing's cap",
    )
    if untouchable is not None:
        return None, [], [], untouchable, False
    pipeline = pipeline_for_rebuild(dataset)
    # Random maps too: the advice says to parallelise them (the numbers then
    # land on other elements), and a timed change is never kept.
    candidates, skipped = plan_rewrites(pipeline, allow_nondeterministic=True)
    replays, one_cpu = _generator_replays(pipeline, cpus)
    candidates, skipped = candidates + replays, skipped + one_cpu
    untouchable, reran_python = _rerun_plan(pipeline, allow_unverified)
    return pipeline, candidates, skipped, untouchable, reran_python


def _generator_replays(pipeline, cpus: int) -> Tuple[List[Rewrite], List[Skipped]]:
    """A replay of each `from_generator` source's advised fix, `cpus` copies of it at once.

    Returns `(replays, skipped)`: on one CPU, no replay (one copy is the
    generator as written), and why.
    """
    replays, skipped = [], []
    for stage in pipeline.stages:
        if stage.kind != kinds.FROM_GENERATOR or stage.op != "FlatMapDataset":
            continue
        if cpus < 2:
            skipped.append(Skipped(GENERATOR_COPIES, stage.label, (
                "the run may use one CPU, so a replay of the generator's work spread over "
                "threads would read one copy, the generator as written"
            )))
            continue
        replays.append(Rewrite(
            kind=GENERATOR_COPIES,
            node=stage.node,
            stage=stage.label,
            change=f"{cpus} copies of {stage.label} read at once",
            changes_order=True,
            changes_determinism=True,
            caveat=(
                f"The fix changes the user's code, so a replay stands in for it: {cpus} copies "
                f"of the generator, one per CPU the run may use, each from its first element, "
                "timed against the one as written; a parallel map of its work spreads it over "
                "as many threads."
            ),
            copies=cpus,
        ))
    return replays, skipped


def _wanted(
    recommendations, candidates, skipped, untouchable: Optional[str], reuse=None
) -> Tuple[List[FixTiming], List[Tuple[FixTiming, Rewrite]]]:
    """A `FixTiming` per advised fix that is a rewrite, and those to time with their rewrite."""
    timings: List[FixTiming] = []
    wanted: List[Tuple[FixTiming, Rewrite]] = []
    for recommendation, fix_id in _advised_fixes(recommendations):
        kind = _rewrite_kind(recommendation, fix_id)
        if kind is None:
            continue
        timing = FixTiming(fix_id, recommendation.stage, recommendation.stage_node, "", "")
        timings.append(timing)
        if untouchable is not None:
            timing.status, timing.reason = tune_results.NOT_APPLICABLE, untouchable
            continue
        if kind == CACHE and reuse is not None and reuse.repeats is False:
            timing.status, timing.reason = tune_results.NOT_APPLICABLE, reuse.line
            continue
        rewrite = _matching(candidates, kind, recommendation)
        if rewrite is None:
            timing.status = tune_results.NOT_APPLICABLE
            timing.reason = _skipped_reason(skipped, kind, recommendation)
            continue
        timing.change = rewrite.change
        if rewrite.kind == GENERATOR_COPIES:
            timing.replay = rewrite.caveat or ""
        wanted.append((timing, rewrite))
    return timings, wanted


# Helpers.


def _rerun_plan(pipeline, allow_unverified: bool) -> Tuple[Optional[str], bool]:
    """`(why the pipeline cannot be timed after training or None, whether its Python runs again)`.

    A shuffle or random ops are no reason: every timed pass reads a rebuild
    with seed generators of its own (`TuningSession.build`), so the dataset
    itself shuffles and draws on as it would have. The user's Python (a
    generator, a `py_function`) and state the process keeps (a
    `tf.random.Generator`) are: they run again only when the user vouches for
    them (`allow_unverified`), and a source another reader takes from (a
    queue) never.
    """
    hazard = rerun.rerun_hazard(pipeline, allow_python=False)
    if hazard is None:
        return None, False
    if allow_unverified and rerun.rerun_hazard(pipeline, allow_python=True) is None:
        return None, True
    why = f"the pipeline is not run again after training: {hazard}"
    if rerun.shared_source(pipeline, allow_python=True) is None:
        why += (
            "; pass measure_fixes=True and allow_unverified=True to PipelineTuner to time it "
            "in this process, if its Python can run again (it reads data or files, no queue "
            "or feed)"
        )
    return why, False


def _advised_fixes(recommendations) -> List[Tuple[Recommendation, str]]:
    """Each advised fix: a recommendation's own, and those folded into it (`also`)."""
    found = []
    for recommendation in recommendations:
        for fix_id in [recommendation.id, *recommendation.also]:
            found.append((recommendation, fix_id))
    return found


def _rewrite_kind(recommendation: Recommendation, fix_id: str) -> Optional[str]:
    kind = _REWRITE_OF.get(fix_id)
    if kind is not None or fix_id != BOTTLENECK_STAGE:
        return kind
    # The advisor's fix for a bottleneck no finding explains: read which.
    fix, stage = recommendation.fix, recommendation.stage or ""
    if ".cache()" in fix:
        return CACHE
    if "num_parallel_calls" in fix and stage.startswith("map("):
        return PARALLEL_MAP
    if "num_parallel_calls" in fix and stage.startswith("interleave("):
        return PARALLEL_INTERLEAVE
    if stage.startswith(f"{kinds.FROM_GENERATOR}("):
        return GENERATOR_COPIES
    return None


def _matching(candidates, kind: str, recommendation: Recommendation):
    # A map written with num_parallel_calls=1 is sequential to the lint, and
    # the rewriter gives it AUTOTUNE in place of its fixed parallelism.
    kinds_wanted = (kind, AUTOTUNE_PARALLELISM) if kind == PARALLEL_MAP else (kind,)
    for wanted in kinds_wanted:
        for rewrite in candidates:
            if rewrite.kind != wanted:
                continue
            if wanted in _ONE_PER_PIPELINE or rewrite.node == recommendation.stage_node:
                return rewrite
            if recommendation.stage_node is None and rewrite.stage == recommendation.stage:
                # Named by its label only (the user's Python timed in training).
                return rewrite
    return None


def _skipped_reason(skipped, kind: str, recommendation: Recommendation) -> str:
    for item in skipped:
        if item.kind == kind and (kind in _ONE_PER_PIPELINE or item.stage == recommendation.stage):
            return item.reason
    return "kpt.tune's rewriter does not make this change on this pipeline"


def ends_ahead(pipeline) -> bool:
    """Whether the last stage TensorFlow runs prepares batches ahead of the consumer.

    Example:

    >>> from keras_pipeline_tuner.pipeline.graph.reader import read_pipeline
    >>> ends_ahead(read_pipeline(tf.data.Dataset.range(8).batch(2).prefetch(1)))
    True
    >>> options = tf.data.Options()
    >>> options.experimental_optimization.map_parallelization = False
    >>> fused = tf.data.Dataset.range(8).map(tf.abs).batch(2).with_options(options)
    >>> ends_ahead(read_pipeline(fused))  # TensorFlow runs a map-and-batch, then a prefetch
    True
    """
    # Names are the runtime graph's from its final stage: look them up there.
    read = pipeline.runtime if pipeline.runtime_final is not None else pipeline
    final = read.final
    while final is not None and final.kind == kinds.WITH_OPTIONS and final.inputs:
        final = read.stage(final.inputs[0])
    return final is not None and final.op in _ASYNCHRONOUS_OPS


def _plan(dataset, stats: StepStats, wanted, budget_s: float, min_pass_s: float):
    """Epochs and batches per timed pass: `(epochs, num_batches, why no cache)`.

    A cache pays off from the second epoch: two whole epochs per pass when
    they fit the budget. Otherwise passes of a few batches, as many as fit,
    which time the steady state: `kpt.tune`'s machinery fills a cache before
    them with the elements they read (`CacheScratch.partial`), a few batches'
    worth, when the dataset's length is known, and else with a whole epoch,
    which must then fit the budget too. Passes last at least `min_pass_s`
    (estimated from the steps), past the cap on batches.
    """
    distinct = {(rewrite.kind, rewrite.node) for _, rewrite in wanted}
    batch_s = delivered_batch_s(stats)
    cardinality = int(dataset.cardinality())
    caching = any(kind == CACHE for kind, _ in distinct)
    if caching and cardinality > 0:
        whole_epochs = _SETUP_EPOCHS + len(distinct) * (1 + 2 * _PASSES_PER_FIX)
        if cardinality * batch_s * whole_epochs <= _BUDGET_SHARE * budget_s:
            return 2, None, None
    # A cache's fill reads about one pass more.
    caches = sum(1 for kind, _ in distinct if kind == CACHE)
    epochs = _SETUP_EPOCHS + len(distinct) * (1 + _PASSES_PER_FIX) + caches
    # Every timed pass reads its untimed warm-up first (`time_rewrites`).
    warmups = len(distinct) * _PASSES_PER_FIX * WARMUP_BATCHES
    num_batches = int((_BUDGET_SHARE * budget_s / batch_s - warmups) / epochs)
    num_batches = max(
        _MIN_BATCHES, min(_MAX_BATCHES, num_batches), math.ceil(min_pass_s / batch_s)
    )
    if cardinality > 0:
        num_batches = min(num_batches, cardinality)
    if not caching or cardinality > 0:
        return 1, num_batches, None
    cache_reason = (
        "a cache pays off from the second epoch, and the dataset's length is not known, so "
        f"filling it takes a whole epoch, too long for the {budget_s:g} s of measure_fixes"
    )
    return 1, num_batches, cache_reason


def delivered_batch_s(stats: StepStats) -> float:
    """Seconds a batch took in training, wall time: a step and the time to the next one.

    Sizes the passes that time a fix: the pipeline alone is at most as slow as
    the steps that waited for it. The means, with the time between steps:
    under a CPU quota the kernel's stops fall there as much as in the steps (a
    median step of 0.27 ms, in training that took 2.8 ms a step, sized passes
    that spent the whole budget on the first of two fixes).

    Args:
        stats: the run's training `StepStats`.

    Returns:
        Seconds per batch, at least 0.1 ms.

    Example:

    >>> import numpy as np
    >>> stats = StepStats.from_arrays(np.array([0.01, 0.01]), np.array([0.01, 0.01]),
    ...                               np.array([0.005]))
    >>> round(delivered_batch_s(stats), 6)
    0.025
    """
    step_ms = stats.step.mean_ms or 1.0
    return max((step_ms + (stats.host_gap.mean_ms or 0.0)) / 1e3, 1e-4)


def _record(timing: FixTiming, rewrite, item, epochs: int) -> None:
    outcome = item.outcome
    timing.status = outcome.status
    if outcome.status == tune_results.UNVERIFIED:
        timing.reason = (
            f"{rewrite.unverified}; pass allow_unverified=True to PipelineTuner to time it"
        )
        return
    if outcome.status != tune_results.MEASURED or not item.batches or not outcome.ratio:
        timing.reason = outcome.reason
        return
    timing.batch_ms_before = item.without_s / item.batches * 1e3
    timing.batch_ms_after = timing.batch_ms_before * outcome.ratio
    timing.rounds = outcome.rounds
    timing.batches = item.batches
    # Passes of a few batches read a cache filled before them: the fit's
    # first pass, which fills it, is counted in `measured_gain`.
    timing.read_back_only = rewrite.kind == CACHE and epochs == 1
