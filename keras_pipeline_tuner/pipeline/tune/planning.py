"""Which rewrites a pipeline admits, stage by stage, and which it does not, and why.

Each rewrite keeps what the model sees: a map or interleave runs in parallel
only when its function changes no state and draws no random numbers (unless
allowed), a map runs on batches only when it is element-wise, a cache goes
where it replays what every epoch would compute anyway (`cache_point`).
Stages TensorFlow already runs in parallel after its default rewrites are
left alone. Whether a rewrite is worth it is measured (`tuning`).
"""

from typing import List
from typing import Optional
from typing import Tuple

from keras_pipeline_tuner.pipeline.graph import kinds
from keras_pipeline_tuner.pipeline.graph.model import Pipeline
from keras_pipeline_tuner.pipeline.graph.rerun import STATEFUL_PYTHON_OPS
from keras_pipeline_tuner.pipeline.graph.rerun import side_effects
from keras_pipeline_tuner.pipeline.tune.cache_point import cache_caveat
from keras_pipeline_tuner.pipeline.tune.cache_point import cache_point
from keras_pipeline_tuner.pipeline.tune.rewrites import AUTOTUNE_BUDGET
from keras_pipeline_tuner.pipeline.tune.rewrites import AUTOTUNE_OFF
from keras_pipeline_tuner.pipeline.tune.rewrites import AUTOTUNE_PARALLELISM
from keras_pipeline_tuner.pipeline.tune.rewrites import CACHE
from keras_pipeline_tuner.pipeline.tune.rewrites import KINDS
from keras_pipeline_tuner.pipeline.tune.rewrites import MAP_FUSION
from keras_pipeline_tuner.pipeline.tune.rewrites import PARALLEL_BATCH
from keras_pipeline_tuner.pipeline.tune.rewrites import PARALLEL_INTERLEAVE
from keras_pipeline_tuner.pipeline.tune.rewrites import PARALLEL_MAP
from keras_pipeline_tuner.pipeline.tune.rewrites import PREFETCH
from keras_pipeline_tuner.pipeline.tune.rewrites import REORDER
from keras_pipeline_tuner.pipeline.tune.rewrites import THREADPOOL
from keras_pipeline_tuner.pipeline.tune.rewrites import TUNABLE_INPUT
from keras_pipeline_tuner.pipeline.tune.rewrites import VECTORIZE
from keras_pipeline_tuner.pipeline.tune.rewrites import Rewrite
from keras_pipeline_tuner.pipeline.tune.rewrites import Skipped
from keras_pipeline_tuner.pipeline.tune.vectorize import vectorize_blocker
from keras_pipeline_tuner.timing.cpu_budget import CpuBudget
from keras_pipeline_tuner.timing.cpu_budget import read_cpu_budget


def plan_rewrites(
    pipeline: Pipeline,
    allow_nondeterministic: bool = False,
    allow_reordering: bool = False,
) -> Tuple[List[Rewrite], List[Skipped]]:
    """Lists the rewrites that keep what the model sees, stage by stage.

    A cheap element-wise map right before a batch can run on the batch
    instead (vectorisation); a sequential map or interleave can run in
    parallel (with the original order kept); fixed parallelism and buffer
    sizes can be AUTOTUNE; a batch can copy in parallel; consecutive cheap maps
    can be fused; a prefetch can end the pipeline; a cache can follow the last
    expensive stage that gives the same elements every epoch (see
    `cache_point`); with `allow_reordering`, parallel maps and interleaves can
    hand out elements as they are ready; the pipeline can get its own thread
    pool, or run without autotuning's overhead. Stages TensorFlow already runs
    in parallel after its default rewrites are left alone.

    Args:
        pipeline: the pipeline, from `graph.reader.read_pipeline`.
        allow_nondeterministic: also parallelise maps that draw random numbers
            (the numbers then land on different elements from run to run).
        allow_reordering: also plan `deterministic=False` for parallel maps
            and interleaves (elements may come in another order).

    Returns:
        `(rewrites, skipped)`: the candidate rewrites in the order they should
        be tried, and the rewrites not made with the reason.
    """
    rewrites: List[Rewrite] = []
    skipped: List[Skipped] = []
    for stage in pipeline.stages:
        _plan_stage(pipeline, stage, allow_nondeterministic, allow_reordering, rewrites, skipped)
    _plan_map_fusion(pipeline, rewrites)
    _plan_cache(pipeline, rewrites, skipped)
    final = pipeline.final
    # Options set at the end do not change which stage produces the elements.
    while final is not None and final.kind == kinds.WITH_OPTIONS and final.inputs:
        final = pipeline.stage(final.inputs[0])
    if final is not None:
        _plan_prefetch(pipeline, final, rewrites, skipped)
        _plan_options(pipeline, final, rewrites)
    rewrites.sort(key=_rank_of(rewrites))
    return rewrites, skipped


def _rank_of(rewrites: List[Rewrite]):
    """The sort key of the rewrites' order: `KINDS`, the quota's first where one binds.

    Where a container's quota binds below what tf.data counts (an AUTOTUNE
    budget is planned), the thread rewrites sized to it are timed right after
    the parallelism ones: they are what the quota calls for, and what the
    advice (`cpu-quota-threads`) asks `kpt.tune` to time, so a short budget
    must not run out before them.
    """
    kinds_order = list(KINDS)
    if any(rewrite.kind == AUTOTUNE_BUDGET for rewrite in rewrites):
        for kind in (AUTOTUNE_BUDGET, THREADPOOL):
            kinds_order.remove(kind)
        after = kinds_order.index(AUTOTUNE_PARALLELISM) + 1
        kinds_order[after:after] = [AUTOTUNE_BUDGET, THREADPOOL]
    order = {kind: index for index, kind in enumerate(kinds_order)}
    return lambda rewrite: order[rewrite.kind]


def _plan_stage(pipeline, stage, allow_nondeterministic, allow_reordering, rewrites, skipped):
    """Plans the rewrites of one stage's own op."""
    if stage.kind == kinds.MAP and stage.op in ("MapDataset", "ParallelMapDatasetV2"):
        _plan_vectorize(pipeline, stage, rewrites, skipped)
    if stage.op == "MapDataset":
        _plan_parallel_map(stage, allow_nondeterministic, rewrites, skipped)
    elif stage.op == "InterleaveDataset":
        _plan_parallel(PARALLEL_INTERLEAVE, stage, allow_nondeterministic, rewrites, skipped)
    elif stage.op in TUNABLE_INPUT:
        _plan_autotune(stage, allow_nondeterministic, rewrites, skipped)
    if stage.op == "BatchDatasetV2":
        rewrites.append(
            Rewrite(
                kind=PARALLEL_BATCH,
                node=stage.node,
                stage=stage.label,
                change=_with_argument(stage.label, "num_parallel_calls=AUTOTUNE"),
            )
        )
    if stage.kind in (kinds.MAP, kinds.INTERLEAVE):
        _plan_reorder(stage, allow_nondeterministic, allow_reordering, rewrites, skipped)


def _plan_cache(pipeline, rewrites, skipped) -> None:
    """Plans a cache after the stage `cache_point` finds, or says why there is none."""
    point, reason = cache_point(pipeline)
    if point is None:
        skipped.append(Skipped(CACHE, str(pipeline), reason))
        return
    rewrites.append(
        Rewrite(
            kind=CACHE,
            node=point.node,
            stage=point.label,
            change=f"{point.label}.cache()",
            caveat=cache_caveat(pipeline, point),
            filename="",
        )
    )


def _plan_prefetch(pipeline, final, rewrites, skipped) -> None:
    """Plans a prefetch after `final`, unless one ends the pipeline, written or not."""
    runtime_final = pipeline.runtime_final
    if final.kind == kinds.PREFETCH:
        return
    if runtime_final is not None and runtime_final.kind == kinds.PREFETCH:
        skipped.append(
            Skipped(
                PREFETCH,
                final.label,
                "TensorFlow already adds a prefetch at the end when it runs the "
                "pipeline (the default inject_prefetch optimisation)",
            )
        )
        return
    rewrites.append(
        Rewrite(
            kind=PREFETCH,
            node=final.node,
            stage=final.label,
            change=f"{final.label}.prefetch(AUTOTUNE)",
        )
    )


def autotune_budget_short(pipeline: Pipeline, budget: CpuBudget) -> bool:
    """Whether AUTOTUNE's CPU budget should be set to `budget.cpus` (a quota binds).

    AUTOTUNE sizes its parallelism from the CPUs the process may be scheduled
    on; a container's quota, which it does not see, can be less. The one rule
    for `kpt.tune`'s rewrite and the advice (`advice.cpu_limits`).

    Args:
        pipeline: the `Pipeline`, with the options it sets.
        budget: the process's `CpuBudget`.

    Returns:
        `True` when the quota is below what tf.data counts and the pipeline's
        own `autotune.cpu_budget` is unset or above the budget.

    Example:

    >>> from keras_pipeline_tuner.timing.cpu_budget import CpuBudget
    >>> autotune_budget_short(Pipeline(stages=[]), CpuBudget(8, 8, quota_cpus=2.0))
    True
    """
    return budget.hidden_from_tf_data and not budget.holds(
        pipeline.options.get("autotune_options.cpu_budget")
    )


def _plan_options(pipeline, final, rewrites) -> None:
    """Plans the `tf.data.Options` rewrites: AUTOTUNE's CPU budget under a quota, a
    private thread pool, autotuning off."""
    budget = read_cpu_budget()
    if autotune_budget_short(pipeline, budget):
        rewrites.append(
            Rewrite(
                kind=AUTOTUNE_BUDGET,
                node=final.node,
                stage=final.label,
                change=f"options.autotune.cpu_budget = {budget.cpus}",
                options={"autotune.cpu_budget": budget.cpus},
            )
        )
    if "threading_options.private_threadpool_size" not in pipeline.options:
        # Its own pool keeps the pipeline's threads from queueing behind
        # other work of the process (e.g. the training step's), sized to the
        # CPUs the process may use (its affinity, or a container's quota).
        threads = budget.cpus
        rewrites.append(
            Rewrite(
                kind=THREADPOOL,
                node=final.node,
                stage=final.label,
                change=f"options.threading.private_threadpool_size = {threads}",
                options={"threading.private_threadpool_size": threads},
            )
        )
    if pipeline.options.get("autotune_options.enabled") is not False:
        # Autotuning runs a model of the pipeline on its own thread: for a
        # pipeline of cheap stages that can cost more than it finds.
        rewrites.append(
            Rewrite(
                kind=AUTOTUNE_OFF,
                node=final.node,
                stage=final.label,
                change="options.autotune.enabled = False",
                options={"autotune.enabled": False},
                caveat=(
                    "AUTOTUNE parallelism and buffer sizes no longer adapt to the "
                    "load: faster as measured here, to measure again when the machine "
                    "or the training step changes (the lint names it autotune-disabled)"
                ),
            )
        )


def _plan_vectorize(pipeline, stage, rewrites, skipped) -> None:
    """Plans running a map on batches when a batch follows it and it is element-wise."""
    readers = [item for item in pipeline.stages if stage.node in item.inputs]
    if len(readers) != 1 or readers[0].kind != kinds.BATCH or readers[0].inputs[:1] != [stage.node]:
        return
    batch = readers[0]
    if batch.op not in ("BatchDatasetV2", "ParallelBatchDataset"):
        return
    function = stage.function
    if function is None:
        return
    reason = vectorize_blocker(function)
    if reason is not None:
        skipped.append(Skipped(VECTORIZE, f"{stage.label} -> {batch.label}", reason))
        return
    rewrites.append(
        Rewrite(
            kind=VECTORIZE,
            node=stage.node,
            stage=f"{stage.label}.{batch.label}",
            change=f"{batch.label}.{stage.label}",
            batch_node=batch.node,
            # The tuned dataset runs the per-element graph on batches; the
            # pasted code has Python trace the function again on batches.
            caveat=(
                f"the code traces {function.name} again on batches: Python in it that "
                "branches on static shapes (x.shape) would take the batch's branch"
            ),
        )
    )


def _plan_reorder(stage, allow_nondeterministic, allow_reordering, rewrites, skipped) -> None:
    """Plans `deterministic=False` on a map or interleave that is or can be parallel."""
    if stage.params.get("deterministic") == "false":
        return
    function = stage.function
    parallel_op = stage.op in ("ParallelMapDatasetV2", "ParallelInterleaveDatasetV4")
    sequential_op = stage.op in ("MapDataset", "InterleaveDataset")
    if not (parallel_op or sequential_op) or function is None or function.trivial:
        return
    if sequential_op and _parallel_blocker(function, allow_nondeterministic) is not None:
        return
    if not allow_reordering:
        skipped.append(
            Skipped(
                REORDER,
                stage.label,
                "deterministic=False lets elements come out in another order; pass "
                "allow_reordering=True to try it",
            )
        )
        return
    head = stage.label
    if "num_parallel_calls" not in head:
        head = _with_argument(head, "num_parallel_calls=AUTOTUNE")
    rewrites.append(
        Rewrite(
            kind=REORDER,
            node=stage.node,
            stage=stage.label,
            change=_with_argument(head, "deterministic=False"),
            changes_order=True,
            changes_determinism=function.random,
            caveat=_thread_caveat(function),
            unverified=_python_unverified(function),
        )
    )


def _plan_map_fusion(pipeline, rewrites) -> None:
    """Plans tf.data's map fusion when two cheap maps follow each other."""
    if pipeline.options.get("optimization_options.map_fusion"):
        return
    by_node = {stage.node: stage for stage in pipeline.stages}
    for stage in pipeline.stages:
        before = by_node.get(stage.inputs[0]) if stage.inputs else None
        if (
            stage.kind == kinds.MAP
            and before is not None
            and before.kind == kinds.MAP
            and all(s.function is not None and s.function.cheap for s in (before, stage))
        ):
            rewrites.append(
                Rewrite(
                    kind=MAP_FUSION,
                    node=pipeline.final.node,
                    stage=f"{before.label}.{stage.label}",
                    change="options.experimental_optimization.map_fusion = True",
                    options={"experimental_optimization.map_fusion": True},
                )
            )
            return


def _python_unverified(function) -> Optional[str]:
    # A `tf.numpy_function(..., stateful=False)` (PyFuncStateless) is its
    # author's promise that its results depend on its inputs only: as it may
    # run again (`rerun`), it may run on several threads.
    stateful = sorted(set(function.py_function_ops) & STATEFUL_PYTHON_OPS)
    if not stateful:
        return None
    return (
        f"{function.name} runs Python ({', '.join(stateful)}), whose state "
        "TensorFlow cannot see: called from several threads, a function that keeps state "
        "(a counter, a file position) pairs it with other elements, and a check of the "
        "elements cannot prove it does not"
    )


def _plan_parallel_map(stage, allow_nondeterministic, rewrites, skipped) -> None:
    if stage.parallel_at_runtime:
        skipped.append(
            Skipped(
                PARALLEL_MAP,
                stage.label,
                "TensorFlow already runs this map in parallel (the default "
                "map_parallelization optimisation)",
            )
        )
        return
    if stage.function is None or stage.function.trivial:
        return
    _plan_parallel(PARALLEL_MAP, stage, allow_nondeterministic, rewrites, skipped)


def _plan_parallel(kind, stage, allow_nondeterministic, rewrites, skipped) -> None:
    """Plans running a map's or interleave's calls in parallel, order kept."""
    function = stage.function
    blocker = _parallel_blocker(function, allow_nondeterministic) if function else None
    if blocker is not None:
        skipped.append(Skipped(kind, stage.label, blocker))
        return
    rewrites.append(
        Rewrite(
            kind=kind,
            node=stage.node,
            stage=stage.label,
            change=_with_argument(stage.label, "num_parallel_calls=AUTOTUNE"),
            changes_determinism=function is not None and function.random,
            caveat=_thread_caveat(function) if function else None,
            unverified=_python_unverified(function) if function else None,
        )
    )


def _plan_autotune(stage, allow_nondeterministic, rewrites, skipped) -> None:
    _, argument = TUNABLE_INPUT[stage.op]
    value = stage.params.get(argument)
    # AUTOTUNE is already -1, and a prefetch of 0 is none.
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        return
    function = stage.function
    if value == 1 and argument == "num_parallel_calls" and function is not None:
        # One call at a time may be what keeps the function correct: the same
        # rules as for making a sequential map parallel.
        blocker = _parallel_blocker(function, allow_nondeterministic)
        if blocker is not None:
            skipped.append(Skipped(AUTOTUNE_PARALLELISM, stage.label, blocker))
            return
    named = f"{argument}={value}"
    change = (
        stage.label.replace(named, f"{argument}=AUTOTUNE")
        if named in stage.label
        else stage.label.replace(f"({value}", "(AUTOTUNE", 1)
    )
    rewrites.append(
        Rewrite(
            kind=AUTOTUNE_PARALLELISM,
            node=stage.node,
            stage=stage.label,
            change=change,
            changes_determinism=value == 1 and function is not None and function.random,
            caveat=_thread_caveat(function) if value == 1 and function is not None else None,
            unverified=(
                _python_unverified(function) if value == 1 and function is not None else None
            ),
        )
    )


def _parallel_blocker(function, allow_nondeterministic: bool) -> Optional[str]:
    """Why calls of `function` must stay one at a time, or None."""
    changed = side_effects(function)
    if changed:
        return (
            f"the function changes state ({', '.join(changed)}): calls in parallel "
            "could change the results"
        )
    if function.random and not allow_nondeterministic:
        return (
            f"the function draws random numbers ({', '.join(function.random_ops)}): "
            "parallel calls would hand them to other elements from run to run; pass "
            "allow_nondeterministic=True to allow it"
        )
    return None


def _thread_caveat(function) -> Optional[str]:
    if not function.py_function_ops:
        return None
    return (
        "the Python function runs on several threads at once: it must not depend on the "
        "order of calls or on unsynchronised shared state"
    )


def _with_argument(label: str, argument: str) -> str:
    head, _, tail = label.rpartition(")")
    separator = "" if head.endswith("(") else ", "
    return f"{head}{separator}{argument}){tail}"

