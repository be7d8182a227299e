"""Where a cache keeps what the model sees, and whether a pipeline draws randomly.

A cache replays its first epoch: it saves work only after stages that do work
and give the same elements every epoch, and freezes whatever is random before
it (a shuffle's order, a random augmentation). This module finds the stage to
cache after, or says why there is none.
"""

from typing import Optional

from keras_pipeline_tuner.pipeline.graph import kinds
from keras_pipeline_tuner.pipeline.graph.model import Pipeline
from keras_pipeline_tuner.pipeline.graph.rerun import side_effects

# Stateful ops that read a value a training loop may change between epochs.
_MUTABLE_READ_OPS = {"ReadVariableOp", "ResourceGather", "VarHandleOp"}

# Structural stages: they regroup or select elements without computing on them,
# so a cache can sit after them as well as before.
_STRUCTURAL_KINDS = {
    kinds.BATCH,
    kinds.PADDED_BATCH,
    kinds.UNBATCH,
    kinds.TAKE,
    kinds.SKIP,
    kinds.SHARD,
    kinds.REBATCH,
}
# Sources that do work per element (Python, file reads), unlike in-memory ones.
_SOURCE_KINDS_WITH_WORK = {
    kinds.FROM_GENERATOR,
    kinds.TFRECORD,
    kinds.TEXT_LINE,
    kinds.FIXED_LENGTH_RECORD,
}
# Stages whose output differs from one epoch to the next by design.
_RANDOM_KINDS = {kinds.SHUFFLE, kinds.RANDOM, kinds.SAMPLE_FROM_DATASETS}


def cache_point(pipeline: Pipeline):
    """Where a cache keeps what the model sees: the stage to cache after.

    The cache follows the last expensive stage (it runs Python, reads files or
    generates elements, decodes or parses) that has only stages giving the same
    elements every epoch upstream of it, and before anything random (a shuffle,
    a random augmentation, a read of a variable). Structural stages (batch,
    take, ...) right after it are cached too. Functions TensorFlow cannot see
    into (`tf.py_function`, `from_generator`) are assumed to repeat themselves;
    the tuner checks it on the real elements before using the cache.

    Args:
        pipeline: the pipeline, from `graph.reader.read_pipeline`.

    Returns:
        `(stage, None)` with the `Stage` to cache after, or `(None, reason)`.

    Example:

    >>> from keras_pipeline_tuner.pipeline.graph.reader import read_pipeline
    >>> files = tf.data.Dataset.from_tensor_slices(["a.txt", "b.txt"])
    >>> ds = files.map(tf.io.read_file).batch(2)
    >>> stage, _ = cache_point(read_pipeline(ds))
    >>> stage.label
    'batch(2)'
    """
    if any(stage.kind == kinds.CACHE for stage in pipeline.stages):
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
        elif point is not None and stage.kind not in (kinds.PREFETCH, kinds.WITH_OPTIONS):
            # Work after the expensive stage (e.g. a cheap map that grows the
            # elements) stays after the cache, where it costs no memory.
            break
    if point is None:
        return None, "no stage is expensive enough to be worth caching"
    return point, None


def draws_randomly(pipeline: Pipeline) -> bool:
    """Whether a stage shuffles or draws random numbers, as far as the graph shows.

    Args:
        pipeline: the pipeline, from `graph.reader.read_pipeline`.

    Returns:
        True when some stage is a shuffle or sampling, or runs random ops.

    Example:

    >>> from keras_pipeline_tuner.pipeline.graph.reader import read_pipeline
    >>> draws_randomly(read_pipeline(tf.data.Dataset.range(8).shuffle(8)))
    True
    """
    return any(
        stage.kind in _RANDOM_KINDS or (stage.function is not None and stage.function.random)
        for stage in pipeline.stages
    )


def _changes_between_epochs(stage) -> bool:
    if stage.opaque or stage.kind in _RANDOM_KINDS:
        return True
    if stage.kind == kinds.REPEAT:
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


def cache_caveat(pipeline: Pipeline, point) -> Optional[str]:
    """What a cache after `point` assumes of functions TensorFlow cannot see into.

    Args:
        pipeline: the pipeline, from `graph.reader.read_pipeline`.
        point: the stage the cache follows (see `cache_point`).

    Returns:
        The assumption in words, naming the `from_generator` sources and
        `tf.py_function` stages up to `point`, or `None` when there are none.

    Example:

    >>> from keras_pipeline_tuner.pipeline.graph.reader import read_pipeline
    >>> pipeline = read_pipeline(tf.data.Dataset.range(4).map(tf.math.square))
    >>> cache_caveat(pipeline, pipeline.final) is None
    True
    """
    upstream = [point, *pipeline.upstream(point)]
    opaque = [
        stage.label
        for stage in reversed(upstream)
        if stage.kind == kinds.FROM_GENERATOR
        or (stage.function is not None and stage.function.py_function_ops)
    ]
    if not opaque:
        return None
    names = " and ".join([", ".join(opaque[:-1]), opaque[-1]] if len(opaque) > 1 else opaque)
    return (
        f"assumes {names} give{'s' if len(opaque) == 1 else ''} the same elements every "
        "epoch (checked on the real elements)"
    )
