"""Whether a pipeline can run again without changing what training reads from it.

The probes after training (the contention check, the what-if replay, the
timing of the advised fixes) read the user's pipeline again, on iterators of
their own. That is safe for a pipeline that computes its elements from data and
files: a new iterator starts over, and so do the random ops tf.data runs in its
functions (`tf.random.uniform` and the like keep their state per iterator). It
is not where a pass changes state that outlives it:

- a Python function (`tf.py_function`, a stateful `tf.numpy_function`): a
  counter or a NumPy generator inside it moves on (TensorFlow itself never
  runs such a function in parallel or twice for one element);
- a `tf.random.Generator`, whose random state is a variable, or an op that
  writes a table;
- an op that writes a variable (a Keras random layer's seed), unless the
  probe puts the pipeline's variables back afterwards (`PipelineVariables`);
- a source a second reader takes elements from: a Python generator (it may
  read a queue, a live feed) and the tf.data service (a job others share).

Checks that only raise (`Assert`, `CheckNumerics`) change nothing, and reading
in-memory arrays changes nothing either. A `tf.numpy_function(...,
stateful=False)` is its author's promise that its results depend on its
inputs only: it may run again.
"""

import re
from typing import List
from typing import Optional

import numpy as np

from keras_pipeline_tuner.pipeline.graph import kinds
from keras_pipeline_tuner.pipeline.graph.in_memory import InMemoryDataTooLarge
from keras_pipeline_tuner.pipeline.graph.in_memory import dataset_attributes

# In-memory tensors above this are read as one-element stand-ins (as the lint
# reads them): their graph would copy them, and they hold no state.
_READ_MAX_IN_MEMORY_BYTES = 16 * 2**20

# Stateful ops that read but never change state: a function holding only these
# gives the same result whatever order or thread runs it.
READ_ONLY_STATEFUL_OPS = frozenset(
    {
        "ReadVariableOp",
        "ResourceGather",
        "VarHandleOp",
        "LookupTableFind",
        "LookupTableFindV2",
        "LookupTableSize",
        "LookupTableSizeV2",
        "HashTable",
        "HashTableV2",
    }
)
# Stateful only in that they may raise: they change no state.
CHECK_OPS = frozenset({"Assert", "CheckNumerics", "CheckNumericsV2"})
# Ops that call functions (branches, loop bodies, nested calls): stateful only
# when the functions they call are, whose ops are read with them
# (`graph.functions`), e.g. the `If` of a `tf.debugging` assertion.
CALL_OPS = frozenset({"If", "While", "Case", "StatefulPartitionedCall"})
# Ops that write a resource variable: undone by putting its value back.
VARIABLE_WRITE_OPS = frozenset({"AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp"})
# Python function ops whose Python may keep state (`PyFuncStateless` is
# `tf.numpy_function(stateful=False)`: declared free of it).
STATEFUL_PYTHON_OPS = frozenset({"EagerPyFunc", "PyFunc"})
# Random ops whose state is a variable (`tf.random.Generator`): a pass moves it.
_VARIABLE_RANDOM_OPS = frozenset({"RngReadAndSkip", "RngSkip"})
_DATASET_OP = re.compile(r"Dataset(V\d+)?$")
# Sources a second reader takes elements from.
_SHARED_SOURCES = {
    kinds.FROM_GENERATOR: (
        "it reads a Python generator (from_generator), which may be a queue or a live feed "
        "whose elements a second reader would take from training"
    ),
    kinds.DISTRIBUTE: (
        "it reads from the tf.data service, whose job a second reader would take elements "
        "from"
    ),
}


def side_effects(function) -> List[str]:
    """The ops of a stage's function that change state outside the pipeline.

    Args:
        function: a `graph.model.StageFunction`.

    Returns:
        The op types, sorted; empty when it changes nothing (reads, random
        draws, Python calls and datasets built inside aside).
    """
    allowed = (
        set(function.py_function_ops)
        | set(function.io_ops)
        | READ_ONLY_STATEFUL_OPS
        | CHECK_OPS
        | CALL_OPS
    )
    return sorted(
        op
        for op in function.stateful_ops
        # Datasets built inside a function (e.g. the reader an interleave
        # opens) are marked stateful but change nothing outside themselves.
        if op not in allowed and op not in function.random_ops and not _DATASET_OP.search(op)
    )


def state_changing_stages(pipeline) -> List[str]:
    """Labels of the stages whose functions change state outside the pipeline.

    Args:
        pipeline: the pipeline, from `graph.reader.read_pipeline`.

    Returns:
        The labels, e.g. `["map(count)"]` for a map that assigns a variable.
    """
    return [
        stage.label
        for stage in pipeline.stages
        if stage.function is not None and side_effects(stage.function)
    ]


def rerun_hazard(
    pipeline, allow_python: bool = False, restores_variables: bool = False
) -> Optional[str]:
    """Why reading the pipeline again would change what training reads, or `None`.

    Args:
        pipeline: the pipeline, from `graph.reader.read_pipeline`.
        allow_python: the user vouches that the pipeline's Python functions
            keep no state and its generator reads no queue or live feed
            (`allow_unverified=True`): they may run again.
        restores_variables: the caller puts the variables the pipeline's
            functions write back afterwards (`PipelineVariables`): writing
            them is no hazard.

    Returns:
        A clause that completes "The pipeline is not run again: ...", or
        `None` when a pass of a probe leaves the user's later passes as they
        would have been.

    Example:

    >>> from keras_pipeline_tuner.pipeline.graph.reader import read_pipeline
    >>> rerun_hazard(read_pipeline(tf.data.Dataset.range(8).map(lambda x: x + 1)))
    >>> tagged = tf.data.Dataset.range(8).map(
    ...     lambda x: tf.py_function(lambda v: v, [x], tf.int64))
    >>> rerun_hazard(read_pipeline(tagged)).startswith("map(<lambda>) calls Python")
    True
    """
    shared = shared_source(pipeline, allow_python)
    if shared is not None:
        return shared
    for stage in pipeline.stages:
        function = stage.function
        if function is None:
            continue
        python = sorted(set(function.py_function_ops) & STATEFUL_PYTHON_OPS)
        if python and not allow_python:
            return (
                f"{stage.label} calls Python ({', '.join(python)}), whose state (a counter, "
                "a NumPy generator) a second run would move on; a tf.numpy_function(..., "
                "stateful=False) may run again"
            )
        random_state = sorted(
            op
            for op in function.random_ops
            if op in _VARIABLE_RANDOM_OPS or op.startswith("Stateful")
        )
        if random_state:
            return (
                f"{stage.label} draws from a tf.random.Generator ({', '.join(random_state)}), "
                "whose state a second run would move on"
            )
        changed = side_effects(function)
        if restores_variables:
            changed = [op for op in changed if op not in VARIABLE_WRITE_OPS]
        if changed:
            return (
                f"{stage.label} changes state outside the pipeline ({', '.join(changed)}, "
                "e.g. a Keras random layer's seed), which a second run would change again"
            )
    return None


def shared_source(pipeline, allow_python: bool = False) -> Optional[str]:
    """Why a second reader of the pipeline, even in another process, would take training's elements.

    A Python generator may be a queue or a live feed, and the tf.data
    service hands each element of a job to one reader: a copy of the process
    reading them takes what training would read. Every other hazard of
    `rerun_hazard` is state the process keeps in its own memory.

    Args:
        pipeline: the pipeline, from `graph.reader.read_pipeline`.
        allow_python: the user vouches that the generator reads no queue or
            live feed (`allow_unverified=True`): it may be read again.

    Returns:
        A clause that completes "The pipeline is not run again: ...", or `None`.

    Example:

    >>> from keras_pipeline_tuner.pipeline.graph.reader import read_pipeline
    >>> shared_source(read_pipeline(tf.data.Dataset.range(8)))
    >>> fed = tf.data.Dataset.from_generator(lambda: iter(range(8)), output_signature=
    ...     tf.TensorSpec((), tf.int64))
    >>> shared_source(read_pipeline(fed)).startswith("it reads a Python generator")
    True
    """
    for stage in pipeline.stages:
        shared = _SHARED_SOURCES.get(stage.kind)
        if shared is not None and not (allow_python and stage.kind == kinds.FROM_GENERATOR):
            return shared
    return None


def dataset_rerun_hazard(
    dataset, allow_python: bool = False, restores_variables: bool = False
) -> Optional[str]:
    """`rerun_hazard` of a `tf.data.Dataset`'s pipeline (some 10 ms to read).

    Args:
        dataset: the dataset a probe would read again.
        allow_python: as for `rerun_hazard`.
        restores_variables: as for `rerun_hazard`; the variables written must
            also be found (`PipelineVariables`), else writing them is a hazard.

    Returns:
        As `rerun_hazard`; also a reason when the graph holds more in-memory
        arrays than it is read with (a large `from_tensors` source, such as
        Keras' dataset over NumPy arrays): reading it would copy them.
    """
    from keras_pipeline_tuner.pipeline.graph.reader import read_pipeline

    try:
        pipeline = read_pipeline(dataset, _READ_MAX_IN_MEMORY_BYTES)
    except InMemoryDataTooLarge as error:
        return (
            f"its graph, which holds about {error.held_bytes / 2**20:.0f} MB of "
            "in-memory arrays, would be copied to check what running it again changes"
        )
    hazard = rerun_hazard(pipeline, allow_python, restores_variables)
    if hazard is None and restores_variables and rerun_hazard(pipeline, allow_python) is not None:
        if not PipelineVariables(dataset).variables:
            # Written, but not found to put back.
            return rerun_hazard(pipeline, allow_python)
    return hazard


class PipelineVariables:
    """The values of the variables a dataset's functions capture, to put back after a probe.

    A Keras random layer in a `map` (`RandomFlip`, `RandomRotation`) keeps its
    seed in a variable that each call moves on; a probe that runs the map
    again would change the augmentations of the next fit unless the seed is
    put back. The variables are those the dataset's functions captured when
    traced (its stages and their inputs, walked from the final dataset).

    Args:
        dataset: the `tf.data.Dataset` a probe will read.

    Attributes:
        variables: the variables found.

    Example:

    >>> seed = tf.Variable(0, dtype=tf.int64)
    >>> ds = tf.data.Dataset.range(3).map(lambda x: x + seed.assign_add(1))
    >>> saved = PipelineVariables(ds)
    >>> _ = list(ds)
    >>> saved.restore()
    >>> int(seed.numpy())
    0
    """

    def __init__(self, dataset):
        self.variables = _captured_variables(dataset)
        self._values = [np.array(variable.numpy()) for variable in self.variables]

    def restore(self) -> None:
        """Puts every variable back to the value it had when this was made."""
        for variable, value in zip(self.variables, self._values):
            variable.assign(value)


def _captured_variables(dataset) -> list:
    """The variables captured by the functions of `dataset` and the datasets it reads."""
    found = {}
    for value in dataset_attributes(dataset):
        graph = getattr(getattr(value, "function", None), "graph", None)
        if type(value).__name__ == "StructuredFunctionWrapper" and graph is not None:
            for variable in getattr(graph, "variables", ()):
                found[id(variable)] = variable
    return list(found.values())
