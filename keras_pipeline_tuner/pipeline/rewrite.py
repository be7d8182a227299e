"""Rewrites of a tf.data pipeline's graph, and the rebuild of the rewritten dataset.

A dataset serialises itself to a GraphDef (one node per transformation, the
parameters as `Const` inputs, the user's functions in the graph's library), and
`tf.raw_ops.DatasetFromGraph` turns a GraphDef back into a working dataset in the
same process, `tf.py_function` and `from_generator` included. So the fixes the
tf.data performance guide asks users to write by hand can be made on the graph
itself: a sequential map becomes a parallel one, a prefetch is appended, a cache
is inserted, with the user's functions untouched.

This module knows which rewrites exist, where each one is safe, and how to make
it. It does not judge whether a rewrite is worth it: that is measured (see
`pipeline_tuning`). Reading the pipeline's stages is `pipeline_graph`'s job.
"""

import dataclasses
import itertools
import os
import re
import uuid
from typing import Any, Dict, Iterable, List, Optional, Tuple

from keras_pipeline_tuner.pipeline import graph as pipeline_graph
from keras_pipeline_tuner.pipeline.rerun import side_effects
from keras_pipeline_tuner._util.tf_import import tensorflow

PARALLEL_MAP = "parallel-map"
PARALLEL_INTERLEAVE = "parallel-interleave"
AUTOTUNE_PARALLELISM = "autotune"
CACHE = "cache"
PREFETCH = "prefetch"
VECTORIZE = "vectorize"
PARALLEL_BATCH = "parallel-batch"
MAP_FUSION = "map-fusion"
REORDER = "nondeterministic"
THREADPOOL = "private-threadpool"
AUTOTUNE_OFF = "autotune-off"

# The order in which rewrites are tried: vectorisation first (it changes how
# much work there is), then parallelism (it helps every epoch), then the cache
# (it helps from the second epoch), then the prefetch that overlaps whatever is
# left with the consumer; smaller refinements (parallel batch copies, map
# fusion, reordering, the thread pool) last, when the budget is left.
KINDS = (
    VECTORIZE,
    PARALLEL_INTERLEAVE,
    PARALLEL_MAP,
    AUTOTUNE_PARALLELISM,
    CACHE,
    PREFETCH,
    PARALLEL_BATCH,
    MAP_FUSION,
    REORDER,
    THREADPOOL,
    AUTOTUNE_OFF,
)
# Rewrites made by setting `tf.data.Options` on the final dataset.
OPTION_KINDS = (MAP_FUSION, THREADPOOL, AUTOTUNE_OFF)

# Ops that compute each output element from the elements at the same position
# of their inputs (broadcasting scalars), whatever the shapes: a function made
# only of these gives, on a batch, the batch of its results.
ELEMENTWISE_OPS = frozenset(
    {
        "Abs", "Acos", "Acosh", "Add", "AddV2", "Asin", "Asinh", "Atan", "Atan2", "Atanh",
        "BitwiseAnd", "BitwiseOr", "BitwiseXor", "Cast", "Ceil", "ClipByValue", "Cos",
        "Cosh", "Div", "DivNoNan", "Elu", "Equal", "Erf", "Erfc", "Exp", "Expm1", "Floor",
        "FloorDiv", "FloorMod", "Greater", "GreaterEqual", "Inv", "Invert", "IsFinite",
        "IsInf", "IsNan", "LeakyRelu", "LeftShift", "Less", "LessEqual", "Log", "Log1p",
        "LogicalAnd", "LogicalNot", "LogicalOr", "Maximum", "Minimum", "Mod", "Mul",
        "MulNoNan", "Neg", "NotEqual", "Pow", "RealDiv", "Reciprocal", "Relu", "Relu6",
        "RightShift", "Rint", "Round", "Rsqrt", "SelectV2", "Selu", "Sigmoid", "Sign",
        "Sin", "Sinh", "Softplus", "Softsign", "Sqrt", "Square", "SquaredDifference",
        "Sub", "Tan", "Tanh", "TruncateDiv", "TruncateMod", "Xdivy", "Xlogy",
        # Bookkeeping: no computation.
        "Const", "Identity", "IdentityN", "NoOp", "StopGradient", "Placeholder",
    }
)

_AUTOTUNE = -1
_DATASET_OP = re.compile(r"Dataset(V\d+)?$")

# Of those, the ones whose value a training loop may change between epochs.
_MUTABLE_READ_OPS = {"ReadVariableOp", "ResourceGather", "VarHandleOp"}

# Structural stages: they regroup or select elements without computing on them,
# so a cache can sit after them as well as before.
_STRUCTURAL_KINDS = {"batch", "padded_batch", "unbatch", "take", "skip", "shard", "rebatch"}
# Sources that do work per element (Python, file reads), unlike in-memory ones.
_SOURCE_KINDS_WITH_WORK = {
    "from_generator",
    "TFRecordDataset",
    "TextLineDataset",
    "FixedLengthRecordDataset",
}
# Stages whose output differs from one epoch to the next by design.
_RANDOM_KINDS = {"shuffle", "random", "sample_from_datasets"}

# Where each op with a tunable degree of parallelism keeps it, counted from the
# end of its data inputs: op -> (index from the end, argument name).
_TUNABLE_INPUT = {
    "ParallelMapDatasetV2": (-1, "num_parallel_calls"),
    "ParallelInterleaveDatasetV4": (-1, "num_parallel_calls"),
    "ParallelFilterDataset": (-1, "num_parallel_calls"),
    "ParallelBatchDataset": (-2, "num_parallel_calls"),
    "MapAndBatchDataset": (-2, "num_parallel_calls"),
    "PrefetchDataset": (-1, "buffer_size"),
}


@dataclasses.dataclass
class Rewrite:
    """One change to a pipeline's graph.

    Attributes:
        kind: one of `KINDS`: "vectorize", "parallel-map",
            "parallel-interleave", "autotune", "cache", "prefetch",
            "parallel-batch", "map-fusion", "nondeterministic",
            "private-threadpool" or "autotune-off".
        node: the graph node the rewrite changes, or after which it inserts
            a stage (for "prefetch" and options, the final node).
        stage: the stage as the user wrote it, e.g. "map(load)".
        change: the stage after the rewrite, as code, e.g.
            "map(load, num_parallel_calls=AUTOTUNE)".
        changes_order: whether the elements can come in a different order.
        changes_determinism: whether the elements' values can differ from
            one run to another where they did not before (e.g. random numbers
            drawn by parallel calls in a different order).
        caveat: what the rewrite assumes about the user's code, if anything.
        filename: for "cache": "" for memory, else the cache file's path.
        batch_node: for "vectorize", the batch node the map moves after.
        options: for option rewrites, `tf.data.Options` fields to set, by
            dotted path, e.g. `{"threading.private_threadpool_size": 2}`.
        unverified: why the rewrite's elements cannot be proven equal to the
            original's by comparing them (e.g. a Python function that may keep
            state, called from several threads), or `None`.
    """

    kind: str
    node: str
    stage: str
    change: str
    changes_order: bool = False
    changes_determinism: bool = False
    caveat: Optional[str] = None
    filename: Optional[str] = None
    batch_node: Optional[str] = None
    options: Dict[str, Any] = dataclasses.field(default_factory=dict)
    unverified: Optional[str] = None


@dataclasses.dataclass
class Skipped:
    """A rewrite that was considered for a stage and not made, and why.

    Attributes:
        kind: the rewrite's kind, as in `Rewrite.kind`.
        stage: the stage it was considered for.
        reason: why it is not made.
    """

    kind: str
    stage: str
    reason: str


def graph_def_of(dataset):
    """The GraphDef of a dataset, as TensorFlow serialises it.

    Args:
        dataset: a `tf.data.Dataset`.

    Returns:
        A `tf.compat.v1.GraphDef`; the final dataset feeds its `_Retval` node.
    """
    tf = tensorflow()
    serialized = dataset._as_serialized_graph(  # pylint: disable=protected-access
        external_state_policy=tf.data.experimental.ExternalStatePolicy.IGNORE
    )
    return tf.compat.v1.GraphDef.FromString(serialized.numpy())


def plan_rewrites(
    pipeline: "pipeline_graph.Pipeline",
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
        pipeline: the pipeline, from `pipeline_graph.read_pipeline`.
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
        if stage.kind == "map" and stage.op in ("MapDataset", "ParallelMapDatasetV2"):
            _plan_vectorize(pipeline, stage, rewrites, skipped)
        if stage.op == "MapDataset":
            _plan_parallel_map(stage, allow_nondeterministic, rewrites, skipped)
        elif stage.op == "InterleaveDataset":
            _plan_parallel(PARALLEL_INTERLEAVE, stage, allow_nondeterministic, rewrites, skipped)
        elif stage.op in _TUNABLE_INPUT:
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
        if stage.kind in ("map", "interleave"):
            _plan_reorder(stage, allow_nondeterministic, allow_reordering, rewrites, skipped)
    _plan_map_fusion(pipeline, rewrites)
    point, reason = cache_point(pipeline)
    if point is None:
        skipped.append(Skipped(CACHE, str(pipeline), reason))
    else:
        rewrites.append(
            Rewrite(
                kind=CACHE,
                node=point.node,
                stage=point.label,
                change=f"{point.label}.cache()",
                caveat=_cache_caveat(pipeline, point),
                filename="",
            )
        )
    final = pipeline.final
    # Options set at the end do not change which stage produces the elements.
    while final is not None and final.kind == "with_options" and final.inputs:
        final = pipeline.stage(final.inputs[0])
    if final is not None:
        runtime_final = pipeline.runtime_final
        if final.kind == "prefetch":
            pass
        elif runtime_final is not None and runtime_final.kind == "prefetch":
            skipped.append(
                Skipped(
                    PREFETCH,
                    final.label,
                    "TensorFlow already adds a prefetch at the end when it runs the "
                    "pipeline (the default inject_prefetch optimisation)",
                )
            )
        else:
            rewrites.append(
                Rewrite(
                    kind=PREFETCH,
                    node=final.node,
                    stage=final.label,
                    change=f"{final.label}.prefetch(AUTOTUNE)",
                )
            )
        if "threading_options.private_threadpool_size" not in pipeline.options:
            # Its own pool keeps the pipeline's threads from queueing behind
            # other work of the process (e.g. the training step's).
            threads = os.cpu_count() or 1
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
    order = {kind: index for index, kind in enumerate(KINDS)}
    rewrites.sort(key=lambda rewrite: order[rewrite.kind])
    return rewrites, skipped


def _plan_vectorize(pipeline, stage, rewrites, skipped) -> None:
    """Plans running a map on batches when a batch follows it and it is element-wise."""
    readers = [item for item in pipeline.stages if stage.node in item.inputs]
    if len(readers) != 1 or readers[0].kind != "batch" or readers[0].inputs[:1] != [stage.node]:
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


def vectorize_blocker(function: "pipeline_graph.StageFunction") -> Optional[str]:
    """Why a map's function cannot be applied to a batch instead of each element.

    Args:
        function: the map's `StageFunction`.

    Returns:
        The reason in words, or `None` when its graph is made only of
        element-wise ops (then it is still checked on the real elements).
    """
    if function.py_function_ops:
        return (
            f"{function.name} runs Python ({', '.join(function.py_function_ops)}): what it "
            "does with a batch instead of an element cannot be known from its graph"
        )
    if function.random:
        return (
            f"{function.name} draws random numbers ({', '.join(function.random_ops)}): on a "
            "batch it would draw them in other shapes, so the values would change"
        )
    if function.stateful_ops:
        return f"{function.name} has stateful ops ({', '.join(function.stateful_ops)})"
    other = sorted(set(function.ops) - ELEMENTWISE_OPS)
    if other:
        return (
            f"{function.name} has shape-dependent logic or ops that are not element-wise "
            f"({', '.join(other[:6])}{', ...' if len(other) > 6 else ''}): on a batch it "
            "could compute something else"
        )
    return None


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
            stage.kind == "map"
            and before is not None
            and before.kind == "map"
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
    if not function.py_function_ops:
        return None
    return (
        f"{function.name} runs Python ({', '.join(function.py_function_ops)}), whose state "
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
    _, argument = _TUNABLE_INPUT[stage.op]
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


def cache_point(pipeline: "pipeline_graph.Pipeline"):
    """Where a cache keeps what the model sees: the stage to cache after.

    The cache follows the last expensive stage (it runs Python, reads files or
    generates elements, decodes or parses) that has only stages giving the same
    elements every epoch upstream of it, and before anything random (a shuffle,
    a random augmentation, a read of a variable). Structural stages (batch,
    take, ...) right after it are cached too. Functions TensorFlow cannot see
    into (`tf.py_function`, `from_generator`) are assumed to repeat themselves;
    the tuner checks it on the real elements before using the cache.

    Args:
        pipeline: the pipeline, from `pipeline_graph.read_pipeline`.

    Returns:
        `(stage, None)` with the `Stage` to cache after, or `(None, reason)`.
    """
    if any(stage.kind == "cache" for stage in pipeline.stages):
        return None, "the pipeline already caches"
    final = pipeline.final
    # From the source to the final stage, along each stage's first input.
    chain = [] if final is None else [*reversed(list(pipeline.main_chain(final))), final]
    point = None
    for stage in chain:
        upstream = [stage, *pipeline.upstream(stage)]
        barrier = next((item for item in upstream if _changes_between_epochs(item)), None)
        if barrier is not None:
            if point is None:
                return None, (
                    f"{barrier.label} gives different elements every epoch and nothing "
                    "expensive comes before it: a cache would freeze it"
                )
            break
        if _expensive(stage, pipeline):
            point = stage
        elif point is not None and stage.kind in _STRUCTURAL_KINDS:
            point = stage
        elif point is not None and stage.kind not in ("prefetch", "with_options"):
            # Work after the expensive stage (e.g. a cheap map that grows the
            # elements) stays after the cache, where it costs no memory.
            break
    if point is None:
        return None, "no stage is expensive enough to be worth caching"
    return point, None


def draws_randomly(pipeline: "pipeline_graph.Pipeline") -> bool:
    """Whether a stage shuffles or draws random numbers, as far as the graph shows.

    Args:
        pipeline: the pipeline, from `pipeline_graph.read_pipeline`.

    Returns:
        True when some stage is a shuffle or sampling, or runs random ops.
    """
    return any(
        stage.kind in _RANDOM_KINDS or (stage.function is not None and stage.function.random)
        for stage in pipeline.stages
    )


def _changes_between_epochs(stage) -> bool:
    if stage.opaque or stage.kind in _RANDOM_KINDS:
        return True
    if stage.kind == "repeat":
        # An infinite repeat never completes the cache; caching goes before it.
        return True
    if stage.params.get("deterministic") == "false":
        return True
    function = stage.function
    if function is None:
        return False
    if function.random:
        return True
    mutable = set(function.stateful_ops) & _MUTABLE_READ_OPS
    return bool(mutable or side_effects(function))


def _expensive(stage, pipeline) -> bool:
    if stage.kind in _SOURCE_KINDS_WITH_WORK:
        return True
    if stage.function is not None and stage.function.expensive:
        return True
    # An interleave or flat_map over datasets it captures (e.g. a generator per
    # file) is as expensive as what it reads.
    by_node = {item.node: item for item in pipeline.stages}
    side_inputs = [by_node[node] for node in stage.inputs[1:] if node in by_node]
    return any(_expensive(side, pipeline) for side in side_inputs)


def _cache_caveat(pipeline, point) -> Optional[str]:
    upstream = [point, *pipeline.upstream(point)]
    opaque = [
        stage.label
        for stage in reversed(upstream)
        if stage.kind == "from_generator"
        or (stage.function is not None and stage.function.py_function_ops)
    ]
    if not opaque:
        return None
    names = " and ".join([", ".join(opaque[:-1]), opaque[-1]] if len(opaque) > 1 else opaque)
    return (
        f"assumes {names} give{'s' if len(opaque) == 1 else ''} the same elements every "
        "epoch (checked on the real elements)"
    )


def apply_rewrites(graph_def, rewrites: Iterable[Rewrite]):
    """Makes rewrites on a copy of a dataset's GraphDef.

    Args:
        graph_def: the `tf.compat.v1.GraphDef` from `graph_def_of`.
        rewrites: `Rewrite`s from `plan_rewrites` for this graph.

    Returns:
        The rewritten `tf.compat.v1.GraphDef`; `graph_def` is left unchanged.

    Raises:
        ValueError: if a rewrite names a node the graph does not have, or a
            node of another op than the rewrite applies to.
    """
    tf = tensorflow()
    rewritten = tf.compat.v1.GraphDef()
    rewritten.CopyFrom(graph_def)
    editor = _GraphEditor(rewritten)
    for rewrite in rewrites:
        editor.apply(rewrite)
    return rewritten


def cut_at(graph_def, node: str):
    """A copy of a dataset's GraphDef whose output is `node` (a prefix of the pipeline).

    Args:
        graph_def: the `tf.compat.v1.GraphDef`.
        node: the dataset node that becomes the output.

    Returns:
        `(graph_def, element_spec)`: the cut graph and the flat tuple of
        `tf.TensorSpec`s of the node's elements, or `None` as the spec when an
        element holds something other than plain tensors (ragged, nested
        datasets).
    """
    tf = tensorflow()
    cut = tf.compat.v1.GraphDef()
    cut.CopyFrom(graph_def)
    editor = _GraphEditor(cut)
    editor.retval.input[0] = node
    target = editor.node(node)
    types, shapes = _output_signature(target)
    if any(tf.dtypes.as_dtype(dtype) in (tf.variant, tf.resource) for dtype in types):
        return cut, None
    spec = tuple(
        tf.TensorSpec(tf.TensorShape(shape), tf.dtypes.as_dtype(dtype))
        for dtype, shape in zip(types, shapes)
    )
    return cut, spec


def rebuild(graph_def, element_spec, keep_alive: Any):
    """Turns a dataset GraphDef back into a dataset, in this process.

    Every memory cache in the graph gets a fresh, unshared buffer, so a rebuilt
    dataset starts empty as a new dataset would, and several rebuilds of one
    graph do not fill each other's caches; every random seed generator (a
    shuffle's) is fresh too, so the rebuilt dataset draws as a new dataset
    would and leaves the original's draws alone.

    Args:
        graph_def: a dataset `tf.compat.v1.GraphDef` (from `apply_rewrites`).
        element_spec: the element spec of its elements.
        keep_alive: the dataset the graph came from. The rebuilt dataset holds
            on to it: the Python functions its graph calls (`tf.py_function`,
            `from_generator`) live only as long as the original dataset.

    Returns:
        A `tf.data.Dataset`.
    """
    tf = tensorflow()
    fresh = tf.compat.v1.GraphDef()
    fresh.CopyFrom(graph_def)
    editor = _GraphEditor(fresh)
    editor.renew_caches()
    # Its own random seeds too: iterating it leaves the original's shuffle
    # order as it was, and it shuffles as a newly built dataset would.
    editor.renew_seed_generators()
    variant = tf.raw_ops.DatasetFromGraph(graph_def=fresh.SerializeToString())
    dataset = tf.data.experimental.from_variant(variant, element_spec)
    dataset._kpt_rebuilt_from = keep_alive  # pylint: disable=protected-access
    return dataset


# Datasets holding more in-memory tensors than this are not copied to run
# extra passes: their graph would copy the data (about 1 s per 100 MB).
COPY_MAX_IN_MEMORY_BYTES = 64 * 2**20


def independent_copy(dataset):
    """The dataset with random seeds of its own, for passes that must leave it as it was.

    A dataset that reshuffles every epoch draws each new iterator's seed from a
    generator it holds, so any extra pass over it (or over a dataset built on
    it) changes the order the next `fit` on it sees. The copy is rebuilt from
    the dataset's graph with fresh seed generators, which start where a new
    dataset's would; its caches stay shared, so a cache training filled is
    read, not filled again.

    Args:
        dataset: a `tf.data.Dataset`.

    Returns:
        The copy, or `dataset` itself when it holds no seed generator (extra
        passes then change nothing later passes see), or `None` when it holds
        one but also too many in-memory tensors to copy cheaply
        (`COPY_MAX_IN_MEMORY_BYTES`).

    Example:

    >>> ds = tf.data.Dataset.range(4).shuffle(4, seed=1)
    >>> expected = [list(ds.as_numpy_iterator()) for _ in range(2)]
    >>> ds = tf.data.Dataset.range(4).shuffle(4, seed=1)
    >>> _ = list(independent_copy(ds))  # not seen by `ds`
    >>> [list(ds.as_numpy_iterator()) for _ in range(2)] == expected
    True
    """
    tf = tensorflow()
    if pipeline_graph.in_memory_bytes(dataset) > COPY_MAX_IN_MEMORY_BYTES:
        light = pipeline_graph.without_large_sources(dataset, COPY_MAX_IN_MEMORY_BYTES)
        if light is None or _GraphEditor(graph_def_of(light)).seed_generator_inputs():
            return None
        return dataset
    graph_def = graph_def_of(dataset)
    editor = _GraphEditor(graph_def)
    if not editor.seed_generator_inputs():
        return dataset
    editor.renew_seed_generators()
    variant = tf.raw_ops.DatasetFromGraph(graph_def=graph_def.SerializeToString())
    copy = tf.data.experimental.from_variant(variant, dataset.element_spec)
    # The Python functions its graph calls live as long as the original.
    copy._kpt_rebuilt_from = dataset  # pylint: disable=protected-access
    return copy


def vectorized_trace_problem(graph_def, rewrite: Rewrite) -> Optional[str]:
    """Traces a vectorised map's function on batches; says why it does not fit.

    The function's graph is rebuilt with the batched element spec as its
    input shapes, and its output shapes must be those of a batch of its
    per-element outputs.

    Args:
        graph_def: the pipeline's `tf.compat.v1.GraphDef`.
        rewrite: a "vectorize" `Rewrite` for it.

    Returns:
        `None` when the traced outputs are batches of the per-element
        outputs, else the reason in words.
    """
    tf = tensorflow()
    from tensorflow.python.framework import function_def_to_graph

    rewritten = apply_rewrites(graph_def, [rewrite])
    editor = _GraphEditor(rewritten)
    node = editor.node(rewrite.node)
    library = {f.signature.name: f for f in rewritten.library.function}
    definition = library.get(node.attr["f"].func.name)
    if definition is None:
        return "its function is not in the pipeline's graph"
    shapes = []
    for index in range(len(definition.signature.input_arg)):
        attrs = definition.arg_attr[index].attr if index in definition.arg_attr else {}
        listed = attrs["_output_shapes"].list.shape if "_output_shapes" in attrs else []
        shapes.append(tf.TensorShape(listed[0]) if listed else None)
    try:
        traced = function_def_to_graph.function_def_to_graph(definition, input_shapes=shapes)
    except Exception as error:  # noqa: BLE001 - then it is not vectorisable.
        return f"it cannot be traced on batches: {type(error).__name__}: {error}"
    wanted = [tf.TensorShape(shape) for shape in node.attr["output_shapes"].list.shape]
    got = [output.shape for output in traced.outputs]
    if len(got) != len(wanted) or not all(
        one.is_compatible_with(other) for one, other in zip(got, wanted)
    ):
        return (
            f"traced on batches it gives shapes {[str(s) for s in got]} instead of "
            f"batches of its per-element outputs {[str(s) for s in wanted]}"
        )
    return None


def serialized_options(options: Dict[str, Any]) -> bytes:
    """`tf.data.Options` with the given fields set, serialised as in a dataset graph.

    Args:
        options: field values by dotted path, e.g.
            `{"threading.private_threadpool_size": 2}`.

    Returns:
        The bytes of the `serialized_options` attribute of an `OptionsDataset`.
    """
    tf = tensorflow()
    value = tf.data.Options()
    for path, setting in options.items():
        *parents, field = path.split(".")
        target = value
        for parent in parents:
            target = getattr(target, parent)
        setattr(target, field, setting)
    template = graph_def_of(tf.data.Dataset.range(0).with_options(value))
    return next(node for node in template.node if node.op == "OptionsDataset").attr[
        "serialized_options"
    ].s


def _batched(shape, rows: int):
    tf = tensorflow()
    batched = tf.TensorShape([None if rows < 0 else rows]).concatenate(tf.TensorShape(shape))
    return batched.as_proto()


def _set_shapes(node, shapes) -> None:
    listed = node.attr["output_shapes"].list.shape
    del listed[:]
    listed.extend(shapes)


def _output_signature(node) -> Tuple[List[int], List[Any]]:
    for types_attr in ("output_types", "Toutput_types"):
        if types_attr in node.attr:
            types = list(node.attr[types_attr].list.type)
            shapes = list(node.attr["output_shapes"].list.shape)
            return types, shapes
    raise ValueError(f"Dataset node {node.name!r} ({node.op}) has no output types.")


class _GraphEditor:
    """Edits one dataset GraphDef in place."""

    def __init__(self, graph_def):
        self.graph_def = graph_def
        self._by_name = {node.name: node for node in graph_def.node}
        self.retval = next((node for node in graph_def.node if node.op == "_Retval"), None)
        if self.retval is None or not self.retval.input:
            raise ValueError(
                "Not a dataset graph: it has no `_Retval` node. Pass the GraphDef from "
                "`graph_def_of(dataset)`."
            )
        self._names = itertools.count()

    def node(self, name: str):
        node = self._by_name.get(name)
        if node is None:
            raise ValueError(f"The dataset graph has no node {name!r}.")
        return node

    def apply(self, rewrite: Rewrite) -> None:
        node = self.node(rewrite.node)
        if rewrite.kind in (PREFETCH, *OPTION_KINDS):
            # The end of the pipeline as it is now: an earlier rewrite (a
            # vectorised map) may have moved another stage last.
            node = self.node(self.retval.input[0])
        if rewrite.kind == PARALLEL_MAP:
            self._expect(node, rewrite, "MapDataset")
            node.op = "ParallelMapDatasetV2"
            self._add_inputs(node, [self._int64(_AUTOTUNE)])
            if "force_synchronous" in node.attr:
                del node.attr["force_synchronous"]
            node.attr["deterministic"].s = b"true"
        elif rewrite.kind == PARALLEL_INTERLEAVE:
            self._expect(node, rewrite, "InterleaveDataset")
            node.op = "ParallelInterleaveDatasetV4"
            # buffer_output_elements, prefetch_input_elements, num_parallel_calls:
            # what `interleave(num_parallel_calls=...)` passes.
            self._add_inputs(node, [self._int64(_AUTOTUNE) for _ in range(3)])
            node.attr["deterministic"].s = b"true"
        elif rewrite.kind == AUTOTUNE_PARALLELISM:
            self._expect(node, rewrite, *_TUNABLE_INPUT)
            position, _ = _TUNABLE_INPUT[node.op]
            data = [index for index, name in enumerate(node.input) if not name.startswith("^")]
            node.input[data[position]] = self._int64(_AUTOTUNE)
        elif rewrite.kind == PREFETCH:
            self._insert_after(node, "PrefetchDataset", [self._int64(_AUTOTUNE)], {
                "slack_period": ("i", 0),
                "legacy_autotune": ("b", True),
                "buffer_size_min": ("i", 0),
            })
        elif rewrite.kind == CACHE:
            filename = self._string(rewrite.filename or "")
            self._insert_after(node, "CacheDatasetV2", [filename, self._memory_cache()], {})
        elif rewrite.kind == VECTORIZE:
            self._expect(node, rewrite, "MapDataset", "ParallelMapDatasetV2")
            self._vectorize(node, self.node(rewrite.batch_node or ""))
        elif rewrite.kind == PARALLEL_BATCH:
            self._expect(node, rewrite, "BatchDatasetV2")
            # BatchDatasetV2(input, batch_size, drop_remainder) becomes
            # ParallelBatchDataset(input, batch_size, num_parallel_calls, drop_remainder).
            data = [name for name in node.input if not name.startswith("^")]
            control = [name for name in node.input if name.startswith("^")]
            node.op = "ParallelBatchDataset"
            del node.input[:]
            node.input.extend([data[0], data[1], self._int64(_AUTOTUNE), data[2], *control])
            node.attr["deterministic"].s = b"default"
        elif rewrite.kind == REORDER:
            if node.op == "MapDataset":
                self.apply(dataclasses.replace(rewrite, kind=PARALLEL_MAP))
            elif node.op == "InterleaveDataset":
                self.apply(dataclasses.replace(rewrite, kind=PARALLEL_INTERLEAVE))
            self._expect(node, rewrite, "ParallelMapDatasetV2", "ParallelInterleaveDatasetV4")
            node.attr["deterministic"].s = b"false"
        elif rewrite.kind in OPTION_KINDS:
            self._insert_after(node, "OptionsDataset", [], {
                "serialized_options": ("s", serialized_options(rewrite.options)),
            })
        else:
            raise ValueError(f"Unknown rewrite kind {rewrite.kind!r}; expected one of {KINDS}.")

    def _vectorize(self, map_node, batch_node) -> None:
        """Moves `batch_node` before `map_node`, which then maps whole batches."""
        if batch_node.op not in ("BatchDatasetV2", "ParallelBatchDataset"):
            raise ValueError(f"{batch_node.name!r} is a {batch_node.op}, not a batch.")
        if batch_node.input[0] != map_node.name:
            raise ValueError(f"{batch_node.name!r} does not read from {map_node.name!r}.")
        data = [name for name in batch_node.input if not name.startswith("^")]
        size = self._const_value(data[1])
        drop = self._const_value(data[-1])
        rows = int(size) if drop else -1
        source = self.node(map_node.input[0])
        types, shapes = _output_signature(source)
        del batch_node.attr["output_types"].list.type[:]
        batch_node.attr["output_types"].list.type.extend(types)
        _set_shapes(batch_node, [_batched(shape, rows) for shape in shapes])
        _set_shapes(
            map_node,
            [_batched(shape, rows) for shape in map_node.attr["output_shapes"].list.shape],
        )
        for consumer in self.graph_def.node:
            if consumer is not map_node and consumer.input and consumer.input[0] == batch_node.name:
                consumer.input[0] = map_node.name
        batch_node.input[0] = source.name
        map_node.input[0] = batch_node.name
        # A copy of the function whose argument shapes are the batched ones,
        # as tracing it on batches would record.
        library = {f.signature.name: f for f in self.graph_def.library.function}
        original = library.get(map_node.attr["f"].func.name)
        if original is not None:
            copy = type(original)()
            copy.CopyFrom(original)
            copy.signature.name = self._function_name(original.signature.name, library)
            for index in range(len(types)):
                attrs = copy.arg_attr[index].attr if index in copy.arg_attr else None
                if attrs is not None and "_output_shapes" in attrs:
                    listed = attrs["_output_shapes"].list.shape
                    batched = [_batched(shape, rows) for shape in listed]
                    del listed[:]
                    listed.extend(batched)
            self.graph_def.library.function.append(copy)
            map_node.attr["f"].func.name = copy.signature.name

    def _function_name(self, name: str, library) -> str:
        # Digits added to the trailing number keep the name tf.data gave the
        # function readable as the user's (`__inference_..._<n>`).
        stem = name if re.search(r"_\d+$", name) else f"{name}_"
        while True:
            candidate = f"{stem}0{next(self._names)}"
            if candidate not in library:
                return candidate

    def _const_value(self, name: str):
        tf = tensorflow()
        node = self.node(name.split(":")[0])
        if node.op != "Const":
            raise ValueError(f"{name!r} is not a constant.")
        return tf.make_ndarray(node.attr["value"].tensor).item()

    def renew_caches(self) -> None:
        tf = tensorflow()
        for node in list(self.graph_def.node):
            if node.op != "CacheDatasetV2":
                continue
            resource = self._by_name.get(node.input[2].split(":")[0])
            if resource is None or resource.op != "Const":
                continue
            handle = tf.compat.v1.NodeDef()
            handle.CopyFrom(resource)
            handle.name = self._unique("cache_buffer")
            handle.attr["value"].tensor.resource_handle_val[0].name = (
                f"kpt_memory_cache_{uuid.uuid4().hex}"
            )
            self._add(handle)
            node.input[2] = handle.name

    def seed_generator_inputs(self) -> List[Tuple[Any, int]]:
        """(node, input index) of every input that is a dataset's seed generator."""
        found = []
        for node in self.graph_def.node:
            for index, name in enumerate(node.input):
                source = self._by_name.get(name.split(":")[0])
                if source is not None and source.op == "Const" and _is_seed_generator(source):
                    found.append((node, index))
        return found

    def renew_seed_generators(self) -> None:
        tf = tensorflow()
        for node, index in self.seed_generator_inputs():
            handle = tf.compat.v1.NodeDef()
            handle.CopyFrom(self._by_name[node.input[index].split(":")[0]])
            handle.name = self._unique("seed_generator")
            # A name no resource has yet: a fresh generator, seeded as the
            # dataset's own was when it was made.
            handle.attr["value"].tensor.resource_handle_val[0].name = (
                f"kpt_seed_generator_{uuid.uuid4().hex}"
            )
            self._add(handle)
            node.input[index] = handle.name

    # Internals.

    @staticmethod
    def _expect(node, rewrite: Rewrite, *ops: str) -> None:
        if node.op not in ops:
            raise ValueError(
                f"Rewrite {rewrite.kind!r} applies to {' / '.join(ops)} nodes, but "
                f"{node.name!r} is a {node.op}."
            )

    @staticmethod
    def _add_inputs(node, names: List[str]) -> None:
        data = [name for name in node.input if not name.startswith("^")]
        control = [name for name in node.input if name.startswith("^")]
        del node.input[:]
        node.input.extend(data + names + control)

    def _insert_after(self, upstream, op: str, extra_inputs: List[str], attrs) -> None:
        tf = tensorflow()
        types, shapes = _output_signature(upstream)
        node = tf.compat.v1.NodeDef(name=self._unique(op), op=op)
        node.input.extend([upstream.name, *extra_inputs])
        node.attr["output_types"].list.type.extend(types)
        node.attr["output_shapes"].list.shape.extend(shapes)
        node.attr["metadata"].s = b""
        for name, (field, value) in attrs.items():
            setattr(node.attr[name], field, value)
        # Only the next stage along the pipeline reads from the new one; a
        # dataset captured by a function elsewhere keeps reading the original.
        for consumer in self.graph_def.node:
            if consumer.input and consumer.input[0] == upstream.name:
                consumer.input[0] = node.name
        self._add(node)

    def _memory_cache(self) -> str:
        tf = tensorflow()
        template = graph_def_of(tf.data.Dataset.range(0).cache())
        resource = next(
            node
            for node in template.node
            if node.op == "Const" and node.attr["dtype"].type == tf.resource.as_datatype_enum
        )
        handle = tf.compat.v1.NodeDef()
        handle.CopyFrom(resource)
        handle.name = self._unique("cache_buffer")
        self._add(handle)
        return handle.name

    def _int64(self, value: int) -> str:
        tf = tensorflow()
        return self._const(tf.make_tensor_proto(value, tf.int64), tf.int64)

    def _string(self, value: str) -> str:
        tf = tensorflow()
        return self._const(tf.make_tensor_proto(value, tf.string), tf.string)

    def _const(self, tensor, dtype) -> str:
        tf = tensorflow()
        node = tf.compat.v1.NodeDef(name=self._unique("Const"), op="Const")
        node.attr["dtype"].type = dtype.as_datatype_enum
        node.attr["value"].tensor.CopyFrom(tensor)
        self._add(node)
        return node.name

    def _unique(self, stem: str) -> str:
        while True:
            name = f"kpt/{stem}_{next(self._names)}"
            if name not in self._by_name:
                return name

    def _add(self, node) -> None:
        self.graph_def.node.append(node)
        # The proto copies the node on append; index the copy, which later edits change.
        self._by_name[node.name] = self.graph_def.node[-1]


def _is_seed_generator(const) -> bool:
    handles = const.attr["value"].tensor.resource_handle_val
    return bool(handles) and "SeedGenerator" in handles[0].maybe_type_name
