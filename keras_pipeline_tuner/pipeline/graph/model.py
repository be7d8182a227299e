"""The pipeline model: a dataset's `Stage`s in order, and what their functions do.

A `Pipeline` is what the graph reader (`reader.read_pipeline`) makes of a
dataset's graph: stages a person can read (`map(augment,
num_parallel_calls=AUTOTUNE)`), each with the user function it applies and
what that function does (random ops, `tf.py_function`, decoding, file reads),
and the pipeline TensorFlow actually runs after its default rewrites. The
lint, the rewrites and the advice read it; nothing here reads a graph.
"""

import dataclasses
from typing import Dict
from typing import Iterator
from typing import List
from typing import Optional
from typing import Union

from keras_pipeline_tuner.pipeline.graph import keras_made
from keras_pipeline_tuner.pipeline.graph import kinds

AUTOTUNE = "AUTOTUNE"

ParamValue = Union[int, float, bool, str]

_ASYNCHRONOUS = {
    "PrefetchDataset",
    "ParallelMapDataset",
    "ParallelMapDatasetV2",
    "MapAndBatchDataset",
    "ParallelInterleaveDataset",
    "ParallelInterleaveDatasetV2",
    "ParallelInterleaveDatasetV3",
    "ParallelInterleaveDatasetV4",
    "LegacyParallelInterleaveDatasetV2",
    "ParallelBatchDataset",
    "ParallelFilterDataset",
    # The tf.data service read keeps requests to the service's workers in flight.
    "DataServiceDataset",
    "DataServiceDatasetV2",
    "DataServiceDatasetV3",
    "DataServiceDatasetV4",
}

# Parameters shown without their name when they come first, as users write them.
_POSITIONAL = ("start", "stop", "step")
_FIRST_POSITIONAL = ("batch_size", "buffer_size", "count", "filename")

# What a stage's label shows, per kind, in this order.
_LABEL_PARAMS = {
    kinds.MAP: ("num_parallel_calls", "deterministic"),
    kinds.FILTER: ("num_parallel_calls",),
    kinds.MAP_AND_BATCH: ("batch_size", "num_parallel_calls"),
    kinds.INTERLEAVE: ("cycle_length", "block_length", "num_parallel_calls"),
    kinds.BATCH: ("batch_size", "drop_remainder", "num_parallel_calls"),
    kinds.PADDED_BATCH: ("batch_size", "drop_remainder"),
    kinds.PREFETCH: ("buffer_size",),
    kinds.SHUFFLE: ("buffer_size", "reshuffle_each_iteration"),
    kinds.REPEAT: ("count",),
    kinds.TAKE: ("count",),
    kinds.SKIP: ("count",),
    kinds.SHARD: ("num_shards", "index"),
    kinds.RANGE: ("start", "stop", "step"),
    kinds.CACHE: ("filename",),
    kinds.PY_DATASET: ("workers", "use_multiprocessing"),
    kinds.DISTRIBUTE: ("processing_mode", "service", "job_name"),
}

# A function this small (in ops that compute) is cheap to run per element.
CHEAP_FUNCTION_OPS = 25


@dataclasses.dataclass
class StageFunction:
    """What a user function in a stage does, from its traced graph.

    Attributes:
        name: the name the user wrote (`"augment"`, `"<lambda>"`, the class of a
            Keras layer such as `"RandomFlip"`).
        graph_name: the function's name in the graph library.
        ops: distinct op types inside, nested functions included.
        random_ops: ops whose values change between epochs (stateful random
            ops, and stateless ones seeded from a variable, like Keras layers).
        py_function_ops: `tf.py_function` / `tf.numpy_function` ops.
        heavy_ops: decoding, parsing and resizing ops.
        io_ops: file reads, and datasets created inside (readers, generators).
        stateful_ops: ops TensorFlow marks stateful; a function holding one is
            never parallelised automatically.
        compute_ops: how many ops do work (constants and identities aside).
    """

    name: str
    graph_name: str
    ops: List[str] = dataclasses.field(default_factory=list)
    random_ops: List[str] = dataclasses.field(default_factory=list)
    py_function_ops: List[str] = dataclasses.field(default_factory=list)
    heavy_ops: List[str] = dataclasses.field(default_factory=list)
    io_ops: List[str] = dataclasses.field(default_factory=list)
    stateful_ops: List[str] = dataclasses.field(default_factory=list)
    compute_ops: int = 0

    @property
    def random(self) -> bool:
        """Whether the function gives different results in different epochs."""
        return bool(self.random_ops)

    @property
    def expensive(self) -> bool:
        """Whether it runs Python, decodes / parses / resizes, or reads files."""
        return bool(self.py_function_ops or self.heavy_ops or self.io_ops)

    @property
    def trivial(self) -> bool:
        """Whether it computes nothing (e.g. only reshapes the structure)."""
        return self.compute_ops == 0

    @property
    def cheap(self) -> bool:
        """Whether it is a few plain TensorFlow ops, cheap per element."""
        return (
            not self.trivial
            and not self.expensive
            and not self.random
            and not self.stateful_ops
            and self.compute_ops <= CHEAP_FUNCTION_OPS
        )


@dataclasses.dataclass
class Stage:
    """One transformation (or source) of a pipeline.

    Attributes:
        node: the node's name in the dataset graph; unique in the pipeline.
        op: the dataset op, e.g. "ParallelMapDatasetV2".
        kind: the `tf.data` method it comes from, e.g. "map", "TFRecordDataset",
            "from_generator" (see `kinds`); the op name for ops the reader does
            not know.
        params: its arguments, e.g. `{"num_parallel_calls": "AUTOTUNE"}`
            (AUTOTUNE is written as the word).
        function: the user function it applies, if any.
        inputs: `node`s of the stages it reads from.
        files: how many files a reader or `list_files` stage covers.
        element_bytes: size of one output element when all shapes are static.
        opaque: True for ops the reader does not know; shown, not judged.
        runs_as: the label of the stage TensorFlow runs in its place after its
            default rewrites, when it differs (e.g. a fused `map_and_batch`).
        parallel_at_runtime: whether it runs in parallel after those rewrites;
            `None` when the rewritten pipeline could not be read.
        made_by: the Keras utility whose own work the stage is, e.g.
            "image_dataset_from_directory" for its loader map (see
            `keras_made`); the stage is then labelled, and its function
            named, as the call the user wrote.
    """

    node: str
    op: str
    kind: str
    params: Dict[str, ParamValue] = dataclasses.field(default_factory=dict)
    function: Optional[StageFunction] = None
    inputs: List[str] = dataclasses.field(default_factory=list)
    files: Optional[int] = None
    element_bytes: Optional[int] = None
    opaque: bool = False
    runs_as: Optional[str] = None
    parallel_at_runtime: Optional[bool] = None
    made_by: Optional[str] = None

    @property
    def function_name(self) -> Optional[str]:
        """The user function's name (or the Keras utility they called), or `None`."""
        if self.made_by is not None:
            return self.made_by
        return self.function.name if self.function is not None else None

    @property
    def parallel(self) -> bool:
        """Whether the stage, as written, runs its work on several threads."""
        if self.op not in _ASYNCHRONOUS or self.op == "PrefetchDataset":
            return False
        if self.op == "LegacyParallelInterleaveDatasetV2":
            return self.params.get("cycle_length") != 1
        return self.params.get("num_parallel_calls") != 1

    @property
    def asynchronous(self) -> bool:
        """Whether the stage produces ahead of its consumer on its own threads."""
        return self.op in _ASYNCHRONOUS

    @property
    def label(self) -> str:
        """The stage as code, e.g. `map(augment, num_parallel_calls=AUTOTUNE)`."""
        if self.made_by is not None:
            return keras_made.label(self.made_by)
        if self.opaque:
            return f"{self.op} (opaque)"
        arguments = []
        if self.kind in kinds.READER_KINDS or self.kind == kinds.LIST_FILES:
            if self.files is not None:
                arguments.append(f"{self.files} file{'s' if self.files != 1 else ''}")
            if "num_parallel_reads" in self.params:
                arguments.append(f"num_parallel_reads={self.params['num_parallel_reads']}")
        elif self.function is not None and self.kind != kinds.FROM_GENERATOR:
            arguments.append(self.function.name)
        for name in _LABEL_PARAMS.get(self.kind, ()):
            if name not in self.params:
                continue
            value = self.params[name]
            if name in ("drop_remainder", "reshuffle_each_iteration") and value == (
                name == "reshuffle_each_iteration"
            ):
                continue
            if name == "deterministic" and value != "false":
                continue
            if name == "filename" and value in ("", "memory"):
                continue
            if name == "deterministic":
                text = "False"
            elif isinstance(value, str) and value != AUTOTUNE:
                text = repr(value)
            else:
                text = str(value)
            positional = (name in _FIRST_POSITIONAL and not arguments) or (
                name in _POSITIONAL and len(arguments) == _POSITIONAL.index(name)
            )
            arguments.append(text if positional else f"{name}={text}")
        return f"{self.kind}({', '.join(arguments)})"


@dataclasses.dataclass
class Pipeline:
    """A dataset's stages in order, sources first and the final dataset last.

    Attributes:
        stages: the stages in topological order: every stage comes after the
            stages it reads from; the last one is the dataset itself.
        options: the `tf.data.Options` set on the pipeline, flattened to
            `{"autotune_options.enabled": False, ...}` (only what was set).
        runtime: the pipeline TensorFlow runs after its default rewrites, or
            `None` when it could not be read (see `runtime_error`).
        runtime_error: why the rewritten pipeline could not be read.
        cardinality: the dataset's elements in one pass, as
            `dataset.cardinality()` gives it (-1 without end, -2 unknown), or
            `None` when it was built from a graph alone.

    Example:

    >>> from keras_pipeline_tuner.pipeline.graph.reader import read_pipeline
    >>> pipeline = read_pipeline(tf.data.Dataset.range(8).batch(2))
    >>> str(pipeline)
    'range(0, 8, 1) -> batch(2)'
    """

    stages: List[Stage] = dataclasses.field(default_factory=list)
    options: Dict[str, ParamValue] = dataclasses.field(default_factory=dict)
    runtime: Optional["Pipeline"] = None
    runtime_error: Optional[str] = None
    cardinality: Optional[int] = None

    def __str__(self) -> str:
        return " -> ".join(stage.label for stage in self.stages)

    @property
    def final(self) -> Optional[Stage]:
        """The stage that produces the dataset's elements."""
        return self.stages[-1] if self.stages else None

    def stage(self, node: str) -> Stage:
        """The stage whose graph node is `node`.

        Raises:
            KeyError: if no stage has that node.
        """
        for stage in self.stages:
            if stage.node == node:
                return stage
        raise KeyError(f"No stage {node!r} in the pipeline.")

    def upstream(self, stage: Stage) -> Iterator[Stage]:
        """Every stage `stage` reads from, directly or not, nearest first."""
        by_node = {item.node: item for item in self.stages}
        seen = set()
        frontier = list(stage.inputs)
        while frontier:
            node = frontier.pop(0)
            if node in seen or node not in by_node:
                continue
            seen.add(node)
            yield by_node[node]
            frontier.extend(by_node[node].inputs)

    def main_chain(self, stage: Stage) -> Iterator[Stage]:
        """The stages `stage` reads from through first inputs, nearest first.

        The first input is the data a transformation works on (the others are
        e.g. the datasets an interleave or zip also reads).
        """
        by_node = {item.node: item for item in self.stages}
        current = by_node.get(stage.inputs[0]) if stage.inputs else None
        while current is not None:
            yield current
            current = by_node.get(current.inputs[0]) if current.inputs else None

    def downstream(self, stage: Stage) -> Iterator[Stage]:
        """Every stage that reads from `stage`, directly or not, nearest first."""
        readers: Dict[str, List[Stage]] = {}
        for item in self.stages:
            for node in item.inputs:
                readers.setdefault(node, []).append(item)
        seen = set()
        frontier = list(readers.get(stage.node, []))
        while frontier:
            item = frontier.pop(0)
            if item.node in seen:
                continue
            seen.add(item.node)
            yield item
            frontier.extend(readers.get(item.node, []))

    @property
    def worker_processes(self) -> Optional[bool]:
        """Whether the input runs in worker processes it starts, or `None` where unknown.

        A DataLoader and a `PyDataset` say so in their settings (`num_workers`,
        `use_multiprocessing`); tf.data ops and arrays run in the process
        itself; the user's Python elsewhere (a generator, a `py_function`, a
        Grain stage) may start any.

        Example:

        >>> from keras_pipeline_tuner.pipeline.graph.reader import read_pipeline
        >>> read_pipeline(tf.data.Dataset.range(8).batch(2)).worker_processes
        False
        """
        if not self.stages:
            return None
        for stage in self.stages:
            if stage.kind == kinds.DATA_LOADER:
                return int(stage.params.get("num_workers") or 0) > 0
            if stage.kind == kinds.PY_DATASET:
                return bool(stage.params.get("use_multiprocessing"))
            calls_python = stage.kind in (kinds.GENERATOR, kinds.FROM_GENERATOR) or (
                stage.function is not None and stage.function.py_function_ops
            )
            if calls_python or stage.opaque or stage.kind.startswith("grain"):
                return None
        return False

    @property
    def runtime_final(self) -> Optional[Stage]:
        """The final stage TensorFlow runs, when the rewritten pipeline is known."""
        return self.runtime.final if self.runtime is not None else None
